"""Turn accumulated statistics into the report's plain-dict rows: one per layer, one for the whole model.

Every value is a str, int, float (inf / NaN allowed in memory; report.json spells them "inf", "-inf",
"nan"), bool, None, list or dict, so a report round-trips through JSON. The schema is in docs/report.md.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
from typing import Any

import torch
from torch import nn

from lowbit.nn.roles import ROLES
from lowbit.report import real
from lowbit.report.metrics import dtype_bits, storage_bits_per_element, storage_bytes
from lowbit.report.stats import LayerStats

SCHEMA = "lowbit.report/1"
FP32_BITS = 32


def layer_row(stats: LayerStats) -> dict[str, Any]:
    """The report row of one layer (see docs/report.md for every field)."""
    layer = stats.layer
    if layer.kind == "real":
        return _real_row(stats)
    roles = {role: _role_entry(stats, role) for role in ROLES if _has_role(stats, role)}
    stored = {role: stats.parameters[role] for role in roles if role in stats.parameters}
    return {
        "name": layer.name, "op": layer.op, "kind": layer.kind, "module": layer.module_path,
        "formats": layer.formats.describe(), "bypass": layer.formats.bypass, "roles": roles,
        "parameters": sum(p.numel() for p in stored.values()),
        "bytes": sum(storage_bytes(roles[r]["bits_per_element"], p.numel()) for r, p in stored.items()),
        "fp32_bytes": sum(storage_bytes(FP32_BITS, p.numel()) for p in stored.values()),
        **_measured(stats, roles),
    }  # fmt: skip


def _real_row(stats: LayerStats) -> dict[str, Any]:
    """A real-quantized layer: bits and bytes read from its buffers (codes, scales, zero points)."""
    layer, module, twin = stats.layer, stats.layer.module, stats.layer.float_module
    weight = twin.weight
    roles = {
        "data_in": _real_role(stats, "data_in", real.input_format(module) or "float",
                              real.input_bits_per_element(module, stats.shapes.get("data_in", (1,)))),
        "weight": _real_role(stats, "weight", real.weight_format(module),
                             real.weight_bits_per_element(module, weight.numel()), stored=True),
    }  # fmt: skip
    if twin.bias is not None:
        roles["bias"] = {"format": "float", "bits_per_element": float(FP32_BITS), "shape": list(twin.bias.shape),
                         "stored": True, "clamped_share": None}  # fmt: skip
    count = weight.numel() + (twin.bias.numel() if twin.bias is not None else 0)
    return {
        "name": layer.name, "op": layer.op, "kind": "real", "module": layer.module_path,
        "formats": real.describe(module), "bypass": False, "roles": roles, "parameters": count,
        "bytes": real.stored_bytes(module), "fp32_bytes": storage_bytes(FP32_BITS, count),
        **_measured(stats, roles),
    }  # fmt: skip


def _measured(stats: LayerStats, roles: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The row fields every layer kind shares: output error, clamping, element counts, calls."""
    shares = [entry["clamped_share"] for entry in roles.values() if entry["clamped_share"] is not None]
    return {
        "sqnr_db": stats.output.sqnr_db, "relative_error": stats.output.relative_error,
        "local_sqnr_db": stats.local.sqnr_db, "local_relative_error": stats.local.relative_error,
        "clamped_share": max(shares) if shares else None,
        "output_elements": stats.output.elements, "nonfinite_outputs": stats.output.nonfinite,
        "float_nonfinite_outputs": stats.output.float_nonfinite, "calls": stats.calls, "latency": None,
    }  # fmt: skip


def _real_role(stats: LayerStats, role: str, described: str, bits: float, stored: bool = False) -> dict[str, Any]:
    shape = stats.shapes.get(role)
    return {"format": described, "bits_per_element": float(bits), "shape": list(shape) if shape else None,
            "stored": stored, "clamped_share": stats.clamps.share(role)}  # fmt: skip


def header(fields: dict[str, str], rows: list[dict[str, Any]]) -> dict[str, str]:
    """The page header: the caller's fields (model, dataset, config, checkpoint, ...), then what lowbit
    knows itself: how the layers compute and the versions that produced the numbers."""
    known = {"quantization": model_kind(rows), "lowbit": _lowbit_version(),
             "torch": torch.__version__, "python": platform.python_version()}  # fmt: skip
    return {**fields, **{key: value for key, value in known.items() if key not in fields}}


def _lowbit_version() -> str:
    try:
        return importlib.metadata.version("lowbit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def model_kind(rows: list[dict[str, Any]]) -> str:
    """"simulated", "real" or "mixed": how the quantized layers compute."""
    kinds = {"real" if row["kind"] == "real" else "simulated" for row in rows}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _has_role(stats: LayerStats, role: str) -> bool:
    return getattr(stats.layer.formats, role) is not None or role in stats.parameters


def _role_entry(stats: LayerStats, role: str) -> dict[str, Any]:
    spec = getattr(stats.layer.formats, role)
    shape = stats.shapes.get(role)
    parameter = stats.parameters.get(role)
    float_bits = dtype_bits(parameter) if parameter is not None else FP32_BITS
    if shape is None:  # a role the op never handed a tensor (a linear without bias, say)
        bits = float(spec.bits_per_element()) if spec is not None else float(float_bits)
    else:
        bits = storage_bits_per_element(spec, shape, float_bits)
    return {
        "format": spec.describe() if spec is not None else "float", "bits_per_element": bits,
        "shape": list(shape) if shape is not None else None, "stored": parameter is not None,
        "clamped_share": stats.clamps.share(role),
    }  # fmt: skip


def model_summary(model: nn.Module, all_stats: list[LayerStats]) -> dict[str, Any]:
    """Storage of every parameter of the quantized model: in its role's format where a layer quantizes
    it, in its own dtype otherwise; a real layer's every stored buffer (in place of the float parameters it
    replaced); against fp32 (32 bits each). Tied parameters count once."""
    specs = {id(p): getattr(s.layer.formats, role) for s in all_stats for role, p in s.parameters.items()}
    count = quantized = total_bytes = fp32_bytes = 0
    total_bits = 0.0
    for layer_stats in all_stats:
        if layer_stats.layer.kind != "real":
            continue
        twin, stored = layer_stats.layer.float_module, real.stored_bytes(layer_stats.layer.module)
        numel = sum(p.numel() for p in twin.parameters(recurse=False))
        count, quantized = count + numel, quantized + twin.weight.numel()
        total_bits, total_bytes = total_bits + 8 * stored, total_bytes + stored
        fp32_bytes += storage_bytes(FP32_BITS, numel)
    for parameter in model.parameters():
        spec = specs.get(id(parameter))
        bits = storage_bits_per_element(spec, tuple(parameter.shape), dtype_bits(parameter))
        count += parameter.numel()
        quantized += parameter.numel() if spec is not None else 0
        total_bits += bits * parameter.numel()
        total_bytes += storage_bytes(bits, parameter.numel())
        fp32_bytes += storage_bytes(FP32_BITS, parameter.numel())
    return {
        "parameters": count, "quantized_parameters": quantized, "total_bytes": total_bytes,
        "fp32_bytes": fp32_bytes, "compression": fp32_bytes / total_bytes if total_bytes else math.nan,
        "average_bits_per_weight": total_bits / count if count else math.nan,
    }  # fmt: skip
