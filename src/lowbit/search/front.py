"""Pareto fronts, hypervolume, and the run's output files: ``front.json`` and ``front/<trial>.toml`` (each
a config ``lowbit transform`` runs: module style, one ``[passes.quantize."<layer>".config]`` per layer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lowbit._io import atomic_write_text
from lowbit.config.toml_config import none_to_na


def dominates(a: dict[str, float], b: dict[str, float], directions: dict[str, str]) -> bool:
    """``a`` is at least as good as ``b`` on every metric and better on one."""
    better = False
    for name, direction in directions.items():
        x, y = (a[name], b[name]) if direction == "maximize" else (-a[name], -b[name])
        if x < y:
            return False
        better = better or x > y
    return better


def pareto_front(records: list[dict[str, Any]], directions: dict[str, str]) -> list[dict[str, Any]]:
    """The records (each with ``metrics``) no other record dominates; equal metrics keep the first."""
    front, seen = [], set()
    for record in records:
        metrics = record["metrics"]
        if any(dominates(other["metrics"], metrics, directions) for other in records):
            continue
        key = tuple(metrics[name] for name in directions)
        if key not in seen:
            seen.add(key)
            front.append(record)
    return front


def hypervolume_2d(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by ``points`` (maximize the first coordinate, minimize the second) up to ``reference``
    (a worst metric, a largest cost)."""
    useful = sorted((x, y) for x, y in points if x > reference[0] and y < reference[1])
    area, best_y = 0.0, reference[1]
    for x, y in sorted(useful, key=lambda p: (-p[0], p[1])):  # best metric first
        if y < best_y:
            area += (x - reference[0]) * (best_y - y)
            best_y = y
    return area


def node_config(formats: dict[str, Any]) -> dict[str, Any]:
    """A plan entry (RoleFormats.to_dict form) as a flat MASE-style config with per-role names."""
    roles = {role: value for role, value in formats.items() if isinstance(value, dict)}
    config: dict[str, Any] = {"name": next(iter(roles.values()))["name"]}
    for role, value in roles.items():
        for key, item in value.items():
            config[f"{role}_{key}"] = item
    if "data_in" not in roles:
        config["data_in_name"] = "NA"
    return config


def transform_config(plan: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A run config for ``lowbit transform`` that applies ``plan`` (layer -> role dict or None)."""
    table: dict[str, Any] = {key: value for key, value in options.items() if value is not None}
    quantize: dict[str, Any] = {"by": "name"}
    for layer, formats in plan.items():
        if formats:
            quantize[layer] = {"config": node_config(formats)}
    table["transform"] = {"style": "module"}
    table["passes"] = {"quantize": quantize}
    return none_to_na(table)


def write_front(folder: Path, front: list[dict[str, Any]], options: dict[str, Any], extra: dict[str, Any]) -> Path:
    """front.json and front/<trial>.toml; stale TOMLs of trials no longer on the front are removed."""
    import tomli_w

    directory = folder / "front"
    directory.mkdir(parents=True, exist_ok=True)
    names = set()
    for record in front:
        name = f"trial_{record['number']:05d}.toml"
        names.add(name)
        atomic_write_text(directory / name, tomli_w.dumps(transform_config(record["plan"], options)))
    for stale in directory.glob("trial_*.toml"):
        if stale.name not in names:
            stale.unlink(missing_ok=True)
    document = {**extra, "front": [{"trial": r["number"], "metrics": r["metrics"], "plan": r["plan"],
                                    "config": f"front/trial_{r['number']:05d}.toml"} for r in front]}  # fmt: skip
    atomic_write_text(folder / "front.json", json.dumps(document, indent=1, sort_keys=True))
    return folder / "front.json"


__all__ = ["dominates", "hypervolume_2d", "node_config", "pareto_front", "transform_config", "write_front"]
