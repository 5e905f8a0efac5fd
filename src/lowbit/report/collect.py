"""Run the float and the quantized model side by side and gather what each layer saw and produced.

Two runners share one interface, ``run(batch, record, overrides) -> (model output, {layer: [Call]})``:

- :class:`GraphRunner` interprets an ``fx.GraphModule`` node by node (so quantized *functions* are layers
  too); a layer listed in ``overrides`` runs with those formats instead of its own.
- :class:`ModuleRunner` puts forward hooks on named modules of a plain ``nn.Module`` (the module-swap
  path); an override swaps the module's formats for the duration of the call (a real-quantized layer is
  swapped for its float twin instead).

Recorded tensors are cloned (a later in-place op of the model, ``ReLU(inplace=True)``, must not change
them); parameters are kept as they are.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from lowbit._model import model_arguments
from lowbit.errors import ConfigError, ReportError
from lowbit.report.layers import Layer
from lowbit.nn.roles import RoleFormats


@dataclass
class Call:
    """One call of a layer: its evaluated arguments and its result."""

    args: tuple
    kwargs: dict[str, Any]
    output: Any


def model_inputs(batch: Any) -> tuple[tuple, dict[str, Any]]:
    """A batch as model arguments, by lowbit's one rule (:func:`lowbit._model.model_arguments`: a mapping
    is keyword arguments, a tuple / list gives its first item, anything else is the one input)."""
    try:
        return model_arguments(batch)
    except ConfigError as error:
        raise ReportError(str(error)) from None


def main_tensor(output: Any, where: str = "the model output") -> torch.Tensor:
    """The tensor that stands for an output: itself, ``logits`` / the first tensor of a mapping (Hugging
    Face outputs), or the first tensor of a tuple / list."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    raise ReportError(f"{where} is a {type(output).__name__} with no tensor in it; the report compares tensors")


def _snapshot(value: Any) -> Any:
    if isinstance(value, nn.Parameter):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list):
        return [_snapshot(item) for item in value]
    if type(value) is tuple:  # named tuples are left as they are
        return tuple(_snapshot(item) for item in value)
    if isinstance(value, dict):
        return {key: _snapshot(item) for key, item in value.items()}
    return value


@contextlib.contextmanager
def evaluation_mode(*models: nn.Module) -> Iterator[None]:
    """Every module in eval mode (dropout off, batch norm frozen), restored afterwards."""
    saved = [(module, module.training) for model in models for module in model.modules()]
    try:
        for model in models:
            model.eval()
        yield
    finally:
        for module, training in saved:
            module.training = training


# ---- graphs --------------------------------------------------------------------------------------------
class _Recorder(fx.Interpreter):
    def __init__(self, model: fx.GraphModule, layers: Mapping[str, Layer], record, overrides) -> None:
        super().__init__(model)
        self.layers, self.record, self.overrides = layers, set(record), dict(overrides)
        self.calls: dict[str, list[Call]] = {}

    def run_node(self, node: fx.Node) -> Any:
        if node.name not in self.record and node.name not in self.overrides:
            return super().run_node(node)
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        if node.name in self.overrides:
            result = self.layers[node.name].call(args, kwargs, self.overrides[node.name])
        else:
            result = getattr(self, node.op)(node.target, args, kwargs)
        if node.name in self.record:
            self.calls.setdefault(node.name, []).append(Call(_snapshot(args), _snapshot(kwargs), _snapshot(result)))
        return result


class GraphRunner:
    """Runs an fx.GraphModule node by node, recording and overriding layers by node name."""

    def __init__(self, model: fx.GraphModule, layers: list[Layer] | None = None) -> None:
        self.model = model
        self.layers = {layer.name: layer for layer in layers or ()}
        self.placeholders = [node for node in model.graph.nodes if node.op == "placeholder"]

    def run(self, batch: Any, record=(), overrides: Mapping[str, RoleFormats] | None = None):
        recorder = _Recorder(self.model, self.layers, record, overrides or {})
        output = recorder.run(*self._positional(batch))
        return output, recorder.calls

    def _positional(self, batch: Any) -> list[Any]:
        """Keyword inputs placed by placeholder name (fx's interpreter takes positional inputs only)."""
        args, kwargs = model_inputs(batch)
        values = list(args)
        for node in self.placeholders[len(args):]:
            if node.target in kwargs:
                values.append(kwargs.pop(node.target))
            elif node.args:
                values.append(node.args[0])  # the parameter's default
            else:
                raise ReportError(f"an input batch has no value for the model input {node.target!r}")
        if kwargs:
            names = [node.target for node in self.placeholders]
            raise ReportError(f"the model has no input(s) {sorted(kwargs)}; its inputs: {names}")
        return values


# ---- plain modules -------------------------------------------------------------------------------------
class ModuleRunner:
    """Runs a plain nn.Module, recording layers (qualified module names) with forward hooks."""

    def __init__(self, model: nn.Module, layers: list[Layer] | None = None) -> None:
        self.model = model
        self.modules = dict(model.named_modules())
        self.layers = {layer.name: layer for layer in layers or ()}

    def run(self, batch: Any, record=(), overrides: Mapping[str, RoleFormats] | None = None):
        calls: dict[str, list[Call]] = {}
        handles, saved, swapped = [], {}, []
        try:
            for name in record:
                hook = functools.partial(_record_call, calls.setdefault(name, []))
                handles.append(self.modules[name].register_forward_hook(hook, with_kwargs=True))
            for name, formats in (overrides or {}).items():
                layer = self.layers[name]
                if layer.kind == "real":
                    swapped.append(name)
                    self._place(name, layer.float_module)
                    continue
                saved[name] = layer.module.formats
                layer.module.formats = formats
            args, kwargs = model_inputs(batch)
            output = self.model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
            for name, formats in saved.items():
                self.layers[name].module.formats = formats
            for name in swapped:
                self._place(name, self.layers[name].module)
        return output, {name: found for name, found in calls.items() if found}

    def _place(self, path: str, module: nn.Module) -> None:
        parent, _, child = path.rpartition(".")
        setattr(self.model.get_submodule(parent), child, module)


def _record_call(calls: list[Call], module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    calls.append(Call(_snapshot(args), _snapshot(kwargs), _snapshot(output)))


def make_runner(model: nn.Module, layers: list[Layer] | None = None) -> GraphRunner | ModuleRunner:
    return GraphRunner(model, layers) if isinstance(model, fx.GraphModule) else ModuleRunner(model, layers)
