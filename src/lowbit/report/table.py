"""The report as text: the per-layer table (rich) and the formatting both the table and the HTML use."""

from __future__ import annotations

import math
from typing import Any

COLUMNS = ("layer", "op", "formats", "W bits/el", "A bits/el", "bytes", "SQNR dB", "alone dB", "rel. error",
           "clamped", "sensitivity")  # fmt: skip


def fmt_number(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def fmt_share(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.2f}%"


def fmt_metric(kind: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{100.0 * value:.2f}%" if kind == "accuracy" else f"{value:.4f}"


def role_bits(row: dict[str, Any], role: str) -> str:
    entry = row["roles"].get(role)
    return fmt_number(entry["bits_per_element"], 3) if entry else "-"


def formats_text(row: dict[str, Any]) -> str:
    """One line per quantized role ("weight: integer(width=4, frac_width=3)"), or "float"."""
    lines = [f"{role}: {entry['format']}" for role, entry in row["roles"].items() if entry["format"] != "float"]
    text = "\n".join(lines) or "float"
    return f"bypass\n{text}" if row.get("bypass") else text


def layer_cells(row: dict[str, Any], metric: str) -> list[str]:
    """One table row as strings, in COLUMNS order."""
    rank = row.get("sensitivity_rank")
    sensitivity = "-" if rank is None else f"#{rank} {fmt_metric(metric, row['sensitivity_metric'])}"
    error = fmt_number(row["relative_error"], 4)
    if row["nonfinite_outputs"]:
        error += f" ({row['nonfinite_outputs']} non-finite)"
    return [row["name"], row["op"], formats_text(row), role_bits(row, "weight"), role_bits(row, "data_in"),
            fmt_number(row["bytes"]), fmt_number(row["sqnr_db"]), fmt_number(row["local_sqnr_db"]), error,
            fmt_share(row["clamped_share"]), sensitivity]  # fmt: skip


def summary_lines(report: dict[str, Any]) -> list[str]:
    s = report["summary"]
    metric = s["metric"]
    sign = "+" if s["metric_delta"] >= 0 else ""
    return [
        f"{metric}: float {fmt_metric(metric, s['float_metric'])}, quantized "
        f"{fmt_metric(metric, s['quantized_metric'])} ({sign}{fmt_metric(metric, s['metric_delta'])})",
        f"parameters: {s['total_bytes']:,} bytes vs {s['fp32_bytes']:,} in fp32 "
        f"({fmt_number(s['compression'])}x smaller), "
        f"{fmt_number(s['average_bits_per_weight'], 3)} bits per weight on average",
        f"{s['layers']} quantized layers, {s['batches']} batches, {s['samples']} samples",
    ]  # fmt: skip


def role_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per layer and role: layer, role, format, shape, bits/element, stored, clamped."""
    rows = []
    for row in report["layers"]:
        for role, entry in row["roles"].items():
            shape = "x".join(map(str, entry["shape"])) if entry["shape"] else "-"
            rows.append([row["name"], role, entry["format"], shape, fmt_number(entry["bits_per_element"], 3),
                         "yes" if entry["stored"] else "no", fmt_share(entry["clamped_share"])])  # fmt: skip
    return rows


ROLE_COLUMNS = ("layer", "role", "format", "shape", "bits/element", "stored", "clamped")


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """Print the per-layer table, the formats per role and the model summary with rich (``console``: a
    rich Console; default: a new one on stdout)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:  # a pipe or a file gets a wide page instead of rich's 80 columns
        console = Console()
        console = console if console.is_terminal else Console(width=160)
    metric = report["summary"]["metric"]
    layers = Table(title="Quantization report")
    kept = [index for index, column in enumerate(COLUMNS) if column != "formats"]  # formats: the role table
    for index in kept:
        layers.add_column(COLUMNS[index], justify="left" if index < 2 else "right", overflow="fold")
    for row in report["layers"]:
        cells = layer_cells(row, metric)
        layers.add_row(*(cells[index] for index in kept))
    roles = Table(title="Formats per role")
    for index, column in enumerate(ROLE_COLUMNS):
        roles.add_column(column, justify="left" if index < 3 else "right", overflow="fold")
    for cells in role_rows(report):
        roles.add_row(*cells)
    console.print(layers)
    console.print(roles)
    for line in summary_lines(report):
        console.print(line)
