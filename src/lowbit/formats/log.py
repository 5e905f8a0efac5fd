"""Logarithmic (power-of-two) format: sign and exponent code, no mantissa.

``log`` with width W has one sign bit and an Eb = W - 1 bit exponent code c in [0, 2^Eb - 1]. The code 0 is
reserved for zero; a code c >= 1 means 2^(c - B), with bias B (default 2^(Eb-1) - 1). So

    value set = {0} U {+-2^e : e_min <= e <= e_max},   e_min = 1 - B,   e_max = 2^Eb - 1 - B,

2^W - 1 distinct values (the sign bit with code 0 gives -0, which equals 0).

Rounding is in the linear domain by default: the nearest value, so the decision point between 2^k and
2^(k+1) is 1.5 * 2^k and between 0 and 2^e_min it is 2^(e_min - 1). Ties go by the rounding mode;
``nearest_even`` picks the even exponent code (zero's code 0 is even), as IEEE 754 picks the even
significand. ``log_domain=True`` rounds log2|x| instead (MASE's rule): the decision point between 2^k and
2^(k+1) becomes 2^(k + 1/2), which no binary float equals, so no ties occur there; zero has no logarithm,
so the interval [0, 2^e_min] keeps the linear rule. Directed and stochastic rounding do not depend on the
domain (stochastic picks the upper neighbour with probability (|x| - lo) / (hi - lo): unbiased).

Special values: NaN stays NaN; +-inf and values beyond 2^e_max saturate to +-2^e_max; a result keeps the
sign of its input (small negatives become -2^k or -0, never positive). When the compute dtype cannot hold
2^e_max (float32 and e_max > 127), saturation is at the largest power of two that dtype holds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction

import torch

from lowbit.formats._base import (
    FormatSpec,
    check_bool,
    check_int,
    check_optional,
    set_field,
)
from lowbit.formats._float_grid import exact_pow2, floor_log2
from lowbit.formats._registry import register
from lowbit.formats.rounding import round_to_integer
from lowbit.native import sign_log

# Exponents must stay inside float64 (subnormals included) so that value_set() and float64 inputs are exact.
FLOAT64_MIN_EXPONENT = -1074
FLOAT64_MAX_EXPONENT = 1023
MAX_WIDTH = 11  # Eb = 10: 1023 exponent codes, the most whose default-bias range fits float64

# A sign-dependent mode rounds a magnitude like this: (mode for x >= 0, mode for x < 0).
_MAGNITUDE_MODES = {
    "up": ("up", "down"),
    "down": ("down", "up"),
    "nearest_up": ("nearest_up", "nearest_down"),
    "nearest_down": ("nearest_down", "nearest_up"),
}


def default_exponent_bias(exponent_width: int) -> int:
    return 2 ** (exponent_width - 1) - 1


@functools.cache
def _largest_float_below_sqrt2(dtype: torch.dtype) -> float:
    """The largest ``dtype`` value below sqrt(2): r > it exactly when r > sqrt(2) (sqrt(2) is irrational)."""
    candidate = torch.tensor(math.sqrt(2.0), dtype=dtype)
    if Fraction(candidate.item()) ** 2 > 2:
        candidate = torch.nextafter(candidate, torch.zeros_like(candidate))
    return candidate.item()


def _round_magnitude(position: torch.Tensor, negative: torch.Tensor, rounding: str, generator) -> torch.Tensor:
    """Round nonnegative positions to integers as ``rounding`` rounds the signed values they came from."""
    if rounding not in _MAGNITUDE_MODES:  # the mode treats both signs alike
        return round_to_integer(position, rounding, generator)
    positive_mode, negative_mode = _MAGNITUDE_MODES[rounding]
    return torch.where(
        negative,
        round_to_integer(position, negative_mode, generator),
        round_to_integer(position, positive_mode, generator),
    )


def _fraction_below_smallest(mantissa, exponent, min_exponent, magnitude) -> torch.Tensor:
    """|x| / 2^e_min in [0, 1) for magnitudes under the smallest power; never 0 for a nonzero magnitude."""
    exponent_shift = torch.clamp(exponent - min_exponent, max=0)  # only lanes below 2^e_min are used
    fraction = mantissa * exact_pow2(exponent_shift, mantissa.dtype)
    # A fraction that underflows would turn "up" / stochastic rounding of a tiny nonzero value into zero.
    tiny = torch.finfo(magnitude.dtype).tiny
    return torch.where(magnitude > 0, fraction.clamp(min=tiny), fraction)


def round_to_power_of_two(
    x: torch.Tensor,
    min_exponent: int | torch.Tensor,
    max_exponent: int | torch.Tensor,
    rounding: str = "nearest_even",
    generator: torch.Generator | None = None,
    log_domain: bool = False,
) -> torch.Tensor:
    """The value of {0} U {+-2^e : min_exponent <= e <= max_exponent} that ``rounding`` picks for each x.

    Exponents may be tensors broadcasting against x (a bias per block). Values are indexed by a code:
    0 for zero, e - min_exponent + 1 for 2^e. Each magnitude is placed between the codes of its
    neighbours, position = lower code + (|x| - lo) / (hi - lo), which the shared integer rounding rounds;
    only the parity of the lower code is kept in the position so that it stays exact.
    """
    magnitude = x.abs()
    magnitude = torch.where(torch.isfinite(magnitude), magnitude, torch.zeros_like(magnitude))
    # magnitude = mantissa * 2^exponent with mantissa in [0.5, 1), from the exponent bits (frexp does not
    # vectorise in compiled kernels); zero gets mantissa 0 and exponent 0, as frexp gives.
    nonzero = magnitude > 0
    exponent = torch.where(nonzero, floor_log2(magnitude) + 1, 0)
    # Divide by 2^(exponent - 1), which the dtype always holds (2^exponent may overflow), then halve.
    mantissa = torch.where(nonzero, magnitude / exact_pow2(exponent - 1, magnitude.dtype) * 0.5, 0.0)
    min_exponent = torch.as_tensor(min_exponent, dtype=exponent.dtype, device=x.device)
    max_exponent = torch.as_tensor(max_exponent, dtype=exponent.dtype, device=x.device)
    below = (exponent <= min_exponent) | (magnitude == 0)  # |x| < 2^e_min: between zero and the smallest power
    lower_code = torch.where(below, 0, exponent - min_exponent)  # lo = 2^(exponent - 1)
    fraction = 2 * mantissa - 1  # (|x| - lo) / lo, exact
    if log_domain and rounding.startswith("nearest"):
        fraction = (2 * mantissa > _largest_float_below_sqrt2(x.dtype)).to(x.dtype)  # past 2^(k+1/2) or not
    fraction = torch.where(below, _fraction_below_smallest(mantissa, exponent, min_exponent, magnitude), fraction)
    parity = (lower_code % 2).to(x.dtype)
    step = _round_magnitude(parity + fraction, x < 0, rounding, generator) - parity  # 0 or 1
    # Saturate at e_max, or at the largest power of two the compute dtype holds if that is smaller.
    dtype_max_exponent = math.frexp(torch.finfo(x.dtype).max)[1] - 1  # 127 for float32, 1023 for float64
    top_code = torch.clamp(max_exponent, max=dtype_max_exponent) - min_exponent + 1
    code = torch.minimum(lower_code + step.to(lower_code.dtype), top_code)
    code = torch.where(torch.isinf(x), top_code, code)
    power = exact_pow2(min_exponent + code - 1, magnitude.dtype)
    value = torch.copysign(torch.where(code == 0, torch.zeros_like(power), power), x)
    return torch.where(torch.isnan(x), x, value)


_BIT_LAYOUT = {torch.float32: (torch.int32, 23, 127), torch.float64: (torch.int64, 52, 1023)}


def fast_nearest_applies(dtype: torch.dtype, min_exponent: int) -> bool:
    """``nearest_power_of_two`` needs a float32 / float64 input whose dtype holds 2^(e_min - 1) as a normal."""
    return dtype in _BIT_LAYOUT and min_exponent - 1 >= 1 - _BIT_LAYOUT[dtype][2]


def nearest_power_of_two(x: torch.Tensor, min_exponent: int, max_exponent: int) -> torch.Tensor:
    """``round_to_power_of_two(x, e_min, e_max, "nearest_even")`` in a few in-place passes over the bits.

    Rounding the float's significand to zero fraction bits, half to the even exponent field, is rounding to
    the nearest power of two (1.5 * 2^k is the midpoint, exactly); adding a constant to the parity picks
    the even exponent *code* instead. Below 2^e_min the neighbours are 0 and 2^e_min (midpoint 2^(e_min-1),
    whose tie goes to the even code 0), above 2^e_max everything saturates; the sign is copied back (-0 for
    small negatives) and NaN, whose bits the addition may carry out of, is restored last. Tested bit for
    bit against the general routine on every float32 bit-pattern class (tests/formats/test_fast_paths.py).
    """
    int_dtype, mantissa_bits, bias = _BIT_LAYOUT[x.dtype]
    dtype_max_exponent = math.frexp(torch.finfo(x.dtype).max)[1] - 1
    magnitude = x.abs()
    bits = magnitude.view(int_dtype)
    parity = (bits >> mantissa_bits).add_(min_exponent & 1).bitwise_and_(1)  # 1: a tie rounds up
    power = parity.add_(bits).add_((1 << (mantissa_bits - 1)) - 1).bitwise_and_((2 * bias + 1) << mantissa_bits)
    power = power.view(x.dtype).clamp_(math.ldexp(1.0, min_exponent), math.ldexp(1.0, min(max_exponent, dtype_max_exponent)))
    power.masked_fill_(magnitude <= math.ldexp(1.0, min_exponent - 1), 0.0).copysign_(x)
    return torch.where(torch.isnan(x), x, power)


def fast_nearest_applies_per_block(dtype: torch.dtype, min_exponent: torch.Tensor) -> bool:
    """``fast_nearest_applies`` for every block's ``min_exponent`` (eager: reads the small tensor)."""
    return dtype in _BIT_LAYOUT and bool((min_exponent - 1 >= 1 - _BIT_LAYOUT[dtype][2]).all())


def nearest_power_of_two_finite(x: torch.Tensor, min_exponent: torch.Tensor,
                                max_exponent: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``nearest_power_of_two`` for finite x (no NaN / inf) with per-block exponent tensors that broadcast
    against it (int), each block's 2^(min_exponent - 1) a normal number of x's dtype: the same bit steps,
    with the parity constant, the clamp bounds and the zero threshold per block, and the zeroing done by a
    multiplication with a 0 / 1 comparison written into the |x| buffer (masked_fill is slow on the CPU)."""
    int_dtype, mantissa_bits, bias = _BIT_LAYOUT[x.dtype]
    dtype_max_exponent = math.frexp(torch.finfo(x.dtype).max)[1] - 1
    magnitude = x.abs()
    bits = magnitude.view(int_dtype)
    parity = (bits >> mantissa_bits).add_((min_exponent & 1).to(int_dtype)).bitwise_and_(1)  # 1: a tie rounds up
    power = parity.add_(bits).add_((1 << (mantissa_bits - 1)) - 1).bitwise_and_((2 * bias + 1) << mantissa_bits)
    smallest = exact_pow2(min_exponent, x.dtype)
    largest = exact_pow2(torch.clamp(max_exponent, max=dtype_max_exponent), x.dtype)
    power = power.view(x.dtype).clamp_(smallest, largest)
    kept = torch.gt(magnitude, exact_pow2(min_exponent - 1, x.dtype), out=magnitude)  # 1.0 above the midpoint
    return power.mul_(kept).copysign_(x)


def power_of_two_values(min_exponent: int, max_exponent: int) -> torch.Tensor:
    """{0} U {+-2^e : min_exponent <= e <= max_exponent}, sorted ascending (float64)."""
    powers = [math.ldexp(1.0, e) for e in range(min_exponent, max_exponent + 1)]
    positives = torch.tensor(powers, dtype=torch.float64)
    return torch.cat([-positives.flip(0), torch.zeros(1, dtype=torch.float64), positives])


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Log(FormatSpec):
    """Sign + exponent-code power-of-two format (see the module docstring for the full contract).

    ``width`` W in [2, 11] (1 sign bit, Eb = W - 1 exponent bits); ``exponent_bias`` B (default
    2^(Eb-1) - 1) with every exponent inside float64: B in [2^Eb - 1024, 1075]. Values: 0 (exponent code 0)
    and +-2^e for e in [1 - B, 2^Eb - 1 - B]; 2^W - 1 distinct values; max 2^(2^Eb - 1 - B), smallest
    nonzero 2^(1 - B), no subnormals. NaN stays NaN; +-inf and out-of-range values saturate to +-max.
    ``log_domain=True`` moves the nearest-mode decision point between 2^k and 2^(k+1) from 1.5 * 2^k to
    2^(k + 1/2) (MASE's rounding).
    """

    format_name = "log"

    width: int = 8
    exponent_bias: int | None = None
    log_domain: bool = False

    def validate(self) -> None:
        check_int(self, "width", 2, MAX_WIDTH)
        if check_optional(self, "exponent_bias") is None:
            set_field(self, "exponent_bias", default_exponent_bias(self.exponent_width))
        top_code = 2**self.exponent_width - 1
        check_int(self, "exponent_bias", top_code - FLOAT64_MAX_EXPONENT, 1 - FLOAT64_MIN_EXPONENT)
        check_bool(self, "log_domain")

    @property
    def exponent_width(self) -> int:
        return self.width - 1

    @property
    def min_exponent(self) -> int:
        return 1 - self.exponent_bias

    @property
    def max_exponent(self) -> int:
        return 2**self.exponent_width - 1 - self.exponent_bias

    @property
    def max_value(self) -> float:
        return math.ldexp(1.0, self.max_exponent)

    @property
    def min_value(self) -> float:
        """The smallest positive value."""
        return math.ldexp(1.0, self.min_exponent)

    @property
    def bits(self) -> int:
        return self.width

    def value_set(self) -> torch.Tensor:
        return power_of_two_values(self.min_exponent, self.max_exponent)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if self.rounding == "nearest_even" and not self.log_domain and fast_nearest_applies(x.dtype, self.min_exponent):
            return nearest_power_of_two(x, self.min_exponent, self.max_exponent)
        return round_to_power_of_two(
            x, self.min_exponent, self.max_exponent, self.rounding, generator, self.log_domain
        )

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        below_sqrt2 = _largest_float_below_sqrt2(torch.float32)
        return sign_log.log(x, self.min_exponent, self.max_exponent, self.rounding, self.log_domain, below_sqrt2)

    native_takes_halves = True
