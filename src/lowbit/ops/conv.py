"""Integer 2-D convolution (nGraph's QuantizedConvolution and its fused +bias / +ReLU / +residual variants).

The input is padded with its zero point's code (the real value 0, as every int8 backend pads), unfolded into
columns (im2col; float32 holds every 8-bit code exactly) and multiplied with the weight codes by the exact
accumulator of :mod:`lowbit.ops.integer` (int64 reference or ``torch._int_mm``), one group at a time. Bias,
residual, ReLU and requantization are the same shared code as :func:`lowbit.ops.quantized_linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowbit.errors import FormatError
from lowbit.ops.integer import (
    AffineCodes,
    _check_output,
    _residual,
    accumulate,
    bias_codes,
    check_codes,
    finish,
)
from lowbit.ops.quant import CODE_RANGES, broadcast_qparams


def _pair(value, name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise FormatError(f"{name}={value!r} must be an int or a pair of ints")
    return pair


def _columns(x: torch.Tensor, zero_point: int, kernel, stride, padding, dilation) -> torch.Tensor:
    """im2col of x [B, C, H, W] codes, padded with ``zero_point``: [B * L, C * kh * kw] in x's dtype."""
    pad_h, pad_w = padding
    padded = F.pad(x.float(), (pad_w, pad_w, pad_h, pad_h), value=float(zero_point))
    columns = F.unfold(padded, kernel, dilation=dilation, stride=stride)  # [B, C*kh*kw, L]
    return columns.transpose(1, 2).reshape(-1, columns.shape[1]).to(x.dtype)


def _output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def quantized_conv2d(x: torch.Tensor, x_scale, x_zero_point, weight: torch.Tensor, weight_scale,
                     weight_zero_point=0, bias=None, *, stride=1, padding=0, dilation=1, groups: int = 1,
                     relu: bool = False, residual=None, output_scale=None, output_zero_point: int = 0,
                     output_dtype: torch.dtype | None = None, path: str = "auto") -> torch.Tensor:  # fmt: skip
    """x [B, C, H, W] codes (per-tensor parameters) * weight [O, C / groups, kh, kw] codes (per-tensor or
    per-output-channel parameters) -> [B, O, H', W']: float32 real values or requantized int8 / uint8."""
    check_codes(x, "x")
    check_codes(weight, "weight")
    stride, padding, dilation = (_pair(v, n) for v, n in ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    _check_shapes(x, weight, groups)
    batch, _, height, width = x.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_h = _output_size(height, kernel_h, stride[0], padding[0], dilation[0])
    out_w = _output_size(width, kernel_w, stride[1], padding[1], dilation[1])
    if out_h < 1 or out_w < 1:
        raise FormatError(f"the kernel {tuple(weight.shape[2:])} does not fit the padded input {tuple(x.shape[2:])}")
    xp = broadcast_qparams(x, x_scale, x_zero_point, qrange=CODE_RANGES[x.dtype])
    wp = broadcast_qparams(weight, weight_scale, weight_zero_point, axis=0, qrange=CODE_RANGES[weight.dtype])
    w_scale = wp.scale.reshape(-1).expand(out_channels)
    w_zp = wp.zero_point.reshape(-1).expand(out_channels)
    output = _check_output(output_scale, output_zero_point, output_dtype, x.device)
    out_shape = (batch, out_channels, out_h, out_w)
    res = _residual(residual, out_shape)
    geometry = ((kernel_h, kernel_w), stride, padding, dilation)
    acc = _grouped_accumulate(x, int(xp.zero_point), weight, w_zp, groups, geometry, path)
    codes = bias_codes(bias, xp.scale, w_scale, out_channels)
    if codes is not None:
        acc = acc + codes
    if res is not None:  # to the accumulator's [B * H' * W', O] layout
        res = AffineCodes(res.codes.permute(0, 2, 3, 1).reshape(-1, out_channels), res.scale, res.zero_point)
    out = finish(acc, xp.scale.double() * w_scale.double(), residual=res, relu=relu, output=output)
    return out.reshape(batch, out_h, out_w, out_channels).permute(0, 3, 1, 2).contiguous()


def _check_shapes(x: torch.Tensor, weight: torch.Tensor, groups: int) -> None:
    if x.dim() != 4 or weight.dim() != 4:
        raise FormatError(f"quantized_conv2d needs x [B, C, H, W] and weight [O, C/groups, kh, kw]; got "
                          f"{tuple(x.shape)} and {tuple(weight.shape)}")  # fmt: skip
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise FormatError(f"groups={groups!r} must be a positive int")
    if x.shape[1] % groups or weight.shape[0] % groups or x.shape[1] // groups != weight.shape[1]:
        raise FormatError(f"shape mismatch: x has {x.shape[1]} channels, weight {tuple(weight.shape)} with groups={groups}")


def _grouped_accumulate(x, x_zp: int, weight, w_zp, groups: int, geometry, path: str) -> torch.Tensor:
    """Exact accumulator [B * H' * W', O], one group's columns at a time."""
    kernel, stride, padding, dilation = geometry
    in_per_group, out_per_group = x.shape[1] // groups, weight.shape[0] // groups
    zero = torch.tensor(x_zp, dtype=torch.int64)
    parts = []
    for group in range(groups):
        channels = slice(group * in_per_group, (group + 1) * in_per_group)
        outputs = slice(group * out_per_group, (group + 1) * out_per_group)
        columns = _columns(x[:, channels], x_zp, kernel, stride, padding, dilation)  # [B*L, Cg*kh*kw]
        kernel_rows = weight[outputs].reshape(out_per_group, -1)  # [Og, Cg*kh*kw]
        parts.append(accumulate(columns, zero, kernel_rows, w_zp[outputs], path))
    return torch.cat(parts, dim=1) if groups > 1 else parts[0]
