"""ONNX stand-ins for real-quantized modules (``lowbit.ops.REAL_MODULES``): their own integer codes and scales.

Before export every real module is swapped for a small module that computes the same numbers with ops ONNX
has, holding the real module's codes (never re-quantizing a float weight):

- weight-only (``Int8WeightOnlyLinear``, ``Int4WeightOnlyLinear``): DequantizeLinear of the weight codes
  (int8 per output channel; 4-bit codes unpacked to one uint8 each with their group scales and zero points,
  ``block_size`` = the group) -> float MatMul / Gemm. The dequantized weight is lowbit's bit for bit.
- static activations (``W8A8StaticLinear``, ``Int8Conv2d(activation="static")``): QuantizeLinear ->
  DequantizeLinear of the input with its calibrated scale and zero point, DequantizeLinear of the weight
  codes, float Gemm / Conv: the QDQ pattern ONNX Runtime fuses into its integer QGemm / QLinearConv.
- dynamic activations (``Int8DynamicLinear``, ``Int8Conv2d(activation="dynamic")``): the input's codes are
  computed in the graph with lowbit's own float operations (per-token max |x| / 127 and x * (1 / scale); or
  the per-tensor uint8 range), then MatMulInteger / ConvInteger give the exact int32 sums and the rescaling
  (scale x weight scale, + offset x weight sums, + bias) runs in float64 as in the modules' reference path:
  ONNX Runtime's own dynamic-quantization form (QDQ has no per-input scale that its kernels fuse).

Every integer weight is stored as uint8 with its zero point moved by 128 (see onnx_export's module doc: the
exact u8u8 kernels of ONNX Runtime on every x86 CPU); activation codes of the dynamic form likewise.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lowbit.ops import REAL_MODULES, Int4WeightOnlyLinear, Int8Conv2d, Int8DynamicLinear, Int8WeightOnlyLinear
from lowbit.ops import W8A8StaticLinear
from lowbit.export._errors import ExportError
from lowbit.ops.quant import token_codes

SHIFT = 128  # signed codes c are stored as the uint8 c + 128 with zero point 128


def is_real(module: Any) -> bool:
    return isinstance(module, tuple(REAL_MODULES.values()))


def _shifted(codes: torch.Tensor) -> torch.Tensor:
    return (codes.to(torch.int16) + SHIFT).to(torch.uint8)


def _weight_dq(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """(uint8 codes, float32 scale, uint8 zero point, axis, block size) of the weight's DequantizeLinear."""
    if isinstance(module, Int4WeightOnlyLinear):
        return (module.codes().contiguous(), module.weight_scale.float().contiguous(),
                module.weight_zero_point.contiguous(), 1, module.group_size)  # fmt: skip
    channels = module.weight_scale.numel()
    zero = torch.full((channels,), SHIFT, dtype=torch.uint8, device=module.weight_codes.device)
    return _shifted(module.weight_codes).contiguous(), module.weight_scale.float().contiguous(), zero, 0, 0


class _Exported(nn.Module):
    """Base: the real module's buffers copied under export names."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        codes, scale, zero, self.axis, self.block_size = _weight_dq(module)
        self.register_buffer("weight_codes", codes)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("weight_zero_point", zero)
        self.register_buffer("bias", None if module.bias is None else module.bias.detach().float().clone())
        if getattr(module, "input_scale", None) is not None:
            signed = bool(module.act_signed)
            self.register_buffer("input_scale", module.input_scale.detach().float().reshape(()).clone())
            self.register_buffer("input_zero_point", module.input_zero_point.to(torch.int8 if signed else torch.uint8)
                                 .reshape(()).clone())  # fmt: skip

    def weight(self) -> torch.Tensor:
        return torch.ops.lowbit_onnx.dq(self.weight_codes, self.weight_scale, self.weight_zero_point, self.axis,
                                        self.block_size)  # fmt: skip

    def static_input(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.lowbit_onnx.qdq(x, self.input_scale, self.input_zero_point, 0, -1)


class _FloatLinear(_Exported):
    """Weight-only and static Linear: (QDQ input ->) DequantizeLinear weight -> Gemm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "input_scale"):
            x = self.static_input(x)
        return F.linear(x, self.weight(), self.bias)


class _FloatConv(_Exported):
    """Static Int8Conv2d: QDQ input -> DequantizeLinear weight -> Conv."""

    def __init__(self, module: Int8Conv2d) -> None:
        super().__init__(module)
        self.geometry = (module.stride, module.padding, module.dilation, module.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(self.static_input(x), self.weight(), self.bias, *self.geometry)


class _DynamicLinear(_Exported):
    """Int8DynamicLinear: the input's codes as lowbit computes them, MatMulInteger, float64 rescaling."""

    def __init__(self, module: Int8DynamicLinear) -> None:
        super().__init__(module)
        self.symmetric, self.q_max, self.per_token = module.act_symmetric, module.q_max, module.act_granularity == "token"
        self.in_features, self.out_features = module.in_features, module.out_features
        self.register_buffer("weight_codes_t", self.weight_codes.t().contiguous())  # [K, N] for MatMulInteger
        sums = module.weight_codes.sum(1, dtype=torch.int64).float() * module.weight_scale  # as the module's
        self.register_buffer("weight_sums", sums.double())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        if self.per_token:
            token = token_codes(rows, self.symmetric, self.q_max)
            codes, zero_point, scale, offset = _shifted(token.codes), SHIFT, token.scale, token.offset
        else:
            scale, zero_point = _uint8_range(rows)
            codes, offset = _uint8_codes(rows, scale, zero_point), None
        acc = torch.ops.lowbit_onnx.matmul_integer(codes, self.weight_codes_t, _zero(zero_point, rows),
                                                   self.weight_zero_point[:1].reshape(()))  # fmt: skip
        # int32 -> int64 -> float64: ONNX Runtime would fuse a direct cast into MatMulIntegerToFloat (float32 only)
        real = acc.long().double() * (scale.double() * self.weight_scale.double())
        if offset is not None:
            real = real + offset.double() * self.weight_sums
        if self.bias is not None:
            real = real + self.bias.double()
        return real.float().reshape(*x.shape[:-1], self.out_features)


class _DynamicConv(_Exported):
    """Dynamic Int8Conv2d: the input's uint8 codes over its range, ConvInteger, float64 rescaling."""

    def __init__(self, module: Int8Conv2d) -> None:
        super().__init__(module)
        self.geometry = (list(module.stride), list(module.padding), list(module.dilation), module.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        scale, zero_point = _uint8_range(x)
        acc = torch.ops.lowbit_onnx.conv_integer(_uint8_codes(x, scale, zero_point), self.weight_codes, zero_point,
                                                 self.weight_zero_point[:1].reshape(()), *self.geometry)  # fmt: skip
        real = acc.double() * (scale.double() * self.weight_scale.double().reshape(1, -1, 1, 1))
        if self.bias is not None:
            real = real + self.bias.double().reshape(1, -1, 1, 1)
        return real.float()


def _uint8_range(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor uint8 scale and zero point over x's range widened to 0 (the modules' dynamic rule)."""
    low, high = x.min().clamp(max=0.0), x.max().clamp(min=0.0)
    scale = ((high - low) / 255.0).clamp(min=torch.finfo(torch.float32).eps)
    zero_point = (-torch.round(low / scale)).clamp(0, 255).to(torch.uint8)
    return scale, zero_point


def _uint8_codes(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    scaled = x * (1.0 / scale)
    return torch.round(torch.where(scaled == scaled, scaled, 0.0)).add(zero_point.float()).clamp(0, 255).to(torch.uint8)


def _zero(zero_point: Any, like: torch.Tensor) -> torch.Tensor:
    if isinstance(zero_point, torch.Tensor):
        return zero_point.reshape(())
    return torch.tensor(zero_point, dtype=torch.uint8, device=like.device)


# Real modules whose codes no ONNX operator that onnxruntime runs can hold: the answer when one is exported.
NO_ONNX = {"GGMLLinear": "llama.cpp's block codes (ggml types have no ONNX operator; lowbit.export_gguf writes them)"}


def stand_in(module: nn.Module, layer: str = "") -> tuple[nn.Module, dict[str, str]]:
    """The export module for a real module (``layer``: its name, for errors) and its role -> description (for
    OnnxExport.layers); ExportError for the modules ONNX cannot hold (``NO_ONNX``)."""
    name = type(module).__name__
    if getattr(module, "float_zero", False):
        raise ExportError(f"layer {layer!r}: an Int4WeightOnlyLinear with a float zero point (zero_point_domain="
                          "'float'): ONNX's DequantizeLinear takes integer zero points; quantize it with "
                          "zero_point_domain='int' to export ONNX")  # fmt: skip
    if name in NO_ONNX:
        raise ExportError(f"layer {layer!r}: a {name} holds {NO_ONNX[name]}: ONNX cannot express it; export the "
                          "float model, or the model quantized to a format ONNX holds (8-bit affine / integer, "
                          "int4 weight-only, e4m3 / e5m2)")  # fmt: skip
    if name == "FormatWeightLinear":  # onnxruntime runs no FP4 / table DequantizeLinear: a table and scales
        from lowbit.export.onnx_tables import TableLinear

        return TableLinear(module, layer), {"weight": f"{module.spec.format_name} codes (Gather x scale)"}
    if isinstance(module, (Int8WeightOnlyLinear, Int4WeightOnlyLinear)):
        return _FloatLinear(module), {"weight": f"{name} codes (DequantizeLinear)"}
    if isinstance(module, W8A8StaticLinear):
        return _FloatLinear(module), {"data_in": "static QDQ", "weight": f"{name} codes (DequantizeLinear)"}
    if isinstance(module, Int8DynamicLinear):
        return _DynamicLinear(module), {"data_in": f"dynamic {module.act_granularity} codes (MatMulInteger)",
                                        "weight": f"{name} codes (MatMulInteger)"}  # fmt: skip
    if isinstance(module, Int8Conv2d) and module.activation == "static":
        return _FloatConv(module), {"data_in": "static QDQ", "weight": f"{name} codes (DequantizeLinear)"}
    if isinstance(module, Int8Conv2d):
        return _DynamicConv(module), {"data_in": "dynamic tensor codes (ConvInteger)",
                                      "weight": f"{name} codes (ConvInteger)"}  # fmt: skip
    raise TypeError(f"no ONNX stand-in for {name}")


def replace_real_modules(model: nn.Module) -> dict[str, dict[str, str]]:
    """Swap every real module of ``model`` (a copy) for its stand-in; layer name -> role descriptions."""
    found = [(name, module) for name, module in model.named_modules() if is_real(module)]
    layers = {}
    for name, module in found:
        new, described = stand_in(module, name)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        layers[name] = described
    return layers


# ---- the integer marker ops and their ONNX translations ----------------------------------------------------------
@functools.cache
def real_ops() -> dict[Any, Any]:
    from onnxscript import opset21 as op

    @torch.library.custom_op("lowbit_onnx::matmul_integer", mutates_args=())
    def matmul_integer(a: torch.Tensor, b: torch.Tensor, a_zero: torch.Tensor, b_zero: torch.Tensor) -> torch.Tensor:
        return ((a.long() - a_zero.long()) @ (b.long() - b_zero.long())).to(torch.int32)

    @matmul_integer.register_fake
    def _(a, b, a_zero, b_zero):
        return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)

    @torch.library.custom_op("lowbit_onnx::conv_integer", mutates_args=())
    def conv_integer(x: torch.Tensor, w: torch.Tensor, x_zero: torch.Tensor, w_zero: torch.Tensor, stride: list[int],
                     padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:  # fmt: skip
        centred_x, centred_w = x.double() - x_zero.double(), w.double() - w_zero.double()  # sums exact in float64
        return F.conv2d(centred_x, centred_w, None, stride, padding, dilation, groups).round().to(torch.int32)

    @conv_integer.register_fake
    def _(x, w, x_zero, w_zero, stride, padding, dilation, groups):
        sizes = [(x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1
                 for i in range(2)]  # fmt: skip
        return x.new_empty((x.shape[0], w.shape[0], *sizes), dtype=torch.int32)

    def matmul_integer_onnx(a, b, a_zero, b_zero):
        return op.MatMulInteger(a, b, a_zero, b_zero)

    def conv_integer_onnx(x, w, x_zero, w_zero, stride, padding, dilation, groups: int):
        return op.ConvInteger(x, w, x_zero, w_zero, strides=stride, pads=[*padding, *padding], dilations=dilation,
                              group=groups)  # fmt: skip

    return {torch.ops.lowbit_onnx.matmul_integer.default: matmul_integer_onnx,
            torch.ops.lowbit_onnx.conv_integer.default: conv_integer_onnx}  # fmt: skip
