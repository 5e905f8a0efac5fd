"""The layers a report compares: every quantized op of the quantized model, matched to the float model.

A layer is a quantized module (:class:`lowbit.nn.QuantModule`), a real-quantized module (one of
``lowbit.ops.REAL_MODULES``: integer codes and kernels, kind "real") or, in a traced graph, a
``call_function`` node retargeted to a quantized function. In a graph a layer is named by its fx node name (the names the
quantize pass selects by); in a plain module (module-swap path) by its qualified module name.
:class:`Layer` can run its op again on other inputs, with its own formats or others (float, for the
sensitivity ranking; a real layer runs its float twin instead), and finds the tensor behind each role.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from lowbit.errors import ReportError, did_you_mean
from lowbit.nn.functional import FUNCTION_FOR_OP, QUANT_FUNCTIONS
from lowbit.nn.modules import QuantModule
from lowbit.nn.roles import ROLES, RoleFormats
from lowbit.report import real

_OP_OF_FUNCTION = {function: op for op, function in FUNCTION_FOR_OP.items()}

# Where a quantized function finds each role's tensor: positional index and keyword name.
_ARGUMENT_OF_ROLE: dict[str, dict[str, tuple[tuple[int, str | None], ...]]] = {
    "linear": {"data_in": ((0, None),), "weight": ((1, "weight"),), "bias": ((2, "bias"),)},
    "conv1d": {"data_in": ((0, None),), "weight": ((1, "weight"),), "bias": ((2, "bias"),)},
    "conv2d": {"data_in": ((0, None),), "weight": ((1, "weight"),), "bias": ((2, "bias"),)},
    "matmul": {"data_in": ((0, None),), "weight": ((1, None),)},
    "bmm": {"data_in": ((0, None),), "weight": ((1, None),)},
    "add": {"data_in": ((0, None), (1, None))},
    "sub": {"data_in": ((0, None), (1, None))},
    "mul": {"data_in": ((0, None), (1, None))},
    "layer_norm": {"data_in": ((0, None),), "weight": ((2, "weight"),), "bias": ((3, "bias"),)},
    "batch_norm2d": {"data_in": ((0, None),), "weight": ((3, "weight"),), "bias": ((4, "bias"),)},
    "embedding": {"weight": ((1, "weight"),)},
}
_DEFAULT_ROLES = {"data_in": ((0, None),)}  # relu, gelu, softmax


@dataclass
class Layer:
    """One quantized op: its name, op, formats and how to run it."""

    name: str
    op: str
    kind: str  # "module", "real" or "function"
    formats: RoleFormats
    module_path: str | None = None
    module: nn.Module | None = None
    function: Any = None
    float_module: nn.Module | None = None  # a real layer's float twin (set by check_float_counterparts)
    _clones: dict[RoleFormats, nn.Module] = field(default_factory=dict, repr=False)

    def call(self, args: tuple, kwargs: dict[str, Any], formats: RoleFormats | None = None) -> Any:
        """The op on ``args`` / ``kwargs`` with ``formats`` (default: its own)."""
        if self.kind == "function":
            config = (self.formats if formats is None else formats).to_dict()
            return self.function(*args, **{**kwargs, "config": config})
        if self.kind == "real":  # a real layer has no formats to swap: any override means its float twin
            return (self.module if formats is None else self.float_module)(*args, **kwargs)
        module = self.module if formats is None else self._with_formats(formats)
        return module(*args, **kwargs)

    def without(self, role: str) -> RoleFormats:
        """The layer's formats with ``role`` left float."""
        return dataclasses.replace(self.formats, **{role: None})

    def role_tensors(self, role: str, args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """The floating-point tensors the op passes through ``role``'s format (data_out excluded)."""
        if self.kind == "real" and role == "weight":  # the float weight its codes stand for
            found = [self.float_module.weight]
        elif self.kind == "real":
            found = [args[0]] if role == "data_in" and args else []
        elif self.kind == "module" and role in ("weight", "bias"):
            found = [getattr(self.module, role, None)]
        elif self.kind == "module":
            found = [args[0]] if role == "data_in" and args else []
        else:
            places = _ARGUMENT_OF_ROLE.get(self.op, _DEFAULT_ROLES).get(role, ())
            found = [_argument(args, kwargs, index, keyword) for index, keyword in places]
        return [t for t in found if isinstance(t, torch.Tensor) and t.is_floating_point()]

    def _with_formats(self, formats: RoleFormats) -> nn.Module:
        """A shallow copy of the module (same parameters) carrying other formats; cached per formats."""
        if formats not in self._clones:
            clone = copy.copy(self.module)
            clone.formats = formats
            self._clones[formats] = clone
        return self._clones[formats]


def _argument(args: tuple, kwargs: dict[str, Any], index: int, keyword: str | None) -> Any:
    if index < len(args):
        return args[index]
    return kwargs.get(keyword) if keyword else None


# ---- discovery -----------------------------------------------------------------------------------------
def find_layers(model: nn.Module) -> list[Layer]:
    """The quantized ops of ``model``, in execution order for graphs and module order otherwise."""
    if isinstance(model, fx.GraphModule):
        return _graph_layers(model)
    return [_module_layer(path, path, module) for path, module in model.named_modules() if _is_layer(module)]


def _is_layer(module: Any) -> bool:
    return isinstance(module, QuantModule) or real.is_real(module)


def _graph_layers(model: fx.GraphModule) -> list[Layer]:
    modules = dict(model.named_modules())
    layers = []
    for node in model.graph.nodes:
        if node.op == "call_module" and _is_layer(modules.get(node.target)):
            layers.append(_module_layer(node.name, node.target, modules[node.target]))
        elif node.op == "call_function" and node.target in QUANT_FUNCTIONS:
            formats = RoleFormats.from_dict(node.kwargs.get("config", {}))
            op = _OP_OF_FUNCTION[node.target]
            layers.append(Layer(node.name, op, "function", formats, function=node.target))
    return layers


def _module_layer(name: str, path: str, module: nn.Module) -> Layer:
    if real.is_real(module):
        return Layer(name, real.op_name(module), "real", RoleFormats(), module_path=path, module=module)
    return Layer(name, module.mase_op, "module", module.formats, module_path=path, module=module)


# ---- matching against the float model ------------------------------------------------------------------
def check_float_counterparts(layers: list[Layer], float_model: nn.Module, by_node: bool) -> None:
    """ReportError unless every layer has a float twin of the same name, kind and parameter shapes.

    ``by_node``: layers are fx node names of a graph and ``float_model`` is a GraphModule too."""
    if not layers:
        raise ReportError("the quantized model has no quantized layers (run a quantize pass first)")
    modules = dict(float_model.named_modules())
    nodes = {node.name: node for node in float_model.graph.nodes} if by_node else {}
    names = list(nodes) if by_node else list(modules)
    missing = [layer.name for layer in layers if layer.name not in names]
    if missing:
        raise ReportError(
            f"the float model has no layer {missing[0]!r}{did_you_mean(missing[0], names)} "
            f"({len(missing)} of {len(layers)} quantized layers are missing: {', '.join(missing[:5])}); "
            "the quantized model must come from the same architecture as the float model"
        )
    for layer in layers:
        if layer.kind in ("module", "real"):
            path = nodes[layer.name].target if by_node else layer.name
            _check_module_pair(layer, modules.get(path) if isinstance(path, str) else None)
        elif nodes[layer.name].op != "call_function":
            raise ReportError(f"layer {layer.name!r} is a function call in the quantized model but a "
                              f"{nodes[layer.name].op} in the float model")  # fmt: skip


def _check_module_pair(layer: Layer, float_module: nn.Module | None) -> None:
    if layer.kind == "real":
        _check_real_pair(layer, float_module)
        return
    expected = type(layer.module).float_class
    if float_module is None or not isinstance(float_module, expected):
        found = type(float_module).__name__ if float_module is not None else "nothing"
        raise ReportError(f"layer {layer.name!r}: the float model has {found} there, expected {expected.__name__}")
    if isinstance(float_module, QuantModule) and float_module.formats.active():
        raise ReportError(
            f"layer {layer.name!r} of float_model is quantized ({float_module.formats.describe()}); "
            "pass the float (unquantized) model as float_model"
        )
    for role in ROLES:
        mine, theirs = getattr(layer.module, role, None), getattr(float_module, role, None)
        if isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor) and mine.shape != theirs.shape:
            raise ReportError(
                f"layer {layer.name!r}: {role} has shape {tuple(mine.shape)} in the quantized model but "
                f"{tuple(theirs.shape)} in the float model (a checkpoint of another architecture?)"
            )


def _check_real_pair(layer: Layer, float_module: nn.Module | None) -> None:
    """A real layer's twin: a float module of the class it replaced, with the weight shape its codes stand for."""
    expected = real.float_class(layer.module)
    if not isinstance(float_module, expected) or isinstance(float_module, QuantModule):
        found = type(float_module).__name__ if float_module is not None else "nothing"
        hint = " (quantized)" if isinstance(float_module, QuantModule) or real.is_real(float_module) else ""
        raise ReportError(f"layer {layer.name!r} ({type(layer.module).__name__}): the float model has {found}{hint} "
                          f"there, expected a float {expected.__name__}; pass the model as it was before "
                          "quantization as float_model")  # fmt: skip
    shape = tuple(real.dequantized_weight(layer.module).shape)
    if tuple(float_module.weight.shape) != shape:
        raise ReportError(f"layer {layer.name!r}: the weight has shape {shape} in the quantized model but "
                          f"{tuple(float_module.weight.shape)} in the float model (another architecture?)")  # fmt: skip
    layer.float_module = float_module
