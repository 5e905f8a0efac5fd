"""The search chart: task metric against bits per weight (and against cost when a cost table is given),
every trial, the Pareto front and the uniform presets (matplotlib, Agg canvas, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lowbit._io import atomic_write_bytes


def draw_chart(path: Path, records: list[dict[str, Any]], front: list[dict[str, Any]], references: dict[str, dict],
               task_metric: str, front_metrics: tuple[str, ...] = ()) -> Path:  # fmt: skip
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    axes_names = ["weight_bits"] + (["cost"] if records and "cost" in records[0]["metrics"] else [])
    figure = Figure(figsize=(6.5 * len(axes_names), 4.5))
    FigureCanvasAgg(figure)
    for index, x_name in enumerate(axes_names):
        axes = figure.add_subplot(1, len(axes_names), index + 1)
        axes.scatter([r["metrics"][x_name] for r in records], [r["metrics"][task_metric] for r in records],
                     s=12, c="#9aa5b1", label=f"trials ({len(records)})")  # fmt: skip
        ordered = sorted(front, key=lambda r: r["metrics"][x_name])
        style = "o-" if x_name in front_metrics else "o"  # a staircase only on the front's own axes
        axes.plot([r["metrics"][x_name] for r in ordered], [r["metrics"][task_metric] for r in ordered], style,
                  c="#d1495b", ms=5, label=f"front over {', '.join(front_metrics)} ({len(front)})")  # fmt: skip
        for name, metrics in references.items():
            if x_name in metrics:
                axes.scatter([metrics[x_name]], [metrics[task_metric]], marker="s", s=40, c="#00798c")
                axes.annotate(name, (metrics[x_name], metrics[task_metric]), fontsize=8, xytext=(4, 4),
                              textcoords="offset points")  # fmt: skip
        axes.set_xlabel("bits per weight (scales included)" if x_name == "weight_bits" else "cost (user table)")
        axes.set_ylabel(task_metric)
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    atomic_write_bytes(path, buffer.getvalue())
    return path


__all__ = ["draw_chart"]
