"""Block minifloat: minifloat elements sharing one exponent bias per block.

Each element is a W-bit minifloat (``width`` W, ``exponent_width`` E, M = W - E - 1 mantissa bits):
implicit leading one, subnormals at exponent code 0, every code finite (no inf / NaN codes). With element
bias beta, the exponent codes 1 .. 2^E - 1 are the binades 1 - beta .. 2^E - 1 - beta.

The block stores its shared bias as the exponent of its *top* element binade,

    t = 2^E - 1 - beta,   a Bw-bit two's-complement integer: t in [-2^(Bw-1), 2^(Bw-1) - 1],

so a block with shared exponent t holds 0, the subnormals k * 2^(t - 2^E + 2 - M) (0 < k < 2^M) and the
normals 2^e * (1 + f / 2^M) for e in [t - 2^E + 2, t]; its largest magnitude is (2 - 2^-M) * 2^t.
t is chosen so the block maximum lies in the top binade: t = floor(log2(max|x|)), plus one when the
maximum would round up to 2^(t + 1) (for stochastic rounding, when it could), clamped to the Bw-bit range
(and to 127 for float32 / bfloat16 inputs, so the top value stays finite).

Covered range: block maxima in [2^(-2^(Bw-1)), 2^(2^(Bw-1))) get their own top binade (Bw = 8: about
[3e-39, 3e38], every normal float32; Bw = 4: [2^-8, 2^8)). A block whose maximum is larger saturates to
+-(2 - 2^-M) * 2^(2^(Bw-1) - 1); a block whose maximum is smaller uses t = -2^(Bw-1), so its small
elements may become subnormal or zero. Zero is encoded as exponent code 0, mantissa 0 (the sign follows
the input). NaN stays NaN and +-inf saturate to the block's largest magnitude; neither sets t. An
all-zero block uses the smallest t and stays zero; a block of only zeros and infs uses the largest t,
so that a lone inf saturates to the format's max.
"""

from __future__ import annotations

import dataclasses

import torch

from lowbit.errors import FormatError
from lowbit.formats._base import FormatSpec, check_block_size, check_bool, check_int
from lowbit.formats._float_grid import float_grid_values, round_to_float_grid
from lowbit.formats._registry import register
from lowbit.formats.block_fp import (
    dtype_max_exponent,
    exponent_from_extremes,
    nearest_even_exponent,
    shared_exponent,
)
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    can_branch_on_data,
    finite_extremes,
    runs_of,
    scaled_bits_per_element,
)
from lowbit.native import block as native_block

# Mantissa bits beyond float32's 23 could not be represented in a float32 result.
_MAX_MANTISSA_BITS = 23


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockMinifloat(FormatSpec):
    """Block minifloat: W-bit (E exponent bits) minifloat elements whose bias is shared per block.

    The shared value is t, the exponent of the block's top element binade (bias beta = 2^E - 1 - t),
    stored as a signed Bw-bit integer: t in [-2^(Bw-1), 2^(Bw-1) - 1]. t = floor(log2 max|x|) of the
    block's finite elements, plus one if the maximum would round up to 2^(t+1). Block values: 0,
    subnormals k * 2^(t - 2^E + 2 - M), normals 2^e (1 + f/2^M) for e in [t - 2^E + 2, t]. Format max
    (2 - 2^-M) * 2^(2^(Bw-1) - 1); smallest positive 2^(-2^(Bw-1) - 2^E + 2 - M). Every code is finite:
    NaN stays NaN, +-inf and out-of-range values saturate to the block's largest magnitude and never set
    t (a block of only zeros and infs uses the largest t); zero is the all-zero code; an all-zero block
    stays zero.
    """

    upcast_before_kernel = True  # block reductions: see FormatSpec.upcast_before_kernel

    format_name = "block_minifloat"

    width: int = 8
    exponent_width: int = 4
    exponent_bias_width: int = 8
    block_size: tuple[int, ...] | None = (16,)
    skip_first_dim: bool = False

    def validate(self) -> None:
        check_int(self, "width", 2, 32)
        check_int(self, "exponent_width", 1, 8)
        mantissa_bits = self.width - self.exponent_width - 1
        if not 0 <= mantissa_bits <= _MAX_MANTISSA_BITS:
            raise FormatError(
                f"{self.format_name}: width={self.width} is invalid with exponent_width={self.exponent_width}; "
                f"width - exponent_width - 1 (the mantissa bits) must be in [0, {_MAX_MANTISSA_BITS}]"
            )
        check_int(self, "exponent_bias_width", 1, 10)
        check_block_size(self)
        check_bool(self, "skip_first_dim")

    # ---- description --------------------------------------------------------------------------------
    @property
    def mantissa_bits(self) -> int:
        return self.width - self.exponent_width - 1

    @property
    def min_shared_exponent(self) -> int:
        return -(2 ** (self.exponent_bias_width - 1))

    @property
    def max_shared_exponent(self) -> int:
        return 2 ** (self.exponent_bias_width - 1) - 1

    @property
    def max_value(self) -> float:
        return (2.0 - 2.0**-self.mantissa_bits) * 2.0**self.max_shared_exponent

    @property
    def bits(self) -> int:
        return self.width

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """W bits per element plus Bw shared-bias bits per block."""
        return scaled_bits_per_element(
            self.width, self.exponent_bias_width, shape, self.block_size, None, self.skip_first_dim
        )

    def element_min_exponent(self, shared: int | torch.Tensor) -> int | torch.Tensor:
        """Smallest normal exponent of a block whose top binade is ``shared`` (2^E - 2 binades below)."""
        return shared - (2**self.exponent_width - 2)

    def element_max_value(self, shared: int | torch.Tensor) -> float | torch.Tensor:
        """Largest magnitude of a block whose top binade is ``shared``."""
        return (2.0 - 2.0**-self.mantissa_bits) * 2.0**shared

    def block_values(self, exponent: int) -> torch.Tensor:
        """Every value of a block whose shared exponent (top binade) is ``exponent``, sorted (float64)."""
        if not self.min_shared_exponent <= exponent <= self.max_shared_exponent:
            raise FormatError(
                f"{self.format_name}: exponent={exponent} is outside "
                f"[{self.min_shared_exponent}, {self.max_shared_exponent}]"
            )
        if self.width > 16:
            raise FormatError(f"{self.format_name}: block_values enumerates at most 16-bit elements")
        minimum = self.element_min_exponent(exponent)
        return float_grid_values(self.mantissa_bits, minimum, self.element_max_value(exponent))

    # ---- quantization -------------------------------------------------------------------------------
    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        block = block_shape(x.shape, self.block_size, None, self.skip_first_dim)
        max_shared = min(self.max_shared_exponent, dtype_max_exponent(x.dtype))
        if self._float32_applies(x):
            return apply_blockwise(x, block, lambda blocked, dims: self._float32_blocks(blocked, dims, max_shared))

        def quantize_blocks(blocked: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
            return self._quantize_blocks(blocked, dims, max_shared, generator)

        # float64: the smallest subnormal step (about 2^-790 at Bw = 10, E = 8) stays a normal float64.
        return apply_blockwise(x.double(), block, quantize_blocks).to(x.dtype)

    def _native(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor | None:
        """Blocks that are contiguous runs (along the last dimension, per row, per tensor) run natively."""
        if x.dim() == 0:
            return None
        runs = runs_of(x.shape, self.block_size, None, self.skip_first_dim)
        if runs is None:
            return None
        max_shared = min(self.max_shared_exponent, dtype_max_exponent(torch.float32))  # halves: float32 too
        in_float = self._float32_grid_applies() and can_branch_on_data(x)
        return native_block.block_minifloat(x, runs, self.mantissa_bits, 2**self.exponent_width - 2,
                                            self.min_shared_exponent, max_shared, in_float, self.rounding)  # fmt: skip

    native_takes_halves = True

    def _float32_applies(self, x: torch.Tensor) -> bool:
        """float32 data and ``_float32_grid_applies``."""
        return x.dtype == torch.float32 and self._float32_grid_applies() and can_branch_on_data(x)

    def _float32_grid_applies(self) -> bool:
        """A nearest mode and every block's smallest step >= 2^-149: then the float32 grid rounding is exact
        where it matters (a quotient under 2^-126 rounds to a signed zero either way) and every result is a
        float32 value, so on float32 data it gives the float64 path's bits."""
        smallest_step = self.element_min_exponent(self.min_shared_exponent) - self.mantissa_bits
        return self.rounding.startswith("nearest") and self.mantissa_bits <= 22 and smallest_step >= -149

    def _float32_blocks(self, blocked: torch.Tensor, dims: tuple[int, ...], max_shared: int) -> torch.Tensor:
        """The blocks in float32 with one reduction for the shared exponents (finite blocks); float64 otherwise."""
        extremes = finite_extremes(blocked, dims)
        if extremes is None:  # NaN / inf somewhere: the general path
            return self._quantize_blocks(blocked.double(), dims, max_shared, None).float()
        low, high = extremes
        limits = (self.min_shared_exponent, max_shared)
        if self.rounding == "nearest_even":
            shared, saturates = nearest_even_exponent(low, high, self.mantissa_bits + 1, *limits)
        else:
            low, high = low.double().clamp_(max=0), high.double().clamp_(min=0)
            shared = exponent_from_extremes(low, high, False, self.mantissa_bits + 1, self.rounding, *limits)
            saturates = True
        shared = shared.to(torch.int32)
        top = torch.full(shared.shape, 2.0 - 2.0**-self.mantissa_bits, dtype=torch.float32, device=shared.device)
        max_value = torch.ldexp(top, shared)
        min_exponent = self.element_min_exponent(shared)
        return round_to_float_grid(blocked, self.mantissa_bits, min_exponent, max_value, self.rounding,
                                   saturate=saturates)  # fmt: skip

    def _quantize_blocks(self, blocked, dims, max_shared: int, generator) -> torch.Tensor:
        # The top binade of a minifloat is a block_fp grid with M + 1 significant bits.
        limits = (self.min_shared_exponent, max_shared)
        shared = shared_exponent(blocked, dims, self.mantissa_bits + 1, self.rounding, *limits)  # [n0, 1, ...]
        top = torch.full(shared.shape, 2.0 - 2.0**-self.mantissa_bits, dtype=blocked.dtype, device=blocked.device)
        max_value = torch.ldexp(top, shared)
        min_exponent = self.element_min_exponent(shared)
        return round_to_float_grid(blocked, self.mantissa_bits, min_exponent, max_value, self.rounding, generator)
