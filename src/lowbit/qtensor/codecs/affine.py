"""Codecs of the uniform integer grids: ``integer`` / ``fixed`` and ``affine`` with the Burn presets.

- integer / fixed: code k = y * 2^frac_width, a ``width``-bit two's-complement (or unsigned) integer; no
  parameters (the step is a format parameter). Value: k * 2^-frac_width.
- affine, q8s q4s q2s q8f q4f q2f: code q in the format's code range; per block a ``scale`` (stored in the
  format's ``scale_dtype``) and, unless symmetric, an integer ``zero_point``. Value: (q - zero_point) * scale,
  computed exactly as the format computes it. A given scale / zero point is stored per tensor, or per
  channel along ``axis``.
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats.blocking import block_shape
from lowbit.qtensor.codecs._common import (
    Codec,
    Encoded,
    as_int,
    block_stat,
    check_no_nan,
    expand_blocks,
    grid_shape,
    narrow_scale,
    smallest_int_dtype,
)


class IntegerCodec(Codec):
    names = ("integer", "fixed")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.width

    def code_signed(self, spec: FormatSpec) -> bool:
        return spec.signed

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        return Encoded(as_int(values / spec.step), {}, None)  # a power-of-two step: the division is exact

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        return codes.to(dtype) * spec.step


class AffineCodec(Codec):
    names = ("affine", "q8s", "q4s", "q2s", "q8f", "q4f", "q2f")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.bits

    def code_signed(self, spec: FormatSpec) -> bool:
        return spec.signed

    takes_out_dtype = True  # encode's parameters settle as quantization's do (Affine.settle_dtype)

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor,
               out_dtype: torch.dtype | None = None) -> Encoded:  # fmt: skip
        check_no_nan(spec, values)
        if spec.scale is not None:  # given: per tensor, or per channel along axis
            block = block_shape(work.shape, None, spec.axis)
            scale, zero_point = spec._given_parameters(work)
            grid = grid_shape(work.shape, block)
            scale, zero_point = scale.expand(grid), zero_point.expand(grid)
        else:
            block = block_shape(work.shape, spec.block_size, spec.axis, spec.skip_first_dim)
            settle = spec.settle_dtype(work.dtype, out_dtype) if out_dtype is not None else None
            scale, zero_point = block_stat(work, block, lambda b, dims: spec.parameters_from_block(b, dims, settle))
        steps = torch.round(values / expand_blocks(scale, work.shape, block))
        codes = as_int(steps + expand_blocks(zero_point, work.shape, block))
        # A product past the float range was clamped to +-max: the extreme code decodes to it as well.
        low, high = spec.clamp_range
        limit = torch.finfo(values.dtype).max
        codes = torch.where(values == limit, high, torch.where(values == -limit, low, codes))
        params = {"scale": narrow_scale(scale.contiguous(), spec.scale_dtype)}
        if not spec.symmetric:
            low, high = spec.code_range
            params["zero_point"] = as_int(zero_point.contiguous(), smallest_int_dtype(low, high))
        return Encoded(codes, params, tuple(block))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        shape = codes.shape
        scale = expand_blocks(params["scale"].to(dtype), shape, block)
        zero_point = params.get("zero_point")
        if zero_point is None:  # symmetric: the format subtracts a zero of the scale's dtype
            zero_point = torch.zeros_like(scale)
        else:
            zero_point = expand_blocks(zero_point.to(dtype), shape, block)
        out = (codes.to(dtype) - zero_point) * scale
        limit = torch.finfo(dtype).max  # the format saturates products past the float range
        return out.clamp(-limit, limit)
