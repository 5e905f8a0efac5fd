"""Codecs of the sign formats: ``binary``, ``ternary`` and ``binary_residual``.

- binary: one unsigned bit, 1 = the high value (+alpha, or alpha unipolar), 0 = the low one (-alpha / 0);
  with ``scaling_factor`` one ``scale`` alpha per tensor (or per index of ``axis``).
- ternary: a 2-bit two's-complement code in {-1, 0, 1}; value code * alpha (or the code itself unscaled).
- binary_residual: ``levels`` unsigned bits, the index into the sorted set of distinct signed sums.

alpha is read back from the output (the largest magnitude of its block): every nonzero output is +-alpha.
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats.blocking import block_shape
from lowbit.qtensor.codecs._common import Codec, Encoded, block_stat, check_no_nan, expand_blocks, narrow_scale


def _alpha(values: torch.Tensor, axis: int | None) -> tuple[torch.Tensor, tuple[int, ...]]:
    block = block_shape(values.shape, None, axis)
    alpha = block_stat(values, block, lambda blocked, dims: blocked.abs().amax(dim=dims, keepdim=True))
    return narrow_scale(alpha.contiguous()), tuple(block)


def _scale_of(params: dict[str, torch.Tensor], codes: torch.Tensor, block, dtype) -> torch.Tensor:
    if "scale" not in params:
        return torch.ones((), dtype=dtype, device=codes.device)
    return expand_blocks(params["scale"].to(dtype), codes.shape, block)


class BinaryCodec(Codec):
    names = ("binary",)

    def code_bits(self, spec: FormatSpec) -> int:
        return 1

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        # Bipolar: the sign bit tells +alpha from -alpha (also when alpha = 0: -1 * 0 is -0.0).
        codes = (~torch.signbit(values) if spec.bipolar else values > 0).to(torch.int64)
        if not spec.scaling_factor:
            return Encoded(codes, {}, None)
        alpha, block = _alpha(values, spec.axis)
        return Encoded(codes, {"scale": alpha}, block)

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        alpha = _scale_of(params, codes, block, dtype)
        low = -1.0 if spec.bipolar else 0.0
        return torch.where(codes == 1, alpha, low * alpha).expand(codes.shape)


class TernaryCodec(Codec):
    names = ("ternary",)

    def code_bits(self, spec: FormatSpec) -> int:
        return 2

    def code_signed(self, spec: FormatSpec) -> bool:
        return True

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        # A negative zero only arises as -1 * alpha with alpha = 0 (a block whose large elements are all inf).
        codes = torch.where(values > 0, 1, torch.where(torch.signbit(values), -1, 0)).to(torch.int64)
        if not spec.scaling_factor:
            return Encoded(codes, {}, None)
        alpha, block = _alpha(values, spec.axis)
        return Encoded(codes, {"scale": alpha}, block)

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        signs = codes.to(dtype)
        return signs * _scale_of(params, codes, block, dtype) if "scale" in params else signs


class BinaryResidualCodec(Codec):
    names = ("binary_residual",)

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.levels

    def _grid(self, spec: FormatSpec, dtype: torch.dtype, device) -> torch.Tensor:
        return torch.tensor(spec._grids[dtype], dtype=dtype, device=device)

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        grid = self._grid(spec, values.dtype, values.device)
        codes = torch.searchsorted(grid, values.contiguous()).clamp(max=grid.numel() - 1)
        return Encoded(codes.to(torch.int64), {}, None)

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        return self._grid(spec, dtype, codes.device)[codes.to(torch.int64)]
