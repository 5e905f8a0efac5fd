"""NVFP4: E2M1 elements, one E4M3 scale per 16 elements along the last dimension, one float32 tensor scale.

The recipe is torchao 0.18's (``nvfp4_quantize`` with a per-tensor scale), in float32 and in this order:

- ``pts = amax / 2688`` (2688 = 448 * 6), amax = max |x| over the tensor's finite elements;
- per block of 16 consecutive elements of the last dimension (the last block of a row may be shorter):
  ``s8 = e4m3(clamp(block_amax / 6 / pts, 2^-6, 448))`` (round half to even onto float8_e4m3fn; the clamp
  keeps s8 a normal E4M3 value, so a block far below the tensor's maximum gets s8 = 2^-6);
- ``r = (1 / pts) / s8``, ``y = e2m1(clamp(x * r, -6, 6)) * (pts * s8)`` (E2M1 round half to even).

Older torchao divided x by ``pts * s8`` instead of multiplying by r; the two differ at a few ties.

Value set: per block, +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} * (pts * s8); it depends on the data (``value_set`` is
None). Bits: 4 per element + 8 per block of 16 (4.5) + one 32-bit tensor scale.

Special cases (lowbit's contract where torchao's formula is undefined):

- NaN stays NaN and sets no scale; +-inf set no scale and saturate to +-6 * pts * s8 of their block.
- An all-zero tensor (or one with no finite non-zero element) stays zero (pts would be 0 and 0 / 0 NaN);
  an all-zero block of a non-zero tensor gets s8 = 2^-6 and stays zero. Zero keeps its sign.
- A tensor with amax < 2688 * 2^-126 (about 3.2e-35: pts would be subnormal and 1 / pts may overflow) is
  multiplied by 2^100 first and the result by 2^-100 after (exact up to the final rounding into float32's
  subnormals): the recipe at a scale where every step is a normal float32.
- A finite result past float32's range (6 * fl(pts * 448) may round up past the largest float32 when amax
  is near it) saturates at +-float32 max.

The arithmetic is float32: float64 inputs are rounded to float32 first, half inputs widened, and results
cast back (saturating). Rounding: nearest_even only (the recipe's).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn.functional as F

from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import register
from lowbit.formats.blocking import finite_abs_max
from lowbit.formats.ocp_float import ELEMENT_FORMATS

BLOCK_SIZE = 16
ELEMENT_MAX = 6.0
SCALE_MAX = 448.0
SCALE_MIN = 2.0**-6  # float8_e4m3fn's smallest normal
TENSOR_DIVISOR = SCALE_MAX * ELEMENT_MAX  # 2688
TINY_AMAX = TENSOR_DIVISOR * 2.0**-126  # below: pts would not be a normal float32
TINY_SHIFT = 100  # tiny tensors are quantized at 2^100 times their size
_FLOAT32_MAX = torch.finfo(torch.float32).max
_E2M1 = ELEMENT_FORMATS["e2m1"].grid


class NVFP4Parts(NamedTuple):
    """One tensor in NVFP4, before the scales are multiplied back in (float32, shapes of the padded grid).

    ``elements``: E2M1 values [..., blocks, 16] (padding included); ``block_scales``: s8 [..., blocks];
    ``tensor_scale``: pts (0-d); ``shift``: 0 or -TINY_SHIFT (int32, 0-d), the power of two the result is
    multiplied by.
    """

    elements: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor
    shift: torch.Tensor


def blocked(x: torch.Tensor) -> torch.Tensor:
    """float32 x (at least 1-d) as [..., blocks, 16], the last dimension zero-padded to a multiple of 16."""
    pad = (-x.shape[-1]) % BLOCK_SIZE
    padded = F.pad(x, (0, pad)) if pad else x
    return padded.reshape(*padded.shape[:-1], -1, BLOCK_SIZE)


def tensor_scale(amax: torch.Tensor) -> torch.Tensor:
    """pts = amax / 2688 in float32; 1 where amax is 0 (nothing to scale: every block stays zero)."""
    return torch.where(amax > 0, amax / TENSOR_DIVISOR, torch.ones_like(amax))


def block_scales(blocks: torch.Tensor, pts: torch.Tensor) -> torch.Tensor:
    """s8 per block: e4m3(clamp(block_amax / 6 / pts, 2^-6, 448)), float32 [..., blocks]."""
    block_amax = finite_abs_max(blocks, (blocks.dim() - 1,)).squeeze(-1)
    ratio = (block_amax / ELEMENT_MAX / pts).clamp(SCALE_MIN, SCALE_MAX)
    return ratio.to(torch.float8_e4m3fn).to(torch.float32)


def combine(elements: torch.Tensor, s8: torch.Tensor, pts: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """e * (pts * s8), times 2^shift (one rounding), saturated at float32's range (every element is finite)."""
    y = elements * (pts * s8).unsqueeze(-1)
    return torch.ldexp(y, shift).clamp(-_FLOAT32_MAX, _FLOAT32_MAX)


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class NVFP4(FormatSpec):
    """NVIDIA FP4: E2M1 elements, an E4M3 scale per 16 elements of the last dimension and a float32 tensor
    scale, exactly torchao 0.18's recipe (see the module docstring for the formula and special cases)."""

    format_name = "nvfp4"
    roundings = ("nearest_even",)

    @property
    def bits(self) -> int:
        return 4

    def bits_per_element(self, shape: tuple[int, ...] | None = None) -> float:
        """4 element bits + 8 bits per block of 16 (+ the 32-bit tensor scale spread over ``shape``)."""
        if shape is None:
            return 4.0 + 8.0 / BLOCK_SIZE
        numel = 1
        for dim in shape:
            numel *= dim
        if numel == 0:
            return 4.0
        last = shape[-1] if shape else 1
        blocks = numel // last * -(-last // BLOCK_SIZE)
        return 4.0 + (8.0 * blocks + 32.0) / numel

    def decompose(self, x: torch.Tensor) -> NVFP4Parts:
        """The recipe's elements and scales for x (float32 or wider, at least 1-d; see ``NVFP4Parts``)."""
        work = x.to(torch.float32)
        amax = finite_abs_max(work.reshape(1, -1), (1,)).reshape(())
        tiny = (amax > 0) & (amax < TINY_AMAX)  # no branch on the data: one graph when compiled
        shift = torch.where(tiny, -TINY_SHIFT, 0).to(torch.int32)
        work, amax = torch.ldexp(work, -shift), torch.ldexp(amax, -shift)  # exact: x 2^100 or x 1
        pts = tensor_scale(amax)
        blocks = blocked(work)
        s8 = block_scales(blocks, pts)
        ratio = (1.0 / pts) / s8  # [..., blocks]
        scaled = (blocks * ratio.unsqueeze(-1)).clamp(-ELEMENT_MAX, ELEMENT_MAX)
        elements = _E2M1.round(scaled, "nearest_even")
        return NVFP4Parts(elements, s8, pts, shift)

    def _quantize(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if x.dim() == 0:
            return self._quantize(x.reshape(1), generator).reshape(())
        parts = self.decompose(x)
        y = combine(parts.elements, parts.block_scales, parts.tensor_scale, parts.shift)
        y = y.reshape(*y.shape[:-2], -1)[..., : x.shape[-1]].to(x.dtype)
        return torch.where(torch.isnan(x), x, y)
