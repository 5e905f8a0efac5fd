"""What the report needs to know about a real-quantized layer (``lowbit.ops.REAL_MODULES``).

A real layer holds integer codes, scales and zero points in buffers and computes with integer kernels. The
report reads everything from those buffers, never from a format spec that might round differently:

- bits per element of the weight: every bit the module stores for it (codes, scales, zero points) divided by
  the weight's element count, so int4 with bf16 group scales and uint8 zero points at group 32 is
  4 + (16 + 8) / 32 = 4.75;
- bits per element of the input: the code width plus the scales / zero points it needs (per token: one
  float32 scale, and an offset when centred, per row; per tensor: one scale and one 8-bit zero point), or 32
  (float) for weight-only layers;
- clamped share of the weight: elements whose dequantized value lies more than half a step from the float
  weight (so the range, not rounding, decided their code: what int4's range search trades); of a static
  input: elements beyond the calibrated range by more than half a step. Dynamic inputs are never clamped
  (their range is measured on each input);
- latency: the median of a few timed calls of the layer and of its float original on the same captured input.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn

from lowbit.ops import REAL_MODULES, Int4WeightOnlyLinear, Int8Conv2d, Int8DynamicLinear, W8A8StaticLinear

FLOAT_BITS = 32
_HALF_STEP_SLACK = 1.0 + 1e-6  # float rounding of codes * scale


def is_real(module: Any) -> bool:
    return isinstance(module, tuple(REAL_MODULES.values()))


def float_class(module: nn.Module) -> type[nn.Module]:
    """The float module a real layer replaces."""
    return nn.Conv2d if isinstance(module, Int8Conv2d) else nn.Linear


def op_name(module: nn.Module) -> str:
    return "conv2d" if isinstance(module, Int8Conv2d) else "linear"


# ---- descriptions ------------------------------------------------------------------------------------------
def weight_format(module: nn.Module) -> str:
    if isinstance(module, Int4WeightOnlyLinear):
        offset = f"{module.scale_dtype} minimum" if module.float_zero else "uint8 zero point"
        return f"uint4 asymmetric, groups of {module.group_size} ({module.scale_dtype} scale, {offset})"
    return "int8 symmetric per output channel (f32 scale)"


def input_format(module: nn.Module) -> str | None:
    """The input's quantization, or None (weight-only: the input stays float)."""
    if isinstance(module, Int8DynamicLinear):
        if module.act_granularity == "tensor":
            return "uint8 per tensor (dynamic)"
        centred = "symmetric" if module.act_symmetric else "centred"
        return f"int{module.act_bits} {centred} per token (dynamic)"
    static = isinstance(module, W8A8StaticLinear) or getattr(module, "activation", None) == "static"
    if static:
        scale, zero = float(module.input_scale), int(module.input_zero_point)
        kind = "int8" if module.act_signed else "uint8"
        return f"{kind} per tensor (static, scale {scale:.4g}, zero point {zero})"
    if isinstance(module, Int8Conv2d):
        return "uint8 per tensor (dynamic)"
    return None


def describe(module: nn.Module) -> str:
    parts = [f"weight: {weight_format(module)}"]
    data_in = input_format(module)
    if data_in is not None:
        parts.append(f"data_in: {data_in}")
    algorithm = algorithm_text(module)
    if algorithm:
        parts.append(algorithm)
    return f"{type(module).__name__} ({', '.join(parts)})"


def algorithm_text(module: nn.Module) -> str:
    """What chose the codes, from the module's saved record: "by gptq (damping 0.1, ...; grid span mean 0.93,
    min 0.7)", or "" for a module without one."""
    record = dict(getattr(module, "algorithm", None) or {})
    method = record.pop("method", None)
    if method is None:
        return ""
    spans = [f"{key.replace('_', ' ')} {record.pop(key)}" for key in ("grid_span_mean", "grid_span_min") if key in record]
    options = [f"{key.replace('_', ' ')} {value}" for key, value in record.items()]
    detail = "; ".join(part for part in (", ".join(options), ", ".join(spans)) if part)
    return f"by {method}" + (f" ({detail})" if detail else "")


# ---- storage -----------------------------------------------------------------------------------------------
def weight_buffers(module: nn.Module) -> list[torch.Tensor]:
    names = ("weight_codes", "weight_scale", "weight_zero_point", "weight_min")
    return [getattr(module, name) for name in names if getattr(module, name, None) is not None]


def stored_bytes(module: nn.Module) -> int:
    """Every byte the module stores: codes, scales, zero points, bias, calibrated input parameters."""
    return sum(buffer.numel() * buffer.element_size() for buffer in module.buffers())


def weight_bits_per_element(module: nn.Module, weight_numel: int) -> float:
    bits = sum(buffer.numel() * buffer.element_size() * 8 for buffer in weight_buffers(module))
    return bits / weight_numel


def input_bits_per_element(module: nn.Module, shape: tuple[int, ...]) -> float:
    """Code bits plus the per-row or per-tensor parameters, per input element (32 for a float input)."""
    numel = max(1, int(torch.Size(shape).numel()))
    if input_format(module) is None:
        return float(FLOAT_BITS)
    if isinstance(module, Int8DynamicLinear) and module.act_granularity == "token":
        per_row = FLOAT_BITS * (1 if module.act_symmetric else 2)  # scale (+ float offset)
        return module.act_bits + per_row / shape[-1]
    return 8.0 + (FLOAT_BITS + 8) / numel  # one scale, one 8-bit zero point


# ---- weights -----------------------------------------------------------------------------------------------
def dequantized_weight(module: nn.Module) -> torch.Tensor:
    """float32 weight rebuilt from the codes, in the float module's shape."""
    if isinstance(module, Int8Conv2d):
        return module.weight_codes.float() * module.weight_scale.reshape(-1, 1, 1, 1)
    return module.dequantized_weight()


def weight_steps(module: nn.Module) -> torch.Tensor:
    """The quantization step of every weight element (broadcastable to the weight)."""
    if isinstance(module, Int4WeightOnlyLinear):
        return module.weight_scale.float().repeat_interleave(module.group_size, dim=1)
    shape = (-1,) + (1,) * (module.weight_codes.dim() - 1)
    return module.weight_scale.float().reshape(shape)


def weight_clamped(module: nn.Module, float_weight: torch.Tensor) -> int:
    """Weight elements more than half a step from their dequantized value (the range clipped them)."""
    error = (dequantized_weight(module) - float_weight.detach().float()).abs()
    return int((error > weight_steps(module) * 0.5 * _HALF_STEP_SLACK).sum())


def weight_grid(module: nn.Module) -> torch.Tensor:
    values = dequantized_weight(module).reshape(-1).double()
    return torch.unique(values[torch.isfinite(values)])


# ---- inputs ------------------------------------------------------------------------------------------------
def input_limits(module: nn.Module) -> tuple[float, float] | None:
    """Half a step beyond the calibrated range of a static input, or None (dynamic / float input)."""
    if not hasattr(module, "input_scale") or input_format(module) is None:
        return None
    scale, zero = float(module.input_scale), int(module.input_zero_point)
    low, high = (-128, 127) if module.act_signed else (0, 255)
    return (low - zero - 0.5) * scale, (high - zero + 0.5) * scale


def input_grid(module: nn.Module) -> torch.Tensor | None:
    """The representable values of a static input (every code times the scale)."""
    if input_limits(module) is None:
        return None
    scale, zero = float(module.input_scale), int(module.input_zero_point)
    low, high = (-128, 127) if module.act_signed else (0, 255)
    return (torch.arange(low, high + 1, dtype=torch.float64) - zero) * scale


def input_clamped(module: nn.Module, x: torch.Tensor) -> int:
    limits = input_limits(module)
    if limits is None or not x.is_floating_point():
        return 0
    outside = (x < limits[0]) | (x > limits[1])
    return int((outside & torch.isfinite(x)).sum())


# ---- latency -----------------------------------------------------------------------------------------------
def median_milliseconds(module: nn.Module, args: tuple, kwargs: dict[str, Any], runs: int) -> float:
    """Median wall time of ``runs`` calls (after one warm-up call), in milliseconds."""
    device = next((b.device for b in module.buffers()), None) or next((p.device for p in module.parameters()), None)
    synchronize = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
    module(*args, **kwargs)
    times = []
    for _ in range(runs):
        synchronize()
        start = time.perf_counter()
        module(*args, **kwargs)
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def latency(module: nn.Module, float_module: nn.Module, args: tuple, kwargs: dict[str, Any], runs: int) -> dict:
    """{"ms", "fp32_ms", "speedup"} of the real layer against its float original on one captured input."""
    real_ms = median_milliseconds(module, args, kwargs, runs)
    float_ms = median_milliseconds(float_module, args, kwargs, runs)
    return {"ms": real_ms, "fp32_ms": float_ms, "speedup": float_ms / real_ms if real_ms > 0 else None,
            "runs": runs, "input_shape": list(args[0].shape) if args and hasattr(args[0], "shape") else None}  # fmt: skip
