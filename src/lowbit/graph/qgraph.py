"""QGraph: a torch.fx capture of a model, the object every graph pass takes and returns.

``QGraph(model)`` traces ``model`` symbolically (an ``fx.GraphModule`` is used as it is). Quantized
modules and quantized functions are leaves of the tracer, so a quantized graph re-traces to the same
nodes. ``MaseGraph`` is the same class under MASE's name, so MASE snippets run with one import changed.
Models fx cannot trace (data-dependent control flow, Hugging Face models) raise :class:`GraphError`
pointing at the module-swap path (:func:`lowbit.graph.quantize_module_transform_pass`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from torch import fx, nn

from lowbit.errors import LowbitError
from lowbit.nn.functional import FUNCTION_FOR_OP, QUANT_FUNCTIONS
from lowbit.nn.modules import QuantModule


class GraphError(LowbitError):
    """A model could not be captured, or a graph is not in the state a pass needs."""


_OP_OF_FUNCTION = {function: op.replace("batch_norm2d", "batch_norm") for op, function in FUNCTION_FOR_OP.items()}


class _Tracer(fx.Tracer):
    def __init__(self, leaf_modules: tuple[type[nn.Module], ...] = ()):  # no-argument form: fx re-creates it
        super().__init__(autowrap_modules=(math,), autowrap_functions=QUANT_FUNCTIONS)
        self._leaf_modules = leaf_modules

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
        # A quantized function's node is named after the op ("add", not "quantized_add"), so a quantized
        # graph re-traces to the node names it had before it was quantized.
        if kind == "call_function" and name is None and target in _OP_OF_FUNCTION:
            name = _OP_OF_FUNCTION[target]
        return super().create_node(kind, target, args, kwargs, name, type_expr)

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        if isinstance(module, (QuantModule, *self._leaf_modules)):
            return True
        return super().is_leaf_module(module, qualified_name)


class QGraph:
    """A traced model plus graph-level metadata; passes read and rewrite ``model`` / ``fx_graph``."""

    def __init__(self, model: nn.Module, concrete_args: dict[str, Any] | None = None,
                 custom_leaf_modules: Iterable[type[nn.Module]] | None = None) -> None:  # fmt: skip
        if not isinstance(model, nn.Module):
            raise GraphError(f"QGraph needs a torch.nn.Module, got {type(model).__name__}")
        leaves = tuple(custom_leaf_modules or ())
        if any(not (isinstance(c, type) and issubclass(c, nn.Module)) for c in leaves):
            raise GraphError(f"custom_leaf_modules must be nn.Module classes, got {leaves!r}")
        self.custom_leaf_modules = leaves
        self.model: fx.GraphModule = model if isinstance(model, fx.GraphModule) else _trace(model, concrete_args, leaves)
        self.meta: dict[str, Any] = {"mase": {"common": {}, "software": {}}}

    # ---- views ---------------------------------------------------------------------------------------
    @property
    def fx_graph(self) -> fx.Graph:
        return self.model.graph

    @fx_graph.setter
    def fx_graph(self, graph: fx.Graph) -> None:
        self.model.graph = graph

    @property
    def nodes(self) -> list[fx.Node]:
        return list(self.model.graph.nodes)

    @property
    def modules(self) -> dict[str, nn.Module]:
        return dict(self.model.named_modules())

    def node(self, name: str) -> fx.Node:
        """The node called ``name``; GraphError naming the nearest node name if there is none."""
        from lowbit.errors import did_you_mean

        for node in self.model.graph.nodes:
            if node.name == name:
                return node
        names = [n.name for n in self.model.graph.nodes]
        raise GraphError(f"no node named {name!r}{did_you_mean(name, names)}")

    def recompile(self) -> None:
        """Regenerate the model's code after the graph changed (passes call this)."""
        self.model.graph.lint()
        self.model.recompile()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def __repr__(self) -> str:
        return f"QGraph({type(self.model).__name__}, {len(self.nodes)} nodes)"


MaseGraph = QGraph


def _trace(model: nn.Module, concrete_args: dict[str, Any] | None, leaves: tuple[type[nn.Module], ...]):
    for parameter in model.parameters():  # MASE does this too: fx-generated code expects contiguous params
        if not parameter.is_contiguous():
            parameter.data = parameter.data.contiguous()
    tracer = _Tracer(leaves)
    try:
        graph = tracer.trace(model, concrete_args)
    except Exception as error:  # fx raises many types (TraceError, TypeError, RuntimeError, ...)
        raise GraphError(
            f"torch.fx cannot trace {type(model).__name__} ({type(error).__name__}: {str(error)[:300]}); "
            "pass concrete_args to freeze control flow, or quantize it with "
            "lowbit.graph.quantize_module_transform_pass (module swap, no tracing needed)"
        ) from error
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def is_traceable(model: nn.Module) -> bool:
    """Whether ``QGraph(model)`` would succeed (traces a throw-away capture)."""
    try:
        _trace(model, None, ())
    except GraphError:
        return False
    return True


__all__ = ["GraphError", "MaseGraph", "QGraph", "is_traceable"]
