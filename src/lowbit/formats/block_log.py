"""Block logarithmic format: power-of-two elements sharing one exponent bias per block.

Each element has ``width`` W bits (1 sign bit, Eb = W - 1 exponent-code bits, code 0 = zero, as in ``log``);
each block stores one bias beta in ``exponent_bias_width`` Bw bits. In a block with bias beta the values
are 0 and +-2^e for e in [1 - beta, 2^Eb - 1 - beta].

The bias puts the block's largest finite magnitude m at the top of the element range:
beta = 2^Eb - 1 - ceil(log2 m), so the top power 2^ceil(log2 m) is >= m and the block maximum never
saturates, in any rounding mode. beta is clamped to [0, 2^Bw - 1] (MASE's range): a block whose m exceeds
2^(2^Eb - 1) gets beta = 0 and saturates at +-2^(2^Eb - 1); a block whose m is below 2^(2^Eb - 2^Bw) gets
beta = 2^Bw - 1, so its maximum sits below the top of the range and values under 2^(1 - (2^Bw - 1)) go to
zero by the rounding rule. An all-zero block (m = 0, the limit m -> 0) gets beta = 2^Bw - 1 and stays zero.
NaN stays NaN and +-inf saturate to +-2^(2^Eb - 1 - beta); neither sets a block's bias.

Blocks follow the shared geometry (``block_size`` right-aligned to the trailing dimensions, -1 or an
oversize entry = the whole dimension, zero padding that changes nothing, ``skip_first_dim``, ``axis``);
``block_size=None`` ("NA") means one block per tensor, or per index of ``axis``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from lowbit.formats._base import (
    FormatSpec,
    check_axis,
    check_block_size,
    check_bool,
    check_int,
)
from lowbit.formats._registry import register
from lowbit.formats.block_fp import dtype_max_exponent
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    can_branch_on_data,
    finite_abs_max,
    finite_extremes,
    native_runs,
    scaled_bits_per_element,
)
from lowbit.formats.log import (
    MAX_WIDTH,
    _largest_float_below_sqrt2,
    fast_nearest_applies_per_block,
    nearest_power_of_two_finite,
    round_to_power_of_two,
)
from lowbit.native import block as native_block

MAX_BIAS_WIDTH = 10  # beta <= 1023 keeps the smallest element power 2^(1 - beta) inside float64


def ceil_log2(magnitude: torch.Tensor) -> torch.Tensor:
    """ceil(log2 m) as int32 for m > 0, exact (frexp); m = 0 gives a very negative number."""
    mantissa, exponent = torch.frexp(magnitude)  # m = mantissa * 2^exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)  # an exact power of two
    return torch.where(magnitude > 0, exponent, torch.full_like(exponent, -(2**20)))


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockLog(FormatSpec):
    """Power-of-two elements with a shared per-block exponent bias (see the module docstring).

    ``width`` W in [2, 11], ``exponent_bias_width`` Bw in [0, 10]; bias per block
    beta = clamp(2^(W-1) - 1 - ceil(log2 max|block|), 0, 2^Bw - 1). Element values in a block: 0 and
    +-2^e for e in [1 - beta, 2^(W-1) - 1 - beta]. ``log_domain`` as in ``log``.
    """

    upcast_before_kernel = True  # block reductions: see FormatSpec.upcast_before_kernel

    format_name = "block_log"

    width: int = 8
    exponent_bias_width: int = 8
    block_size: tuple[int, ...] | None = (16,)
    skip_first_dim: bool = False
    axis: int | None = None
    log_domain: bool = False

    def validate(self) -> None:
        check_int(self, "width", 2, MAX_WIDTH)
        check_int(self, "exponent_bias_width", 0, MAX_BIAS_WIDTH)
        check_block_size(self)  # None: one block per tensor (per channel with axis)
        check_bool(self, "skip_first_dim")
        check_axis(self)
        check_bool(self, "log_domain")

    @property
    def exponent_width(self) -> int:
        return self.width - 1

    @property
    def max_bias(self) -> int:
        return 2**self.exponent_bias_width - 1

    @property
    def bits(self) -> int:
        return self.width

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """Element bits plus the Bw bias bits of each block, spread over the tensor's elements."""
        if shape is None:  # the nominal block, when it does not depend on the shape
            fixed = self.block_size is not None and self.axis is None and min(self.block_size) > 0
            return self.width + (self.exponent_bias_width / math.prod(self.block_size) if fixed else 0.0)
        return scaled_bits_per_element(
            self.width, self.exponent_bias_width, shape, self.block_size, self.axis, self.skip_first_dim
        )

    def block_bias(self, block_max: torch.Tensor) -> torch.Tensor:
        """beta per block from its finite max |x| (int32): the max sits at the top power, clamped."""
        top_code = 2**self.exponent_width - 1
        return torch.clamp(top_code - ceil_log2(block_max), 0, self.max_bias)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        block = block_shape(x.shape, self.block_size, self.axis, self.skip_first_dim)
        return apply_blockwise(x, block, lambda blocked, dims: self._quantize_block(blocked, dims, generator))

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        """Blocks that are contiguous runs (along the last dimension, per row, per tensor) run natively."""
        runs = native_runs(self, x)
        if runs is None:
            return None
        below_sqrt2 = _largest_float_below_sqrt2(torch.float32) if self.log_domain else 0.0
        return native_block.block_log(x, runs, 2**self.exponent_width - 1, self.max_bias, self.log_domain,
                                      below_sqrt2, self.rounding)  # fmt: skip

    native_takes_halves = True

    def _quantize_block(self, blocked: torch.Tensor, dims: tuple[int, ...], generator) -> torch.Tensor:
        fast = (self.rounding == "nearest_even" and not self.log_domain
                and blocked.dtype in (torch.float32, torch.float64) and can_branch_on_data(blocked))  # fmt: skip
        extremes = finite_extremes(blocked, dims) if fast else None  # None: some block holds NaN / inf
        if extremes is None:
            block_max = finite_abs_max(blocked, dims)
        else:
            block_max = torch.maximum(extremes[1], extremes[0].neg()).abs_()
        bias = self.block_bias(block_max)  # [n0, 1, n1, 1, ...]
        min_exponent = 1 - bias
        max_exponent = 2**self.exponent_width - 1 - bias
        # the bit path needs every block's zero threshold 2^(min_exponent - 1) to be a normal number
        if extremes is not None and fast_nearest_applies_per_block(blocked.dtype, min_exponent):
            return nearest_power_of_two_finite(blocked, min_exponent, max_exponent)
        if extremes is not None and fast_nearest_applies_per_block(torch.float64, min_exponent):
            # float32 blocks whose smallest powers are float32 subnormals (Bw = 8 on data near 1): the same
            # rounding in float64, where every float32 value and power is normal, saturating at float32's
            # largest power; the cast back rounds 2^e below float32's range as the float32 path builds it
            dtype_max = dtype_max_exponent(blocked.dtype)
            top = torch.clamp(max_exponent, max=dtype_max)
            return nearest_power_of_two_finite(blocked.double(), min_exponent, top).to(blocked.dtype)
        return round_to_power_of_two(blocked, min_exponent, max_exponent, self.rounding, generator, self.log_domain)
