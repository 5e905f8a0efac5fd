"""OCP / Burn float element formats: ``e5m2``, ``e4m3`` (FP8), ``e3m2``, ``e2m3`` (FP6) and ``e2m1`` (FP4).

Unscaled (no ``axis``, no ``block_size``), a format is a plain cast: the nearest value by ``rounding``
(default round-half-to-even), bit for bit what ``x.to(torch.float8_e5m2)`` / ``x.to(torch.float8_e4m3fn)``
and ml_dtypes' ``float6_e3m2fn`` / ``float6_e2m3fn`` / ``float4_e2m1fn`` give for in-range inputs.

Overflow (values beyond max, and +-Inf). ``saturate=True`` (default): +-max for every format. ``saturate=False``
follows the type's own rule: e5m2 overflows to +-Inf and keeps +-Inf; e4m3 (E4M3FN: no Inf) overflows to NaN
and turns +-Inf into NaN, as ml_dtypes does; the FP6 / FP4 types have no Inf or NaN codes and ml_dtypes
saturates them, so for them ``saturate=False`` is the same as True. Under directed rounding an overflow stops
at +-max where the mode rounds toward zero (IEEE 754: ``toward_zero`` always, ``down`` for positive values,
``up`` for negative ones). NaN stays NaN in every case (ml_dtypes turns NaN into -0 for FP6 / FP4; a
fake-quantizer keeps it visible).

Scaled (Burn's per-block FP8 / FP4): with ``axis`` (per channel) or ``block_size`` (ND blocks; see
``blocking``), each block gets one scale s and its elements become s * element(x / s). s is the smallest
value of ``scale_dtype`` with max_element * s >= max |x| over the block's finite elements (the float of
amax / max_element rounded up, adjusted by at most one step): the block maximum never overflows, and
quantizing a quantized block gives the same scale back, so scaled formats are idempotent too. An all-zero
block gets the smallest normal scale and stays zero. NaN elements do not set the scale.

Scale rule (``scale_rule``, derived scales only): ``covering`` (default, above: never clamps a block maximum,
idempotent bit for bit) or ``amax``: s = amax / max_element rounded to nearest in ``scale_dtype`` (float32(amax
/ 448) for e4m3 and f32 scales), DeepSeek-V3's FP8 tile rule, e.g. ``block_size=[128, 128],
scale_rule="amax"``; an all-zero block (or amax / max_element below the smallest normal) gets the smallest
normal scale. See docs/formats/minifloat.md.

Given (calibrated) scales: ``scale`` is one number for the whole tensor, or one per index of ``axis``
(see ``lowbit.calibrate.calibrated_spec``). It is rounded to ``scale_dtype`` (to nearest) and used as it
is, whatever the data: elements become s * element(x / s), and values beyond s * max overflow as
``saturate`` says. ``scale`` excludes ``block_size``; ``skip_first_dim`` does not apply to it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import (
    SCALE_DTYPES,
    FormatSpec,
    check_axis,
    check_block_size,
    check_bool,
    check_choice,
    check_given_scales,
)
from lowbit.formats._registry import register
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    block_statistics,
    finite_abs_max,
    finite_min_max,
    given_per_axis,
    runs_of,
    scaled_bits_per_element,
)
from lowbit.formats.minifloat import FloatGrid
from lowbit.formats.scaling import SCALE_DTYPE_BITS, round_scale, safe_scale
from lowbit.native import block as native_block

_TORCH_SCALE_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SCALE_RULES = ("covering", "amax")

# Where an overflow may go past max (to Inf, or NaN for e4m3) for (positive, negative) values; every mode
# not listed (the nearest modes, away_from_zero, stochastic) rounds past max on both sides.
_OVERFLOW_PAST_MAX: dict[str, tuple[bool, bool]] = {
    "toward_zero": (False, False),
    "up": (True, False),
    "down": (False, True),
}


class ElementFormat(NamedTuple):
    """One OCP element type: its float grid and what an overflow becomes without saturation."""

    exponent_width: int
    mantissa_bits: int
    exponent_bias: int
    max_value: float
    overflow: str  # "inf", "nan" or "saturate" (the type has no Inf / NaN codes)

    @property
    def bits(self) -> int:
        return 1 + self.exponent_width + self.mantissa_bits

    @property
    def grid(self) -> FloatGrid:
        return FloatGrid(self.mantissa_bits, 1 - self.exponent_bias, self.max_value)


ELEMENT_FORMATS: dict[str, ElementFormat] = {
    "e5m2": ElementFormat(5, 2, 15, 57344.0, "inf"),  # IEEE-like: top exponent code holds Inf / NaN
    "e4m3": ElementFormat(4, 3, 7, 448.0, "nan"),  # E4M3FN: only S.1111.111 is NaN, so 480 is lost
    "e3m2": ElementFormat(3, 2, 3, 28.0, "saturate"),
    "e2m3": ElementFormat(2, 3, 1, 7.5, "saturate"),
    "e2m1": ElementFormat(2, 1, 1, 6.0, "saturate"),
}


def round_element(
    x: torch.Tensor, element: ElementFormat, rounding: str, saturate: bool, generator: torch.Generator | None
) -> torch.Tensor:
    """The element value of each x by ``rounding``; overflow by ``saturate`` and the type's own rule."""
    grid = element.grid
    if saturate or element.overflow == "saturate":
        return grid.round(x, rounding, generator)
    unbounded = grid.round(x, rounding, generator, max_value=math.inf)
    past_positive, past_negative = _OVERFLOW_PAST_MAX.get(rounding, (True, True))
    goes_past = torch.where(x > 0, past_positive, past_negative)
    special = torch.full_like(x, math.inf).copysign(x) if element.overflow == "inf" else torch.full_like(x, math.nan)
    overflow = unbounded.abs() > element.max_value
    result = torch.where(overflow, torch.where(goes_past, special, element.max_value * x.sign()), unbounded)
    # An infinite input is not a large finite number: it is Inf (e5m2) or NaN (e4m3) in every mode.
    return torch.where(torch.isinf(x), special, result)


def covering_scale(amax: torch.Tensor, element_max: float, scale_dtype: str) -> torch.Tensor:
    """Per block: the smallest ``scale_dtype`` value s with element_max * s >= amax (in amax's precision).

    Clamped to [smallest normal, largest finite] of scale_dtype (then it may not cover a huge amax).
    """
    target = _TORCH_SCALE_DTYPES[scale_dtype]
    scale = safe_scale(round_scale(amax / element_max, scale_dtype))  # within one step of the answer
    larger = _next_scale(scale, target, math.inf)
    scale = torch.where((scale * element_max < amax) & torch.isfinite(larger), larger, scale)
    smaller = _next_scale(scale, target, 0.0)
    usable = smaller >= max(torch.finfo(target).tiny, torch.finfo(scale.dtype).tiny)
    return torch.where((smaller * element_max >= amax) & usable, smaller, scale)


def _next_scale(scale: torch.Tensor, target: torch.dtype, toward: float) -> torch.Tensor:
    """The neighbouring value of ``target`` precision next to ``scale`` in the direction of ``toward``."""
    stored = scale.to(target)
    return torch.nextafter(stored, torch.full_like(stored, toward)).to(scale.dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _OcpFloat(FormatSpec):
    """An OCP element type as a format: a plain cast, per-channel / per-block scaled, or with given scales."""

    element: ClassVar[ElementFormat]

    saturate: bool = True
    axis: int | None = None
    block_size: tuple[int, ...] | None = None
    skip_first_dim: bool = False
    scale_dtype: str = "f32"
    scale: float | tuple[float, ...] | None = None
    scale_rule: str = "covering"

    def validate(self) -> None:
        check_bool(self, "saturate")
        check_choice(self, "scale_rule", SCALE_RULES)
        check_bool(self, "skip_first_dim")
        check_axis(self)
        check_block_size(self)
        check_choice(self, "scale_dtype", SCALE_DTYPES)
        if self.axis is not None and self.block_size is not None and len(self.block_size) > 1:
            raise FormatError(
                f"{self.format_name}: axis={self.axis!r} with block_size={list(self.block_size)} is ambiguous; "
                "give axis with a one-entry block_size (blocks along axis), or an ND block_size alone"
            )
        scales = check_given_scales(self, "scale", self.scale_dtype)
        if scales is not None and self.block_size is not None:
            raise FormatError(
                f"{self.format_name}: give scale= (per tensor or per axis) or block_size= (scales from each "
                "block's data), not both"
            )
        if self.scale_rule != "covering" and (scales is not None or (self.axis is None and self.block_size is None)):
            raise FormatError(
                f"{self.format_name}: scale_rule={self.scale_rule!r} needs scales derived from the data (block_size= "
                "or axis=); a plain cast or a given scale= has no scale to derive"
            )
        # The given scales as stored (rounded to scale_dtype once, here): every path multiplies by these.
        stored = None if scales is None else round_scale(torch.tensor(scales, dtype=torch.float64), self.scale_dtype)
        object.__setattr__(self, "stored_scale", None if stored is None else tuple(stored.tolist()))

    # ---- description --------------------------------------------------------------------------------
    @property
    def is_scaled(self) -> bool:
        return self.axis is not None or self.block_size is not None or self.scale is not None

    @property
    def bits(self) -> int:
        return self.element.bits

    @property
    def max_value(self) -> float:
        """Largest element magnitude (before any scale)."""
        return self.element.max_value

    @property
    def min_normal(self) -> float:
        return self.element.grid.min_normal

    @property
    def min_subnormal(self) -> float:
        return self.element.grid.min_subnormal

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Element bits plus each block's scale bits spread over the block's elements (given scales are
        parameters of the format, as for ``affine``: element bits only)."""
        if not self.is_scaled or self.scale is not None:
            return float(self.bits)
        scale_bits = SCALE_DTYPE_BITS[self.scale_dtype]
        return scaled_bits_per_element(self.bits, scale_bits, shape, self.block_size, self.axis, self.skip_first_dim)

    def value_set(self) -> torch.Tensor | None:
        """Every finite value (float64, sorted, one zero): the elements, times the scale when one scale is
        given; None when the scales depend on the data or differ per channel."""
        if not self.is_scaled:
            return self.element.grid.values()
        if self.scale is None or len(self.scale) != 1:
            return None
        return self.element.grid.values() * self.stored_scale[0]

    # ---- quantization -------------------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if not self.is_scaled:
            return round_element(x, self.element, self.rounding, self.saturate, generator)
        if self.scale is not None:
            return self._round_scaled(x, self.given_scale(x), generator)
        block = block_shape(x.shape, self.block_size, self.axis, self.skip_first_dim)
        return apply_blockwise(x, block, lambda blocked, dims: self._quantize_block(blocked, dims, generator))

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        """Unscaled casts, given scales (per tensor, or per index of the first dimension) and f32 block scales
        over contiguous runs (per-row blocks, per-channel on the first dimension) or per column (per channel
        on the last dimension, nearest modes) run natively."""
        element = self.element
        grid = (element.mantissa_bits, 1 - element.exponent_bias, element.max_value, element.overflow,
                self.saturate, self.rounding)  # fmt: skip
        if not self.is_scaled:
            return native_block.ocp_element(x, *grid)
        if x.dim() == 0:
            return None
        if self.scale is not None:
            return self._native_given(x, grid)
        if self.scale_dtype != "f32" or self.scale_rule != "covering":
            return None
        runs = runs_of(x.shape, self.block_size, self.axis, self.skip_first_dim)
        if runs is not None:
            return native_block.ocp_scaled(x, runs, None, 1, *grid)
        if self.block_size is None and self.axis is not None and x.dim() >= 2 and self.axis % x.dim() == x.dim() - 1:
            per_column = (*[n for n in x.shape[:-1]], 1)  # a channel per index of the last dimension: a column
            if tuple(block_shape(x.shape, None, self.axis, self.skip_first_dim)) == per_column:
                return native_block.ocp_columns(x, *grid)
        return None

    native_takes_halves = True

    def _native_given(self, x: torch.Tensor, grid: tuple) -> torch.Tensor | None:
        scales = self.stored_scale
        if self.axis is not None and not -x.dim() <= self.axis < x.dim():
            return None  # the eager path names the axis
        if len(scales) == 1:
            length = min(x.numel(), native_block.GIVEN_CHUNK)
            runs, per_scale = (1, x.numel(), length), x.numel()
        elif self.axis is not None and self.axis % x.dim() == 0 and len(scales) == x.shape[0]:
            inner = x.numel() // x.shape[0]
            length = min(inner, native_block.GIVEN_CHUNK)
            runs, per_scale = (x.shape[0], inner, length), -(-inner // length)
        else:
            return None  # other axes, and wrong lengths (the eager path names them)
        given = torch.tensor(scales, dtype=torch.float32)
        return native_block.ocp_scaled(x, runs, given, per_scale, *grid)

    def _quantize_block(self, blocked: torch.Tensor, dims: tuple[int, ...], generator) -> torch.Tensor:
        out = self._round_scaled(blocked, self._block_scale(blocked, dims), generator)
        # A scale rounded up to scale_dtype can put max_element * s just past the float range: finite data
        # saturates there instead of becoming inf (derived scales never overflow an element otherwise).
        limit = torch.finfo(out.dtype).max
        return torch.where(torch.isinf(out) & torch.isfinite(blocked), out.clamp(-limit, limit), out)

    def _round_scaled(self, x: torch.Tensor, scale: torch.Tensor, generator) -> torch.Tensor:
        """s * element(x / s). Under a directed mode a value already on the grid stays: s * e is rounded to
        x's precision, so x / s can come back an ulp below e and "down" would move it a whole element."""
        out = round_element(x / scale, self.element, self.rounding, self.saturate, generator) * scale
        if self.rounding not in ("up", "down", "toward_zero", "away_from_zero"):
            return out
        nearest = round_element(x / scale, self.element, "nearest_even", True, None) * scale
        return torch.where(nearest == x, nearest, out)

    def _block_scale(self, blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
        element_max = self.element.max_value
        amax = finite_abs_max(blocked, dims)
        if self.scale_rule == "amax":
            return safe_scale(round_scale(amax / element_max, self.scale_dtype))
        scale = covering_scale(amax, element_max, self.scale_dtype)
        if self.rounding not in ("toward_zero", "down", "up"):
            return scale
        return self._inward_scale(blocked, dims, amax, scale)

    def _inward_scale(self, blocked, dims, amax: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """Directed modes that round the block's extreme toward zero (toward_zero; down for a positive
        extreme, up for a negative one): the next smaller scale, unless the covering one is exact.

        With the covering scale the extreme lies just below max_element * s and rounds down to the element
        below max, and the next pass derives a smaller scale (the grid moves every pass). One scale step
        smaller, the extreme lies at or past max_element and rounds (toward zero) onto it: the output's
        maximum is max_element * s and re-derives this scale. Not taken where the other sign's extreme would
        then overflow away from zero (down / up), nor below the scale dtype's smallest normal.
        """
        element_max = self.element.max_value
        low, high = finite_min_max(blocked, dims)
        smaller = _next_scale(scale, _TORCH_SCALE_DTYPES[self.scale_dtype], 0.0)
        usable = (smaller >= torch.finfo(_TORCH_SCALE_DTYPES[self.scale_dtype]).tiny) & (scale * element_max != amax)
        if self.rounding == "toward_zero":
            inward = torch.ones_like(usable)
        else:
            positive = high >= -low  # the extreme is positive
            rounded_inward = positive if self.rounding == "down" else ~positive
            other = torch.where(positive, -low, high)  # the other sign's largest magnitude
            inward = rounded_inward & (other <= smaller * element_max)
        return torch.where(usable & inward, smaller, scale)

    def given_scale(self, x: torch.Tensor) -> torch.Tensor:
        """The given ``scale`` rounded to ``scale_dtype`` (``stored_scale``), in x's dtype (float32 / float64
        hold it exactly), shaped to broadcast over ``x``."""
        return given_per_axis(self.stored_scale, x, self.axis, f"{self.format_name}: scale")

    def scales(self, x: torch.Tensor) -> torch.Tensor:
        """The scale of every block of ``x`` (one entry per block, float32 / float64); ones when unscaled."""
        work = x.detach() if x.dtype in (torch.float32, torch.float64) else x.detach().float()
        if not self.is_scaled or work.numel() == 0:
            return torch.ones((1,) * work.dim(), dtype=work.dtype, device=work.device)
        if self.scale is not None:  # per tensor ([1, 1, ...]) or per channel ([1, C, 1, ...])
            block = block_shape(work.shape, None, self.axis)
            return self.given_scale(work).expand([-(-d // b) for d, b in zip(work.shape, block, strict=True)]).clone()
        block = block_shape(work.shape, self.block_size, self.axis, self.skip_first_dim)
        return block_statistics(work, block, self._block_scale)


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class E5M2(_OcpFloat):
    """OCP FP8 E5M2 (IEEE-like, bias 15): +-0, subnormals k * 2^-16 (k = 1..3), normals 2^e * (1 + f/4)
    for e in [-14, 15]; 247 finite values. max 57344, min normal 2^-14, min subnormal 2^-16. Codes
    S.11111.00 are +-Inf and S.11111.xx (xx != 0) NaN. Saturates by default; ``saturate=False``: overflow
    -> +-Inf and +-Inf stays. Zero: S.00000.00 (sign kept)."""

    format_name = "e5m2"
    aliases = ("float8_e5m2",)
    element = ELEMENT_FORMATS["e5m2"]


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class E4M3(_OcpFloat):
    """OCP FP8 E4M3 (torch float8_e4m3fn, bias 7): +-0, subnormals k * 2^-9 (k = 1..7), normals
    2^e * (1 + f/8) for e in [-6, 8] except 480 (S.1111.111 is NaN); 253 finite values. max 448, min normal
    2^-6, min subnormal 2^-9. No Inf. Saturates by default; ``saturate=False``: overflow and +-Inf -> NaN.
    Zero: S.0000.000 (sign kept)."""

    format_name = "e4m3"
    aliases = ("float8_e4m3fn",)
    element = ELEMENT_FORMATS["e4m3"]


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class E3M2(_OcpFloat):
    """OCP FP6 E3M2 (bias 3, no Inf / NaN codes): +-0, subnormals k * 2^-4 (k = 1..3), normals
    2^e * (1 + f/4) for e in [-2, 4]; 63 values. max 28, min normal 0.25, min subnormal 0.0625. Always
    saturates (the type has no Inf). Zero: S.000.00."""

    format_name = "e3m2"
    aliases = ("float6_e3m2fn",)
    element = ELEMENT_FORMATS["e3m2"]


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class E2M3(_OcpFloat):
    """OCP FP6 E2M3 (bias 1, no Inf / NaN codes): +-0, subnormals k / 8 (k = 1..7), normals
    2^e * (1 + f/8) for e in [0, 2]; 63 values. max 7.5, min normal 1, min subnormal 0.125. Always
    saturates. Zero: S.00.000."""

    format_name = "e2m3"
    aliases = ("float6_e2m3fn",)
    element = ELEMENT_FORMATS["e2m3"]


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class E2M1(_OcpFloat):
    """OCP FP4 E2M1 (bias 1, no Inf / NaN codes): values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; 15 values. max 6,
    min normal 1, min subnormal 0.5. Always saturates. Zero: S.00.0."""

    format_name = "e2m1"
    aliases = ("float4_e2m1fn",)
    element = ELEMENT_FORMATS["e2m1"]
