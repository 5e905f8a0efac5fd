"""GGMLLinear: a weight-only Linear holding exactly what a llama.cpp tensor of type Q4_0, Q4_1, Q5_0, Q8_0,
Q4_K or Q6_K stores.

Blocks along the input dimension (32 elements; the K-quants' super-blocks 256, see :mod:`lowbit.formats.ggml`
and :mod:`lowbit.formats.ggml_k`). Buffers (the state dict):

========= ===================================== ================================ ===============================
type      ``weight_codes``                      ``weight_scale`` / ``weight_min`` sub-block fields
========= ===================================== ================================ ===============================
q4_0      uint8 [N, K / 2] nibbles 0..15        float16 d [N, K / 32]            -
q4_1      uint8 [N, K / 2] nibbles 0..15        d, m [N, K / 32]                 -
q5_0      int8 [N, K]: q - 16 (-16..15)         d [N, K / 32]                    -
q8_0      int8 [N, K]                           d [N, K / 32]                    -
q4_k      uint8 [N, K / 2] nibbles 0..15        d, dmin [N, K / 256]             ``weight_sub_scale``,
                                                                                 ``weight_sub_min`` uint8 [N, K / 32]
q6_k      int8 [N, K] (-32..31)                 d [N, K / 256]                   ``weight_sub_scale`` int8 [N, K / 16]
========= ===================================== ================================ ===============================

Nibbles are lowbit's packed layout (element 2j low); ggml's own byte order is written and read by
:func:`ggml_block_bytes` / :func:`from_block_bytes`. Q5_0 and Q6_K keep a byte per code (1.06 / 1.07 bytes per
weight against ggml's 0.69 / 0.82) so the int8 kernels read them as they are. Weight values, in float32, are
the formats' own (``block_values`` / ``k_values``): bit for bit what ``gguf.quants.dequantize`` gives.

Paths: "reference" and "dequantize" (float32 weight rebuilt per call, in row blocks for large weights, then
a float32 matmul), "dequantize_bf16", and "native" (lowbit's float32 weight-only kernels: Q4_0 as int4 with
zero point 8; Q4_1 and Q4_K as codes x scale + minimum per 32 (Q4_K's d * sc and -(dmin * m), exact float32
products); Q5_0, Q8_0 and Q6_K as int8 codes x scale per 32 / 16; every weight ggml's float32 value).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lowbit.errors import ConfigError, FormatError
from lowbit.formats import _ggml_bytes
from lowbit.formats.ggml import BLOCK_SIZE, ZERO_CODES, block_fields, block_values, to_blocks
from lowbit.formats.ggml import GGML_TYPES as LEGACY_TYPES
from lowbit.formats.ggml_k import K_TYPES as K_QUANTS
from lowbit.formats.ggml_k import SUB_BLOCKS, SUPER_BLOCK, KFields, k_fields, k_values
from lowbit.native import linear as native_linear
from lowbit.ops import kernels
from lowbit.ops.modules import WeightOnlyLinear, _check_linear, check_compute_dtype, register

GGML_TYPES = LEGACY_TYPES + K_QUANTS
PACKED = ("q4_0", "q4_1", "q4_k")  # nibbles two to a byte; the others one int8 code a byte
BLOCKS = {name: (SUPER_BLOCK if name in K_QUANTS else BLOCK_SIZE) for name in GGML_TYPES}
CODE_OFFSET = {"q5_0": ZERO_CODES["q5_0"]}  # stored int8 code = ggml's code - offset


def _check_type(ggml_type: Any) -> str:
    if ggml_type not in GGML_TYPES:
        raise ConfigError(f"ggml_type={ggml_type!r}; legal: {', '.join(GGML_TYPES)}")
    return ggml_type


@register
class GGMLLinear(WeightOnlyLinear):
    """Weight-only Linear on ggml block codes (module docstring); ``ggml_type`` one of ``GGML_TYPES``."""

    paths = ("auto", "reference", "dequantize", "dequantize_bf16", "native")
    packed_path = "packed"  # not a path: no packed bfloat16 kernel takes ggml's float16 fields exactly

    def __init__(self, in_features: int, out_features: int, bias: bool = True, ggml_type: str = "q4_0",
                 compute_dtype: str | None = None) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias)
        self.ggml_type = _check_type(ggml_type)
        self.compute_dtype = check_compute_dtype(type(self).__name__, compute_dtype)
        block = BLOCKS[ggml_type]
        if in_features % block:
            raise FormatError(f"in_features={in_features} is not a multiple of {ggml_type.upper()}'s block of {block}")
        n, k = out_features, in_features
        packed = ggml_type in PACKED
        self.register_buffer("weight_codes", torch.zeros(n, k // 2 if packed else k, dtype=torch.uint8 if packed else torch.int8))
        self.register_buffer("weight_scale", torch.zeros(n, k // block, dtype=torch.float16))
        if ggml_type in ("q4_1", "q4_k"):
            self.register_buffer("weight_min", torch.zeros(n, k // block, dtype=torch.float16))
        if ggml_type in K_QUANTS:
            small = torch.uint8 if ggml_type == "q4_k" else torch.int8
            self.register_buffer("weight_sub_scale", torch.zeros(n, k // SUB_BLOCKS[ggml_type], dtype=small))
        if ggml_type == "q4_k":
            self.register_buffer("weight_sub_min", torch.zeros(n, k // SUB_BLOCKS[ggml_type], dtype=torch.uint8))

    has_native = True  # every type on one of lowbit's weight-only kernel kinds (module docstring)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "ggml_type": self.ggml_type}

    @classmethod
    def from_float(cls, module: nn.Linear, ggml_type: str = "q4_0", compute_dtype: str | None = None,
                   search: bool = True) -> GGMLLinear:  # fmt: skip
        """``module``'s weight quantized by the ``gguf_<type>`` format's own rule (``search``: the K-quants'
        least-squares search, their format's default)."""
        _check_linear(module)
        weight = module.weight.detach().float()
        if not bool(torch.isfinite(weight).all()):
            raise FormatError("the weight has NaN or inf values; it cannot be quantized")
        new = cls(module.in_features, module.out_features, module.bias is not None, ggml_type, compute_dtype)
        n = weight.shape[0]
        if ggml_type in K_QUANTS:
            fields = k_fields(ggml_type, to_blocks(weight.cpu(), SUPER_BLOCK), search)
            sub_min = None if fields.sub_min is None else fields.sub_min.reshape(n, -1)
            new.set_fields(fields.codes.reshape(weight.shape), fields.d, fields.dmin, fields.sub_scale.reshape(n, -1), sub_min)
        else:
            fields = block_fields(ggml_type, to_blocks(weight.cpu()))
            new.set_fields(fields.codes.reshape(weight.shape), fields.scale, fields.minimum)
        if module.bias is not None:
            new.bias.copy_(module.bias.detach())
        return new.to(module.weight.device)

    def set_fields(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None = None,
                   sub_scale: torch.Tensor | None = None, sub_min: torch.Tensor | None = None) -> GGMLLinear:  # fmt: skip
        """Store ggml's codes [N, K] (integer-valued), float16 d (and m / dmin) and, for K-quants, the integer
        sub-block scales (and minima) as they are."""
        if self.ggml_type in PACKED:
            self.weight_codes.copy_(kernels.pack_nibbles(codes.to(torch.uint8)))
        else:
            self.weight_codes.copy_((codes - CODE_OFFSET.get(self.ggml_type, 0)).to(torch.int8))
        self.weight_scale.copy_(scale)
        if hasattr(self, "weight_min"):
            self.weight_min.copy_(minimum)
        if hasattr(self, "weight_sub_scale"):
            self.weight_sub_scale.copy_(sub_scale.to(self.weight_sub_scale.dtype))
        if hasattr(self, "weight_sub_min"):
            self.weight_sub_min.copy_(sub_min.to(torch.uint8))
        self._kernel_state.clear()
        return self

    def codes(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """ggml's codes [rows, K]: uint8 0..15 (Q4_0 / Q4_1 / Q4_K), int16 0..31 (Q5_0), int8 (Q8_0, Q6_K)."""
        stored = self.weight_codes[start:end]
        if self.ggml_type in PACKED:
            return kernels.unpack_nibbles(stored)
        offset = CODE_OFFSET.get(self.ggml_type, 0)
        return stored.to(torch.int16) + offset if offset else stored

    def dequantized_weight(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """float32 weight rows [start, end)."""
        codes = self.codes(start, end)
        rows = codes.shape[0]
        if self.ggml_type in K_QUANTS:
            return k_values(self.ggml_type, self._k_fields(codes, start, end)).reshape(rows, -1)
        blocks = codes.reshape(rows, -1, BLOCK_SIZE)
        minimum = self.weight_min[start:end] if self.ggml_type == "q4_1" else None
        return block_values(self.ggml_type, blocks, self.weight_scale[start:end], minimum).reshape(rows, -1)

    def _k_fields(self, codes: torch.Tensor, start: int, end: int | None) -> KFields:
        rows, supers = codes.shape[0], self.in_features // SUPER_BLOCK
        sub = lambda name: getattr(self, name)[start:end].reshape(rows, supers, -1) if hasattr(self, name) else None  # noqa: E731
        dmin = self.weight_min[start:end] if hasattr(self, "weight_min") else None
        return KFields(codes.reshape(rows, supers, SUPER_BLOCK), self.weight_scale[start:end], dmin,
                       sub("weight_sub_scale"), sub("weight_sub_min"))  # fmt: skip

    def dequantize_weight(self) -> torch.Tensor:
        """The whole weight [out, in] in float32."""
        return self.dequantized_weight()

    def packed_fits(self) -> bool:
        return False

    def run_packed(self, rows: torch.Tensor) -> torch.Tensor:
        raise ConfigError("GGMLLinear has no packed kernel")

    # ---- native kernels ---------------------------------------------------------------------------------------
    def _kernel_fields(self) -> tuple[str, int, torch.Tensor, torch.Tensor | None]:
        """(kernel kind, group, float32 scale per group, float32 minimum per group or None), kept until the
        buffers change; Q4_0's kind is int4_linear's (zero point 8, see :meth:`_q4_0_zero_point`)."""
        return self.derived("ggml_native", self._build_kernel_fields)

    def _build_kernel_fields(self):
        kind = {"q4_0": "int4_zero", "q4_1": "int4_min", "q4_k": "int4_min"}.get(self.ggml_type, "int8_group")
        if self.ggml_type not in K_QUANTS:
            minimum = self.weight_min.float().contiguous() if self.ggml_type == "q4_1" else None
            return kind, BLOCK_SIZE, self.weight_scale.float().contiguous(), minimum
        group = SUB_BLOCKS[self.ggml_type]
        per_group = lambda field, sub: (field.float().unsqueeze(-1) * sub.float().reshape(*field.shape, -1)).reshape(  # noqa: E731
            field.shape[0], -1).contiguous()  # fmt: skip
        scale = per_group(self.weight_scale, self.weight_sub_scale)
        minimum = -per_group(self.weight_min, self.weight_sub_min) if self.ggml_type == "q4_k" else None
        return kind, group, scale, minimum

    def _q4_0_zero_point(self) -> torch.Tensor:
        shape, device = self.weight_scale.shape, self.weight_scale.device
        return self.derived("q4_0_zero_point", lambda: torch.full(shape, 8, dtype=torch.uint8, device=device))

    def native_weight_rows(self, start: int, end: int) -> torch.Tensor | None:
        kind, group, scale, minimum = self._kernel_fields()
        zero_point = self._q4_0_zero_point()[start:end] if kind == "int4_zero" else None
        return native_linear.weight_rows(kind, self.weight_codes[start:end], scale[start:end], zero_point=zero_point,
                                         minimum=None if minimum is None else minimum[start:end], group=group)  # fmt: skip

    def run_native(self, rows: torch.Tensor) -> torch.Tensor | None:
        kind, group, scale, minimum = self._kernel_fields()
        if kind == "int4_zero":
            return native_linear.int4_linear(rows, self.weight_codes, self._q4_0_zero_point(), scale, self.bias, group)
        return native_linear.ggml_linear(rows, self.weight_codes, scale, minimum, self.bias, kind, group)


# ---- ggml's block bytes ---------------------------------------------------------------------------------------
def _fields(module: GGMLLinear) -> dict[str, np.ndarray]:
    numpy = lambda t: t.detach().cpu().numpy()  # noqa: E731
    fields = {"codes": numpy(module.codes()).astype(np.int16), "d": numpy(module.weight_scale)}
    for key, name in (("m", "weight_min"), ("sub_scale", "weight_sub_scale"), ("sub_min", "weight_sub_min")):
        if hasattr(module, name):
            fields[key] = numpy(getattr(module, name)).astype(np.int16 if key.startswith("sub") else np.float16)
    return fields


def ggml_block_bytes(module: GGMLLinear) -> np.ndarray:
    """The module's weight as ggml stores it: uint8 [N, K / block * block bytes] (a GGUF file's tensor data)."""
    return _ggml_bytes.pack(module.ggml_type, _fields(module))


def fields_from_block_bytes(ggml_type: str, data: np.ndarray, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The fields of ggml's block bytes for a [N, K] weight (``lowbit.formats._ggml_bytes``)."""
    return _ggml_bytes.unpack(_check_type(ggml_type), data, shape)


def from_block_bytes(ggml_type: str, data: np.ndarray, shape: tuple[int, int], bias: torch.Tensor | None = None,
                     compute_dtype: str | None = None) -> GGMLLinear:  # fmt: skip
    """A GGMLLinear holding ggml's block bytes of a [N, K] weight exactly."""
    fields = fields_from_block_bytes(ggml_type, data, shape)
    new = GGMLLinear(shape[1], shape[0], bias is not None, ggml_type, compute_dtype)
    if bias is not None:
        new.bias.copy_(bias.detach())
    tensor = lambda key: None if key not in fields else torch.from_numpy(np.ascontiguousarray(fields[key]))  # noqa: E731
    return new.set_fields(tensor("codes"), tensor("d"), tensor("m"), tensor("sub_scale"), tensor("sub_min"))
