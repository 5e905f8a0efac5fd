"""Rounding onto a floating-point grid: the core shared by minifloat, block and MX formats.

A binary floating-point grid with ``mantissa_bits`` M and smallest normal exponent ``min_exponent`` holds
0, the subnormals k * 2^(min_exponent - M) for 0 < k < 2^M, and the normals 2^e * (1 + f / 2^M) for
e >= min_exponent. ``round_to_float_grid`` gives each element the grid value chosen by the rounding mode
(a mantissa that rounds up to 2 carries into the next exponent, as IEEE 754 does), then clamps the
magnitude to ``max_value``. ``min_exponent`` and ``max_value`` may be tensors that broadcast against x
(a shared exponent bias per block). NaN stays NaN; +-inf saturate to +-max_value.
"""

from __future__ import annotations

import torch

from lowbit.formats.rounding import round_to_integer


# Per float dtype: (same-width integer dtype, mantissa bits, exponent bias, shift that normalises subnormals).
_LAYOUT = {
    torch.float32: (torch.int32, 23, 127, 24),
    torch.float64: (torch.int64, 52, 1023, 54),
}


def floor_log2(magnitude: torch.Tensor) -> torch.Tensor:
    """floor(log2(|x|)) as an int32 tensor, exact, read from the float's exponent bits.

    Subnormals are first scaled into the normal range (exact), so they get their true exponent too. Zero
    gives a value below every exponent of the dtype; +-inf and NaN give -1 (callers treat them apart). Reading the
    bits vectorises in compiled kernels, where frexp runs element by element.
    """
    if magnitude.dtype not in _LAYOUT:
        _, exponent = torch.frexp(magnitude)
        return exponent - 1
    int_dtype, mantissa_bits, bias, shift = _LAYOUT[magnitude.dtype]
    magnitude = magnitude.abs()
    subnormal = magnitude < torch.finfo(magnitude.dtype).tiny
    scaled = torch.where(subnormal, magnitude * 2.0**shift, magnitude)
    field = (scaled.view(int_dtype) >> mantissa_bits) & (2 * bias + 1)
    exponent = (field - bias).to(torch.int32)
    exponent = torch.where(field == 2 * bias + 1, -1, exponent)  # inf / NaN: -1, as frexp's exponent 0 gives
    return torch.where(subnormal, exponent - shift, exponent)


def exact_pow2(exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2^exponent as ``dtype``, built from the exponent bits (exact; vectorises where ldexp does not).

    Exponents below the normal range are built 64 binades higher and scaled down, which is exact for
    every power of two the dtype holds (subnormals included). Exponents above it give inf.
    """
    if dtype not in _LAYOUT:
        return torch.ldexp(torch.ones_like(exponent, dtype=dtype), exponent)
    int_dtype, mantissa_bits, bias, _ = _LAYOUT[dtype]
    exponent = exponent.to(int_dtype)
    low = exponent < 1 - bias
    shifted = torch.where(low, exponent + 64, exponent).clamp(-bias, bias + 1)  # bias + 1 -> inf bits
    power = ((shifted + bias) << mantissa_bits).view(dtype)
    return torch.where(low, power * 2.0**-64, power)


def round_to_float_grid(
    x: torch.Tensor,
    mantissa_bits: int,
    min_exponent: int | torch.Tensor,
    max_value: float | torch.Tensor,
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
    saturate: bool = True,
) -> torch.Tensor:
    """Nearest (by ``rounding``) value of the grid described above, saturating at +-max_value (a caller
    that knows nothing can round past max_value may pass ``saturate=False`` to skip that pass)."""
    # Elements of the binade [2^e, 2^(e+1)) (or the subnormal range) sit on multiples of 2^(e - M).
    step = grid_step(x, mantissa_bits, min_exponent)
    scaled = x / step  # exact: a power of two
    rounded = scaled.round_() if rounding == "nearest_even" else round_to_integer(scaled, rounding, generator)
    rounded = rounded.mul_(step)
    return rounded.clamp_(-max_value, max_value) if saturate else rounded  # a per-block max_value >= 0 clamps in one pass as well


def grid_step(x: torch.Tensor, mantissa_bits: int, min_exponent: int | torch.Tensor) -> torch.Tensor:
    """2^(max(floor(log2 |x|), min_exponent) - M): the grid step at each element.

    Where the smallest step is a normal number of x's dtype (every minifloat / OCP grid in float32), the
    step is the exponent field of x lowered by M >= 1 binades and clamped from below, built in two integer passes
    (``_step_from_bits``); +-inf and NaN get a huge finite step, which leaves them inf / NaN exactly as the
    general path's step does. Otherwise (per-block exponents, steps below the normal range) the general
    path reads the exponent (``floor_log2``) and builds the power of two (``exact_pow2``). Per-block
    exponents (MX, block minifloat) take the bit path eagerly when every block's smallest step is normal
    (one check of the small per-block tensor); compiled kernels keep the general path (no data-dependent
    branch), which gives the same steps.
    """
    if x.dtype in _LAYOUT and mantissa_bits >= 1:  # M = 0: inf would get step inf
        _, _, bias, _ = _LAYOUT[x.dtype]
        if not isinstance(min_exponent, torch.Tensor):
            if min_exponent - mantissa_bits >= 1 - bias:
                return _step_from_bits(x, mantissa_bits, min_exponent)
        elif _can_read(x) and min_exponent.numel() and bool((min_exponent - mantissa_bits >= 1 - bias).all()):
            return _step_from_bits(x, mantissa_bits, min_exponent)  # eager only: the check reads the data
    exponent = floor_log2(x.abs())
    if isinstance(min_exponent, torch.Tensor):
        # Widen to the per-block tensor's integer type (not narrow it): mixing int32 and int64 lanes trips
        # Inductor's C++ vectorizer on float64 inputs.
        exponent = torch.maximum(exponent.to(min_exponent.dtype), min_exponent)
    else:
        exponent = exponent.clamp(min=min_exponent)
    return exact_pow2(exponent - mantissa_bits, x.dtype)


def _can_read(x: torch.Tensor) -> bool:
    """Whether a data-dependent branch may read x's values: eagerly, and not on meta (shapes only)."""
    return not _compiling() and x.device.type != "meta"


def _step_from_bits(x: torch.Tensor, mantissa_bits: int, min_exponent: int | torch.Tensor) -> torch.Tensor:
    """The step from the exponent bits; with per-block ``min_exponent`` every block's smallest step must be
    a normal float (then the integer maximum of the bit patterns is the maximum of the powers of two)."""
    int_dtype, float_mantissa_bits, bias, _ = _LAYOUT[x.dtype]
    exponent_mask = (2 * bias + 1) << float_mantissa_bits
    field = x.view(int_dtype) & exponent_mask  # the biased exponent in place; sign and mantissa cleared
    field.sub_(mantissa_bits << float_mantissa_bits)  # M binades lower (negative for tiny x: clamped next)
    if isinstance(min_exponent, torch.Tensor):
        smallest = (min_exponent.to(int_dtype) - mantissa_bits + bias) << float_mantissa_bits
        return torch.maximum(field, smallest, out=field).view(x.dtype)
    field.clamp_(min=(min_exponent - mantissa_bits + bias) << float_mantissa_bits)
    return field.view(x.dtype)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def float_grid_max(exponent_width: int, mantissa_bits: int, exponent_bias: int, reserved_top: bool) -> float:
    """Largest finite value; ``reserved_top`` drops the top exponent code (IEEE: it encodes inf / NaN)."""
    top_exponent = (2**exponent_width - 1) - exponent_bias - (1 if reserved_top else 0)
    return (2.0 - 2.0**-mantissa_bits) * 2.0**top_exponent


def float_grid_values(mantissa_bits: int, min_exponent: int, max_value: float) -> torch.Tensor:
    """Every value of the grid up to max_value, both signs, sorted (float64); for exhaustive tests."""
    positives = [k * 2.0 ** (min_exponent - mantissa_bits) for k in range(2**mantissa_bits)]
    exponent = min_exponent
    while 2.0**exponent <= max_value:
        positives += [2.0**exponent * (1 + f / 2**mantissa_bits) for f in range(2**mantissa_bits)]
        exponent += 1
    positives = torch.tensor(sorted({v for v in positives if v <= max_value}), dtype=torch.float64)
    return torch.cat([-positives.flip(0)[:-1], positives])
