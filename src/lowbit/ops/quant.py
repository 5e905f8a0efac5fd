"""Quantize, dequantize and fake-quantize with given scales and zero points (nGraph's Quantize / Dequantize /
FakeQuantize ops), plus the dynamic scale builders the real-quantized modules use.

Codes: q = clamp(round(x * (1 / scale)) + zero_point, qmin, qmax), with any of lowbit's rounding modes
(x * (1 / scale), not x / scale: bit for bit what ``torch.quantize_per_tensor`` and
``torch.fake_quantize_per_*`` compute); values: (q - zero_point) * scale. NaN inputs become the zero point's
code (the real value 0), +-inf saturate to qmin / qmax.

Granularity: a number or one-element tensor is per tensor; a 1-D tensor with ``axis`` is per channel; with
``group_size`` the scale has shape ``x.shape[:-1] + (x.shape[-1] // group_size,)``: one scale per group of
``group_size`` consecutive elements of the last dimension (the int4 weight layout).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lowbit.errors import FormatError
from lowbit.formats.affine import AffineParameters
from lowbit.formats.rounding import canonical_rounding, round_to_integer

# Integer code dtypes and their full ranges.
CODE_RANGES: dict[torch.dtype, tuple[int, int]] = {
    torch.int8: (-128, 127),
    torch.uint8: (0, 255),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
}
TINY = float(torch.finfo(torch.float32).tiny)  # the smallest scale a dynamic builder returns


QParams = AffineParameters  # lowbit's one (scale, zero point) type (lowbit.formats.affine)


def code_limits(dtype: torch.dtype, qmin: int | None = None, qmax: int | None = None) -> tuple[int, int]:
    """(qmin, qmax): the dtype's range unless narrowed; FormatError if they leave it or cross."""
    if dtype not in CODE_RANGES:
        legal = ", ".join(str(d).replace("torch.", "") for d in CODE_RANGES)
        raise FormatError(f"code dtype {dtype} is not supported; legal: {legal}")
    low, high = CODE_RANGES[dtype]
    qmin = low if qmin is None else int(qmin)
    qmax = high if qmax is None else int(qmax)
    if not low <= qmin <= qmax <= high:
        raise FormatError(f"qmin={qmin}, qmax={qmax} must satisfy {low} <= qmin <= qmax <= {high} for {dtype}")
    return qmin, qmax


def _as_tensor(value, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, dtype=dtype)
    try:
        return torch.tensor(value, dtype=dtype, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise FormatError(f"{name}={value!r} is not a number or a tensor of numbers") from None


def check_scale(scale: torch.Tensor, name: str = "scale") -> None:
    """FormatError unless every scale is finite and > 0."""
    if scale.numel() == 0:
        raise FormatError(f"{name} is empty")
    if scale.device.type == "meta":  # shapes and devices only: there are no values to check
        return
    bad = ~(torch.isfinite(scale) & (scale > 0))
    if bool(bad.any()):
        first = scale.reshape(-1)[bad.reshape(-1)][0].item()
        raise FormatError(f"{name} must be finite and > 0 everywhere; found {first!r}")


def broadcast_qparams(x: torch.Tensor, scale, zero_point=0, *, axis: int | None = None,
                      group_size: int | None = None, qrange: tuple[int, int] | None = None) -> QParams:  # fmt: skip
    """Checked scale and zero point, reshaped (and for groups expanded) to broadcast over ``x``."""
    scale = _as_tensor(scale, "scale", torch.float32, x.device)
    zero_point = _as_tensor(zero_point, "zero_point", torch.float64, x.device)
    check_scale(scale)
    if zero_point.device.type != "meta" and not bool((zero_point == zero_point.round()).all()):
        raise FormatError("zero_point must hold integers")
    zero_point = zero_point.to(torch.int32)
    if qrange is not None and zero_point.device.type != "meta" and bool(((zero_point < qrange[0]) | (zero_point > qrange[1])).any()):
        raise FormatError(f"zero_point must lie in the code range [{qrange[0]}, {qrange[1]}]")
    if group_size is not None:
        return QParams(*(_expand_groups(x, p, group_size, name) for p, name in ((scale, "scale"), (zero_point, "zero_point"))))
    if axis is None:
        for value, name in ((scale, "scale"), (zero_point, "zero_point")):
            if value.numel() != 1:
                raise FormatError(f"{value.numel()} {name} values need axis= (per channel) or group_size=")
        return QParams(scale.reshape(()), zero_point.reshape(()))
    if not -x.dim() <= axis < x.dim():
        raise FormatError(f"axis={axis} is out of range for a tensor of shape {tuple(x.shape)}")
    axis = axis % x.dim()
    view = [1] * x.dim()
    view[axis] = -1
    shaped = []
    for value, name in ((scale, "scale"), (zero_point, "zero_point")):
        if value.numel() not in (1, x.shape[axis]):
            raise FormatError(f"{value.numel()} {name} values do not match dimension {axis} of shape {tuple(x.shape)}")
        shaped.append(value.reshape(-1).reshape(view) if value.numel() > 1 else value.reshape(()))
    return QParams(*shaped)


def _expand_groups(x: torch.Tensor, value: torch.Tensor, group_size: int, name: str) -> torch.Tensor:
    """Per-group parameters [..., K / g] repeated to [..., K] (a single value broadcasts as is)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise FormatError(f"group_size={group_size!r} must be a positive int")
    if x.dim() == 0 or x.shape[-1] % group_size:
        raise FormatError(f"the last dimension ({tuple(x.shape)[-1:]}) is not divisible by group_size={group_size}")
    if value.numel() == 1:
        return value.reshape(())
    groups = tuple(x.shape[:-1]) + (x.shape[-1] // group_size,)
    if tuple(value.shape) != groups:
        raise FormatError(f"{name} of shape {tuple(value.shape)} does not match groups {groups} of x {tuple(x.shape)}")
    return value.repeat_interleave(group_size, dim=-1)


def _round_codes(x, params: QParams, qmin: int, qmax: int, rounding: str, generator) -> torch.Tensor:
    """Integer-valued float32 codes (NaN -> the zero point's code)."""
    x = x.float() if x.dtype != torch.float64 else x
    scaled = torch.nan_to_num(x * (1.0 / params.scale), nan=0.0)
    steps = round_to_integer(scaled, canonical_rounding(rounding), generator)
    return (steps + params.zero_point).clamp(qmin, qmax)


def quantize(x: torch.Tensor, scale, zero_point=0, *, axis: int | None = None, group_size: int | None = None,
             dtype: torch.dtype = torch.int8, qmin: int | None = None, qmax: int | None = None,
             rounding: str = "nearest_even", generator: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
    """Integer codes of ``x`` (``dtype``): clamp(round(x * (1 / scale)) + zero_point, qmin, qmax)."""
    _check_float_input(x)
    qmin, qmax = code_limits(dtype, qmin, qmax)
    params = broadcast_qparams(x, scale, zero_point, axis=axis, group_size=group_size, qrange=(qmin, qmax))
    return _round_codes(x, params, qmin, qmax, rounding, generator).to(dtype)


def dequantize(codes: torch.Tensor, scale, zero_point=0, *, axis: int | None = None, group_size: int | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """(codes - zero_point) * scale in ``dtype`` (float32 arithmetic unless dtype is float64)."""
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise FormatError(f"dequantize needs integer codes, got {codes.dtype}")
    params = broadcast_qparams(codes, scale, zero_point, axis=axis, group_size=group_size)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    values = (codes.to(work) - params.zero_point.to(work)) * params.scale.to(work)
    return values.to(dtype)


def fake_quantize(x: torch.Tensor, scale, zero_point=0, *, axis: int | None = None, group_size: int | None = None,
                  qmin: int = -128, qmax: int = 127, rounding: str = "nearest_even",
                  generator: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
    """dequantize(quantize(x)) without the integer round trip, in x's dtype; NaN stays NaN, as in every
    lowbit format (integer codes cannot hold NaN, so :func:`quantize` gives it the zero point's code)."""
    _check_float_input(x)
    qmin, qmax = int(qmin), int(qmax)
    if qmin > qmax:
        raise FormatError(f"qmin={qmin} is above qmax={qmax}")
    params = broadcast_qparams(x, scale, zero_point, axis=axis, group_size=group_size, qrange=(qmin, qmax))
    codes = _round_codes(x, params, qmin, qmax, rounding, generator)
    values = (codes - params.zero_point) * params.scale
    return torch.where(torch.isnan(x), x, values.to(x.dtype))


def _check_float_input(x) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise FormatError(f"quantize needs a floating-point tensor, got {got}")


# ---- dynamic scale builders --------------------------------------------------------------------------------
def absmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """max |x| along ``dim`` (keepdim) without a temporary |x|: max(max x, -min x)."""
    return torch.maximum(x.amax(dim, keepdim=True), x.amin(dim, keepdim=True).neg())


def symmetric_scale(x: torch.Tensor, bits: int = 8, dim: int = -1) -> torch.Tensor:
    """Per-row (``dim`` reduced, keepdim) symmetric scale max|x| / (2^(bits-1) - 1), at least TINY."""
    return (absmax(x.float(), dim) * (1.0 / (2 ** (bits - 1) - 1))).clamp_min(TINY)


class TokenCodes(NamedTuple):
    """Per-token int8 codes [M, K] in [-127, 127]: row m holds real values codes * scale[m] + offset[m]."""

    codes: torch.Tensor
    scale: torch.Tensor  # [M, 1] float32
    inverse: torch.Tensor  # [M, 1] float32, 1 / scale: codes = round((x - offset) * inverse)
    offset: torch.Tensor | None  # [M, 1] float32 (centred codes), or None (symmetric: offset 0)


def token_scales(x: torch.Tensor, symmetric: bool = True, q_max: int = 127) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(scale, 1 / scale, offset) per row of x [M, K] for :func:`token_codes`; the fast kernels use them too.

    Symmetric: scale = max|row| / q_max, offset None. Centred (``symmetric=False``): the row's range
    [min, max] is mapped onto [-q_max, q_max] around offset = (max + min) / 2 with scale = (max - min) / (2 q_max)
    (q_max 127: 8-bit codes; 63: 7-bit codes, which fbgemm sums exactly without VNNI):
    an affine code with its zero point in the float domain, one bit finer than symmetric codes for
    one-sided rows (GELU / ReLU outputs) and no integer zero-point terms in the integer sums.
    """
    high = x.amax(-1, keepdim=True)
    low = x.amin(-1, keepdim=True)
    if symmetric:  # in-place steps on the small [M, 1] tensors: fewer allocations per call
        offset, scale = None, torch.maximum(high, low.neg_()).mul_(1.0 / q_max)
    else:
        offset, scale = (high + low).mul_(0.5), (high - low).mul_(0.5 / q_max)
    scale = scale.clamp_min_(TINY)
    return scale, torch.reciprocal(scale), offset


def token_codes(x: torch.Tensor, symmetric: bool = True, q_max: int = 127) -> TokenCodes:
    """Dynamic per-token (per row of the last dimension) int8 codes of x [M, K] in [-q_max, q_max] (NaN -> 0)."""
    token = token_float_codes(x, symmetric, q_max)
    return token._replace(codes=token.codes.to(torch.int8))


def token_float_codes(x: torch.Tensor, symmetric: bool = True, q_max: int = 127) -> TokenCodes:
    """:func:`token_codes` with the codes left as integer-valued float32 (what fbgemm's float-input kernel
    takes: one pass fewer than int8 codes converted back)."""
    x = x.float()
    scale, inverse, offset = token_scales(x, symmetric, q_max)
    centred = x if offset is None else x - offset
    scaled = centred * inverse
    # NaN -> 0 written as a comparison: Inductor vectorises it, nan_to_num it does not (3.5x slower fused)
    codes = torch.round(torch.where(scaled == scaled, scaled, 0.0)).clamp(-q_max, q_max)
    return TokenCodes(codes, scale, inverse, offset)
