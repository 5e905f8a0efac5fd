"""``profile_statistics_analysis_pass``: MASE's statistics profiler, batched and with bounded memory.

pass_args (as MASE's ``[passes.profile_statistics]``):

- ``by``: "type" (targets are mase_op names, e.g. "linear") or "name" (fx node names).
- ``target_weight_nodes``: nodes whose parameters get ``weight_statistics``.
- ``target_activation_nodes``: nodes whose tensor inputs get ``activation_statistics``.
- ``weight_statistics`` / ``activation_statistics``: ``{stat name: {options}}``, see
  :mod:`lowbit.calibrate.stats`.
- ``num_samples``: samples to profile; ceil(num_samples / batch size) batches are run, the batch size
  being dim 0 of the first batch (fewer if the generator runs out first).
- ``input_generator``: an iterable of batches. A batch is a dict ``{placeholder name: tensor}``, or a tuple
  / list whose first items are the inputs in placeholder order, the rest (labels) ignored, so a
  DataLoader of ``(x, y)`` works as it is; a bare tensor works for a one-input model.
- ``profile_output_activation``: also give the target activation nodes' output (``results.data_out_0``)
  the activation statistics (MASE accepts the key and does nothing with it).

Needs :func:`add_software_metadata_analysis_pass` first. Results go to
``node.meta["mase"]["software"]["args"][entry]["stat"][stat name] = {field: value}``.

Which entries get which statistics (the rule; MASE instead asserts when a linear is an activation target
but not a weight target):

- a weight-target node: every entry that is not a ``data_in_*`` (weight, bias, buffers) gets the weight
  statistics, measured once as one tensor (a weight computed inside the graph: on the first batch);
- an activation-target node: its ``data_in_*`` entries get the activation statistics, and so do its
  other entries unless the node is also a weight target;
- module parameters and buffers, and operands fed by a ``get_attr``, are the same for every batch, so
  they are read directly and measured once (as one sample) whichever statistics they get; every other
  operand is measured on every batch, one vectorised update per batch (MASE: one per sample). Weight
  targets on modules need no input_generator at all.

The model runs in eval mode under no_grad (flags restored after). An iterator as input_generator is
consumed; the pass_args themselves are never changed. info = ``{"batches": n, "samples": m}``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from lowbit.calibrate.stats import Stat, create_stat
from lowbit.errors import ConfigError, did_you_mean
from lowbit.graph.metadata import _software_names, common_of, eval_mode, graph_module, read_pass_args
from lowbit.graph.qgraph import GraphError

PASS = "profile_statistics_analysis_pass"
_DEFAULTS = {"by": "type", "target_weight_nodes": [], "target_activation_nodes": [], "weight_statistics": {},
             "activation_statistics": {}, "num_samples": None, "input_generator": None,
             "profile_output_activation": False}  # fmt: skip
_RESULT = object()  # marks a target that reads the node's output instead of an operand


@dataclass
class _Target:
    """One metadata entry being profiled, and where its tensor comes from."""

    node: fx.Node
    section: str  # "args" or "results"
    entry: str  # software entry name: data_in_0, weight, bias, data_out_0, ...
    stats: dict[str, Stat]
    source: Any = None  # per run: a common arg key (data_in_1, weight, ...) or _RESULT; None: ``constant``
    constant: Any = None  # a module's parameter / buffer or a get_attr value, read without running
    once: bool = False  # weight statistics of a computed operand: measured on the first batch only
    done: bool = field(default=False)

    def feed(self, value: Any) -> None:
        if self.done or not isinstance(value, torch.Tensor) or value.dtype == torch.bool:
            return
        single = self.once or self.source is None
        sample = value[None] if single else value  # one tensor is one sample; else dim 0 is the batch
        for stat in self.stats.values():
            stat.update(sample)
        self.done = single


# ---- pass ---------------------------------------------------------------------------------------------------
def profile_statistics_analysis_pass(graph: Any, pass_args: Mapping[str, Any] | None = None):
    """Profile weights and activations of the target nodes into their software metadata."""
    options = read_pass_args(PASS, pass_args, _DEFAULTS)
    model = graph_module(graph)
    _check_options(options, [node.name for node in model.graph.nodes])
    _check_software(model)
    targets = _plan(model, options)
    for target in targets:
        if target.source is None:  # parameters, buffers, constants: the same for every batch
            target.feed(target.constant)
    batches = samples = 0
    if any(target.source is not None for target in targets):
        batches, samples = _run(model, targets, options)
    for target in targets:
        software = target.node.meta["mase"]["software"][target.section]
        software[target.entry]["stat"] = {name: stat.compute() for name, stat in target.stats.items()}
    return graph, {"batches": batches, "samples": samples}


# ---- options ------------------------------------------------------------------------------------------------
def _check_options(options: dict[str, Any], node_names: list[str]) -> None:
    if options["by"] not in ("type", "name"):
        raise ConfigError(f"{PASS}: by must be \"type\" or \"name\", got {options['by']!r}"
                          f"{did_you_mean(str(options['by']), ('type', 'name'))}")  # fmt: skip
    for key in ("target_weight_nodes", "target_activation_nodes"):
        targets = options[key]
        if not isinstance(targets, (list, tuple)) or not all(isinstance(t, str) for t in targets):
            raise ConfigError(f"{PASS}: {key} must be a list of strings, got {targets!r}")
        for name in targets if options["by"] == "name" else ():
            if name not in node_names:
                raise ConfigError(f"{PASS}: {key} names {name!r}, which is not a node{did_you_mean(name, node_names)}")
    for key in ("weight_statistics", "activation_statistics"):
        _new_stats(options[key], key)  # builds them once so a bad name or option fails before any work
    if not isinstance(options["profile_output_activation"], bool):
        raise ConfigError(f"{PASS}: profile_output_activation must be true or false")
    if options["target_activation_nodes"] and options["activation_statistics"]:
        if options["input_generator"] is None:
            raise ConfigError(f"{PASS}: activation statistics need an input_generator (batches of model inputs)")
        n = options["num_samples"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{PASS}: num_samples must be a positive integer, got {n!r}")


def _new_stats(table: Any, key: str) -> dict[str, Stat]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{PASS}: {key} must be a table {{stat name: {{options}}}}, got {type(table).__name__}")
    stats = {}
    for name, kwargs in table.items():
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"{PASS}: {key}.{name} must be a table of options, got {kwargs!r}")
        try:
            stats[name] = create_stat(name, **dict(kwargs))
        except ConfigError as error:
            raise ConfigError(f"{PASS}: {key}: {error}") from None
    return stats


def _check_software(model: fx.GraphModule) -> None:
    for node in model.graph.nodes:
        meta = node.meta.get("mase")
        software = meta["software"] if meta is not None and "software" in meta else {}
        entries = software.get("args")
        if not isinstance(entries, dict) or any(not isinstance(e, dict) or "stat" not in e for e in entries.values()):
            raise GraphError(f"{PASS}: node {node.name!r} has no software stat entries; run "
                             "add_software_metadata_analysis_pass (after add_common_metadata_analysis_pass) first")


# ---- which entries ------------------------------------------------------------------------------------------
def _selected(node: fx.Node, targets: list[str], by: str) -> bool:
    return (node.name if by == "name" else common_of(node)["mase_op"]) in targets


def _plan(model: fx.GraphModule, options: dict[str, Any]) -> list[_Target]:
    plan = []
    for node in model.graph.nodes:
        weight = _selected(node, options["target_weight_nodes"], options["by"])
        activation = _selected(node, options["target_activation_nodes"], options["by"])
        for entry in node.meta["mase"]["software"]["args"]:
            parameter_like = not entry.startswith("data_in")
            if weight and parameter_like and options["weight_statistics"]:
                plan.append(_target(model, node, entry, _new_stats(options["weight_statistics"], ""), weight=True))
            elif activation and options["activation_statistics"]:
                plan.append(_target(model, node, entry, _new_stats(options["activation_statistics"], ""), weight=False))
        if activation and options["profile_output_activation"] and options["activation_statistics"]:
            stats = _new_stats(options["activation_statistics"], "")
            plan.append(_Target(node, "results", "data_out_0", stats, source=_RESULT))
    return plan


def _target(model: fx.GraphModule, node: fx.Node, entry: str, stats: dict[str, Stat], weight: bool) -> _Target:
    if node.op == "call_module":
        module = model.get_submodule(node.target)
        owned = dict([*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)])
        if entry in owned:
            return _Target(node, "args", entry, stats, constant=owned[entry])
    renamed = {name: key for key, name in _software_names(node, common_of(node)["mase_op"]).items()}
    common_key = renamed.get(entry, entry)  # the software "weight" of F.linear is its common "data_in_1"
    operand = _operand(common_key, node.args, node.kwargs)
    if isinstance(operand, fx.Node) and operand.op == "get_attr":
        return _Target(node, "args", entry, stats, constant=_attribute(model, operand.target))
    # weight statistics describe one tensor, even when the weight is computed in the graph
    return _Target(node, "args", entry, stats, source=common_key, once=weight)


def _attribute(model: nn.Module, path: str) -> Any:
    value = model
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _operand(key: str, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """The argument stored under common key ``key`` (data_in_i is positional argument i)."""
    index = key.removeprefix("data_in_")
    if key.startswith("data_in_") and index.isdigit():
        return args[int(index)] if int(index) < len(args) else None
    return kwargs.get(key)


# ---- running the batches --------------------------------------------------------------------------------
class _Profiler(fx.Interpreter):
    """Runs the graph, feeding the target nodes' operands (and outputs) to their stats."""

    def __init__(self, model: fx.GraphModule, targets: list[_Target]) -> None:
        super().__init__(model)
        self.by_node: dict[fx.Node, list[_Target]] = {}
        for target in targets:
            if target.source is not None:
                self.by_node.setdefault(target.node, []).append(target)

    def run_node(self, node: fx.Node) -> Any:
        targets = self.by_node.get(node, [])
        if targets:
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            for target in targets:
                if target.source is not _RESULT:
                    target.feed(_operand(target.source, args, kwargs))
        result = super().run_node(node)
        for target in targets:
            if target.source is _RESULT:
                target.feed(result)
        return result


def _run(model: fx.GraphModule, targets: list[_Target], options: dict[str, Any]) -> tuple[int, int]:
    placeholders = [node for node in model.graph.nodes if node.op == "placeholder"]
    profiler = _Profiler(model, targets)
    device = next((p.device for p in model.parameters()), None)
    batches = samples = 0
    wanted = None
    with eval_mode(model), torch.no_grad():
        for item in _iterate(options["input_generator"]):
            inputs = _positional(item, placeholders)
            size = next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.ndim > 0), 1)
            # num_samples may be absent when only weights computed in the graph need a run: one batch does
            wanted = wanted or (math.ceil(options["num_samples"] / size) if options["num_samples"] else 1)
            profiler.run(*[x.to(device) if device is not None and isinstance(x, torch.Tensor) else x for x in inputs])
            batches, samples = batches + 1, samples + size
            if batches >= wanted:
                break
    return batches, samples


def _iterate(generator: Any) -> Iterable[Any]:
    if generator is None:
        raise ConfigError(f"{PASS}: these targets are only seen by running the model: give an input_generator")
    if not isinstance(generator, Iterable):
        raise ConfigError(f"{PASS}: input_generator must be iterable (a DataLoader, a list or a generator of "
                          f"batches), got {type(generator).__name__}")  # fmt: skip
    return generator


def _positional(item: Any, placeholders: list[fx.Node]) -> list[Any]:
    """One batch as the model's positional inputs."""
    names = [node.name for node in placeholders]
    if isinstance(item, Mapping):
        known = set(names) | {str(node.target) for node in placeholders}
        for key in item:
            if key not in known:
                raise ConfigError(f"{PASS}: input_generator gave input {key!r}, which is not a placeholder"
                                  f"{did_you_mean(str(key), names)}; placeholders: {', '.join(names)}")  # fmt: skip
        return [_lookup(item, node, names) for node in placeholders]
    if isinstance(item, (tuple, list)):
        if len(item) < len(placeholders):
            raise ConfigError(f"{PASS}: a batch of {len(item)} items cannot feed {len(placeholders)} inputs "
                              f"({', '.join(names)}); yield dicts {{placeholder: tensor}}")  # fmt: skip
        return list(item[: len(placeholders)])  # (x, y): extra items are labels
    if len(placeholders) == 1:
        return [item]
    raise ConfigError(f"{PASS}: batches for a model with inputs {', '.join(names)} must be dicts or tuples, "
                      f"got {type(item).__name__}")  # fmt: skip


def _lookup(item: Mapping[str, Any], node: fx.Node, names: list[str]) -> Any:
    for key in (node.name, node.target):
        if key in item:
            return item[key]
    if node.args:  # the placeholder has a default value
        return node.args[0]
    raise ConfigError(f"{PASS}: a batch has no value for input {node.name!r}; placeholders: {', '.join(names)}")


__all__ = ["profile_statistics_analysis_pass"]
