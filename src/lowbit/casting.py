"""Casting a float32 result to a narrower float dtype by lowbit's rule: finite values beyond the dtype's range
saturate to its largest value instead of becoming inf (the eager path's cast; csrc/stream.h narrows the same
way a tile at a time)."""

from __future__ import annotations

import torch


def saturating_cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to a narrower float dtype; finite values beyond its range saturate instead of becoming inf.

    On the CPU a tensor whose values all lie within the range (no NaN, no inf: the usual case) takes a plain
    cast after one min / max pass; torch's isfinite and where over a float32 tensor cost 25 times the cast
    (2112 x 384: about 1 ms each against 40 us, torch 2.13, Zen 4). Traced into a compiled kernel it stays
    the rule as written (fused there, and a data-dependent branch would break the graph)."""
    limit = torch.finfo(dtype).max
    if values.is_floating_point() and torch.finfo(values.dtype).max <= limit:
        return values.to(dtype)  # a cast to a dtype at least as wide: nothing to saturate
    if values.is_cpu and values.numel() > 0 and not torch.compiler.is_compiling():
        low, high = torch.aminmax(values)  # NaN anywhere makes both NaN: the full path below
        if -limit <= float(low) and float(high) <= limit:
            return values.to(dtype)
    return torch.where(torch.isfinite(values), values.clamp(-limit, limit), values).to(dtype)


# The narrow float dtypes by their bits: (integer view, width in bits, whether the dtype lacks -0 (fnuz: its
# pattern is NaN)).
_BITS = {torch.float16: (torch.int16, 16, False), torch.bfloat16: (torch.int16, 16, False),
         torch.float8_e4m3fn: (torch.uint8, 8, False), torch.float8_e5m2: (torch.uint8, 8, False),
         torch.float8_e4m3fnuz: (torch.uint8, 8, True), torch.float8_e5m2fnuz: (torch.uint8, 8, True)}  # fmt: skip


# Directed rounding narrows in the direction opposite to its own (formats.rounding.DIRECTED_MODES): where a
# value narrows downward (else upward).
_NARROWS_DOWN = {"up": lambda v: torch.ones_like(v, dtype=torch.bool),
                 "down": lambda v: torch.zeros_like(v, dtype=torch.bool),
                 "toward_zero": lambda v: v < 0, "away_from_zero": lambda v: v > 0}  # fmt: skip


def narrow_directed(values: torch.Tensor, dtype: torch.dtype, mode: str) -> torch.Tensor:
    """``values`` (float32 results of the directed rounding ``mode``) cast to ``dtype`` rounded against the
    mode: "up" narrows down, "down" up, "toward_zero" away from zero, "away_from_zero" toward zero; the value
    itself where ``dtype`` holds it.

    The float32 result of "up" lies at or above x, and x (the input) is a ``dtype`` value, so the value below
    the result is still at or above x: the direction holds in ``dtype``. And since no grid value lies between
    x and the result, the narrowed value rounds back onto the same grid value and narrows to itself: q(q(x))
    == q(x) in every dtype. Narrowed to nearest it could land above the grid value, and the next pass would
    move it a whole step up. The rule depends on the value and the mode only, so a QTensor's codes narrow the
    same way when dequantized. NaN and +-inf stay; finite values past ``dtype``'s range saturate as in
    ``saturating_cast``.
    """
    nearest = saturating_cast(values, dtype)
    if dtype not in _BITS or mode not in _NARROWS_DOWN:
        return nearest
    back = nearest.float()
    wanted_down = _NARROWS_DOWN[mode](values)
    down = (back > values) & wanted_down
    up = (back < values) & ~wanted_down
    if not bool((down | up).any()):
        return nearest
    return _step(nearest, down, up)


def narrow_toward(values: torch.Tensor, target: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float32) cast to ``dtype``, each rounded toward its ``target`` (float32 holding a value of
    ``dtype``: the input the value was rounded from): the neighbour in ``dtype`` on the target's side, or the
    value itself where ``dtype`` holds it. Where the value lies on the mode's side of its input (every value
    but a saturated one) this is ``narrow_directed``; a saturated value (past the grid's end, on the other
    side of x) narrows toward x too, so it stays between the grid's end and x, and a grid re-derived from a
    block's extremes (min-max affine) moves as little as possible. NaN and +-inf stay."""
    nearest = saturating_cast(values, dtype)
    if dtype not in _BITS:
        return nearest
    back = nearest.float()
    down = (back > values) & (target < values)  # rounded up, away from the target: one step down
    up = (back < values) & (target > values)
    if not bool((down | up).any()):
        return nearest
    return _step(nearest, down, up)


def _step(narrow: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``narrow`` moved one representable value toward -inf where ``down``, toward +inf where ``up`` (the
    moves never leave the finite range: each lands between a finite value and its target)."""
    view, width, no_negative_zero = _BITS[narrow.dtype]
    sign_bit = 1 << (width - 1)
    bits = narrow.view(view).to(torch.int32) & ((1 << width) - 1)
    magnitude, negative = bits & (sign_bit - 1), (bits & sign_bit) != 0
    zero = magnitude == 0
    # toward +inf: a negative magnitude shrinks, anything else grows (a zero becomes the smallest positive)
    # toward -inf: a positive magnitude shrinks, anything else grows (a zero becomes the smallest negative)
    shrink = torch.where(up, negative & ~zero, ~negative & ~zero)
    new_magnitude = torch.where(shrink, magnitude - 1, magnitude + 1)
    new_negative = torch.where(up, negative & ~zero, negative | zero)
    if no_negative_zero:
        new_negative &= new_magnitude != 0
    moved = new_magnitude | torch.where(new_negative, sign_bit, 0)
    bits = torch.where(up | down, moved, bits)
    if view is torch.int16:
        bits = torch.where(bits >= sign_bit, bits - (1 << width), bits)
    return bits.to(view).view(narrow.dtype)

