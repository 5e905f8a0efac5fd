"""The report's charts as PNG bytes, drawn from the report dict alone.

matplotlib is used through its object API on an explicit Agg canvas (``FigureCanvasAgg``): no pyplot, no
global backend switch and no display, so it works headless and never touches the caller's own plots.
"""

from __future__ import annotations

import io
import math
from typing import Any

ROLE_COLOURS = {"data_in": "#4c72b0", "weight": "#dd8452", "bias": "#55a868", "data_out": "#c44e52"}
_BAR = "#4c72b0"
_ALONE = "#93b5e1"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", facecolor="white")
    return buffer.getvalue()


def _height(count: int) -> float:
    return max(2.6, 0.9 + 0.42 * count)


def _finite_for_plot(values: list[float]) -> tuple[list[float], list[str]]:
    """inf (an exact layer) is drawn just past the largest finite bar and labelled; NaN as 0, "n/a"."""
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    top = (max(finite) if finite else 0.0) + 10.0
    pairs = [_bar_and_note(value, top) for value in values]
    return [bar for bar, _ in pairs], [note for _, note in pairs]


def _bar_and_note(value: float | None, top: float) -> tuple[float, str]:
    if value is None or math.isnan(value):
        return 0.0, "n/a"
    if math.isinf(value):
        return (top, "exact") if value > 0 else (0.0, "-inf")
    return float(value), f"{value:.1f}"


def sqnr_chart(report: dict[str, Any]) -> bytes:
    """Per-layer SQNR (dB) of the layer output: in the quantized model, and with the layer quantized alone."""
    rows = report["layers"]
    names = [row["name"] for row in rows]
    figure = _figure(9.0, _height(len(rows)))
    axes = figure.add_subplot()
    positions = list(range(len(rows)))
    full, full_notes = _finite_for_plot([row["sqnr_db"] for row in rows])
    alone, _ = _finite_for_plot([row["local_sqnr_db"] for row in rows])
    axes.barh([p - 0.2 for p in positions], full, height=0.4, color=_BAR, label="in the quantized model")
    axes.barh([p + 0.2 for p in positions], alone, height=0.4, color=_ALONE, label="layer alone")
    for position, value, note in zip(positions, full, full_notes):
        axes.annotate(note, (value, position - 0.2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    axes.set_yticks(positions, names)
    axes.invert_yaxis()
    axes.set_xlabel("SQNR of the layer output (dB, higher is better)")
    axes.set_title("Per-layer SQNR")
    _legend_outside(axes)
    axes.grid(axis="x", alpha=0.3)
    return _png(figure)


def bits_chart(report: dict[str, Any]) -> bytes:
    """Bits per element of every role of every layer (scales and zero points included)."""
    rows = report["layers"]
    roles = [role for role in ROLE_COLOURS if any(role in row["roles"] for row in rows)]
    figure = _figure(9.0, _height(len(rows)))
    axes = figure.add_subplot()
    width = 0.8 / max(len(roles), 1)
    for index, role in enumerate(roles):
        offsets = [p - 0.4 + width * (index + 0.5) for p in range(len(rows))]
        entries = [row["roles"].get(role) for row in rows]
        values = [entry["bits_per_element"] if entry else 0.0 for entry in entries]
        floats = [entry is not None and entry["format"] == "float" for entry in entries]
        bars = axes.barh(offsets, values, height=width, color=ROLE_COLOURS[role], label=role)
        for bar, is_float in zip(bars, floats):
            if is_float:  # a role left in float: pale and hatched, so quantized roles stand out
                bar.set_alpha(0.3)
                bar.set_hatch("//")
        for offset, value, is_float in zip(offsets, values, floats):
            if value:
                axes.annotate(f"{value:.3g}{' (float)' if is_float else ''}", (value, offset), xytext=(2, 0),
                              textcoords="offset points", va="center", fontsize=7)  # fmt: skip
    axes.set_yticks(range(len(rows)), [row["name"] for row in rows])
    axes.invert_yaxis()
    axes.set_xlabel("bits per element (incl. scales / zero points; float roles at their dtype)")
    axes.set_title("Bits per element")
    from matplotlib.patches import Patch

    handles = [Patch(color=ROLE_COLOURS[role], label=role) for role in roles]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="//", label="left in float"))
    _legend_outside(axes, handles)
    axes.grid(axis="x", alpha=0.3)
    return _png(figure)


def sensitivity_chart(report: dict[str, Any]) -> bytes | None:
    """The task metric with only one layer quantized, worst first; None without a ranking."""
    ranking = report.get("sensitivity")
    if not ranking:
        return None
    summary = report["summary"]
    figure = _figure(9.0, _height(len(ranking)))
    axes = figure.add_subplot()
    values, notes = _finite_for_plot([entry["metric"] for entry in ranking])
    axes.barh(range(len(ranking)), values, color="#8172b3")
    for position, value, note in zip(range(len(ranking)), values, notes):
        axes.annotate(note if note == "n/a" else f"{value:.4g}", (value, position), xytext=(3, 0),
                      textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    axes.axvline(summary["float_metric"], color="black", linestyle="--", linewidth=1, label="float model")
    axes.axvline(summary["quantized_metric"], color="#c44e52", linestyle=":", linewidth=1.5,
                 label="all layers quantized")
    axes.set_yticks(range(len(ranking)), [entry["layer"] for entry in ranking])
    axes.invert_yaxis()
    _zoom(axes, [*values, summary["float_metric"], summary["quantized_metric"]])
    axes.set_xlabel(f"{summary['metric']} with only this layer quantized")
    axes.set_title("Sensitivity ranking (most sensitive first)")
    _legend_outside(axes)
    return _png(figure)


def _zoom(axes, values: list[float]) -> None:
    """Start the axis near the smallest value, so that small differences between layers show."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    pad = max((high - low) * 0.15, abs(high) * 1e-3, 1e-6)
    axes.set_xlim(low - pad, high + pad)


def _legend_outside(axes, handles=None) -> None:
    extra = {} if handles is None else {"handles": handles}
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, **extra)


def histogram_chart(entry: dict[str, Any]) -> bytes:
    """A histogram of a layer's weights or input activations with the format's grid overlaid."""
    figure = _figure(9.0, 3.2)
    axes = figure.add_subplot()
    edges, counts = entry["bin_edges"], entry["counts"]
    axes.stairs(counts, edges, fill=True, color="#4c72b0", alpha=0.75, label=f"{entry['samples']:,} values")
    if entry["grid"]:
        label = "representable values" if entry["grid_kind"] == "fixed" else "values the format produced"
        if entry["grid_in_view"] > len(entry["grid"]):
            label += f" (every ~{entry['grid_in_view'] / len(entry['grid']):.0f}th of {entry['grid_in_view']})"
        axes.vlines(entry["grid"], 0, 1, transform=axes.get_xaxis_transform(), colors="#dd8452", linewidth=0.6,
                    alpha=0.6, label=label)  # fmt: skip
    if entry["format_range"]:
        low, high = entry["format_range"]
        for limit in (low, high):
            if edges[0] <= limit <= edges[-1]:
                axes.axvline(limit, color="#c44e52", linestyle="--", linewidth=1.2)
        axes.plot([], [], color="#c44e52", linestyle="--", label="format range")
    axes.set_yscale("symlog", linthresh=1)
    axes.set_xlim(edges[0], edges[-1])
    axes.set_title(f"{entry['layer']} · {entry['role']} · {entry['format']}", fontsize=10)
    axes.set_ylabel("count")
    axes.set_xlabel("weight value" if entry["role"] == "weight" else "input activation value")
    _legend_outside(axes)
    return _png(figure)
