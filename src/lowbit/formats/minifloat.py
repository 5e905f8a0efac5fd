"""Minifloats: ``minifloat_ieee`` (implicit leading one) and ``minifloat_denorm`` (MASE's no-implicit-bit float).

Both take MASE's parameters: ``width`` W, ``exponent_width`` E and ``exponent_bias`` B (None -> 2^(E-1) - 1);
the mantissa has M = W - E - 1 bits. Neither reserves codes for Inf or NaN: the top exponent code holds
ordinary numbers, out-of-range values and +-Inf saturate to +-max, NaN stays NaN, zero is the all-zero
magnitude (both +0 and -0 exist; a negative value that rounds to zero keeps its sign).

Both value sets are binary floating-point grids (see :class:`FloatGrid`), so both round through the one exact
routine ``_float_grid.round_to_float_grid`` and support every rounding mode. ``minifloat_denorm`` looks like a
different kind of format but is not: its value set {2^e * m / 2^M} is a union of uniform grids that collapses
into an ordinary grid with one fraction bit fewer (worked out in :class:`MinifloatDenorm`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import torch

from lowbit.formats._base import FormatSpec, _fail, check_int, check_optional, set_field
from lowbit.formats._float_grid import (
    float_grid_max,
    float_grid_values,
    round_to_float_grid,
)
from lowbit.formats._registry import register
from lowbit.native import kernels

# float32 holds every grid whose smallest step and largest value stay inside its range; wider grids are
# rounded in float64 (whose own limits bound the legal exponent_bias).
_FLOAT32_MIN_EXPONENT, _FLOAT32_MAX_EXPONENT = -149, 127
_FLOAT64_MIN_EXPONENT, _FLOAT64_MAX_EXPONENT = -1074, 1023
# value_set() enumerates at most this many bits of codes (65535 values); wider formats return None.
_MAX_ENUMERATED_WIDTH = 16


class FloatGrid(NamedTuple):
    """A binary float grid: normals 2^e * (1 + f / 2^M) for e >= min_exponent, subnormals below, up to max."""

    mantissa_bits: int  # fraction bits M of a normal value
    min_exponent: int  # exponent of the smallest normal binade
    max_value: float  # largest finite magnitude

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.min_exponent)

    @property
    def min_subnormal(self) -> float:
        """The smallest positive value (the smallest normal when M = 0: there are no subnormals then)."""
        return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)

    @property
    def exponent_span(self) -> tuple[int, int]:
        """(exponent of the smallest step, exponent of the largest binade)."""
        return self.min_exponent - self.mantissa_bits, math.frexp(self.max_value)[1] - 1

    @property
    def needs_float64(self) -> bool:
        low, high = self.exponent_span
        return low < _FLOAT32_MIN_EXPONENT or high > _FLOAT32_MAX_EXPONENT

    def values(self) -> torch.Tensor:
        """Every value, both signs, sorted ascending (float64); one zero."""
        return float_grid_values(self.mantissa_bits, self.min_exponent, self.max_value)

    def round(
        self,
        x: torch.Tensor,
        rounding: str,
        generator: torch.Generator | None = None,
        max_value: float | None = None,
    ) -> torch.Tensor:
        """Round onto the grid, saturating at +-max_value (default: the grid's own max; inf: no clamp)."""
        limit = self.max_value if max_value is None else max_value
        return round_to_float_grid(x, self.mantissa_bits, self.min_exponent, limit, rounding, generator)

    def round_native(self, x: torch.Tensor, rounding: str, max_value: float | None = None) -> torch.Tensor | None:
        """``round`` by the native kernel (float32 x), or None where it does not apply."""
        limit = self.max_value if max_value is None else max_value
        return kernels.float_grid(x, self.mantissa_bits, self.min_exponent, limit, rounding, saturate=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Minifloat(FormatSpec):
    """Shared parameters, validation and quantization of the two MASE minifloats."""

    # The smallest mantissa width M = W - E - 1 that gives a useful format.
    min_mantissa_bits: ClassVar[int] = 0

    width: int = 8
    exponent_width: int = 4
    exponent_bias: int | None = None

    def validate(self) -> None:
        check_int(self, "width", 2, 32)
        check_int(self, "exponent_width", 1, 11)
        low_width = self.exponent_width + 1 + self.min_mantissa_bits
        if self.width < low_width:
            raise _fail(
                self, "width", self.width,
                f"must be at least exponent_width + {1 + self.min_mantissa_bits} = {low_width} "
                f"(sign, {self.exponent_width} exponent bits and at least {self.min_mantissa_bits} mantissa bits)",
            )  # fmt: skip
        if check_optional(self, "exponent_bias") is None:
            set_field(self, "exponent_bias", 2 ** (self.exponent_width - 1) - 1)
        check_int(self, "exponent_bias", -4096, 4096)
        self._check_bias_range()

    def _check_bias_range(self) -> None:
        """The grid must fit in float64: name exponent_bias and its legal range if it does not."""
        low, high = self._exponent_span(self.exponent_bias)
        bias_high = self.exponent_bias + (low - _FLOAT64_MIN_EXPONENT)  # raising B lowers every exponent
        bias_low = self.exponent_bias - (_FLOAT64_MAX_EXPONENT - high)
        if not bias_low <= self.exponent_bias <= bias_high:
            raise _fail(
                self, "exponent_bias", self.exponent_bias,
                f"must be an integer in [{bias_low}, {bias_high}] for width={self.width}, "
                f"exponent_width={self.exponent_width} (the values must fit in float64)",
            )  # fmt: skip

    def _exponent_span(self, bias: int) -> tuple[int, int]:
        raise NotImplementedError

    # ---- description --------------------------------------------------------------------------------
    @property
    def mantissa_bits(self) -> int:
        return self.width - self.exponent_width - 1

    @property
    def grid(self) -> FloatGrid:
        raise NotImplementedError

    @property
    def bits(self) -> int:
        return self.width

    @property
    def max_value(self) -> float:
        return self.grid.max_value

    @property
    def min_normal(self) -> float:
        return self.grid.min_normal

    @property
    def min_subnormal(self) -> float:
        return self.grid.min_subnormal

    def value_set(self) -> torch.Tensor | None:
        """Sorted values (float64) for widths up to 16 bits; None for wider formats (too many to list)."""
        return self.grid.values() if self.width <= _MAX_ENUMERATED_WIDTH else None

    # ---- quantization -------------------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        grid = self.grid
        if grid.needs_float64:
            x = x.double()  # steps below 2^-149 (or values above 2^127) do not exist in float32
        return grid.round(x, self.rounding, generator)

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        grid = self.grid
        return None if grid.needs_float64 else grid.round_native(x, self.rounding)

    native_takes_halves = True


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class MinifloatIEEE(_Minifloat):
    """IEEE-style minifloat without Inf / NaN codes: ``width`` W, ``exponent_width`` E, ``exponent_bias`` B.

    Value set: +-0, subnormals k * 2^(1-B-M) for 0 < k < 2^M (biased exponent 0 means 0.f * 2^(1-B)), and
    normals 2^e * (1 + f / 2^M) for e in [1-B, 2^E-1-B], f in [0, 2^M-1]; 2^W - 1 distinct values.
    max = 2^(2^E-1-B) * (2 - 2^-M); min normal = 2^(1-B); min subnormal = 2^(1-B-M) (M = 0: no subnormals).
    E4M3 with B = 7: max 480, min normal 2^-6, min subnormal 2^-9.

    Rounding: nearest value by ``rounding`` (default ties to even mantissa); a mantissa that rounds up past
    its binade carries into the exponent (E4M3: 1.95 -> 2.0). With M = 0 a tie between two powers of two goes
    to the larger one. Out-of-range values and +-Inf saturate to +-max; NaN stays NaN; zero is the all-zero
    magnitude, with its sign kept.
    """

    format_name = "minifloat_ieee"

    def _exponent_span(self, bias: int) -> tuple[int, int]:
        return 1 - bias - self.mantissa_bits, 2**self.exponent_width - 1 - bias

    @property
    def grid(self) -> FloatGrid:
        m, b = self.mantissa_bits, self.exponent_bias
        return FloatGrid(m, 1 - b, float_grid_max(self.exponent_width, m, b, reserved_top=False))


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class MinifloatDenorm(_Minifloat):
    """MASE's minifloat without an implicit leading one: every value is 2^e * m / 2^M.

    Parameters as ``minifloat_ieee`` (W, E, B, M = W - E - 1 >= 1). Value set: {2^e * m / 2^M : e in
    [-B, 2^E-1-B], m in [0, 2^M-1]}. The exponents' grids overlap: the grid of e + 1 holds every other point
    of the grid of e and extends it up to twice as far, so the finest grid covering a value is the one that
    counts. What remains is uniform with step 2^(-B-M) on [0, 2^-B], then each binade [2^(e-1), 2^e) holds
    2^(M-1) values with step 2^(e-M): a binary float grid with M - 1 fraction bits, smallest normal binade
    2^(-B-1), and max = 2^(2^E-1-B) * (1 - 2^-M). Count: 2^E * 2^(M-1) + 2^(M-1) - 1 positive values.
    W=8, E=4, B=7: max 224, smallest normal binade 2^-8, min subnormal 2^-10, 135 distinct values.

    Rounding: the nearest value of that set by ``rounding`` (ties: the neighbour whose multiple of the local
    step is even, which is MASE's half-to-even mantissa inside a binade); powers of two are exact (MASE loses
    an ulp: 1.0 -> 0.875). Out-of-range values and +-Inf saturate to +-max; NaN stays NaN; zero is m = 0.
    """

    format_name = "minifloat_denorm"
    min_mantissa_bits = 1  # with M = 0 every code would be zero

    def _exponent_span(self, bias: int) -> tuple[int, int]:
        # smallest step 2^(-B-M); the largest value lies in the binade [2^(e_max-1), 2^e_max)
        return -bias - self.mantissa_bits, 2**self.exponent_width - 2 - bias

    @property
    def grid(self) -> FloatGrid:
        m, b = self.mantissa_bits, self.exponent_bias
        top_exponent = 2**self.exponent_width - 1 - b
        max_value = math.ldexp(1.0 - math.ldexp(1.0, -m), top_exponent)
        return FloatGrid(m - 1, -b - 1, max_value)
