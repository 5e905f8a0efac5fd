"""The report's charts as PNG bytes, drawn from the report dict alone.

matplotlib is used through its object API on an explicit Agg canvas (``FigureCanvasAgg``): no pyplot, no
global backend switch and no display, so it works headless and never touches the caller's own plots.
"""

from __future__ import annotations

import io
import math
from typing import Any

from lowbit.report.table import readable

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
    for position, value, note in zip(positions, full, full_notes, strict=True):
        axes.annotate(note, (value, position - 0.2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    axes.set_yticks(positions, names)
    axes.invert_yaxis()
    axes.set_xlabel("SQNR of the layer output (dB, higher is better)")
    axes.set_title("Per-layer SQNR")
    _legend_outside(axes)
    axes.grid(axis="x", alpha=0.3)
    return _png(figure)


def float_roles(report: dict[str, Any]) -> list[str]:
    """"layer role (32 bits)" for every role left in float, listed under the bits chart instead of drawn."""
    return [f"{row['name']} {role} ({entry['bits_per_element']:.3g} bits)" for row in report["layers"]
            for role, entry in row["roles"].items() if entry["format"] == "float"]  # fmt: skip


def bits_chart(report: dict[str, Any]) -> bytes | None:
    """Bits per element of every quantized role of every layer (scales and zero points included); roles
    left in float are not drawn (their 32-bit bars would squash the low-bit ones): see float_roles."""
    rows = report["layers"]
    quantized = lambda entry: entry is not None and entry["format"] != "float"
    roles = [role for role in ROLE_COLOURS if any(quantized(row["roles"].get(role)) for row in rows)]
    if not roles:
        return None
    figure = _figure(9.0, _height(len(rows)))
    axes = figure.add_subplot()
    width = 0.8 / len(roles)
    top = 0.0
    for index, role in enumerate(roles):
        offsets = [p - 0.4 + width * (index + 0.5) for p in range(len(rows))]
        entries = [row["roles"].get(role) for row in rows]
        values = [entry["bits_per_element"] if quantized(entry) else 0.0 for entry in entries]
        top = max(top, *values)
        axes.barh(offsets, values, height=width, color=ROLE_COLOURS[role], label=role)
        for offset, value in zip(offsets, values, strict=True):
            if value:
                axes.annotate(f"{value:.3g}", (value, offset), xytext=(2, 0), textcoords="offset points",
                              va="center", fontsize=7)  # fmt: skip
    axes.set_yticks(range(len(rows)), [row["name"] for row in rows])
    axes.invert_yaxis()
    axes.set_xlim(0, top * 1.12)
    axes.set_xlabel("bits per element of the quantized roles (codes + scales / zero points)")
    axes.set_title("Bits per element")
    _legend_outside(axes)
    axes.grid(axis="x", alpha=0.3)
    return _png(figure)


def sensitivity_chart(report: dict[str, Any]) -> bytes | None:
    """The change of the task metric (vs the float model) with only one layer quantized, worst first; None
    without a ranking. Drawing the change, not the metric, keeps a cosine of 0.99999 from reading as 1."""
    ranking = report.get("sensitivity")
    if not ranking:
        return None
    summary = report["summary"]
    scale = 100.0 if summary["metric"] == "accuracy" else 1.0
    figure = _figure(9.0, _height(len(ranking)))
    axes = figure.add_subplot()
    deltas = [entry["metric"] - summary["float_metric"] for entry in ranking]
    values = [0.0 if math.isnan(d) else d * scale for d in deltas]
    axes.barh(range(len(ranking)), values, color="#8172b3")
    for position, (value, delta) in enumerate(zip(values, deltas, strict=True)):
        note = "n/a" if math.isnan(delta) else f"{value:.3g}"
        axes.annotate(note, (value, position), xytext=(3 if value >= 0 else -3, 0), textcoords="offset points",
                      va="center", ha="left" if value >= 0 else "right", fontsize=8)  # fmt: skip
    axes.axvline(0.0, color="black", linewidth=1, label="float model")
    if math.isfinite(summary["metric_delta"]):
        axes.axvline(summary["metric_delta"] * scale, color="#c44e52", linestyle=":", linewidth=1.5,
                     label="all layers quantized")  # fmt: skip
    labels = [f"#{entry.get('rank', index + 1)} {entry['layer']}" for index, entry in enumerate(ranking)]
    axes.set_yticks(range(len(ranking)), labels)
    axes.invert_yaxis()
    _zoom(axes, [*values, 0.0, summary["metric_delta"] * scale])
    unit = "accuracy points" if summary["metric"] == "accuracy" else summary["metric"]
    axes.set_xlabel(f"change of {unit} vs float with only this layer quantized")
    axes.set_title("Sensitivity ranking (most sensitive first; ties share a rank)")
    _legend_outside(axes)
    return _png(figure)


def _zoom(axes, values: list[float]) -> None:
    """Start the axis near the smallest value, so that small differences between layers show."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    pad = max((high - low) * 0.2, abs(high) * 1e-3, 1e-9)
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
    axes.set_title(f"{entry['layer']} · {entry['role']} · {readable(entry['format'])}", fontsize=10)
    axes.set_ylabel("count")
    axes.set_xlabel("weight value" if entry["role"] == "weight" else "input activation value")
    _legend_outside(axes)
    return _png(figure)
