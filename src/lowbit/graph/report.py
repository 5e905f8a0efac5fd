"""Reports on a graph's metadata: node types, shapes and the full per-node parameters.

Each pass returns its table as data (``info["table"]``, a list of dicts, one per node) and prints it
unless ``{"print": False}``: with ``rich`` when it is installed (the optional ``report`` extra), as a
plain-text grid otherwise. Tensors are shown as ``Tensor(shape=[...], dtype=...)``, never dumped.
"""

from __future__ import annotations

import pprint
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from lowbit._io import atomic_write_text
from lowbit.errors import ConfigError, did_you_mean
from lowbit.graph.metadata import MaseMetadata, graph_module, read_pass_args
from lowbit.graph.qgraph import GraphError

SECTIONS = ("all", "common", "software")


# ---- the passes ------------------------------------------------------------------------------------------
def report_node_type_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """Node name, fx op, mase_type, mase_op and the type of data_in_0 of every node."""
    options = read_pass_args("report_node_type_analysis_pass", pass_args, {"print": True})
    rows = []
    for node in _nodes(graph):
        common = node.meta["mase"]["common"]
        data_in = common.get("args", {}).get("data_in_0")
        rows.append({"name": node.name, "fx_op": node.op, "mase_type": common.get("mase_type"),
                     "mase_op": common.get("mase_op"), "data_in_0": _get(data_in, "type")})  # fmt: skip
    if options["print"]:
        show("Node types", rows)
    return graph, {"table": rows}


def report_node_shape_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """The shape of every tensor arg and result of every node ({key: shape})."""
    options = read_pass_args("report_node_shape_analysis_pass", pass_args, {"print": True})
    rows = []
    for node in _nodes(graph):
        common = node.meta["mase"]["common"]
        rows.append({"name": node.name, "fx_op": node.op, "mase_op": common.get("mase_op"),
                     "in_shapes": _shapes(common.get("args", {})),
                     "out_shapes": _shapes(common.get("results", {}))})  # fmt: skip
    if options["print"]:
        show("Node shapes", rows)
    return graph, {"table": rows}


def report_node_meta_param_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """Every node's common and / or software parameters as a text grid (saved to ``save_path`` if given).

    ``which``: a list of "all", "common", "software" (default ["all"]). info: table, text, save_path.
    """
    name = "report_node_meta_param_analysis_pass"
    options = read_pass_args(name, pass_args, {"which": ["all"], "save_path": None, "print": True})
    sections = _sections(name, options["which"])
    rows = []
    for node in _nodes(graph):
        meta = node.meta["mase"]
        row = {"name": node.name, "fx_op": node.op, "mase_type": meta["common"].get("mase_type"),
               "mase_op": meta["common"].get("mase_op")}  # fmt: skip
        row.update({section: readable(meta[section]) for section in sections})
        rows.append(row)
    text = grid(rows)
    if options["save_path"] is not None:
        atomic_write_text(options["save_path"], text + "\n")
    if options["print"]:
        print(text)
    return graph, {"table": rows, "text": text, "save_path": options["save_path"]}


# ---- helpers -----------------------------------------------------------------------------------------------
def _nodes(graph: Any) -> list[fx.Node]:
    nodes = list(graph_module(graph).graph.nodes)
    bare = [node.name for node in nodes if not isinstance(node.meta.get("mase"), MaseMetadata)]
    if bare:
        raise GraphError(f"nodes without MASE metadata: {', '.join(bare)}; run add_common_metadata_analysis_pass")
    return nodes


def _sections(pass_name: str, which: Any) -> list[str]:
    chosen = [which] if isinstance(which, str) else which
    if not isinstance(chosen, (list, tuple)) or not chosen:
        raise ConfigError(f"{pass_name}: which must be a non-empty list of {', '.join(SECTIONS)}, got {which!r}")
    for item in chosen:
        if item not in SECTIONS:
            raise ConfigError(f"{pass_name}: unknown which {item!r}{did_you_mean(str(item), SECTIONS)}; "
                              f"valid: {', '.join(SECTIONS)}")  # fmt: skip
    if "all" in chosen:
        return ["common", "software"]
    return [section for section in ("common", "software") if section in chosen]


def _get(entry: Any, key: str) -> Any:
    return entry.get(key) if isinstance(entry, dict) else None


def _shapes(entries: dict[str, Any]) -> dict[str, list[int]]:
    return {key: entry["shape"] for key, entry in entries.items() if isinstance(entry, dict) and "torch_dtype" in entry}


def readable(value: Any) -> Any:
    """``value`` with tensors replaced by a short description (so a report never dumps a weight)."""
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={list(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')})"
    if isinstance(value, dict):
        return {key: readable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [readable(item) for item in value]
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        return tuple(readable(item) for item in value)
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        return "\n".join(f"{key}={item}" for key, item in value.items())  # shape maps: one per line
    return pprint.pformat(value, width=80, sort_dicts=False)


def grid(rows: list[dict[str, Any]]) -> str:
    """A plain-text grid of ``rows`` (columns: the first row's keys); cells may span several lines."""
    if not rows:
        return "(no nodes)"
    headers = list(rows[0])
    cells = [[_cell(row.get(header)).split("\n") for header in headers] for row in rows]
    widths = [max(len(header), *(len(line) for row in cells for line in row[i])) for i, header in enumerate(headers)]
    rule = "+" + "+".join("-" * (width + 2) for width in widths) + "+"
    lines = [rule, _grid_line(headers, widths), rule.replace("-", "=")]
    for row in cells:
        for depth in range(max(len(cell) for cell in row)):
            lines.append(_grid_line([cell[depth] if depth < len(cell) else "" for cell in row], widths))
        lines.append(rule)
    return "\n".join(lines)


def _grid_line(texts: list[str], widths: list[int]) -> str:
    return "| " + " | ".join(text.ljust(width) for text, width in zip(texts, widths, strict=True)) + " |"


def _rich_classes():
    """rich's (Console, Table, escape), or None when rich is not installed (it is an optional extra)."""
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        return None
    return Console, Table, escape


def show(title: str, rows: list[dict[str, Any]]) -> None:
    """Print ``rows`` as a table: rich if available, plain text otherwise."""
    classes = _rich_classes()
    if classes is None or not rows:
        print(f"{title}\n{grid(rows)}")
        return
    console_class, table_class, escape = classes
    table = table_class(title=title)
    for header in rows[0]:
        table.add_column(header)
    for row in rows:  # escaped: a cell such as "[8, 4]" must not be read as rich markup
        table.add_row(*(escape(_cell(value)) for value in row.values()))
    console_class().print(table)


__all__ = [
    "grid", "readable", "report_node_meta_param_analysis_pass", "report_node_shape_analysis_pass",
    "report_node_type_analysis_pass", "show",
]  # fmt: skip
