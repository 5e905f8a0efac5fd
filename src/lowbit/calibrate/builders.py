"""Quantized builders in nGraph's sense: a real range [min, max] -> (scale, zero point) of integer codes.

Codes q lie in [q_min, q_max]: [-2^(bits-1), 2^(bits-1) - 1] signed (``narrow_range`` drops -2^(bits-1)),
[0, 2^bits - 1] unsigned; a real value x maps to q = clamp(round(x / scale) + zero_point, q_min, q_max)
and back to (q - zero_point) * scale, the ``affine`` format's grid. All arithmetic is float32, the
precision every backend stores scales in, so the results equal torch.ao's ``calculate_qparams`` bit for bit.

- The range is first widened to include 0 (low = min(min, 0), high = max(max, 0)): zero must be exact.
- Asymmetric: scale = (high - low) / (q_max - q_min); zero_point = q_min - round(low / scale), rounded
  half to even (``torch.round``) and clamped to [q_min, q_max]. low lands on q_min and high within half a
  step of q_max (the rounding of the zero point moves both by at most half a step).
- Symmetric: scale = max(-low, high) / ((q_max - q_min) / 2); zero_point = 0 for signed codes and
  2^(bits-1), the code just above the unsigned midpoint, for unsigned codes (torch.ao's quint8 uses 128).
  With 8-bit signed codes the divisor is 127.5, so +max(|min|, |max|) lands half a step past q_max and
  saturates: at most half a step of error, as in torch.ao.
- The scale is never below ``eps`` (default float32's machine epsilon 2^-23 ~ 1.19e-7, torch.ao's
  floor): a zero range (min == max == 0, as all-zero activations give) gets scale eps and zero point
  q_min (asymmetric) or the symmetric zero point, never NaN or inf.
- ``power_of_two`` rounds the scale (after the eps floor) up to a power of two with
  ``lowbit.formats.scaling.ceil_power_of_two`` (exact, no log2 rounding); a larger scale keeps the widened
  range inside the codes, and the zero point is recomputed from the new scale.

Non-finite min / max and min > max raise :class:`lowbit.errors.ConfigError`. Min and max may be numbers
or tensors of any broadcastable shapes (one per channel or block); the results have the broadcast shape.
"""

from __future__ import annotations

import torch

from lowbit.errors import ConfigError
from lowbit.formats.affine import Affine, AffineParameters
from lowbit.formats.integer import code_range
from lowbit.formats.scaling import ceil_power_of_two

FLOAT32_EPS = float(torch.finfo(torch.float32).eps)  # 2^-23, torch.ao's smallest scale


ScaleZeroPoint = AffineParameters  # one (scale, zero point) type for formats, builders and kernels


def scale_zero_point(
    min: torch.Tensor | float,  # noqa: A002 - nGraph's and torch.ao's names for the range ends
    max: torch.Tensor | float,  # noqa: A002
    bits: int,
    signed: bool = True,
    symmetric: bool = False,
    power_of_two: bool = False,
    narrow_range: bool = False,
    eps: float = FLOAT32_EPS,
) -> ScaleZeroPoint:
    """Scale and zero point that map [min, max] (widened to include 0) onto ``bits``-wide codes.

    See the module docstring for the formulas; ``min`` / ``max`` may be per-channel or per-block tensors.
    """
    q_min, q_max = _checked_code_range(bits, signed, symmetric, narrow_range, eps)
    low, high = _checked_range(min, max)
    low, high = low.clamp(max=0.0), high.clamp(min=0.0)
    if symmetric:
        scale = _floored(torch.maximum(-low, high) / ((q_max - q_min) / 2), eps, power_of_two)
        zero_point = torch.full_like(scale, 0 if signed else 2 ** (bits - 1), dtype=torch.int64)
        return ScaleZeroPoint(scale, zero_point)
    levels = float(q_max - q_min)
    span = high - low  # inf only for a range wider than float32: divide the ends separately then
    raw = torch.where(torch.isinf(span), high / levels - low / levels, span / levels)
    scale = _floored(raw, eps, power_of_two)
    zero_point = (q_min - torch.round(low / scale)).clamp(q_min, q_max).to(torch.int64)
    return ScaleZeroPoint(scale, zero_point)


def affine_spec(
    parameters: ScaleZeroPoint,
    bits: int,
    signed: bool = True,
    axis: int | None = None,
    narrow_range: bool = False,
    **format_parameters,
) -> Affine:
    """An ``affine`` FormatSpec that quantizes with the given scale and zero point (per channel: ``axis``).

    Extra keywords (``rounding``, ``scale_dtype``, ...) go to the spec unchanged. Per-block parameters
    have no given-scale form in ``affine``; quantize blocks with ``affine(block_size=...)`` instead.
    """
    scale, zero_point = parameters
    if scale.numel() > 1 and axis is None:
        raise ConfigError(
            f"affine_spec: {scale.numel()} scales (shape {tuple(scale.shape)}) need axis= to say which "
            "dimension they follow"
        )
    if scale.dim() > 1:
        raise ConfigError(
            f"affine_spec: scales of shape {tuple(scale.shape)} are per block; affine takes given scales "
            "per tensor or per channel only"
        )
    return Affine(
        bits=bits,
        signed=signed,
        narrow_range=narrow_range,
        scale=tuple(float(s) for s in scale.reshape(-1).tolist()),
        zero_point=tuple(int(z) for z in zero_point.reshape(-1).tolist()),
        axis=axis,
        **format_parameters,
    )


def _checked_code_range(bits: int, signed: bool, symmetric: bool, narrow_range: bool, eps: float):
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
        raise ConfigError(f"bits={bits!r} is invalid; expected an int in [1, 16]")
    if narrow_range and (not signed or bits < 2):
        raise ConfigError("narrow_range=True needs signed codes of at least 2 bits")
    q_min, q_max = code_range(bits, signed, narrow_range)
    if symmetric and q_max < 1:
        raise ConfigError(
            f"symmetric=True needs a positive largest code; {bits}-bit signed codes are [{q_min}, {q_max}]"
        )
    if not (eps > 0 and eps < float("inf")):
        raise ConfigError(f"eps={eps!r} is invalid; expected a finite number > 0")
    return q_min, q_max


def _checked_range(low, high) -> tuple[torch.Tensor, torch.Tensor]:
    """min and max as float32 tensors of one broadcast shape, after checking they form a finite range."""
    low = torch.as_tensor(low, dtype=torch.float32).detach()
    high = torch.as_tensor(high, dtype=torch.float32).detach()
    try:
        low, high = torch.broadcast_tensors(low, high)
    except RuntimeError:
        shapes = f"min of shape {tuple(low.shape)} and max of shape {tuple(high.shape)}"
        raise ConfigError(f"{shapes} do not broadcast") from None
    if low.device.type == "meta":  # shapes only: there are no values to check
        return low.clone(), high.clone()
    for name, value in (("min", low), ("max", high)):
        bad = ~torch.isfinite(value)
        if bad.any():
            raise ConfigError(
                f"{name} contains {value[bad].reshape(-1)[0].item()} at index {_first_index(bad)}; a range "
                "must be finite (did the observer see NaN or inf?)"
            )
    inverted = low > high
    if inverted.any():
        index = _first_index(inverted)
        raise ConfigError(f"min > max at index {index}: {low[index].item()} > {high[index].item()}")
    return low.clone(), high.clone()


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.dim() else ()


def _floored(scale: torch.Tensor, eps: float, power_of_two: bool) -> torch.Tensor:
    """The eps floor (zero ranges), then the optional power of two, rounded up so the range still fits."""
    scale = torch.clamp(scale, min=eps)
    scale = ceil_power_of_two(scale) if power_of_two else scale
    if scale.device.type != "meta" and not torch.isfinite(scale).all():
        # Only a range near float32's limits with very few codes gets here (e.g. 1 bit over +-3e38).
        raise ConfigError("the range is too wide for a float32 scale with this many bits")
    return scale


def expected_squared_error(
    counts: torch.Tensor, lowest_edge: torch.Tensor, bin_width: torch.Tensor, scale: torch.Tensor,
    zero_point: torch.Tensor, q_min: int, q_max: int,
) -> torch.Tensor:  # fmt: skip
    """Mean squared error of round-to-nearest affine quantization of a histogram (float64).

    ``counts`` [groups, bins] counts the bins [lowest_edge + m w, lowest_edge + (m + 1) w) (``lowest_edge``,
    ``bin_width`` [groups]); ``scale`` / ``zero_point`` are [groups, candidates]. Each bin's values are taken
    as spread uniformly over the bin, and the squared error is integrated exactly: a sawtooth between the
    grid ends L = (q_min - zp) s and H = (q_max - zp) s, the distance to L or H outside. Returns
    [groups, candidates].
    """
    width = bin_width.reshape(-1, 1, 1)
    bins = torch.arange(counts.shape[1], dtype=torch.float64, device=counts.device)
    start = lowest_edge.reshape(-1, 1, 1) + bins * width  # [g, 1, b]
    end = start + width
    step = scale.to(torch.float64).unsqueeze(2)  # [g, c, 1]
    offset = zero_point.to(torch.float64).unsqueeze(2)
    lowest, highest = (q_min - offset) * step, (q_max - offset) * step
    inside_start, inside_end = torch.maximum(start, lowest), torch.minimum(end, highest)
    inside_end = torch.maximum(inside_end, inside_start)
    inside = (_sawtooth_integral(inside_end / step) - _sawtooth_integral(inside_start / step)) * step**3
    below = _squared_distance_integral(start, torch.minimum(end, lowest), lowest)
    above = _squared_distance_integral(torch.maximum(start, highest), end, highest)
    per_bin = (inside + below + above) / width  # [g, c, b]: the mean squared error of one value of the bin
    total = counts.sum(1).to(torch.float64).clamp(min=1).reshape(-1, 1)
    return (per_bin * counts.to(torch.float64).unsqueeze(1)).sum(2) / total


def _sawtooth_integral(v: torch.Tensor) -> torch.Tensor:
    """An antiderivative of (v - round(v))^2: 1/12 per whole period plus the part of the current one."""
    periods = torch.floor(v + 0.5)
    phase = v + 0.5 - periods  # in [0, 1)
    return periods / 12 + ((phase - 0.5) ** 3 + 0.125) / 3


def _squared_distance_integral(start: torch.Tensor, end: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """The integral of (t - anchor)^2 over [start, end], 0 where end <= start."""
    end = torch.maximum(end, start)
    return ((end - anchor) ** 3 - (start - anchor) ** 3) / 3
