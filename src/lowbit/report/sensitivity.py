"""Sensitivity ranking: the task metric when only one layer is quantized and every other layer runs float.

A layer whose metric drops most on its own is the one to give more bits first. Each entry is
``{"layer", "metric", "delta", "rank"}`` (delta = metric - the float model's metric), the worst first. Ties
share a rank (standard competition ranking: 1, 2, 2, 4) and keep the layers' execution order; NaN (the
layer breaks the model) ranks first. A real-quantized layer is "quantized alone" as itself, every other
layer replaced by its float twin.
"""

from __future__ import annotations

import math
from typing import Any

from lowbit.nn.roles import RoleFormats
from lowbit.report.collect import GraphRunner, ModuleRunner, main_tensor
from lowbit.report.layers import Layer
from lowbit.report.metrics import TaskMetric

_FLOAT = RoleFormats()


def metric_with_only(runner: GraphRunner | ModuleRunner, layers: list[Layer], keep: Layer | None,
                     batches: list[Any], metric: TaskMetric) -> float:  # fmt: skip
    """The metric with ``keep`` quantized and every other layer float (``keep`` None: all float)."""
    overrides = {layer.name: _FLOAT for layer in layers if layer is not keep}
    outputs = [main_tensor(runner.run(batch, (), overrides)[0]) for batch in batches]
    return metric.score(outputs)


def sensitivity_ranking(runner: GraphRunner | ModuleRunner, layers: list[Layer], batches: list[Any],
                        metric: TaskMetric, float_score: float) -> list[dict[str, Any]]:  # fmt: skip
    """One entry per layer, sorted from the largest loss to the smallest (NaN first: the worst)."""
    ranking = []
    for layer in layers:
        score = metric_with_only(runner, layers, layer, batches, metric)
        ranking.append({"layer": layer.name, "metric": score, "delta": score - float_score})
    return rank_entries(ranking)


def rank_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` sorted by "metric" (stable, NaN first) with a "rank" each: equal metrics, equal rank."""
    ordered = sorted(entries, key=_order)
    previous = None
    for position, entry in enumerate(ordered, start=1):
        key = _order(entry)
        entry["rank"] = previous[1] if previous is not None and previous[0] == key else position
        previous = (key, entry["rank"])
    return ordered


def _order(entry: dict[str, Any]) -> tuple[bool, float]:
    value = entry["metric"]
    return (False, 0.0) if math.isnan(value) else (True, value)
