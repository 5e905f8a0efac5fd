"""search.html: one self-contained page (inline CSS, the chart as a base64 PNG, no scripts) with the chart of
the task metric against bits per weight (and cost), the front's members, the front against the uniform
presets (which member beats each on both axes) and the presets' metrics."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from lowbit._io import atomic_write_text
from lowbit.search.compare import comparison_rows

_STYLE = """body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; width: 100%; margin-bottom: 20px; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: right; vertical-align: top; }
th { background: #f3f5f9; } td.text { text-align: left; font-family: ui-monospace, monospace; white-space: pre-line; }
img { max-width: 100%; border: 1px solid #eee; } p.verdict { font-weight: 600; }"""


def _number(value: Any) -> str:
    return f"{value:.5g}" if isinstance(value, float) else html.escape(str(value))


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(rows_cell for rows_cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _plan_text(plan: dict[str, Any]) -> str:
    lines = []
    for layer, formats in plan.items():
        roles = ", ".join(f"{role}={value['name']}" + "".join(f" {k}={v}" for k, v in value.items() if k != "name")
                          for role, value in (formats or {}).items() if isinstance(value, dict))  # fmt: skip
        lines.append(f"{layer}: {roles or 'float'}")
    return "\n".join(lines)


def _comparison_section(comparison: dict[str, Any] | None) -> str:
    """The front against the presets: the sentence, then per preset the best member beating it on both axes."""
    if comparison is None:
        return ""
    task = comparison["task_metric"]
    rows = [[f"<td class='text'>{html.escape(cell)}</td>" if index in (0, 3) else f"<td>{html.escape(cell)}</td>"
             for index, cell in enumerate(row)] for row in comparison_rows(comparison)]  # fmt: skip
    header = ["preset", task, "bits / weight", f"best front member with a better {task} at fewer bits"]
    return (f"<h2>Front against the uniform presets</h2><p class='verdict'>{html.escape(comparison['sentence'])}</p>"
            + _table(header, rows))


def write_page(path: Path, chart_png: bytes | None, front: list[dict[str, Any]], references: dict[str, dict],
               title: str, comparison: dict[str, Any] | None = None) -> Path:  # fmt: skip
    metrics = list(front[0]["metrics"]) if front else []
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]  # fmt: skip
    if chart_png:
        parts.append(f"<img alt='task metric vs bits per weight' src='data:image/png;base64,"
                     f"{base64.b64encode(chart_png).decode()}'>")  # fmt: skip
    parts.append(f"<h2>Pareto front ({len(front)})</h2>")
    rows = [[f"<td>{r['number']}</td>", *(f"<td>{_number(r['metrics'][m])}</td>" for m in metrics),
             f"<td class='text'>{html.escape(_plan_text(r['plan']))}</td>"] for r in front]  # fmt: skip
    parts.append(_table(["trial", *metrics, "formats"], rows))
    parts.append(_comparison_section(comparison))
    parts.append("<h2>Uniform presets</h2>")
    names = list(next(iter(references.values()))) if references else []
    rows = [[f"<td class='text'>{html.escape(name)}</td>", *(f"<td>{_number(values[m])}</td>" for m in names)]
            for name, values in references.items()]  # fmt: skip
    parts.append(_table(["preset", *names], rows))
    parts.append("</body></html>")
    atomic_write_text(path, "\n".join(parts))
    return path


__all__ = ["write_page"]
