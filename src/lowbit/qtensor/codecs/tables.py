"""Codecs of the look-up-table formats ``codebook`` and ``nf4``.

- codes: the index of each element's table entry (unsigned, ceil(log2(table size)) bits: 4 for nf4, packed
  two to a byte when saved), shaped like the tensor;
- ``absmax`` (scaled tables only): each block's absmax, float32, on the block grid.

value = table[code] (rounded to the compute dtype) * absmax: the format's own arithmetic.
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.qtensor.codecs._common import Codec, Encoded, block_stat, check_no_nan, expand_blocks


class TableCodec(Codec):
    names = ("codebook", "nf4")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.bits

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        if spec.block_size is None:
            return Encoded(spec.indices(work), {}, None)
        rows = work.reshape(1) if work.dim() == 0 else work
        block = spec._block(rows)
        absmax = block_stat(rows, block, spec._absmax)
        expanded = expand_blocks(absmax, rows.shape, block)
        t = rows / torch.where(expanded > 0, expanded, torch.ones_like(expanded))
        codes = spec.indices(t).reshape(work.shape)
        return Encoded(codes, {"absmax": absmax.to(torch.float32).contiguous()}, tuple(block))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        entries = spec.entries(codes.to(torch.int64), dtype)
        if "absmax" not in params:
            return entries
        rows = entries.reshape(1) if entries.dim() == 0 else entries
        absmax = expand_blocks(params["absmax"].to(dtype), rows.shape, block)
        return (rows * absmax).reshape(codes.shape)
