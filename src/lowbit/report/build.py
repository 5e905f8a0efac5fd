"""Turn accumulated statistics into the report's plain-dict rows: one per layer, one for the whole model.

Every value is a str, int, float (inf / NaN allowed in memory; report.json spells them "inf", "-inf",
"nan"), bool, None, list or dict, so a report round-trips through JSON. The schema is in docs/report.md.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from lowbit.nn.roles import ROLES
from lowbit.report.metrics import dtype_bits, storage_bits_per_element, storage_bytes
from lowbit.report.stats import LayerStats

SCHEMA = "lowbit.report/1"
FP32_BITS = 32


def layer_row(stats: LayerStats) -> dict[str, Any]:
    """The report row of one layer (see docs/report.md for every field)."""
    layer = stats.layer
    roles = {role: _role_entry(stats, role) for role in ROLES if _has_role(stats, role)}
    stored = {role: stats.parameters[role] for role in roles if role in stats.parameters}
    shares = [entry["clamped_share"] for entry in roles.values() if entry["clamped_share"] is not None]
    return {
        "name": layer.name, "op": layer.op, "kind": layer.kind, "module": layer.module_path,
        "formats": layer.formats.describe(), "bypass": layer.formats.bypass, "roles": roles,
        "parameters": sum(p.numel() for p in stored.values()),
        "bytes": sum(storage_bytes(roles[r]["bits_per_element"], p.numel()) for r, p in stored.items()),
        "fp32_bytes": sum(storage_bytes(FP32_BITS, p.numel()) for p in stored.values()),
        "sqnr_db": stats.output.sqnr_db, "relative_error": stats.output.relative_error,
        "local_sqnr_db": stats.local.sqnr_db, "local_relative_error": stats.local.relative_error,
        "clamped_share": max(shares) if shares else None,
        "output_elements": stats.output.elements, "nonfinite_outputs": stats.output.nonfinite,
        "float_nonfinite_outputs": stats.output.float_nonfinite, "calls": stats.calls,
    }  # fmt: skip


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
    it, in its own dtype otherwise; against fp32 (32 bits each). Tied parameters count once."""
    specs = {id(p): getattr(s.layer.formats, role) for s in all_stats for role, p in s.parameters.items()}
    count = quantized = total_bytes = fp32_bytes = 0
    total_bits = 0.0
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
