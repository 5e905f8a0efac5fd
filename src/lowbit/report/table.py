"""The report as text: the per-layer table (rich) and the formatting both the table and the HTML use."""

from __future__ import annotations

import math
import re
from typing import Any

COLUMNS = ("layer", "op", "formats", "W bits/el", "A bits/el", "bytes", "SQNR dB", "alone dB", "rel. error",
           "clamped", "sensitivity", "latency vs fp32")  # fmt: skip
GRADIENT_COLUMN = "grad W dB"  # the gradient pass's weight-gradient SQNR, a column only when the report has it
SIGNIFICANT = 4  # digits of a number written inside a text (scales in a format's description)
_LONG_NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?(?![\w.])")


def readable(text: str, digits: int = SIGNIFICANT) -> str:
    """``text`` with every decimal number cut to ``digits`` significant digits (a calibrated scale of
    0.012345678901234567 in a format's description reads 0.01235)."""
    return _LONG_NUMBER.sub(lambda match: fmt_significant(float(match.group()), digits), text)


def fmt_significant(value: float, digits: int = SIGNIFICANT) -> str:
    """``digits`` significant digits without trailing zeros: plain for 1e-4 <= |value| < 1e6, else 1.5e-07."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return fmt_number(float(value))
    if 1e-4 <= abs(value) < 1e6:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
        text = f"{value:.{decimals}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


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


def fmt_delta(kind: str, value: float) -> str:
    """A change of the metric, signed, never rounded to zero (cosine -1.4e-05, not -0.0000)."""
    sign = "+" if value >= 0 else "-"
    size = abs(value) * (100.0 if kind == "accuracy" else 1.0)
    unit = " points" if kind == "accuracy" else ""
    text = "0" if size == 0 else (f"{size:.2f}" if size >= 0.01 else fmt_significant(size, 2))
    return f"{sign}{text}{unit}"


def fmt_latency(latency: dict[str, Any] | None) -> str:
    """"0.127 ms (0.44x)": the real layer's median time and its speed-up over fp32 (> 1: faster)."""
    if not latency:
        return "-"
    speedup = latency.get("speedup")
    ratio = f" ({speedup:.2f}x)" if speedup is not None else ""
    return f"{fmt_significant(latency['ms'], 3)} ms{ratio}"


def role_bits(row: dict[str, Any], role: str) -> str:
    entry = row["roles"].get(role)
    return fmt_number(entry["bits_per_element"], 3) if entry else "-"


def formats_text(row: dict[str, Any]) -> str:
    """One line per quantized role ("weight: integer(width=4, frac_width=3)"), or "float"."""
    if row.get("kind") == "real":
        lines = [readable(row["formats"].split(" (", 1)[0])]  # the class name; roles follow
    else:
        lines = []
    lines += [f"{role}: {readable(entry['format'])}" for role, entry in row["roles"].items() if entry["format"] != "float"]
    text = "\n".join(lines) or "float"
    return f"bypass\n{text}" if row.get("bypass") else text


def layer_columns(report: dict[str, Any]) -> tuple[str, ...]:
    """COLUMNS, plus the weight-gradient SQNR where the report ran the gradient pass."""
    return COLUMNS + (GRADIENT_COLUMN,) if any("grad_weight_sqnr_db" in row for row in report["layers"]) else COLUMNS


def layer_cells(row: dict[str, Any], metric: str) -> list[str]:
    """One table row as strings, in :func:`layer_columns` order."""
    rank = row.get("sensitivity_rank")
    sensitivity = "-" if rank is None else f"#{rank} {fmt_metric(metric, row['sensitivity_metric'])}"
    if rank is not None and metric == "cosine":
        sensitivity = f"#{rank} {fmt_delta(metric, row['sensitivity_metric'] - 1.0)}"  # 1.0000 hides the change
    error = fmt_number(row["relative_error"], 4)
    if row["nonfinite_outputs"]:
        error += f" ({row['nonfinite_outputs']} non-finite)"
    cells = [row["name"], row["op"], formats_text(row), role_bits(row, "weight"), role_bits(row, "data_in"),
             fmt_number(row["bytes"]), fmt_number(row["sqnr_db"]), fmt_number(row["local_sqnr_db"]), error,
             fmt_share(row["clamped_share"]), sensitivity, fmt_latency(row.get("latency"))]  # fmt: skip
    if "grad_weight_sqnr_db" in row:
        cells.append(fmt_number(row["grad_weight_sqnr_db"]))
    return cells


def summary_lines(report: dict[str, Any]) -> list[str]:
    s = report["summary"]
    metric = s["metric"]
    lines = [
        f"{metric}: float {fmt_metric(metric, s['float_metric'])}, quantized "
        f"{fmt_metric(metric, s['quantized_metric'])} ({fmt_delta(metric, s['metric_delta'])})",
        f"parameters: {s['total_bytes']:,} bytes vs {s['fp32_bytes']:,} in fp32 "
        f"({fmt_number(s['compression'])}x smaller), "
        f"{fmt_number(s['average_bits_per_weight'], 3)} bits per weight on average",
        f"{s['layers']} quantized layers, {s['batches']} batch{'es' if s['batches'] != 1 else ''}, {s['samples']} samples",
    ]  # fmt: skip
    timed = [row["latency"] for row in report["layers"] if row.get("latency")]
    if timed:
        real_ms, float_ms = sum(t["ms"] for t in timed), sum(t["fp32_ms"] for t in timed)
        lines.append(f"real layers: {fmt_significant(real_ms, 3)} ms vs {fmt_significant(float_ms, 3)} ms in fp32 "
                     f"({float_ms / real_ms:.2f}x), median of {timed[0]['runs']} runs per layer on its captured input")
    return lines


HEADER_ORDER = ("model", "dataset", "config", "checkpoint", "quantization", "lowbit", "torch", "python")


def header_items(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's header as (label, value) pairs, the usual fields first."""
    header = report.get("header") or {}
    keys = [key for key in HEADER_ORDER if key in header] + [key for key in header if key not in HEADER_ORDER]
    return [(key, readable(str(header[key]))) for key in keys]


def role_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per layer and role: layer, role, format, shape, bits/element, stored, clamped."""
    rows = []
    for row in report["layers"]:
        for role, entry in row["roles"].items():
            shape = "x".join(map(str, entry["shape"])) if entry["shape"] else "-"
            rows.append([row["name"], role, readable(entry["format"]), shape, fmt_number(entry["bits_per_element"], 3),
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
    columns = layer_columns(report)
    kept = [index for index, column in enumerate(columns) if column != "formats"]  # formats: the role table
    for index in kept:
        layers.add_column(columns[index], justify="left" if index < 2 else "right", overflow="fold")
    for row in report["layers"]:
        cells = layer_cells(row, metric)
        layers.add_row(*(cells[index] for index in kept))
    roles = Table(title="Formats per role")
    for index, column in enumerate(ROLE_COLUMNS):
        roles.add_column(column, justify="left" if index < 3 else "right", overflow="fold")
    for cells in role_rows(report):
        roles.add_row(*cells)
    for label, value in header_items(report):
        console.print(f"{label}: {value}")
    console.print(layers)
    console.print(roles)
    for line in summary_lines(report):
        console.print(line)
