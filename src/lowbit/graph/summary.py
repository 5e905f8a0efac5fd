"""``summarize_quantization_analysis_pass``: what the quantize pass changed, as a table and two CSV files.

Rows: every call_module / call_function / call_method node with its mase_type, mase_op, original type (the float class
or function), quantized type, the formats per role, whether it changed and the config keys the node did not
use (a shared ``default`` config's weight keys at a ReLU, ...). Unlike MASE, a retargeted
function counts as changed (MASE compares ``type(function)``, which is always ``function``). Files, when
``save_dir`` is given: ``quantize_table.csv`` (the rows) and ``quantize_histogram.csv`` (per original
type: total, changed, unchanged), each written atomically.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lowbit._io import atomic_write_text
from lowbit.errors import ConfigError, did_you_mean
from lowbit.graph.mase_ops import classify
from lowbit.graph.qgraph import QGraph
from lowbit.graph.quantize import ORIGINAL_TARGET, UNUSED_KEYS
from lowbit.nn.modules import QuantModule
from lowbit.nn.roles import RoleFormats

_KEYS = ("save_dir", "original_graph", "print")
COLUMNS = ("node", "mase_type", "mase_op", "original_type", "quantized_type", "formats", "changed", "unused_keys")


def summarize_quantization_analysis_pass(graph: QGraph, pass_args: Mapping[str, Any] | None = None):
    """Table of the quantized graph; info = {"table": rows, "histogram": rows, "files": paths}."""
    args = _checked(pass_args)
    rows = [_row(node, graph.modules) for node in graph.nodes if node.op.startswith("call_")]
    histogram = _histogram(rows)
    files = []
    if args.get("save_dir"):
        directory = Path(args["save_dir"])
        files = [directory / "quantize_table.csv", directory / "quantize_histogram.csv"]
        atomic_write_text(files[0], _csv(rows, COLUMNS))
        atomic_write_text(files[1], _csv(histogram, ("op", "total", "changed", "unchanged")))
    if args.get("print", True):
        print_table("Quantization summary", COLUMNS, rows)
    return graph, {"table": rows, "histogram": histogram, "files": [str(f) for f in files]}


def _checked(pass_args: Mapping[str, Any] | None) -> dict[str, Any]:
    args = dict(pass_args or {})
    for key in args:
        if key not in _KEYS:
            raise ConfigError(f"summarize_quantization_analysis_pass: unknown key {key!r}{did_you_mean(key, _KEYS)}")
    return args


def _row(node, modules) -> dict[str, Any]:
    kind = classify(node, modules)
    if node.op == "call_module":
        module = modules[node.target]
        quantized = isinstance(module, QuantModule)
        original = module.float_class.__name__ if quantized else type(module).__name__
        new_type = type(module).__name__
        formats = module.formats.describe() if quantized else ""
    else:
        before = node.meta.get(ORIGINAL_TARGET, node.target)
        original, new_type = _name(before), _name(node.target)
        quantized = "config" in node.kwargs and before is not node.target
        formats = RoleFormats.from_dict(node.kwargs["config"]).describe() if quantized else ""
    unused = " ".join(node.meta.get(UNUSED_KEYS, {})) if quantized else ""
    return {"node": node.name, "mase_type": kind.mase_type, "mase_op": kind.mase_op, "original_type": original,
            "quantized_type": new_type, "formats": formats, "changed": quantized, "unused_keys": unused}  # fmt: skip


def _name(target: Any) -> str:
    return getattr(target, "__qualname__", str(target))


def _histogram(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts: dict[str, list[int]] = {}
    for row in rows:
        total_changed = counts.setdefault(row["original_type"], [0, 0])
        total_changed[0] += 1
        total_changed[1] += int(row["changed"])
    return [{"op": op, "total": t, "changed": c, "unchanged": t - c} for op, (t, c) in counts.items()]


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def print_table(title: str, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """A rich table when rich is installed (the ``report`` extra), plain aligned text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(str(r[c])) for r in rows)) if rows else len(c) for c in columns]
        print(title)
        for line in [dict(zip(columns, columns, strict=True)), *rows]:
            print("  ".join(str(line[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    Console(width=None if sys.stdout.isatty() else 200).print(table)
