"""Histogram data of the report: which layers get one, and each histogram's bins and format grid.

A histogram entry holds plain numbers only (bin edges, counts, grid values), so report.json carries it and
the charts are drawn from the report alone. The grid is the format's representable values when the format
fixes them (``grid_kind`` "fixed"; its end points are ``format_range``), or the distinct values the format
produced on the first tensor it saw when its scale follows the data (``grid_kind`` "observed").
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lowbit.errors import ReportError, did_you_mean
from lowbit.formats import FormatSpec
from lowbit.report import real

BINS = 60
GRID_LIMIT = 400  # grid values drawn per histogram at most (evenly thinned beyond that)
HISTOGRAM_ROLES = ("weight", "data_in")


def check_choice(choice: Any, names: list[str]) -> None:
    """ReportError unless ``choice`` is "all", an int >= 0 or a list of these layer names."""
    if choice == "all":
        return
    if isinstance(choice, int) and not isinstance(choice, bool):
        if choice < 0:
            raise ReportError(f"histogram_layers={choice} must be >= 0, 'all' or a list of layer names")
        return
    if not (isinstance(choice, (list, tuple)) and all(isinstance(name, str) for name in choice)):
        raise ReportError(f"histogram_layers must be 'all', an int or a list of layer names, got {choice!r}")
    for name in choice:
        if name not in names:
            raise ReportError(f"histogram_layers: no layer {name!r}{did_you_mean(name, names)}; "
                              f"layers: {', '.join(names)}")  # fmt: skip


def select_layers(choice: Any, rows: list[dict[str, Any]]) -> list[str]:
    """Layer names from ``histogram_layers``: "all", an int N (the N lowest SQNR) or a list of names."""
    names = [row["name"] for row in rows]
    check_choice(choice, names)
    if choice == "all":
        return names
    if isinstance(choice, int):
        worst = sorted(rows, key=lambda row: _sort_key(row["sqnr_db"]))
        return [row["name"] for row in worst[:choice]]
    return list(dict.fromkeys(choice))


def _sort_key(sqnr: float) -> float:
    return -math.inf if math.isnan(sqnr) else sqnr  # NaN (no usable values) first: the worst


def histogram_entry(layer: str, role: str, spec: FormatSpec | None, values: torch.Tensor,
                    observed_grid: torch.Tensor | None) -> dict[str, Any] | None:  # fmt: skip
    """Bins of ``values`` (float64, flat) plus the grid of ``spec`` inside the plotted range."""
    values = values[torch.isfinite(values)]
    if values.numel() == 0:
        return None
    fixed = spec.value_set() if spec is not None else None
    format_range = (float(fixed[0]), float(fixed[-1])) if fixed is not None and fixed.numel() else None
    low, high = _view(float(values.min()), float(values.max()), format_range)
    counts, edges = torch.histogram(values.clamp(low, high), bins=BINS, range=(low, high))
    grid = fixed if fixed is not None else observed_grid
    kind = "none" if spec is None else ("fixed" if fixed is not None else "observed")
    shown, in_view = _grid_in_view(grid, low, high)
    return {
        "layer": layer, "role": role, "format": spec.describe() if spec is not None else "float",
        "samples": int(values.numel()), "bin_edges": edges.tolist(), "counts": [int(c) for c in counts.tolist()],
        "grid_kind": kind, "grid": shown, "grid_in_view": in_view,
        "format_range": list(format_range) if format_range else None,
    }  # fmt: skip


def real_histogram_entry(layer: str, role: str, module: torch.nn.Module, values: torch.Tensor,
                         grid: torch.Tensor | None) -> dict[str, Any] | None:  # fmt: skip
    """The histogram of a real-quantized layer's float weight (grid: its dequantized codes, "observed") or
    input (grid: a static input's representable values, "fixed"; none for a dynamic or float input)."""
    values = values[torch.isfinite(values)]
    if values.numel() == 0:
        return None
    fixed = role == "data_in" and grid is not None
    described = real.weight_format(module) if role == "weight" else (real.input_format(module) or "float")
    format_range = (float(grid[0]), float(grid[-1])) if fixed and grid.numel() else None
    low, high = _view(float(values.min()), float(values.max()), format_range)
    counts, edges = torch.histogram(values.clamp(low, high), bins=BINS, range=(low, high))
    shown, in_view = _grid_in_view(grid, low, high)
    return {
        "layer": layer, "role": role, "format": described, "samples": int(values.numel()),
        "bin_edges": edges.tolist(), "counts": [int(c) for c in counts.tolist()],
        "grid_kind": "none" if grid is None else ("fixed" if fixed else "observed"), "grid": shown,
        "grid_in_view": in_view, "format_range": list(format_range) if format_range else None,
    }  # fmt: skip


def _view(low: float, high: float, format_range: tuple[float, float] | None) -> tuple[float, float]:
    """The data's range, widened to the format's range when that is not much wider (so clamping shows)."""
    if format_range is not None:
        span = max(high - low, 1e-30)
        if format_range[1] - format_range[0] <= 3 * span:
            low, high = min(low, format_range[0]), max(high, format_range[1])
    if high <= low:
        pad = abs(low) * 0.1 or 0.5
        low, high = low - pad, high + pad
    pad = (high - low) * 0.02
    return low - pad, high + pad


def _grid_in_view(grid: torch.Tensor | None, low: float, high: float) -> tuple[list[float], int]:
    if grid is None or grid.numel() == 0:
        return [], 0
    inside = grid[(grid >= low) & (grid <= high)]
    count = int(inside.numel())
    if count > GRID_LIMIT:
        inside = inside[torch.linspace(0, count - 1, GRID_LIMIT).round().long()]
    return inside.tolist(), count
