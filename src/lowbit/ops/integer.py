"""Integer matmul / linear with int32-style accumulation and requantization (nGraph's QuantizedDot family).

Inputs are integer codes (int8 or uint8) with a scale and a zero point; the accumulator is

    acc[m, n] = sum_k (x[m, k] - x_zp) * (w[n, k] - w_zp[n]) + bias_codes[n]

computed EXACTLY: the reference path in int64 (``torch.mm`` on int64, obviously right), the fast path with
``torch._int_mm`` (int8 x int8 -> int32) on codes shifted into int8 plus int64 zero-point corrections. Both
give the same integers, and everything after the accumulator is one shared function (:func:`finish`), so
the integer outputs of the two paths are identical.

Output: float32 real values ``acc * x_scale * w_scale[n]`` (+ residual, ReLU), or codes requantized to
``output_dtype`` (int8 / uint8) with ``output_scale`` / ``output_zero_point``:
``clamp(round_half_even(real / output_scale) + output_zero_point)``, evaluated in float64.
The bias is int32 codes with scale x_scale * w_scale[n] (zero point 0); a float bias is quantized to such
codes first (round half to even, in float64). The fused residual (nGraph's ...BiasAdd / ...BiasSignedAdd)
is another quantized tensor, signed or unsigned, added in real terms before the ReLU and the requantization.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lowbit.errors import FormatError
from lowbit.ops import capabilities
from lowbit.ops.quant import CODE_RANGES, broadcast_qparams, check_scale

PATHS = ("auto", "reference", "int_mm")
INT_MM_MAX_K = 2**31 // (128 * 128)  # int8 x int8 products summed in int32 never overflow below this K


class AffineCodes(NamedTuple):
    """A quantized tensor: integer ``codes`` with ``scale`` and ``zero_point`` (per tensor)."""

    codes: torch.Tensor
    scale: float | torch.Tensor
    zero_point: int | torch.Tensor = 0


def check_codes(codes: torch.Tensor, name: str, allowed=(torch.int8, torch.uint8)) -> None:
    if not isinstance(codes, torch.Tensor) or codes.dtype not in allowed:
        got = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise FormatError(f"{name} must be integer codes of dtype {' or '.join(map(str, allowed))}, got {got}")


# ---- the accumulator ----------------------------------------------------------------------------------------
def accumulate_reference(x: torch.Tensor, x_zp: torch.Tensor, w: torch.Tensor, w_zp: torch.Tensor) -> torch.Tensor:
    """sum_k (x - x_zp)(w - w_zp) in int64: x [M, K], w [N, K], x_zp scalar, w_zp scalar or [N] -> [M, N]."""
    return (x.long() - x_zp.long()) @ (w.long() - w_zp.long().reshape(-1, 1)).t()


def _shift_to_int8(codes: torch.Tensor, zero_point: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 codes minus 128 as int8, with the zero point shifted alike (the real values do not change)."""
    if codes.dtype == torch.uint8:
        return (codes.to(torch.int16) - 128).to(torch.int8), zero_point.long() - 128
    return codes, zero_point.long()


def dense(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix`` with row-major strides (a copy unless it has them). torch 2.13's CPU ``_int_mm`` returns
    wrong sums for some other layouts, e.g. the transpose of an [N, 1] matrix (strides (1, 1))."""
    rows, columns = matrix.shape
    if matrix.stride() == (columns, 1):
        return matrix
    return torch.empty((rows, columns), dtype=matrix.dtype, device=matrix.device).copy_(matrix)


def accumulate_int_mm(x: torch.Tensor, x_zp: torch.Tensor, w: torch.Tensor, w_zp: torch.Tensor) -> torch.Tensor:
    """The same sum via ``torch._int_mm`` on int8 codes:
    sum (x - a)(w - b) = sum x w - b * rowsum(x) - a * colsum(w) + K a b, corrections in int64."""
    x8, a = _shift_to_int8(x, x_zp)
    w8, b = _shift_to_int8(w, w_zp)
    k = x.shape[-1]
    product = torch._int_mm(dense(x8), dense(w8.t())).long()  # [M, N]
    b = b.reshape(1, -1) if b.dim() else b
    row_sums = x8.long().sum(1, keepdim=True)  # [M, 1]
    col_sums = w8.long().sum(1).reshape(1, -1)  # [1, N]
    return product - b * row_sums - a * col_sums + k * a * b


def accumulate(x: torch.Tensor, x_zp: torch.Tensor, w: torch.Tensor, w_zp: torch.Tensor, path: str = "auto") -> torch.Tensor:
    """Exact int64 accumulator [M, N] by ``path``: "reference", "int_mm", or "auto" (int_mm where it fits and
    its probes say it is exact and fast on this device, see :mod:`lowbit.ops.capabilities`)."""
    if path not in PATHS:
        raise FormatError(f"path={path!r} is not a path; legal: {', '.join(PATHS)}")
    if path == "int_mm" and not capabilities.probe("int_mm_exact", x.device):
        raise FormatError(f"path='int_mm' is not exact on this machine ({capabilities.machine(x.device).name}: "
                          "torch._int_mm saturates sums of products); use path='auto'")  # fmt: skip
    if path == "reference" or (path == "auto" and not (_int_mm_fits(x, w) and capabilities.probe("int_mm_fast", x.device))):
        return accumulate_reference(x, x_zp, w, w_zp)
    try:
        return accumulate_int_mm(x, x_zp, w, w_zp)
    except RuntimeError:  # a build whose _int_mm rejects this shape or device
        if path == "int_mm":
            raise
        return accumulate_reference(x, x_zp, w, w_zp)


def _int_mm_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.shape[-1] <= INT_MM_MAX_K and x.shape[0] > 0 and w.shape[0] > 0


# ---- after the accumulator ----------------------------------------------------------------------------------
def bias_codes(bias, x_scale: torch.Tensor, w_scale: torch.Tensor, n: int) -> torch.Tensor | None:
    """int64 bias codes [N] with scale x_scale * w_scale (int32 input as is, float input rounded half-even)."""
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or bias.reshape(-1).shape[0] != n:
        raise FormatError(f"bias must be a tensor of {n} values (one per output)")
    bias = bias.reshape(-1)
    if bias.dtype == torch.int32:
        return bias.long()
    if not bias.is_floating_point():
        raise FormatError(f"bias must be int32 codes or floats, got {bias.dtype}")
    codes = torch.round(bias.double() / (x_scale.double() * w_scale.double().reshape(-1)))
    limit = CODE_RANGES[torch.int32]
    if bool(((codes < limit[0]) | (codes > limit[1])).any()):
        raise FormatError("the bias does not fit int32 codes at scale x_scale * weight_scale")
    return codes.long()


def _check_output(output_scale, output_zero_point, output_dtype, device) -> tuple | None:
    """None for a float output, else (scale float64, zero point, qmin, qmax)."""
    if output_dtype is None or output_dtype in (torch.float32, torch.float64):
        if output_scale is not None:
            raise FormatError("output_scale needs an integer output_dtype (int8 or uint8)")
        return None
    if output_dtype not in (torch.int8, torch.uint8):
        raise FormatError(f"output_dtype must be int8, uint8 or float32, got {output_dtype}")
    if output_scale is None:
        raise FormatError(f"an {output_dtype} output needs output_scale")
    scale = torch.as_tensor(output_scale, dtype=torch.float32, device=device).reshape(())
    check_scale(scale, "output_scale")
    qmin, qmax = CODE_RANGES[output_dtype]
    if not isinstance(output_zero_point, int) or not qmin <= output_zero_point <= qmax:
        raise FormatError(f"output_zero_point={output_zero_point!r} must be an int in [{qmin}, {qmax}]")
    return scale.double(), output_zero_point, qmin, qmax


def finish(acc: torch.Tensor, real_scale: torch.Tensor, *, residual: AffineCodes | None, relu: bool,
           output: tuple | None) -> torch.Tensor:  # fmt: skip
    """acc (int64) -> float32 real values or requantized codes; float64 arithmetic, shared by every path."""
    real = acc.double() * real_scale
    if residual is not None:
        real = real + (residual.codes.double() - residual.zero_point.double()) * residual.scale.double()
    if relu:
        real = real.clamp_min(0.0)
    return requantize(real, output)


def requantize(real: torch.Tensor, output: tuple | None) -> torch.Tensor:
    """float64 real values -> float32 (output None) or clamp(round_half_even(real / scale) + zero_point)."""
    if output is None:
        return real.float()
    scale, zero_point, qmin, qmax = output
    return (torch.round(real / scale) + zero_point).clamp(qmin, qmax).to(_OUTPUT_DTYPE[(qmin, qmax)])


_OUTPUT_DTYPE = {CODE_RANGES[torch.int8]: torch.int8, CODE_RANGES[torch.uint8]: torch.uint8}


def _residual(residual, shape: tuple[int, ...]) -> AffineCodes | None:
    if residual is None:
        return None
    if not isinstance(residual, tuple) or len(residual) not in (2, 3):
        raise FormatError("residual must be (codes, scale[, zero_point]), e.g. lowbit.ops.AffineCodes")
    codes, scale, zero_point = (*residual, 0)[:3]
    check_codes(codes, "residual codes")
    if tuple(codes.shape) != shape:
        raise FormatError(f"residual of shape {tuple(codes.shape)} does not match the output shape {shape}")
    params = broadcast_qparams(codes, scale, zero_point, qrange=CODE_RANGES[codes.dtype])
    return AffineCodes(codes, params.scale, params.zero_point)


# ---- public ops ---------------------------------------------------------------------------------------------
def quantized_linear(x: torch.Tensor, x_scale, x_zero_point, weight: torch.Tensor, weight_scale,
                     weight_zero_point=0, bias=None, *, relu: bool = False, residual=None, output_scale=None,
                     output_zero_point: int = 0, output_dtype: torch.dtype | None = None,
                     path: str = "auto") -> torch.Tensor:  # fmt: skip
    """x [..., K] codes (per-tensor scale / zero point) times weight [N, K] codes (per-tensor or per-output-
    channel scale / zero point) -> [..., N]: float32 real values, or requantized int8 / uint8 codes."""
    check_codes(x, "x")
    check_codes(weight, "weight")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise FormatError(f"shape mismatch: x {tuple(x.shape)} and weight {tuple(weight.shape)} (need x [..., K], weight [N, K])")
    n = weight.shape[0]
    xp = broadcast_qparams(x, x_scale, x_zero_point, qrange=CODE_RANGES[x.dtype])
    wp = broadcast_qparams(weight, weight_scale, weight_zero_point, axis=0, qrange=CODE_RANGES[weight.dtype])
    w_scale, w_zp = wp.scale.reshape(-1), wp.zero_point.reshape(-1)
    output = _check_output(output_scale, output_zero_point, output_dtype, x.device)
    out_shape = tuple(x.shape[:-1]) + (n,)
    res = _residual(residual, out_shape)
    acc = accumulate(x.reshape(-1, x.shape[-1]), xp.zero_point, weight, w_zp, path)  # [M, N]
    codes = bias_codes(bias, xp.scale, w_scale, n)
    if codes is not None:
        acc = acc + codes
    real_scale = xp.scale.double() * w_scale.double()  # [N] or scalar
    if res is not None:
        res = AffineCodes(res.codes.reshape(-1, n), res.scale, res.zero_point)
    return finish(acc, real_scale, residual=res, relu=relu, output=output).reshape(out_shape)


def quantized_matmul(a: torch.Tensor, a_scale, a_zero_point, b: torch.Tensor, b_scale, b_zero_point=0, bias=None,
                     **options) -> torch.Tensor:  # fmt: skip
    """a [..., M, K] @ b [K, N] on codes (nGraph's QuantizedDot); b's scale / zero point per tensor or per
    column (N values). Same options and outputs as :func:`quantized_linear`."""
    check_codes(b, "b")
    if b.dim() != 2:
        raise FormatError(f"b must be a 2-D [K, N] code matrix, got shape {tuple(b.shape)}")
    return quantized_linear(a, a_scale, a_zero_point, b.t(), b_scale, b_zero_point, bias, **options)


def quantized_concat(inputs, output_scale, output_zero_point: int = 0, *, dim: int = 0,
                     output_dtype: torch.dtype = torch.int8) -> torch.Tensor:  # fmt: skip
    """Concatenate quantized tensors [(codes, scale, zero_point), ...] into one scale / zero point
    (nGraph's QuantizedConcat): each input is re-scaled, round(real / output_scale) + output_zero_point in
    float64, then clamped; inputs already at the output's parameters are copied exactly."""
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise FormatError("quantized_concat needs a non-empty list of (codes, scale, zero_point)")
    first = inputs[0][0] if isinstance(inputs[0], tuple) and inputs[0] else None
    device = first.device if isinstance(first, torch.Tensor) else torch.device("cpu")
    output = _check_output(output_scale, output_zero_point, output_dtype, device)  # on the inputs' device
    if output is None:
        raise FormatError("quantized_concat needs an integer output_dtype (int8 or uint8)")
    parts = []
    for index, item in enumerate(inputs):
        if not isinstance(item, tuple) or len(item) not in (2, 3):
            raise FormatError(f"inputs[{index}] must be (codes, scale[, zero_point]), e.g. lowbit.ops.AffineCodes")
        codes, scale, zero_point = (*item, 0)[:3]
        check_codes(codes, f"inputs[{index}] codes")
        params = broadcast_qparams(codes, scale, zero_point, qrange=CODE_RANGES[codes.dtype])
        real = (codes.double() - params.zero_point.double()) * params.scale.double()
        parts.append(requantize(real, output))
    try:
        return torch.cat(parts, dim=dim)
    except (RuntimeError, IndexError) as error:
        raise FormatError(f"quantized_concat: the inputs do not concatenate along dim={dim}: {error}") from None
