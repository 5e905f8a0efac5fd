"""Check that a graph's common metadata follows lowbit's schema (see :mod:`lowbit.graph.metadata`).

MASE's verify pass is stale at its HEAD (it reads a "size" key its own metadata no longer has and rejects
every format but "fixed"), so this one checks the schema lowbit writes: every node has metadata, a
mase_type and a mase_op; every arg / result entry has type, precision and shape; a tensor's type is "float"
(precision 16, 32 or 64), a registered format name, or int / bool / complex for non-float dtypes; a
non-tensor's type is a Python type name; linear shapes agree with the weight; relu / gelu / softmax keep
their shape; node names are unique. Every problem is collected before one GraphError lists them all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from torch import fx

from lowbit.errors import did_you_mean
from lowbit.formats import list_formats
from lowbit.graph.entries import entry_dtype
from lowbit.graph.metadata import MaseMetadata, graph_module, read_pass_args, role_arg_keys
from lowbit.graph.qgraph import GraphError

FLOAT_BITS = (16, 32, 64)
_NON_FLOAT_TENSOR_TYPES = ("int", "bool", "complex")
_SHAPE_KEEPING_OPS = ("relu", "gelu", "softmax")


def verify_common_metadata_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """Raise GraphError listing every schema problem (node name + what); info ``{"checked": n_nodes}``."""
    read_pass_args("verify_common_metadata_analysis_pass", pass_args, {})
    nodes = list(graph_module(graph).graph.nodes)
    formats = set(list_formats())
    problems = [f"{name}: node name is used by {count} nodes"
                for name, count in Counter(node.name for node in nodes).items() if count > 1]  # fmt: skip
    for node in nodes:
        problems += [f"{node.name}: {problem}" for problem in node_problems(node, formats)]
    if problems:
        listing = "\n  ".join(problems)
        raise GraphError(f"common metadata check failed, {len(problems)} problem(s):\n  {listing}")
    return graph, {"checked": len(nodes)}


def node_problems(node: fx.Node, formats: set[str]) -> list[str]:
    """Everything wrong with one node's common metadata (empty when it is fine)."""
    meta = node.meta.get("mase")
    if not isinstance(meta, MaseMetadata):
        return ["no MASE metadata (run init_metadata_analysis_pass / add_common_metadata_analysis_pass)"]
    common = meta["common"]
    problems = [f"common has no {key!r}" for key in ("mase_type", "mase_op") if not common.get(key)]
    for section in ("args", "results"):
        entries = common.get(section)
        if not isinstance(entries, dict):
            problems.append(f"common has no {section!r} dict (run add_common_metadata_analysis_pass)")
            continue
        for key, entry in entries.items():
            problems += [f"{section}[{key!r}]: {problem}" for problem in entry_problems(entry, formats)]
    if not problems:
        problems += _op_problems(node, common)
    return problems


def entry_problems(entry: Any, formats: set[str]) -> list[str]:
    """What is wrong with one arg / result entry."""
    if not isinstance(entry, dict):
        return [f"entry must be a dict, got {type(entry).__name__}"]
    missing = [key for key in ("type", "precision", "shape") if key not in entry]
    if missing:
        return [f"missing {', '.join(map(repr, missing))}"]
    if not isinstance(entry["precision"], list) or not isinstance(entry["shape"], list):
        return ["precision and shape must be lists"]
    if "torch_dtype" in entry:
        return _tensor_problems(entry, formats)
    kind = entry["type"]
    if not (isinstance(kind, str) and kind.isidentifier()):
        return [f"type {kind!r} of a non-tensor value is not a Python type name"]
    return []


def _tensor_problems(entry: dict[str, Any], formats: set[str]) -> list[str]:
    dtype, kind, precision = entry_dtype(entry), entry["type"], entry["precision"]
    if dtype is None:
        return [f"torch_dtype {entry['torch_dtype']!r} is not a torch dtype"]
    if not all(isinstance(size, int) and size >= 0 for size in entry["shape"]):
        return [f"shape {entry['shape']} is not a list of sizes"]
    if not isinstance(kind, str):
        return [f"type must be a string, got {type(kind).__name__}"]
    if kind == "float":
        if not dtype.is_floating_point or len(precision) != 1 or precision[0] not in FLOAT_BITS:
            return [f"float precision {precision} of a {dtype} tensor is not one of {list(FLOAT_BITS)}"]
        return []
    if kind in formats:
        return [] if precision else [f"format {kind!r} has an empty precision"]
    if kind in _NON_FLOAT_TENSOR_TYPES and not dtype.is_floating_point:
        return []
    return [f"type {kind!r} is not 'float' or a registered format{did_you_mean(kind, ['float', *formats])}"]


def _op_problems(node: fx.Node, common: dict[str, Any]) -> list[str]:
    args, results, op = common["args"], common["results"], common["mase_op"]
    data_in, data_out = args.get("data_in_0"), results.get("data_out_0")
    if not (_is_tensor(data_in) and _is_tensor(data_out)):
        return []
    x_shape, y_shape = data_in["shape"], data_out["shape"]
    if op in _SHAPE_KEEPING_OPS and x_shape != y_shape:
        return [f"{op} changes the shape: data_in_0 {x_shape} -> data_out_0 {y_shape}"]
    if op != "linear":
        return []
    weight_key = role_arg_keys(node, op).get("weight", ["weight"])[0]
    weight = args.get(weight_key)
    if not _is_tensor(weight) or len(weight["shape"]) != 2:
        return [f"linear has no 2-D weight entry {weight_key!r}"]
    (out_features, in_features), problems = weight["shape"], []
    if not x_shape or x_shape[-1] != in_features:
        problems.append(f"linear data_in_0 {x_shape} does not end in the weight's in_features {in_features}")
    if not y_shape or y_shape[-1] != out_features:
        problems.append(f"linear data_out_0 {y_shape} does not end in the weight's out_features {out_features}")
    return problems


def _is_tensor(entry: Any) -> bool:
    return isinstance(entry, dict) and "torch_dtype" in entry


__all__ = ["entry_problems", "node_problems", "verify_common_metadata_analysis_pass"]
