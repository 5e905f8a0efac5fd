"""ONNX for ``FormatWeightLinear`` (NVFP4 / NF4 / codebook weights): the weight rebuilt in the graph as
``table[codes] * block_scale`` (Gather, Mul), then Gemm, with ops every onnxruntime runs.

onnxruntime has no kernel for DequantizeLinear on FLOAT4E2M1 (1.32, CPU: NOT_IMPLEMENTED) and ONNX has no
look-up-table DequantizeLinear, so the graph holds the codes (uint8, one per weight: 0.25x float32, not the
packed 4 bits lowbit keeps), the format's value table and one float32 scale per block: NVFP4's ``pts * s8``
(the product lowbit's decoder forms first, so each weight is the same one float32 product), NF4 / codebook's
absmax; a partial last block is padded in the graph and cut. The rebuilt weight is checked bit for bit against
lowbit's decoder before anything is written; where it differs (an NVFP4 tensor scaled by 2^100 for being tiny)
or the blocks span rows, the export refuses with the reason.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lowbit.export._errors import ExportError


def _table_and_scales(module, stored) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(value table, float32 scales per block, block width) of ``module``'s weight (``stored``: its QTensor)."""
    spec = stored.spec
    if spec.format_name == "nvfp4":
        from lowbit.formats.nvfp4 import BLOCK_SIZE
        from lowbit.qtensor.codecs.nvfp4 import _E2M1, _E2M1_MIN_EXPONENT

        table = _E2M1.decode(torch.arange(16), _E2M1_MIN_EXPONENT).to(torch.float32)
        s8 = stored.params["block_scale"].view(torch.float8_e4m3fn).to(torch.float32)
        return table, stored.params["tensor_scale"].reshape(()) * s8, BLOCK_SIZE
    table = spec.entries(torch.arange(len(spec.table())), torch.float32)
    if "absmax" not in stored.params:
        return table, torch.ones(module.out_features, 1), module.in_features
    width = int(stored.block[-1]) if stored.block else module.in_features
    if len(stored.block or ()) > 1 and any(int(extent) != 1 for extent in stored.block[:-1]):
        width = 0  # blocks across rows: not one scale per row segment
    return table, stored.params["absmax"].to(torch.float32), width


class TableLinear(nn.Module):
    """The export module of a FormatWeightLinear (module docstring)."""

    def __init__(self, module, name: str) -> None:
        super().__init__()
        stored = module.qtensor()
        table, scale, width = _table_and_scales(module, stored)
        n, k = module.out_features, module.in_features
        blocks = -(-k // max(width, 1))  # the last block may be partial: padded in the graph, then cut
        if width < 1 or scale.numel() != n * blocks:
            raise ExportError(f"layer {name!r}: its {module.spec.format_name} blocks are not runs of one row's "
                              "inputs; the ONNX table graph holds one scale per row segment")  # fmt: skip
        self.register_buffer("codes", stored.codes.to(torch.uint8))
        self.register_buffer("table", table)
        self.register_buffer("scale", scale.reshape(n, blocks).contiguous())
        self.register_buffer("bias", None if module.bias is None else module.bias.detach().clone())
        self.width = width
        if not torch.equal(self.weight(), module.dequantize_weight()):
            raise ExportError(f"layer {name!r}: its {module.spec.format_name} weight is not table[code] * one float32 "
                              "scale per block here (a tiny NVFP4 tensor is decoded at 2^100 its size); ONNX "
                              "would not give lowbit's values")  # fmt: skip

    def weight(self) -> torch.Tensor:
        n, k = self.codes.shape
        values = self.table[self.codes.to(torch.int64)]
        pad = self.scale.shape[1] * self.width - k
        values = F.pad(values, (0, pad)) if pad else values
        scaled = values.reshape(n, -1, self.width) * self.scale.unsqueeze(-1)
        return scaled.reshape(n, -1)[:, :k] if pad else scaled.reshape(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight(), self.bias)


__all__ = ["TableLinear"]
