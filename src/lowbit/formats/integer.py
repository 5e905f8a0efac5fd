"""Integer and fixed-point formats.

``integer`` / ``fixed`` (MASE): y = clamp(round(x * 2^f), q_min, q_max) / 2^f with width w and frac_width f;
signed codes [-2^(w-1), 2^(w-1) - 1], unsigned [0, 2^w - 1]. Any f works, negative or larger than w.
The affine (scale + zero point) family is in ``formats/affine.py``. See docs/formats/integer.md.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from lowbit.formats._base import FormatSpec, check_bool, check_int, check_optional
from lowbit.formats._registry import register
from lowbit.formats.rounding import round_to_integer
from lowbit.native import integer as native_integer


def code_range(bits: int, signed: bool, narrow_range: bool = False) -> tuple[int, int]:
    """(q_min, q_max) of a ``bits``-wide integer code; narrow_range drops the most negative code."""
    if signed:
        return -(2 ** (bits - 1)) + int(narrow_range), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Integer(FormatSpec):
    """Fixed point: ``width`` bits, ``frac_width`` of them after the binary point (default width // 2).

    Values: k / 2^f for every code k in [-2^(w-1), 2^(w-1) - 1] (signed) or [0, 2^w - 1] (unsigned), so
    max = (2^(w-1) - 1) / 2^f (signed) or (2^w - 1) / 2^f, min = -2^(w-1) / 2^f (signed) or 0, and the
    smallest nonzero magnitude is 2^-f; an evenly spaced grid, no subnormals. Any f works, negative
    (steps larger than 1) or larger than w (all values below 1). Out-of-range values and +-inf saturate
    to the extreme codes; NaN stays NaN; zero is the code 0 (a negative input that rounds to zero gives
    -0.0). Exact for float64 input; float32 holds every code exactly only up to w = 24.
    """

    format_name = "integer"

    width: int = 8
    frac_width: int | None = None
    signed: bool = True

    def validate(self) -> None:
        check_int(self, "width", 1, 32)
        if check_optional(self, "frac_width") is None:
            object.__setattr__(self, "frac_width", self.width // 2)
        check_int(self, "frac_width", -64, 64)
        check_bool(self, "signed")

    @property
    def bits(self) -> int:
        return self.width

    @property
    def code_range(self) -> tuple[int, int]:
        return code_range(self.width, self.signed)

    @property
    def step(self) -> float:
        return math.ldexp(1.0, -self.frac_width)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        q_min, q_max = self.code_range
        scaled = x * math.ldexp(1.0, self.frac_width)  # a power of two: exact unless it underflows
        if self.frac_width < 0 and not self.rounding.startswith("nearest"):
            # Underflow can flush a tiny nonzero x to zero; keep it nonzero (any value in (0, 1) rounds alike)
            # so that up / down / away_from_zero / stochastic still see which side of zero it is on (every
            # nearest mode sends it to 0 either way, so they skip this pass).
            tiny = torch.sign(x) * torch.finfo(x.dtype).tiny
            scaled = torch.where((scaled == 0) & (x != 0), tiny, scaled)
        codes = round_to_integer(scaled, self.rounding, generator).clamp(q_min, q_max)
        return codes * self.step

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        return native_integer.fixed_point(x, self)

    native_takes_halves = True

    def value_set(self) -> torch.Tensor:
        q_min, q_max = self.code_range
        return torch.arange(q_min, q_max + 1, dtype=torch.float64) * self.step


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Fixed(Integer):
    """MASE's ``fixed``: the same format as ``integer``."""

    format_name = "fixed"
