"""The front against the uniform presets: for each preset, the best front member that beats it on both
axes at once (a better task metric AND fewer bits per weight, each strictly, in the directions the search
uses), and one sentence: the member that beats every preset at once, or why none does, with the numbers."""

from __future__ import annotations

import math
from typing import Any

from lowbit.search.front import dominates

BITS = "weight_bits"
DEFAULT_DIRECTIONS = {"accuracy": "maximize", "mean_cosine": "maximize", "min_cosine": "maximize",
                      "loss": "minimize"}  # fmt: skip


def comparison_axes(task_metric: str, directions: dict[str, str]) -> dict[str, str]:
    """The two axes and their directions: the search's own where it declares them, else the usual ones."""
    task = directions.get(task_metric, DEFAULT_DIRECTIONS.get(task_metric, "maximize"))
    return {task_metric: task, BITS: directions.get(BITS, "minimize")}


def beats(a: dict[str, float], b: dict[str, float], axes: dict[str, str]) -> bool:
    """``a`` is strictly better than ``b`` on every axis (equal bits is not fewer bits)."""
    return all(dominates(a, b, {name: direction}) for name, direction in axes.items())


def _rank(record: dict[str, Any], axes: dict[str, str]) -> tuple[float, ...]:
    """Sort key, best first: the better task metric, then the better bits, then the earlier trial."""
    signs = [1.0 if direction == "minimize" else -1.0 for direction in axes.values()]
    values = [sign * record["metrics"][name] for sign, name in zip(signs, axes, strict=True)]
    return (*[math.inf if math.isnan(v) else v for v in values], record["number"])


def best_beating(front: list[dict[str, Any]], preset: dict[str, float], axes: dict[str, str]) -> dict | None:
    """The best front member that beats ``preset`` on both axes, or None."""
    better = [record for record in front if beats(record["metrics"], preset, axes)]
    return min(better, key=lambda record: _rank(record, axes)) if better else None


def _member(record: dict[str, Any] | None, axes: dict[str, str]) -> dict[str, Any] | None:
    return None if record is None else {"trial": record["number"], **{name: record["metrics"][name] for name in axes}}


def compare_presets(front: list[dict[str, Any]], references: dict[str, dict[str, float]], task_metric: str,
                    directions: dict[str, str]) -> dict[str, Any] | None:  # fmt: skip
    """The comparison front.json, search.html and the command's summary show; None when the presets or the
    front lack the task metric or bits per weight."""
    axes = comparison_axes(task_metric, directions)
    measured = [*references.values(), *(record["metrics"] for record in front)]
    if not references or any(name not in metrics for metrics in measured for name in axes):
        return None
    presets = {name: {**{axis: metrics[axis] for axis in axes},
                      "beaten_by": _member(best_beating(front, metrics, axes), axes)}
               for name, metrics in references.items()}  # fmt: skip
    winners = [record for record in front if all(beats(record["metrics"], m, axes) for m in references.values())]
    winner = min(winners, key=lambda record: _rank(record, axes)) if winners else None
    result = {"task_metric": task_metric, "directions": axes, "presets": presets,
              "beats_every_preset": _member(winner, axes)}  # fmt: skip
    return {**result, "sentence": sentence(result)}


def _point(values: dict[str, Any], task_metric: str) -> str:
    return f"{task_metric} {values[task_metric]:.4f} at {values[BITS]:.3f} bits per weight"


def sentence(comparison: dict[str, Any]) -> str:
    """One plain sentence: which trial beats every preset at once, or what stays unbeaten, with numbers."""
    task, presets = comparison["task_metric"], comparison["presets"]
    winner = comparison["beats_every_preset"]
    if winner is not None:
        return f"trial {winner['trial']} beats every preset at once ({_point(winner, task)})."
    maximize = comparison["directions"][task] == "maximize"
    top = (max if maximize else min)(presets, key=lambda name: presets[name][task])
    cheapest = min(presets, key=lambda name: presets[name][BITS])
    need = (f"that needs {task} {'above' if maximize else 'below'} {presets[top][task]:.4f} ({top}) at fewer than "
            f"{presets[cheapest][BITS]:.3f} bits per weight ({cheapest})")  # fmt: skip
    unbeaten = [f"{name} ({_point(values, task)})" for name, values in presets.items()
                if values["beaten_by"] is None]  # fmt: skip
    rest = "unbeaten: " + "; ".join(unbeaten) if unbeaten else "each preset is beaten, but by different members"
    return f"no front member beats every preset at once: {need}; {rest}."


def comparison_rows(comparison: dict[str, Any]) -> list[list[str]]:
    """Plain-text rows (preset, metric, bits, best member beating it) for the page and the summary."""
    task, rows = comparison["task_metric"], []
    for name, values in comparison["presets"].items():
        member = values["beaten_by"]
        cell = "none" if member is None else f"trial {member['trial']}: {_point(member, task)}"
        rows.append([name, f"{values[task]:.4f}", f"{values[BITS]:.3f}", cell])
    return rows


__all__ = ["beats", "best_beating", "compare_presets", "comparison_axes", "comparison_rows", "sentence"]
