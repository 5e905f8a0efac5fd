"""GGMLLinear: a weight-only Linear holding exactly what a llama.cpp Q4_0 / Q4_1 / Q8_0 tensor stores.

Blocks of 32 along the input dimension (see :mod:`lowbit.formats.ggml` for the rule). Buffers (the state
dict): ``weight_codes`` (Q4_0 / Q4_1: uint8 [N, K / 2], codes 0..15, element 2j in the low nibble, lowbit's
packed layout; Q8_0: int8 [N, K]), ``weight_scale`` float16 [N, K / 32] (d) and, for Q4_1, ``weight_min``
float16 [N, K / 32] (m). Weight values, in float32: Q4_0 d * (q - 8), Q4_1 d * q + m, Q8_0 d * q: the
format's own ``block_values``, bit for bit what ``gguf.quants.dequantize`` gives for the same block bytes
(the codes are ggml's; only the nibble order inside a byte differs, see :func:`ggml_block_bytes`).

Bytes per weight: Q4_0 0.5625 (0.14x float32), Q4_1 0.625 (0.16x), Q8_0 1.0625 (0.27x).
Paths: "reference" and "dequantize" (float32 weight rebuilt per call, in row blocks for large weights, then
a float32 matmul), "dequantize_bf16", and "native" (lowbit's float32 weight-only kernels: Q4_0 as int4 with
zero point 8, Q4_1 and Q8_0 as kinds of their own; every weight ggml's float32 value).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lowbit.errors import ConfigError, FormatError
from lowbit.formats.ggml import BLOCK_SIZE, GGML_TYPES, block_fields, block_values, to_blocks
from lowbit.native import linear as native_linear
from lowbit.ops import kernels
from lowbit.ops.modules import WeightOnlyLinear, _check_linear, check_compute_dtype, register

# ggml's block bytes: (bytes per block, offset of the codes)
BLOCK_BYTES = {"q4_0": (18, 2), "q4_1": (20, 4), "q8_0": (34, 2)}


def _check_type(ggml_type: Any) -> str:
    if ggml_type not in GGML_TYPES:
        raise ConfigError(f"ggml_type={ggml_type!r}; legal: {', '.join(GGML_TYPES)}")
    return ggml_type


@register
class GGMLLinear(WeightOnlyLinear):
    """Weight-only Linear on ggml block codes (module docstring); ``ggml_type`` "q4_0", "q4_1" or "q8_0"."""

    paths = ("auto", "reference", "dequantize", "dequantize_bf16", "native")
    packed_path = "packed"  # not a path: no packed bfloat16 kernel takes ggml's float16 fields exactly

    def __init__(self, in_features: int, out_features: int, bias: bool = True, ggml_type: str = "q4_0",
                 compute_dtype: str | None = None) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias)
        self.ggml_type = _check_type(ggml_type)
        self.compute_dtype = check_compute_dtype(type(self).__name__, compute_dtype)
        if in_features % BLOCK_SIZE:
            raise FormatError(f"in_features={in_features} is not a multiple of ggml's block of {BLOCK_SIZE}")
        blocks = in_features // BLOCK_SIZE
        if ggml_type == "q8_0":
            self.register_buffer("weight_codes", torch.zeros(out_features, in_features, dtype=torch.int8))
        else:
            self.register_buffer("weight_codes", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("weight_scale", torch.zeros(out_features, blocks, dtype=torch.float16))
        if ggml_type == "q4_1":
            self.register_buffer("weight_min", torch.zeros(out_features, blocks, dtype=torch.float16))

    has_native = True  # Q4_0 on lowbit's int4 kernel (zero point 8), Q4_1 / Q8_0 on their own kinds

    def config(self) -> dict[str, Any]:
        return {**super().config(), "ggml_type": self.ggml_type}

    @classmethod
    def from_float(cls, module: nn.Linear, ggml_type: str = "q4_0", compute_dtype: str | None = None) -> GGMLLinear:
        """``module``'s weight quantized by ggml's reference rule (the ``gguf_<type>`` format's own fields)."""
        _check_linear(module)
        weight = module.weight.detach().float()
        if not bool(torch.isfinite(weight).all()):
            raise FormatError("the weight has NaN or inf values; it cannot be quantized")
        new = cls(module.in_features, module.out_features, module.bias is not None, ggml_type, compute_dtype)
        fields = block_fields(ggml_type, to_blocks(weight.cpu()))
        new.set_fields(fields.codes.reshape(weight.shape), fields.scale, fields.minimum)
        if module.bias is not None:
            new.bias.copy_(module.bias.detach())
        return new.to(module.weight.device)

    def set_fields(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None = None) -> GGMLLinear:
        """Store codes [N, K] (integer-valued), float16 scales and minima [N, K / 32] as they are."""
        if self.ggml_type == "q8_0":
            self.weight_codes.copy_(codes.to(torch.int8))
        else:
            self.weight_codes.copy_(kernels.pack_nibbles(codes.to(torch.uint8)))
        self.weight_scale.copy_(scale)
        if self.ggml_type == "q4_1":
            self.weight_min.copy_(minimum)
        self._kernel_state.clear()
        return self

    def codes(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Codes [rows, K]: uint8 0..15 (Q4_0 / Q4_1) or int8 (Q8_0)."""
        stored = self.weight_codes[start:end]
        return stored if self.ggml_type == "q8_0" else kernels.unpack_nibbles(stored)

    def dequantized_weight(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """float32 weight rows [start, end)."""
        codes = self.codes(start, end)
        rows = codes.shape[0]
        blocks = codes.reshape(rows, -1, BLOCK_SIZE)
        minimum = self.weight_min[start:end] if self.ggml_type == "q4_1" else None
        return block_values(self.ggml_type, blocks, self.weight_scale[start:end], minimum).reshape(rows, -1)

    def dequantize_weight(self) -> torch.Tensor:
        """The whole weight [out, in] in float32."""
        return self.dequantized_weight()

    def packed_fits(self) -> bool:
        return False

    def run_packed(self, rows: torch.Tensor) -> torch.Tensor:
        raise ConfigError("GGMLLinear has no packed kernel")

    def native_weight_rows(self, start: int, end: int) -> torch.Tensor | None:
        codes = self.weight_codes[start:end]
        if self.ggml_type == "q4_0":
            zero_point, scale = self._q4_0_fields()
            return native_linear.weight_rows("int4_zero", codes, scale[start:end], zero_point=zero_point[start:end],
                                             group=BLOCK_SIZE)  # fmt: skip
        scale, minimum = self._native_fields()
        if self.ggml_type == "q8_0":
            return native_linear.weight_rows("int8_group", codes, scale[start:end], group=BLOCK_SIZE)
        return native_linear.weight_rows("int4_min", codes, scale[start:end], minimum=minimum[start:end],
                                         group=BLOCK_SIZE)  # fmt: skip

    def _native_fields(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float32 d and (Q4_1) m, contiguous, kept until the buffers change."""
        minimum = lambda: self.weight_min.float().contiguous() if self.ggml_type == "q4_1" else None  # noqa: E731
        return self.derived("ggml_native", lambda: (self.weight_scale.float().contiguous(), minimum()))

    def _q4_0_fields(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Q4_0 as lowbit's int4: zero point 8 and float32 d."""
        shape, device = self.weight_scale.shape, self.weight_scale.device
        zero_point = self.derived("q4_0_zero_point", lambda: torch.full(shape, 8, dtype=torch.uint8, device=device))
        return zero_point, self._native_fields()[0]  # d: the one float32 copy

    def run_native(self, rows: torch.Tensor) -> torch.Tensor | None:
        if self.ggml_type != "q4_0":
            scale, minimum = self._native_fields()
            return native_linear.ggml_linear(rows, self.weight_codes, scale, minimum, self.bias, self.ggml_type)
        zero_point, scale = self._q4_0_fields()
        return native_linear.int4_linear(rows, self.weight_codes, zero_point, scale, self.bias, BLOCK_SIZE)


# ---- ggml's block bytes ---------------------------------------------------------------------------------------
def ggml_block_bytes(module: GGMLLinear) -> np.ndarray:
    """The module's weight as ggml stores it: uint8 [N, K / 32 * block bytes] (the tensor data of a GGUF file)."""
    n, k = module.out_features, module.in_features
    blocks = k // BLOCK_SIZE
    size, offset = BLOCK_BYTES[module.ggml_type]
    out = np.empty((n, blocks, size), dtype=np.uint8)
    out[..., 0:2] = module.weight_scale.detach().cpu().numpy().view(np.uint8).reshape(n, blocks, 2)
    if module.ggml_type == "q4_1":
        out[..., 2:4] = module.weight_min.detach().cpu().numpy().view(np.uint8).reshape(n, blocks, 2)
    codes = module.codes().cpu().numpy().reshape(n, blocks, BLOCK_SIZE)
    if module.ggml_type == "q8_0":
        out[..., offset:] = codes.view(np.uint8)
    else:  # ggml: byte j holds element j (low nibble) and element j + 16 (high nibble)
        out[..., offset:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out.reshape(n, blocks * size)


def fields_from_block_bytes(ggml_type: str, data: np.ndarray, shape: tuple[int, int]):
    """(codes [N, K] int16, scale [N, K / 32] float16, minimum or None) of ggml's block bytes for ``shape``."""
    n, k = shape
    blocks = k // BLOCK_SIZE
    size, offset = BLOCK_BYTES[_check_type(ggml_type)]
    if k % BLOCK_SIZE or data.size != n * blocks * size:
        raise FormatError(f"{ggml_type.upper()} data of {data.size} bytes does not hold a [{n}, {k}] weight "
                          f"({n * blocks * size} bytes in blocks of {BLOCK_SIZE})")  # fmt: skip
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(n, blocks, size)
    scale = torch.from_numpy(raw[..., 0:2].copy().view(np.float16).reshape(n, blocks))
    minimum = torch.from_numpy(raw[..., 2:4].copy().view(np.float16).reshape(n, blocks)) if ggml_type == "q4_1" else None
    payload = raw[..., offset:]
    if ggml_type == "q8_0":
        codes = payload.view(np.int8).astype(np.int16)
    else:
        codes = np.concatenate([payload & 15, payload >> 4], axis=-1).astype(np.int16)
    return torch.from_numpy(codes.reshape(n, k)), scale, minimum


def from_block_bytes(ggml_type: str, data: np.ndarray, shape: tuple[int, int], bias: torch.Tensor | None = None,
                     compute_dtype: str | None = None) -> GGMLLinear:  # fmt: skip
    """A GGMLLinear holding ggml's block bytes of a [N, K] weight exactly."""
    codes, scale, minimum = fields_from_block_bytes(ggml_type, data, shape)
    new = GGMLLinear(shape[1], shape[0], bias is not None, ggml_type, compute_dtype)
    if bias is not None:
        new.bias.copy_(bias.detach())
    return new.set_fields(codes, scale, minimum)
