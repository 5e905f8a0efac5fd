"""Fake-quant ``QuantLinear`` -> real-quantized module, where a kernel computes the same formats.

The weight codes come from the weight format's own scales (``Affine.scale_and_zero_point``), so the real
module's weight values equal the fake-quantized weight exactly; activations are quantized by the real
module's dynamic or static rule, which matches the ``affine`` format's grid (the fake-quant per-token scale
is rounded to 16 significant bits, the real one is not: outputs agree to about 1e-5 relative).
"""

from __future__ import annotations

import torch
from torch import nn

from lowbit.ops.format_weight import PACKED_WEIGHT_FORMATS, FormatWeightLinear
from lowbit.ops.ggml import BLOCKS as GGML_BLOCKS
from lowbit.ops.ggml import GGMLLinear
from lowbit.ops.int4 import Int4WeightOnlyLinear
from lowbit.ops.dynamic import Int8DynamicLinear
from lowbit.ops.modules import Int8WeightOnlyLinear, W8A8StaticLinear


def _plain_affine(spec, bits: int, scale_dtypes: tuple[str, ...] = ("f32",)) -> str | None:
    """Why ``spec`` is not a plain ``bits``-bit affine format a kernel can run (None: it is)."""
    if spec is None:
        return "no format"
    if spec.format_name != "affine":
        return f"format {spec.format_name!r} (kernels run affine integer codes)"
    if spec.bits != bits:
        return f"{spec.bits}-bit codes (kernel: {bits}-bit)"
    if spec.rounding != "nearest_even" or spec.power_of_two or spec.scale_dtype not in scale_dtypes:
        return f"rounding / power_of_two / scale_dtype other than nearest_even / False / {' or '.join(scale_dtypes)}"
    return None


def _weight_kind(spec) -> tuple[str | None, str]:
    """("int8" | "int4" | "gguf" | "codes", group size, ggml type or '') or (None, why)."""
    if spec is not None and spec.format_name.startswith("gguf_"):
        return "gguf", spec.ggml_type
    if spec is not None and spec.format_name in PACKED_WEIGHT_FORMATS:
        return "codes", ""
    if _plain_affine(spec, 8) is None and spec.symmetric and spec.signed and spec.scale is None:
        if spec.axis in (0, -2) and spec.block_size is None:
            return "int8", ""
    why4 = _plain_affine(spec, 4, ("f32", "bf16", "f16"))  # int4 modules store bf16 / f16 scales as they are
    if why4 is None and spec.scale is None and spec.axis is None and spec.block_size is not None:
        block = tuple(spec.block_size)
        if len(block) == 2 and block[0] == 1 and block[1] > 1:
            return "int4", str(block[1])
    return None, (f"weight {spec.describe() if spec is not None else 'float'} has no kernel "
                  "(kernels: affine 8-bit symmetric axis=0, affine 4-bit block_size [1, g], every gguf_* type; "
                  f"packed codes rebuilt per call: {' / '.join(PACKED_WEIGHT_FORMATS)})")


def _data_kind(spec) -> tuple[str | None, str]:
    """("none" | "token" | "tensor" | "static", "") or (None, why)."""
    if spec is None:
        return "none", ""
    if spec.format_name != "affine":
        return None, f"data_in: {_plain_affine(spec, 8)}"
    dynamic = spec.scale is None and spec.axis is None and tuple(spec.block_size or ()) in ((1, -1), ())
    # 7-bit dynamic codes run on the same kernels (one exact fbgemm call on CPUs without VNNI)
    why = _plain_affine(spec, 7 if dynamic and getattr(spec, "bits", 8) == 7 else 8)
    if why is not None:
        return None, f"data_in: {why}"
    if dynamic:
        if spec.symmetric and not spec.signed:
            return None, "data_in: unsigned symmetric dynamic codes have no kernel"
        if not spec.block_size and (spec.symmetric or spec.bits != 8):
            return None, "data_in: per-tensor dynamic codes run as asymmetric 8-bit (symmetric=False, bits=8) only"
        return ("token" if spec.block_size else "tensor"), ""
    if spec.scale is not None and len(spec.scale) == 1 and len(spec.zero_point or (0,)) == 1 and not spec.narrow_range:
        return "static", ""
    return None, "data_in: only per-token dynamic (block_size [1, -1]) or per-tensor static 8-bit affine have kernels"


def convert_quant_linear(module, compute_dtype: str | None = None) -> tuple[nn.Module | None, str]:
    """The real module computing what ``module`` (a QuantLinear) computes, or (None, why not);
    ``compute_dtype`` is the weight-only modules' option."""
    formats = module.formats
    if formats.bypass or formats.bias is not None or formats.data_out is not None:
        return None, "bias / data_out formats or bypass have no kernel"
    weight, detail = _weight_kind(formats.weight)
    if weight is None:
        return None, detail
    data, why = _data_kind(formats.data_in)
    if data is None:
        return None, why
    if weight == "codes":
        if data != "none":
            return None, f"{formats.weight.format_name} weights run weight-only (data_in must have no format)"
        return FormatWeightLinear.from_float(module, formats.weight, compute_dtype), ""
    if weight == "gguf":
        if data != "none":
            return None, "ggml block weights run weight-only (data_in must have no format)"
        block = GGML_BLOCKS[detail]
        if module.in_features % block:
            return None, f"in_features={module.in_features} is not a multiple of {detail.upper()}'s block of {block}"
        return GGMLLinear.from_float(module, detail, compute_dtype, getattr(formats.weight, "search", True)), ""
    if weight == "int4":
        if data != "none":
            return None, "4-bit weights run weight-only (data_in must have no format)"
        if module.in_features % int(detail):
            return None, f"in_features={module.in_features} is not a multiple of the weight's group {detail}"
        return _int4(module, int(detail), compute_dtype), ""
    codes, scale = _int8_weight(module)
    if data == "none":
        return Int8WeightOnlyLinear.from_float(module, codes=codes, scale=scale, compute_dtype=compute_dtype), ""
    if data in ("token", "tensor"):
        spec = formats.data_in
        return Int8DynamicLinear.from_float(module, codes=codes, scale=scale, act_symmetric=spec.symmetric,
                                            act_granularity=data, act_bits=spec.bits), ""  # fmt: skip
    spec = formats.data_in
    new = W8A8StaticLinear.from_float(module, codes=codes, scale=scale, act_signed=spec.signed)
    return new.set_input_qparams(spec.scale[0], (spec.zero_point or (0,))[0]), ""


def _int8_weight(module) -> tuple[torch.Tensor, torch.Tensor]:
    spec = module.formats.weight
    weight = module.weight.detach().float()
    scale = spec.scale_and_zero_point(weight).scale[:, 0]  # [N]
    q_min, q_max = spec.clamp_range
    codes = torch.round(weight * (1.0 / scale.reshape(-1, 1))).clamp(q_min, q_max).to(torch.int8)
    return codes, scale


def _int4(module, group_size: int, compute_dtype: str | None) -> Int4WeightOnlyLinear:
    spec = module.formats.weight
    weight = module.weight.detach().float()
    params = spec.scale_and_zero_point(weight)
    scale = params.scale[:, ::group_size].contiguous()  # [N, K / g]
    zero_point = params.zero_point[:, ::group_size]
    q_min, q_max = spec.clamp_range
    steps = torch.round(weight * (1.0 / params.scale))
    offset = -q_min  # codes to 0..15
    codes = (steps + params.zero_point).clamp(q_min, q_max) + offset
    scale_dtype = spec.scale_dtype if spec.scale_dtype in ("bf16", "f16") else "f32"  # stored as rounded
    return Int4WeightOnlyLinear.from_float(
        module, group_size=group_size, scale_dtype=scale_dtype, codes=codes.to(torch.uint8),
        scale=scale, zero_point=(zero_point + offset).to(torch.uint8), compute_dtype=compute_dtype,
    )  # fmt: skip
