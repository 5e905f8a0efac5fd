"""Codec of ``nvfp4``: E2M1 element codes, one E4M3 byte per block of 16, a float32 tensor scale.

- codes: the 4-bit OCP E2M1 pattern of each element (sign | 2-bit exponent | 1-bit mantissa), shaped like
  the tensor (packed two to a byte when saved);
- ``block_scale``: the float8_e4m3fn bit pattern of s8 (uint8), one per block of 16 along the last
  dimension (the block grid of block (1, ..., 1, 16));
- ``tensor_scale``: pts (float32, one value); ``shift``: 0 or -100 (int16, one value), the power of two
  the decoded values are multiplied by (the format's rule for tensors with a subnormal pts).

value = e2m1(code) * (pts * s8) * 2^shift, saturated at float32's range: the format's own arithmetic.
"""

from __future__ import annotations

import torch

from lowbit.formats._base import FormatSpec
from lowbit.formats.nvfp4 import BLOCK_SIZE, combine
from lowbit.qtensor.codecs._common import Codec, Encoded, check_no_nan
from lowbit.qtensor.codecs.float_codes import ocp_layout

_E2M1 = ocp_layout("e2m1", 2, 1)
_E2M1_MIN_EXPONENT = 0


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(1) if x.dim() == 0 else x


class NVFP4Codec(Codec):
    names = ("nvfp4",)

    def code_bits(self, spec: FormatSpec) -> int:
        return 4

    def encode(self, spec: FormatSpec, work: torch.Tensor, values: torch.Tensor) -> Encoded:
        check_no_nan(spec, values)
        rows = _as_rows(work)
        parts = spec.decompose(rows)
        length = rows.shape[-1]
        elements = parts.elements.reshape(*parts.elements.shape[:-2], -1)[..., :length].reshape(work.shape)
        codes = _E2M1.encode(elements, _E2M1_MIN_EXPONENT)
        params = {
            "block_scale": parts.block_scales.to(torch.float8_e4m3fn).view(torch.uint8).contiguous(),
            "tensor_scale": parts.tensor_scale.reshape(1).to(torch.float32).contiguous(),
            "shift": parts.shift.reshape(1).to(torch.int16),
        }
        return Encoded(codes, params, (*[1] * (rows.dim() - 1), BLOCK_SIZE))

    def decode(self, spec, codes, params, block, dtype) -> torch.Tensor:
        rows = _as_rows(codes)
        length = rows.shape[-1]
        elements = _E2M1.decode(rows, _E2M1_MIN_EXPONENT).to(torch.float32)
        pad = (-length) % BLOCK_SIZE
        elements = torch.nn.functional.pad(elements, (0, pad)).reshape(*rows.shape[:-1], -1, BLOCK_SIZE)
        s8 = params["block_scale"].view(torch.float8_e4m3fn).to(torch.float32)
        values = combine(elements, s8.reshape(elements.shape[:-1]), params["tensor_scale"].reshape(()),
                         params["shift"].reshape(()).to(torch.int32))  # fmt: skip
        return values.reshape(*rows.shape[:-1], -1)[..., :length].reshape(codes.shape).to(dtype)
