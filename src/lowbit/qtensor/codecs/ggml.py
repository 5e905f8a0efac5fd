"""Codec of llama.cpp's block types ``gguf_q4_0`` / ``gguf_q4_1`` / ``gguf_q8_0``: what a ggml block stores.

Codes: the element codes (Q4_0 / Q4_1: 0..15 unsigned; Q8_0: -127..127 two's complement), shaped like the
tensor. Parameters per block of 32 along the last dimension: ``scale`` d (float16) and, for Q4_1, ``min`` m
(float16), shaped [..., ceil(last / 32)]. Values: the format's own ``block_values`` (d * (q - 8), d * q + m,
d * q in float32).
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats.ggml import block_fields, block_values, from_blocks, to_blocks
from lowbit.qtensor.codecs._common import Codec, Encoded, as_int, check_no_nan


class GGMLCodec(Codec):
    names = ("gguf_q4_0", "gguf_q4_1", "gguf_q8_0")

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
