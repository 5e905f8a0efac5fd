"""Integer operators and real-quantized modules (see docs/real-execution.md).

- :mod:`lowbit.ops.quant`: ``quantize`` / ``dequantize`` / ``fake_quantize`` with given scales and zero
  points (per tensor, per channel, per group), any rounding mode; dynamic scale builders.
- :mod:`lowbit.ops.integer`, :mod:`lowbit.ops.conv`: nGraph-style ``quantized_linear`` /
  ``quantized_matmul`` / ``quantized_conv2d`` (exact integer accumulation, fused bias / ReLU / residual
  add, requantized or float output) and ``quantized_concat``; each with an int64 reference path and a
  ``torch._int_mm`` fast path that gives the same integers.
- :mod:`lowbit.ops.modules`, :mod:`lowbit.ops.int4`: Linear modules holding integer codes, with CPU
  kernels (fbgemm, int4pack, int8pack) checked against their reference paths; :data:`REAL_MODULES` maps
  class names to classes for ``lowbit.save`` / ``lowbit.load``.
- :mod:`lowbit.ops.ggml`: ``GGMLLinear``, weight-only on llama.cpp's Q4_0 / Q4_1 / Q8_0 block codes
  (the ``gguf_q4_0`` / ``gguf_q4_1`` / ``gguf_q8_0`` recipes, ``lowbit.load_gguf``, ``lowbit.export_gguf``).
- :mod:`lowbit.ops.format_weight`: ``FormatWeightLinear``, weight-only on the packed codes of formats no
  integer kernel runs (NVFP4, NF4, codebooks), rebuilt per call (``lowbit.convert.to_real``).
- :mod:`lowbit.ops.conv_modules`: ``Int8Conv2d`` (int8 weights, static or dynamic int8 activations; oneDNN
  fast path checked against an exact reference).
- :mod:`lowbit.ops.gptq`: GPTQ error-compensating rounding for the int4 weights
  (``quantize_model(..., "int4_weight_only", method="gptq")``).
"""

from lowbit.ops.conv import quantized_conv2d
from lowbit.ops.conv_modules import Int8Conv2d
from lowbit.ops.dynamic import Int8DynamicLinear
from lowbit.ops.format_weight import FormatWeightLinear
from lowbit.ops.ggml import GGMLLinear
from lowbit.ops.int4 import Int4WeightOnlyLinear
from lowbit.ops.integer import AffineCodes, quantized_concat, quantized_linear, quantized_matmul
from lowbit.ops.modules import (
    REAL_MODULES,
    Int8WeightOnlyLinear,
    RealQuantLinear,
    W8A8StaticLinear,
)
from lowbit.ops.quant import dequantize, fake_quantize, quantize

__all__ = [
    "REAL_MODULES", "AffineCodes", "FormatWeightLinear", "GGMLLinear", "Int4WeightOnlyLinear", "Int8Conv2d", "Int8DynamicLinear", "Int8WeightOnlyLinear",
    "RealQuantLinear", "W8A8StaticLinear", "dequantize", "fake_quantize", "quantize", "quantized_concat",
    "quantized_conv2d", "quantized_linear", "quantized_matmul",
]  # fmt: skip
