"""Codecs of llama.cpp's block types: what a ggml block stores.

Legacy types (``gguf_q4_0`` / ``gguf_q4_1`` / ``gguf_q5_0`` / ``gguf_q8_0``): the element codes (Q4_0 /
Q4_1: 0..15, Q5_0: 0..31 unsigned; Q8_0: -127..127 two's complement), shaped like the tensor; per block of 32
along the last dimension ``scale`` d (float16) and, for Q4_1, ``min`` m (float16), shaped [..., ceil(last /
32)]. Values: the format's own ``block_values``.

K-quants (``gguf_q4_k`` / ``gguf_q6_k``): element codes (Q4_K 0..15 unsigned, Q6_K -32..31 signed); per
super-block of 256 ``d`` (float16) and, for Q4_K, ``dmin`` [..., ceil(last / 256)]; per sub-block
``sub_scale`` (Q4_K uint8 0..63 [..., n, 8]; Q6_K int8 [..., n, 16]) and, for Q4_K, ``sub_min`` (uint8
0..63). Values: ``lowbit.formats.ggml_k.k_values``.
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats.ggml import block_fields, block_values, from_blocks, to_blocks
from lowbit.formats.ggml_k import SUPER_BLOCK, KFields, k_fields, k_values
from lowbit.qtensor.codecs._common import Codec, Encoded, as_int, check_no_nan


class GGMLCodec(Codec):
    names = ("gguf_q4_0", "gguf_q4_1", "gguf_q5_0", "gguf_q8_0")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.bits

    def code_signed(self, spec: FormatSpec) -> bool:
        return spec.ggml_type == "q8_0"

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        fields = block_fields(spec.ggml_type, to_blocks(work))
        codes = as_int(from_blocks(fields.codes, work.shape))
        params = {"scale": fields.scale.contiguous()}
        if fields.minimum is not None:
            params["min"] = fields.minimum.contiguous()
        block = (1,) * (work.dim() - 1) + (32,) if work.dim() else (32,)
        return Encoded(codes, params, block)

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        blocks = to_blocks(codes.to(torch.float32))
        values = block_values(spec.ggml_type, blocks, params["scale"], params.get("min"))
        return from_blocks(values, codes.shape).to(dtype)


class KQuantCodec(Codec):
    names = ("gguf_q4_k", "gguf_q6_k")

    def code_bits(self, spec: FormatSpec) -> int:
        return spec.bits

    def code_signed(self, spec: FormatSpec) -> bool:
        return spec.ggml_type == "q6_k"

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        fields = k_fields(spec.ggml_type, to_blocks(work, SUPER_BLOCK), spec.search)
        codes = as_int(from_blocks(fields.codes, work.shape))
        small = torch.uint8 if spec.ggml_type == "q4_k" else torch.int8
        params = {"d": fields.d.contiguous(), "sub_scale": fields.sub_scale.to(small).contiguous()}
        if fields.dmin is not None:
            params["dmin"] = fields.dmin.contiguous()
            params["sub_min"] = fields.sub_min.to(torch.uint8).contiguous()
        block = (1,) * (work.dim() - 1) + (SUPER_BLOCK,) if work.dim() else (SUPER_BLOCK,)
        return Encoded(codes, params, block)

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        blocks = to_blocks(codes.to(torch.float32), SUPER_BLOCK)
        fields = KFields(blocks, params["d"], params.get("dmin"), params["sub_scale"], params.get("sub_min"))
        return from_blocks(k_values(spec.ggml_type, fields), codes.shape).to(dtype)
