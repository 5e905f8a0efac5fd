"""MASE-compatible node metadata: ``node.meta["mase"]`` with a "common" and a "software" section.

Passes (all ``pass_fn(graph, pass_args=None) -> (graph, info)``; the caller's pass_args are never changed):

- :func:`init_metadata_analysis_pass` gives every node an empty :class:`MaseMetadata`.
- :func:`add_common_metadata_analysis_pass` (``{"dummy_in": {placeholder: value}, "add_value": True}``)
  classifies every node (``common["mase_type"]`` / ``common["mase_op"]``, see :mod:`lowbit.graph.mase_ops`)
  and runs the graph once on ``dummy_in`` to record ``common["args"]`` and ``common["results"]``.
- :func:`add_software_metadata_analysis_pass` prepares ``software["args"|"results"][entry]["stat"]`` for
  the statistics profiler.

Schema of one ``common`` entry (this is lowbit's schema; it differs from MASE where noted):

- tensor: ``{"type", "precision", "shape", "torch_dtype"[, "value"]}``. ``type`` is "float" for floating
  dtypes ("int" / "bool" / "complex" otherwise), ``precision`` is ``[bits of the dtype]`` (bf16 -> [16]),
  ``shape`` the true shape as a list, ``torch_dtype`` ``str(dtype)``, ``value`` a detached clone (only with
  ``add_value``, the default). A tensor is recognised by its ``torch_dtype`` key.
- non-tensor: ``{"type": <python type name>, "precision": [], "shape": [], "value": v}``; the value is
  always kept (tensors inside containers, as in ``torch.cat([a, b])``, become tensor entries).
- quantized operand: as a tensor, with ``type`` the format name, ``precision`` the MASE-style list of
  :meth:`RoleFormats.precision` (integer -> [width, frac_width]) and ``format`` the spec's description.

Arg keys: positional argument i is ``data_in_{i}``, keyword arguments keep their names. For call_method
nodes ``self`` IS argument 0 (MASE leaves it out, so ``x.view(b, -1)`` there has the batch size as
data_in_0); keeping it makes method and function nodes line up. call_module nodes add the module's own
parameters and buffers under their names with their true shapes (MASE stores 1-D ones as [1, N]).
A quantized function's ``config`` keyword is not recorded: its formats show in the operand entries.
Results: ``data_out_0`` (tuple / list results: ``data_out_0``, ``data_out_1``, ...). The output node's
args are the returned values (data_in_0, ...) and its results share the entries of the node it returns
(MASE takes the node before it in graph order, which is not always the returned one). The graph-level
``meta["mase"]["common"]`` holds node *names* in ``nodes_in`` / ``nodes_out`` (not Node objects, so it
survives rewrites and saving). The graph runs in eval mode under no_grad (training flags are restored):
an analysis must not move BatchNorm running statistics, and batch size 1 then works.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn

from lowbit.errors import ConfigError, did_you_mean
from lowbit.graph.entries import (
    dtype_bits, entry_dtype, is_float_tensor_entry, result_entries, tensor_entry, value_entry,
)  # fmt: skip
from lowbit.graph.mase_ops import classify
from lowbit.graph.qgraph import GraphError
from lowbit.nn.functional import QUANT_FUNCTIONS
from lowbit.nn.modules import QuantModule
from lowbit.nn.roles import RoleFormats

REQUIRED = object()  # marks a pass_args key without a default


# ---- pass plumbing ---------------------------------------------------------------------------------------
def read_pass_args(pass_name: str, pass_args: Mapping[str, Any] | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """A new dict of ``defaults`` overridden by ``pass_args``; ConfigError for unknown or missing keys."""
    if pass_args is None:
        pass_args = {}
    if not isinstance(pass_args, Mapping):
        raise ConfigError(f"{pass_name}: pass_args must be a dict or None, got {type(pass_args).__name__}")
    for key in pass_args:
        if key not in defaults:
            valid = ", ".join(map(repr, defaults)) or "none"
            raise ConfigError(f"{pass_name}: unknown pass_args key {key!r}{did_you_mean(key, defaults)}; "
                              f"valid keys: {valid}")  # fmt: skip
    merged = {**defaults, **pass_args}
    for key, value in merged.items():
        if value is REQUIRED:
            raise ConfigError(f"{pass_name}: pass_args needs the key {key!r}")
    return merged


def graph_module(graph: Any) -> fx.GraphModule:
    """The GraphModule of a QGraph (GraphError for anything else)."""
    model = getattr(graph, "model", None)
    if not isinstance(model, fx.GraphModule):
        raise GraphError(f"expected a QGraph (with an fx.GraphModule .model), got {type(graph).__name__}")
    return model


def common_of(node: fx.Node) -> dict[str, Any]:
    """The node's common metadata, which must already hold args/results."""
    meta = node.meta.get("mase")
    if not isinstance(meta, MaseMetadata) or "args" not in meta["common"]:
        raise GraphError(f"node {node.name!r} has no common metadata; run add_common_metadata_analysis_pass first")
    return meta["common"]


# ---- per-node metadata -----------------------------------------------------------------------------------
class MaseMetadata:
    """One node's metadata: ``parameters = {"common": {...}, "software": {...}}``, indexable by section."""

    def __init__(self, node: fx.Node, model: nn.Module) -> None:
        self.node = node
        self.model = model
        self.parameters: dict[str, dict[str, Any]] = {"common": {}, "software": {}}

    @property
    def module(self) -> nn.Module | None:
        """The node's module (looked up on every access, so module swaps show); None unless call_module."""
        if self.node.op != "call_module":
            return None
        try:
            return self.model.get_submodule(self.node.target)
        except AttributeError as error:
            raise GraphError(f"node {self.node.name!r} calls missing module {self.node.target!r}") from error

    def __getitem__(self, key: str) -> dict[str, Any]:
        return self.parameters[key]

    def __setitem__(self, key: str, value: dict[str, Any]) -> None:
        self.parameters[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.parameters

    def __repr__(self) -> str:
        return f"MaseMetadata({self.node.name}, sections={list(self.parameters)})"


def init_metadata_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """Give every node a fresh, empty ``node.meta["mase"]`` and the graph an empty graph-level entry."""
    read_pass_args("init_metadata_analysis_pass", pass_args, {})
    model = graph_module(graph)
    for node in model.graph.nodes:
        node.meta["mase"] = MaseMetadata(node, model)
    if not isinstance(getattr(graph, "meta", None), dict):
        graph.meta = {}
    graph.meta["mase"] = {"common": {}, "software": {}}
    return graph, {"nodes": len(model.graph.nodes)}


# ---- roles -> arg keys ---------------------------------------------------------------------------------
_X = (0, ("input", "x"))
# Functional ops: role -> operand slots, each (positional index, keyword spellings in torch / lowbit).
_FUNCTION_SLOTS: dict[str, dict[str, tuple[tuple[int, tuple[str, ...]], ...]]] = {
    **{op: {"data_in": (_X, (1, ("other", "y")))} for op in ("add", "sub", "mul")},
    **{op: {"data_in": (_X,), "weight": ((1, ("other", "mat2", "y")),)} for op in ("matmul", "bmm")},
    **{op: {"data_in": (_X,), "weight": ((1, ("weight",)),), "bias": ((2, ("bias",)),)}
       for op in ("linear", "conv1d", "conv2d")},
    "layer_norm": {"data_in": (_X,), "weight": ((2, ("weight",)),), "bias": ((3, ("bias",)),)},
    "batch_norm2d": {"data_in": (_X,), "weight": ((3, ("weight",)),), "bias": ((4, ("bias",)),)},
    "embedding": {"weight": ((1, ("weight",)),)},
}  # fmt: skip
_MODULE_KEYS = {"data_in": ["data_in_0"], "weight": ["weight"], "bias": ["bias"], "data_out": ["data_out_0"]}


def _slot_key(node: fx.Node, index: int, names: tuple[str, ...]) -> str:
    if index >= len(node.args):
        for name in names:  # the operand was passed by keyword
            if name in node.kwargs:
                return name
    return f"data_in_{index}"


def role_arg_keys(node: fx.Node, mase_op: str) -> dict[str, list[str]]:
    """Which common entries hold each operand role of ``node`` ({role: [keys]}; data_out -> results).

    call_module: data_in_0 / weight / bias. Functions and methods: by op, e.g. add -> data_in_0 and
    data_in_1, matmul -> weight is data_in_1, layer_norm -> weight data_in_2; an operand passed by keyword
    maps to its keyword name. Other nodes: {}.
    """
    if node.op == "call_module":
        return {role: list(keys) for role, keys in _MODULE_KEYS.items()}
    if node.op not in ("call_function", "call_method"):
        return {}
    slots = _FUNCTION_SLOTS.get(mase_op, {"data_in": (_X,)})
    keys = {role: [_slot_key(node, index, names) for index, names in entries] for role, entries in slots.items()}
    keys["data_out"] = ["data_out_0"]
    return keys


def node_formats(node: fx.Node, model: nn.Module) -> RoleFormats | None:
    """The formats of a quantized module / quantized function node; None for a float node."""
    if node.op == "call_module":
        module = model.get_submodule(node.target)
        return module.formats if isinstance(module, QuantModule) else None
    if node.op == "call_function" and node.target in QUANT_FUNCTIONS:
        return RoleFormats.from_dict(node.kwargs.get("config", {}))
    return None


def record_formats(node: fx.Node, formats: RoleFormats | None) -> None:
    """Write ``formats`` into the node's existing common entries (type / precision / format per role).

    Float tensor operands of roles without a format (and every operand when ``formats`` is None or
    bypassed) are reset to float, so re-quantizing a node leaves no stale format behind. Non-tensor
    operands (``x + 1``) are never quantized, so they are left alone.
    """
    common = common_of(node)
    active = {} if formats is None or formats.bypass else formats.active()
    for role, keys in role_arg_keys(node, common["mase_op"]).items():
        for key in keys:
            section = common["results"] if key.startswith("data_out") else common["args"]
            entry = section.get(key)
            if not is_float_tensor_entry(entry):
                continue
            entry.pop("format", None)
            if role in active:
                entry.update(type=active[role].format_name, precision=formats.precision(role),
                             format=active[role].describe())  # fmt: skip
            else:
                entry.update(type="float", precision=[dtype_bits(entry_dtype(entry))])


# ---- common metadata -----------------------------------------------------------------------------------
class _Recorder(fx.Interpreter):
    """Runs the graph like fx's ShapeProp, writing each node's args before and results after it runs."""

    def __init__(self, model: fx.GraphModule, add_value: bool) -> None:
        super().__init__(model)
        self.extra_traceback = False  # our GraphError already names the node
        self.add_value = add_value

    def run_node(self, node: fx.Node) -> Any:
        common = node.meta["mase"]["common"]
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        # recorded before running: an in-place op would otherwise show its own output as its input
        if node.op == "output":  # one entry per returned value, like the results
            returned = result_entries(args[0], self.add_value)
            common["args"] = {key.replace("data_out", "data_in"): entry for key, entry in returned.items()}
        else:
            common["args"] = {} if node.op == "placeholder" else self._arg_entries(node, args, kwargs)
        try:
            result = super().run_node(node)
        except Exception as error:
            raise GraphError(f"running dummy_in failed at node {node.name!r} ({node.op} {_target_name(node)}): "
                             f"{type(error).__name__}: {error}") from error  # fmt: skip
        if node.op == "output" and isinstance(node.args[0], fx.Node):
            common["results"] = dict(node.args[0].meta["mase"]["common"]["results"])  # the same entry objects
        else:
            common["results"] = result_entries(result, self.add_value)
        return result

    def _arg_entries(self, node: fx.Node, args: tuple, kwargs: dict) -> dict[str, Any]:
        entries = {f"data_in_{i}": value_entry(value, self.add_value) for i, value in enumerate(args)}
        quantized_function = node.op == "call_function" and node.target in QUANT_FUNCTIONS
        for name, value in kwargs.items():
            if not (quantized_function and name == "config"):
                entries[name] = value_entry(value, self.add_value)
        if node.op == "call_module":
            module = self.module.get_submodule(node.target)
            for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                entries[name] = tensor_entry(tensor, self.add_value)
        return entries


def _target_name(node: fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def _positional_inputs(model: fx.GraphModule, dummy_in: Mapping[str, Any]) -> list[Any]:
    placeholders = [node for node in model.graph.nodes if node.op == "placeholder"]
    known = {node.name for node in placeholders} | {str(node.target) for node in placeholders}
    names = [node.name for node in placeholders]
    for key in dummy_in:
        if key not in known:
            raise ConfigError(f"add_common_metadata_analysis_pass: dummy_in key {key!r} is not a placeholder"
                              f"{did_you_mean(key, names)}; placeholders: {', '.join(names)}")  # fmt: skip
    inputs = []
    for node in placeholders:
        if node.name in dummy_in or node.target in dummy_in:
            inputs.append(dummy_in[node.name] if node.name in dummy_in else dummy_in[node.target])
        elif node.args:  # the placeholder has a default value
            inputs.append(node.args[0])
        else:
            raise ConfigError(f"add_common_metadata_analysis_pass: dummy_in has no value for placeholder "
                              f"{node.name!r}; placeholders: {', '.join(names)}")  # fmt: skip
    return inputs


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Analysis must not change the model: eval mode keeps BatchNorm running stats (and dropout) still."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training


def add_common_metadata_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """Classify every node and record its args / results by running ``dummy_in`` through the graph."""
    name = "add_common_metadata_analysis_pass"
    options = read_pass_args(name, pass_args, {"dummy_in": REQUIRED, "add_value": True, "force_device_meta": False})
    if not isinstance(options["dummy_in"], Mapping):
        raise ConfigError(f"{name}: dummy_in must be a dict {{placeholder name: value}}, "
                          f"got {type(options['dummy_in']).__name__}")  # fmt: skip
    if not isinstance(options["add_value"], bool):
        raise ConfigError(f"{name}: add_value must be true or false, got {options['add_value']!r}")
    if options["force_device_meta"] is not False:
        raise ConfigError(f"{name}: force_device_meta is not supported (values are recorded on the model's device)")
    model = graph_module(graph)
    if any(not isinstance(node.meta.get("mase"), MaseMetadata) for node in model.graph.nodes):
        init_metadata_analysis_pass(graph)
    inputs = _positional_inputs(model, options["dummy_in"])
    modules = dict(model.named_modules())
    for node in model.graph.nodes:
        kind = classify(node, modules)
        node.meta["mase"]["common"] = {"mase_type": kind.mase_type, "mase_op": kind.mase_op}
    with eval_mode(model), torch.no_grad():
        _Recorder(model, options["add_value"]).run(*inputs)
    for node in model.graph.nodes:
        formats = node_formats(node, model)
        if formats is not None:
            record_formats(node, formats)
    _graph_common(graph, model)
    return graph, {"nodes": len(model.graph.nodes)}


def _graph_common(graph: Any, model: fx.GraphModule) -> None:
    nodes = list(model.graph.nodes)
    placeholders = [node for node in nodes if node.op == "placeholder"]
    output = next(node for node in nodes if node.op == "output")
    returned = [arg.name for arg in output.all_input_nodes]
    if not isinstance(getattr(graph, "meta", None), dict):
        graph.meta = {}
    section = graph.meta.setdefault("mase", {})
    section.setdefault("software", {})
    section["common"] = {
        "nodes_in": [node.name for node in placeholders], "nodes_out": returned,
        "args": {node.name: node.meta["mase"]["common"]["results"]["data_out_0"] for node in placeholders},
        "results": output.meta["mase"]["common"]["results"],
    }  # fmt: skip


# ---- software metadata ---------------------------------------------------------------------------------
_SOFTWARE_RENAMED_OPS = ("linear", "conv1d", "conv2d", "layer_norm", "batch_norm2d")


def _software_names(node: fx.Node, mase_op: str) -> dict[str, str]:
    """MASE names a functional op's parameter operands weight / bias (and running stats) in software."""
    if node.op != "call_function" or mase_op not in _SOFTWARE_RENAMED_OPS:
        return {}
    keys = role_arg_keys(node, mase_op)
    names = {key: role for role in ("weight", "bias") for key in keys.get(role, [])}
    if mase_op == "batch_norm2d":
        names.update({_slot_key(node, 1, ("running_mean",)): "running_mean",
                      _slot_key(node, 2, ("running_var",)): "running_var"})  # fmt: skip
    return names


def add_software_metadata_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """Empty ``stat`` dicts for every tensor operand and data_out_0, ready for the statistics profiler.

    Only tensor operands get one (a stat of ``dim=1`` means nothing); ``num_batches_tracked`` is left out
    as in MASE. Each entry gets a dict of its own (MASE shares one, so one profile shows everywhere).
    """
    read_pass_args("add_software_metadata_analysis_pass", pass_args, {})
    model = graph_module(graph)
    for node in model.graph.nodes:
        common = common_of(node)
        names = _software_names(node, common["mase_op"])
        args = {names.get(key, key): {"stat": {}} for key, entry in common["args"].items()
                if "torch_dtype" in entry and key != "num_batches_tracked"}  # fmt: skip
        node.meta["mase"]["software"] = {"args": args, "results": {"data_out_0": {"stat": {}}}}
    return graph, {"nodes": len(model.graph.nodes)}


__all__ = [
    "MaseMetadata", "add_common_metadata_analysis_pass", "add_software_metadata_analysis_pass",
    "init_metadata_analysis_pass", "node_formats", "read_pass_args", "record_formats", "role_arg_keys",
]  # fmt: skip
