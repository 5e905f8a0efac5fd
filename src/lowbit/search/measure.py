"""Cost metrics of a plan, computed from shapes only (no forward pass per trial).

- ``weight_bits``: average stored bits per weight over every Linear / Conv weight of the model (layers
  left float count 32), scales and zero points included (:func:`lowbit.report.metrics.storage_bits_per_element`).
- ``activation_bits``: the same over the inputs of the searched layers (shapes recorded once).
- ``average_bitwidth`` (MASE's hardware runner): weight and input bits over weight and input elements of
  the searched layers together; ``memory_density`` = ``compare_to`` / ``average_bitwidth``.
- ``model_bytes``: every parameter's bytes, quantized weights and biases at their stored size.
- ``cost``: sum over layers of multiply-accumulates x the user's cost per MAC for (op, weight format), from
  a TOML table (see :func:`load_cost_table`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError
from lowbit.graph.select import swappable_modules
from lowbit.nn.roles import RoleFormats
from lowbit.report.metrics import storage_bits_per_element, storage_bytes

WEIGHT_OPS = ("linear", "conv1d", "conv2d")


@dataclass(frozen=True)
class LayerGeometry:
    op: str
    weight_shape: tuple[int, ...] | None
    bias_shape: tuple[int, ...] | None
    input_shape: tuple[int, ...] | None
    macs: int


def record_geometry(root: nn.Module, run: Any) -> dict[str, LayerGeometry]:
    """Shapes and MACs of every swappable layer, seen during one call of ``run()`` (one forward pass)."""
    seen: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    handles = []
    layers = swappable_modules(root)
    for name, module, _ in layers:
        def hook(module: nn.Module, args: tuple, output: Any, name: str = name) -> None:
            if name not in seen and args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
                seen[name] = (tuple(args[0].shape), tuple(output.shape))
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    geometry = {}
    for name, module, op in layers:
        weight = getattr(module, "weight", None) if op in WEIGHT_OPS else None
        bias = getattr(module, "bias", None) if op in WEIGHT_OPS else None
        shapes = seen.get(name)
        macs = 0
        if weight is not None and shapes is not None:
            macs = math.prod(shapes[1]) * (weight.numel() // weight.shape[0])  # outputs x inputs per output
        geometry[name] = LayerGeometry(op, tuple(weight.shape) if weight is not None else None,
                                       tuple(bias.shape) if bias is not None else None,
                                       shapes[0] if shapes else None, macs)  # fmt: skip
    return geometry


class CostModel:
    """Bits, bytes and the user cost of a plan over a model's recorded geometry."""

    def __init__(self, root: nn.Module, geometry: dict[str, LayerGeometry], searched: list[str],
                 compare_to: int = 32, cost_table: dict[str, dict[str, float]] | None = None) -> None:  # fmt: skip
        self.geometry, self.searched, self.compare_to, self.table = geometry, searched, compare_to, cost_table
        swapped = {f"{name}.{p}" for name, g in geometry.items() for p in ("weight", "bias") if g.weight_shape}
        self.other_bytes = sum(p.numel() * p.element_size() for n, p in root.named_parameters() if n not in swapped)

    def measure(self, plan: dict[str, RoleFormats | None]) -> dict[str, float]:
        sums = dict.fromkeys(("weight_bits", "weights", "searched_bits", "searched_weights", "input_bits", "inputs",
                              "bytes", "cost"), 0.0)  # fmt: skip
        sums["bytes"] = float(self.other_bytes)
        for name, geometry in self.geometry.items():
            formats = plan.get(name) or RoleFormats()
            if geometry.weight_shape is not None:
                self._add_weights(sums, geometry, formats, name in self.searched)
            if name in self.searched and geometry.input_shape is not None:
                count = math.prod(geometry.input_shape)
                sums["input_bits"] += storage_bits_per_element(formats.data_in, geometry.input_shape) * count
                sums["inputs"] += count
        average = (sums["searched_bits"] + sums["input_bits"]) / max(sums["searched_weights"] + sums["inputs"], 1)
        metrics = {"weight_bits": sums["weight_bits"] / max(sums["weights"], 1),
                   "activation_bits": sums["input_bits"] / max(sums["inputs"], 1), "average_bitwidth": average,
                   "memory_density": self.compare_to / average, "model_bytes": sums["bytes"]}  # fmt: skip
        if self.table is not None:
            metrics["cost"] = sums["cost"]
        return metrics

    def _add_weights(self, sums: dict[str, float], geometry: LayerGeometry, formats: RoleFormats,
                     searched: bool) -> None:  # fmt: skip
        bits, count = storage_bits_per_element(formats.weight, geometry.weight_shape), math.prod(geometry.weight_shape)
        sums["weight_bits"] += bits * count
        sums["weights"] += count
        sums["bytes"] += storage_bytes(bits, count)
        if geometry.bias_shape is not None:
            bias_bits = storage_bits_per_element(formats.bias, geometry.bias_shape)
            sums["bytes"] += storage_bytes(bias_bits, geometry.bias_shape[0])
        if searched:
            sums["searched_bits"] += bits * count
            sums["searched_weights"] += count
        sums["cost"] += self._cost(geometry, formats.weight)

    def _cost(self, geometry: LayerGeometry, spec: Any) -> float:
        if self.table is None:
            return 0.0
        row = self.table.get(geometry.op, self.table.get("default"))
        if row is None:
            raise ConfigError(f"cost table has no [{geometry.op}] (or [default]) table")
        name = "float" if spec is None else spec.format_name
        keys = [f"{name}:{spec.bits}"] if spec is not None and hasattr(spec, "bits") else []
        for key in (*keys, name, "default"):
            if key in row:
                return geometry.macs * float(row[key])
        raise ConfigError(f"cost table [{geometry.op}] has no entry for format {name!r} (keys tried: "
                          f"{', '.join((*keys, name, 'default'))})")  # fmt: skip


def load_cost_table(value: Any, base: Path | None = None) -> dict[str, dict[str, float]] | None:
    """A cost table: a TOML file path or an inline table ``{op: {format or "format:bits": cost per MAC}}``."""
    if value is None:
        return None
    if isinstance(value, str):
        from lowbit.config.toml_config import read_toml

        path = Path(value)
        value = read_toml(path if path.is_absolute() or base is None else base / path)
    if not isinstance(value, dict):
        raise ConfigError(f"cost_table must be a TOML file or a table, got {value!r}")
    for op, row in value.items():
        if not isinstance(row, dict) or not all(_is_number(v) for v in row.values()):
            raise ConfigError(f"cost table [{op}] must map format names to numbers (cost per MAC)")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["CostModel", "LayerGeometry", "load_cost_table", "record_geometry"]
