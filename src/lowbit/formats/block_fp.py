"""Block floating point (MSFP-like): sign-magnitude integer mantissas sharing one exponent per block.

With ``width`` W there are M = W - 1 magnitude bits and one sign bit per element. A block whose shared
exponent is e holds the values

    m * 2^(e - M + 1)      for every integer m in [-(2^M - 1), 2^M - 1]

so the block's largest magnitude is (2 - 2^(1 - M)) * 2^e: the shared exponent is the exponent of the
leading bit of the block maximum, exactly as an IEEE exponent is, and an element in the top binade keeps
M significant bits. Elements of a block form a uniform grid (no per-element exponent, no subnormals).

The shared exponent of a block is the *smallest* e for which no element of the block rounds past the
largest code: e = floor(log2(max|x|)), plus one when the block maximum would round up to 2^(e + 1) (for
stochastic rounding, when it *could*: the test rounds away from zero, so no draw ever overflows). It is
clamped to the E-bit range [-B, 2^E - 1 - B] (``exponent_width`` E, ``exponent_bias`` B), and also to the
largest exponent whose top value the input dtype can hold (127 for float32 / bfloat16 inputs). Where W - 1
exceeds the input dtype's significand p (W > 25 for float32), the largest code is 2^M - 2^(M - p), the
largest the dtype holds exactly: at e = 127 that is float32's largest finite value (never inf), and no
block maximum rounds up into the next binade in the output (which would change the exponent next pass).

Limits: largest value (2 - 2^(1 - M)) * 2^(2^E - 1 - B); smallest positive value 2^(-B - M + 1) (a block
whose maximum is below 2^-B uses e = -B). Zero is m = 0 (its sign follows the input, so -0.0 stays -0.0).
Out-of-range values saturate to +-(largest code) * step of their block; +-inf do not take part in choosing the
block exponent and saturate to their block's largest magnitude; NaN stays NaN and is ignored when choosing
the exponent. A block with no finite non-zero element uses e = -B (zeros stay zero), or the largest
exponent if it holds an inf, so that a lone inf saturates to the format's max as a scalar format's would.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import (
    FormatSpec,
    check_axis,
    check_block_size,
    check_bool,
    check_int,
    check_optional,
)
from lowbit.formats._float_grid import exact_pow2, floor_log2
from lowbit.formats._registry import register
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    can_branch_on_data,
    finite_extremes,
    finite_min_max,
    native_runs,
    scaled_bits_per_element,
)
from lowbit.formats.rounding import round_to_integer
from lowbit.native import block as native_block

# Blocks are computed in float64. exponent_bias <= 1000 keeps the smallest shared exponent (-B) and its
# step 2^(-B - M + 1) normal float64 numbers; the top is capped at the input dtype's largest exponent.
_EXPONENT_LIMIT = 1000


def dtype_max_exponent(dtype: torch.dtype) -> int:
    """Largest e such that 2^e * (2 - tiny) is still finite in ``dtype`` (127 for float32)."""
    # Python's frexp: every dtype's max is exact in a double, and no tensor is made on any device.
    _, exponent = math.frexp(torch.finfo(dtype).max)  # max = m * 2^exponent
    return exponent - 1


def shared_exponent(
    blocked: torch.Tensor,
    dims: tuple[int, ...],
    significand_bits: int,
    rounding: str,
    min_exponent: int,
    max_exponent: int,
) -> torch.Tensor:
    """Per block, the smallest exponent e in [min_exponent, max_exponent] at which nothing overflows.

    The block's top binade is [2^e, 2^(e+1)) on the grid k * 2^(e - significand_bits + 1) with
    |k| <= 2^significand_bits - 1 (block_fp: significand_bits = M; a minifloat's top binade: M + 1).
    NaN and +-inf do not count. A block with no finite non-zero element gets min_exponent, or
    max_exponent when it holds an inf (so a lone inf saturates to the format's max, as a scalar would).
    Returns an int64 tensor shaped [n0, 1, n1, 1, ...] (float64 ``blocked`` from apply_blockwise).
    """
    low, high = finite_min_max(blocked, dims)  # widened to include zero
    has_inf = torch.isinf(blocked).any(dim=dims, keepdim=True)
    return exponent_from_extremes(low, high, has_inf, significand_bits, rounding, min_exponent, max_exponent)


def exponent_from_extremes(low, high, has_inf, significand_bits: int, rounding: str, min_exponent: int,
                           max_exponent: int) -> torch.Tensor:  # fmt: skip
    """``shared_exponent`` from each block's finite (min, max) widened to zero (float64) and whether it holds
    an inf (a bool tensor, or False)."""
    magnitude = torch.maximum(high, -low)
    exponent = floor_log2(magnitude).to(torch.int64)  # the block max lies in [2^e, 2^(e+1))
    empty_exponent = torch.where(has_inf, max_exponent, min_exponent) if has_inf is not False else min_exponent
    exponent = torch.where(magnitude > 0, exponent, empty_exponent).to(torch.int64).clamp(min_exponent, max_exponent)
    # Stochastic rounding may round either way: test the worst case, so that no draw overflows.
    check_mode = "away_from_zero" if rounding == "stochastic" else rounding
    top_code = 2.0**significand_bits - 1
    factor = torch.ldexp(torch.ones_like(high), significand_bits - 1 - exponent)
    overflow = (round_to_integer(high * factor, check_mode) > top_code) | (
        round_to_integer(low * factor, check_mode) < -top_code
    )
    return (exponent + overflow.to(torch.int64)).clamp(max=max_exponent)


def nearest_even_exponent(low: torch.Tensor, high: torch.Tensor, significand_bits: int, min_exponent: int,
                          max_exponent: int) -> tuple[torch.Tensor, bool]:  # fmt: skip
    """``exponent_from_extremes`` for nearest_even rounding and finite blocks, from the bits: the exponent of
    the block maximum rounded (half to even) to significand_bits - 1 fraction bits, clamped (int64), and
    whether any block would need a larger exponent than max_exponent (then its largest elements saturate).

    Rounding |max| onto the top binade's grid carries into the next binade exactly when the block needs
    one more exponent; an integer add on the float64 bit pattern (every float32 value is a normal float64)
    does that rounding, carry included. Zero gives an exponent below every minimum.
    """
    magnitude = torch.maximum(high, -low).abs_().to(torch.float64)
    bits = magnitude.view(torch.int64)
    dropped = 53 - significand_bits  # fraction bits below the kept significand_bits - 1
    if significand_bits == 1:  # the codes are 0 and 1: a tie (1.5 * 2^e) goes to the even code 2, up
        rounded = bits.add_(1 << (dropped - 1))
    else:  # the last kept fraction bit is the code's parity: half to even
        rounded = bits.add_((bits >> dropped).bitwise_and_(1).add_((1 << (dropped - 1)) - 1))
    exponent = (rounded >> 52).sub_(1023)
    saturates = bool((exponent > max_exponent).any())
    return exponent.clamp_(min_exponent, max_exponent), saturates


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockFP(FormatSpec):
    """Block floating point: W-bit sign-magnitude elements sharing an E-bit exponent per block.

    Value set of a block with shared exponent e: m * 2^(e - W + 2) for integers |m| <= 2^(W-1) - 1.
    e = floor(log2 max|x|) of the block's finite elements, plus one if the maximum would round up to
    2^(e+1); clamped to [-exponent_bias, 2^exponent_width - 1 - exponent_bias]. Max value
    (2 - 2^(2 - W)) * 2^(2^E - 1 - B); smallest positive 2^(-B - W + 2); no subnormals (the grid is
    uniform within a block). NaN stays NaN; +-inf and out-of-range values saturate to the block's largest
    magnitude; +-inf and NaN never set the shared exponent (a block of only zeros and infs uses the largest
    exponent); zero is the mantissa 0; an all-zero block stays zero. ``block_size`` / ``axis`` /
    ``skip_first_dim`` follow lowbit.formats.blocking (default: runs of 16 along the last dimension).
    """

    upcast_before_kernel = True  # block reductions: see FormatSpec.upcast_before_kernel

    format_name = "block_fp"

    width: int = 12
    exponent_width: int = 8
    exponent_bias: int | None = None
    block_size: tuple[int, ...] | None = (16,)
    skip_first_dim: bool = False
    axis: int | None = None

    def validate(self) -> None:
        check_int(self, "width", 2, 32)
        check_int(self, "exponent_width", 1, 10)
        if check_optional(self, "exponent_bias") is None:
            object.__setattr__(self, "exponent_bias", 2 ** (self.exponent_width - 1) - 1)
        # Lower bound: the smallest exponent -B must stay <= 127 so float32 data can reach it.
        check_int(self, "exponent_bias", -127, _EXPONENT_LIMIT)
        check_block_size(self)
        check_bool(self, "skip_first_dim")
        if check_axis(self) is not None and self.block_size is not None and len(self.block_size) > 1:
            raise FormatError(
                f"{self.format_name}: axis={self.axis!r} needs a one-entry block_size (blocks along that axis), "
                f"got block_size={self.block_size!r}; give an ND block_size without axis instead"
            )

    # ---- description --------------------------------------------------------------------------------
    @property
    def mantissa_bits(self) -> int:
        """Magnitude bits per element (the sign bit is the remaining one)."""
        return self.width - 1

    @property
    def min_exponent(self) -> int:
        return -self.exponent_bias

    @property
    def max_exponent(self) -> int:
        return 2**self.exponent_width - 1 - self.exponent_bias

    @property
    def max_value(self) -> float:
        return (2.0 - 2.0 ** (1 - self.mantissa_bits)) * 2.0**self.max_exponent

    @property
    def bits(self) -> int:
        return self.width

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """W bits per element plus E shared-exponent bits per block."""
        return scaled_bits_per_element(
            self.width, self.exponent_width, shape, self.block_size, self.axis, self.skip_first_dim
        )

    def block_values(self, exponent: int) -> torch.Tensor:
        """Every value of a block whose shared exponent is ``exponent``, sorted ascending (float64)."""
        if not self.min_exponent <= exponent <= self.max_exponent:
            raise FormatError(
                f"{self.format_name}: exponent={exponent} is outside [{self.min_exponent}, {self.max_exponent}]"
            )
        if self.mantissa_bits > 20:
            raise FormatError(f"{self.format_name}: block_values enumerates at most 21-bit elements")
        top = 2**self.mantissa_bits - 1
        return torch.arange(-top, top + 1, dtype=torch.float64) * 2.0 ** (exponent - self.mantissa_bits + 1)

    # ---- quantization -------------------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        block = block_shape(x.shape, self.block_size, self.axis, self.skip_first_dim)
        max_exponent = min(self.max_exponent, dtype_max_exponent(x.dtype))

        top_code = self._top_code(x.dtype)
        if self._float32_applies(x):
            return apply_blockwise(x, block, lambda blocked, dims: self._float32_blocks(blocked, dims, max_exponent))

        def quantize_blocks(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
            return self._quantize_blocks(blocked, dims, max_exponent, top_code, generator)

        # float64 holds every float32 value, step and scale factor exactly (see _EXPONENT_LIMIT); the top
        # code fits x's dtype (_top_code), so the cast back neither rounds a block past its exponent nor,
        # at the largest exponent, past the dtype's largest finite value.
        return apply_blockwise(x.double(), block, quantize_blocks).to(x.dtype)

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        """Blocks that are contiguous runs (along the last dimension, per row, per tensor) run natively."""
        runs = native_runs(self, x)
        if runs is None:
            return None
        max_exponent, top_code, float32 = _native_constants(self, torch.float32)  # halves: float32 arithmetic too
        return native_block.block_fp(x, runs, self.mantissa_bits, self.min_exponent, max_exponent, top_code,
                                     float32 and can_branch_on_data(x), self.rounding)  # fmt: skip

    native_takes_halves = True

    def _top_code(self, dtype: torch.dtype) -> float:
        """The largest code: 2^M - 1, or where M exceeds ``dtype``'s significand (W > 25 for float32) the
        largest code that ``dtype`` holds exactly, 2^M - 2^(M - p): the top codes above it would round up to
        2^(e + 1) in the output, and the next pass would choose a larger exponent (not idempotent)."""
        significand = 1 - round(math.log2(torch.finfo(dtype).eps))  # 24 for float32, 53 for float64
        if self.mantissa_bits <= significand:
            return 2.0**self.mantissa_bits - 1
        return 2.0**self.mantissa_bits - 2.0 ** (self.mantissa_bits - significand)

    def _float32_applies(self, x: torch.Tensor) -> bool:
        """float32 data, a nearest mode, M <= 23 and every step >= 2^-149: then the float32 arithmetic below
        is exact where it matters (x / step is exact from 0.5 up, smaller quotients round to a signed zero in
        every nearest mode either way; code * step is a float32 value) and gives the float64 path's bits."""
        return _native_constants(self, x.dtype)[2] and can_branch_on_data(x)

    def _float32_blocks(self, blocked: torch.Tensor, dims: tuple[int, ...], max_exponent: int) -> torch.Tensor:
        """The blocks in float32 with one reduction for the exponents (finite blocks); float64 otherwise."""
        mantissa_bits = self.mantissa_bits
        extremes = finite_extremes(blocked, dims)
        if extremes is None:  # NaN / inf somewhere: the general path
            top_code = self._top_code(blocked.dtype)
            return self._quantize_blocks(blocked.double(), dims, max_exponent, top_code, None).float()
        low, high = extremes
        limits = (self.min_exponent, max_exponent)
        if self.rounding == "nearest_even":
            exponent, saturates = nearest_even_exponent(low, high, mantissa_bits, *limits)
        else:
            low, high = low.double().clamp_(max=0), high.double().clamp_(min=0)
            exponent, saturates = exponent_from_extremes(low, high, False, mantissa_bits, self.rounding, *limits), True
        step = exact_pow2(exponent - mantissa_bits + 1, torch.float32)
        codes = blocked / step  # exact: a power of two (quotients under 2^-126 round to a signed zero anyway)
        codes = codes.round_() if self.rounding == "nearest_even" else round_to_integer(codes, self.rounding)
        if saturates:
            top_code = 2.0**mantissa_bits - 1
            codes.clamp_(-top_code, top_code)
        return codes.mul_(step)

    def _quantize_blocks(self, blocked, dims, max_exponent: int, top_code: float, generator) -> torch.Tensor:
        mantissa_bits = self.mantissa_bits
        exponent = shared_exponent(blocked, dims, mantissa_bits, self.rounding, self.min_exponent, max_exponent)
        step = exact_pow2(exponent - mantissa_bits + 1, blocked.dtype)
        scaled = blocked / step  # exact: a power of two
        codes = scaled.round_() if self.rounding == "nearest_even" else round_to_integer(scaled, self.rounding, generator)
        return codes.clamp_(-top_code, top_code).mul_(step)


@functools.lru_cache(maxsize=256)
def _native_constants(spec: BlockFP, dtype: torch.dtype) -> tuple[int, float, bool]:
    """(max exponent, top code, whether the float32 path applies but for the data check) of ``spec`` on
    ``dtype``, computed once: a few microseconds of Python per call otherwise, which count at 384 x 384. The
    float32 path: float32 data, a nearest mode, M <= 23 and every step >= 2^-149."""
    float32 = (dtype == torch.float32 and spec.rounding.startswith("nearest") and spec.mantissa_bits <= 23
               and spec.min_exponent - spec.mantissa_bits + 1 >= -149)  # fmt: skip
    return min(spec.max_exponent, dtype_max_exponent(dtype)), spec._top_code(dtype), float32
