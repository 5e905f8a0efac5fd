"""``quantize_transform_pass``: swap quantizable modules and functions of a QGraph for quantized ones.

pass_args as MASE: ``by`` ("type": keys are mase_op names; "name": fx node names; "regex_name": regexes
fully matched against node names, first match in key order wins), ``default`` for the rest, and
``{key: {"config": {...}}}``; a config whose ``name`` is None / "NA" leaves the node in float. Every
selected node's config is validated (:func:`lowbit.nn.parse_node_config`) before the graph changes, so a
bad key fails with the node and the nearest valid key named and leaves the graph as it was.

Modules are replaced by quantized copies (weights and biases copied exactly); function nodes keep their
name, arguments and metadata and are retargeted to the quantized function with a ``config`` keyword.
The caller's pass_args are never modified.

A shared config (``default``, regex entries) gives each op the operand keys MASE's parser gives it; the keys
an op did not use are listed per node in ``info["unused_keys"]`` and in the node's metadata
(:data:`UNUSED_KEYS`), which the summary pass shows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from lowbit.errors import ConfigError
from lowbit.graph.mase_ops import classify
from lowbit.graph.plan import Simulated, apply
from lowbit.graph.qgraph import QGraph
from lowbit.graph.select import Selector
from lowbit.nn.config import QUANTIZABLE_OPS, read_node_config
from lowbit.nn.functional import FUNCTION_FOR_OP, QUANT_FUNCTIONS
from lowbit.nn.modules import MODULE_FOR_OP
from lowbit.nn.roles import RoleFormats

ORIGINAL_TARGET = "lowbit_original_target"  # node.meta key: the float function a node was retargeted from
UNUSED_KEYS = "lowbit_unused_keys"  # node.meta key: {config key: why this node did not use it}


@dataclass(frozen=True)
class _Planned:
    node: fx.Node
    op: str
    formats: RoleFormats
    unused: dict[str, str]


def node_op(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    """The node's mase_op: from its metadata when the metadata passes ran, else classified now."""
    mase = node.meta.get("mase")
    parameters = getattr(mase, "parameters", None)
    if isinstance(parameters, dict) and "mase_op" in parameters.get("common", {}):
        return parameters["common"]["mase_op"]
    return classify(node, modules).mase_op


def quantize_transform_pass(graph: QGraph, pass_args: dict[str, Any]) -> tuple[QGraph, dict[str, Any]]:
    """Quantize ``graph`` in place as ``pass_args`` says; info lists what was quantized and skipped."""
    if not isinstance(graph, QGraph):
        raise ConfigError(f"quantize_transform_pass needs a QGraph, got {type(graph).__name__}")
    modules = graph.modules
    candidates = [n for n in graph.nodes if n.op.startswith("call_")]
    selector = Selector(pass_args, [n.name for n in candidates], "node name of this graph")
    plan, skipped = _plan(candidates, modules, selector)
    _check_shared_modules(plan)
    module_items = [item for item in plan if item.node.op == "call_module"]
    for item in module_items:
        _check_float_class(item, modules)
    apply(graph.model, {item.node.target: Simulated(item.formats, item.op) for item in module_items})
    for item in plan:
        _rewrite_node(item)
    graph.recompile()
    counts = Counter(item.op for item in plan)
    unused = {item.node.name: item.unused for item in plan if item.unused}
    return graph, {"quantized": [item.node.name for item in plan], "skipped": skipped, "counts": dict(counts),
                   "unused_keys": unused}  # fmt: skip


def _plan(candidates: list[fx.Node], modules: dict[str, nn.Module], selector: Selector):
    plan, skipped = [], []
    explicitly_named = set(selector.entries) if selector.by == "name" else set()
    for node in candidates:
        op = node_op(node, modules)
        if op not in QUANTIZABLE_OPS or node.op == "call_method":
            if node.name in explicitly_named:
                raise ConfigError(f"node {node.name!r} is a {op!r} ({node.op}), which cannot be quantized; "
                                  f"quantizable ops: {', '.join(QUANTIZABLE_OPS)}")  # fmt: skip
            continue
        key, config = selector.config_for(op, node.name)
        where = f"node {node.name!r} ({op}, config {key!r})"
        parsed = read_node_config(op, config, where, shared=selector.is_shared(key)) if config is not None else None
        if parsed is None or parsed.formats is None:
            skipped.append(node.name)
        else:
            plan.append(_Planned(node, op, parsed.formats, parsed.unused))
    return plan, skipped


def _check_shared_modules(plan: list[_Planned]) -> None:
    """One module object called from two nodes can carry one set of formats only."""
    seen: dict[str, _Planned] = {}
    for item in plan:
        if item.node.op != "call_module":
            continue
        first = seen.setdefault(item.node.target, item)
        if first.formats != item.formats:
            raise ConfigError(f"module {item.node.target!r} is called by nodes {first.node.name!r} and "
                              f"{item.node.name!r} with different quantize configs; give both the same config")  # fmt: skip


def _check_float_class(item: _Planned, modules: dict[str, nn.Module]) -> None:
    original = modules[item.node.target]
    if not isinstance(original, MODULE_FOR_OP[item.op].float_class):
        raise ConfigError(f"node {item.node.name!r}: module {type(original).__name__} is classified {item.op!r} "
                          f"but is not a {MODULE_FOR_OP[item.op].float_class.__name__}")  # fmt: skip


def _rewrite_node(item: _Planned) -> None:
    """A function node retargeted to its quantized function; every quantized node's metadata recorded."""
    node = item.node
    if node.op != "call_module":
        if node.target not in QUANT_FUNCTIONS:
            node.meta[ORIGINAL_TARGET] = node.target
        node.target = FUNCTION_FOR_OP[item.op]
        node.kwargs = {**node.kwargs, "config": item.formats.to_dict()}
    node.meta[UNUSED_KEYS] = dict(item.unused)
    _record(node, item.formats)


def _record(node: fx.Node, formats: RoleFormats) -> None:
    """Write each quantized role's format and precision into the node's metadata (when the common metadata
    pass has recorded its args; after init_metadata alone there is nothing to update)."""
    parameters = getattr(node.meta.get("mase"), "parameters", None)
    if not isinstance(parameters, dict) or "args" not in parameters.get("common", {}):
        return
    from lowbit.graph.metadata import record_formats

    record_formats(node, formats)
