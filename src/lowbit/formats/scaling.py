"""Helpers for shared scales: scale precision (f32 / f16 / bf16) and power-of-two scales."""

from __future__ import annotations

import torch

_TORCH_SCALE_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SCALE_DTYPE_BITS = {"f32": 32, "f16": 16, "bf16": 16}


def round_scale(scale: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """Round positive scales to the precision they are stored in, keeping them positive and finite."""
    target = _TORCH_SCALE_DTYPES[scale_dtype]
    if target == scale.dtype:
        return scale
    info = torch.finfo(target)
    clamped = scale.clamp(min=info.tiny, max=info.max)
    return clamped.to(target).to(scale.dtype)


# Significand bits (the implicit one included): a stored value m * 2^e with m in [0.5, 1) has ulp 2^(e - p).
_SIGNIFICAND_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def round_scale_up(scale: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """Like ``round_scale``, but to the smallest stored value >= scale (within the dtype's range).

    For block scales that must not shrink: a scale rounded down lets the block's largest magnitude land
    past the last code.
    """
    target = _TORCH_SCALE_DTYPES[scale_dtype]
    rounded = round_scale(scale, scale_dtype)
    if target == scale.dtype:
        return rounded
    _, exponent = torch.frexp(rounded)
    ulp = torch.ldexp(torch.ones_like(rounded), exponent - _SIGNIFICAND_BITS[target])
    below = (rounded < scale) & (rounded < torch.finfo(target).max)
    return torch.where(below, rounded + ulp, rounded)


def round_scale_down(scale: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """Like ``round_scale``, but to the largest stored value <= scale (not below the dtype's smallest normal)."""
    target = _TORCH_SCALE_DTYPES[scale_dtype]
    rounded = round_scale(scale, scale_dtype)
    if target == scale.dtype:
        return rounded
    mantissa, exponent = torch.frexp(rounded)
    # one ulp below a power of two is half an ulp of the binade above
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    ulp = torch.ldexp(torch.ones_like(rounded), exponent - _SIGNIFICAND_BITS[target])
    above = (rounded > scale) & (rounded > torch.finfo(target).tiny)
    return torch.where(above, rounded - ulp, rounded)


def ceil_power_of_two(scale: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= scale (exact: frexp / ldexp, no log2 rounding)."""
    mantissa, exponent = torch.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.ldexp(torch.ones_like(scale), exponent)


def safe_scale(scale: torch.Tensor) -> torch.Tensor:
    """Replace zero, subnormal or non-finite scales (all-zero blocks) by the smallest normal float."""
    tiny = torch.finfo(scale.dtype).tiny
    return torch.where(torch.isfinite(scale) & (scale >= tiny), scale, torch.full_like(scale, tiny))


SHORTEN_MAX_CODE_BITS = 11


def shorten_scale(scale: torch.Tensor, code_bits: int) -> torch.Tensor:
    """Round a positive scale down to ``24 - code_bits`` significant bits (at least 1).

    Then code * scale is exact in float32 for every code of ``code_bits`` bits, so a quantized tensor's
    extreme values are exact multiples of the scale and re-deriving the scale from them gives the same
    scale back: min-max formats become idempotent. Rounding down keeps q_max * scale <= max|x| (outputs stay
    inside the data's range); the scale shrinks by at most 2^-(24 - code_bits) relative (2^-16 for 8-bit
    codes), which moves the block's extreme codes by 2^(2 code_bits - 25) steps at most. That is below a
    tenth of a step only up to 11-bit codes; wider codes keep their scale unchanged (idempotent then only
    up to the float rounding of the re-derived scale).
    """
    if code_bits > SHORTEN_MAX_CODE_BITS:
        return scale
    keep = 24 - code_bits
    mantissa, exponent = torch.frexp(scale)  # scale = mantissa * 2^exponent, mantissa in [0.5, 1)
    shortened = torch.ldexp(torch.floor(torch.ldexp(mantissa, torch.full_like(exponent, keep))), exponent - keep)
    return torch.where(torch.isfinite(scale) & (scale > 0), shortened, scale)
