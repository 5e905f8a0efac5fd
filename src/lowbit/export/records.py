"""What a saved model's header says about its quantized modules, and how a load rebuilds them.

Two kinds, one record each (qualified name -> record):

- real-quantized modules (``lowbit.ops.REAL_MODULES`` and classes given to save / load):
  ``{"class": "Int8DynamicLinear", "config": module.config()}``, rebuilt with ``cls.from_config(config)``;
- simulated modules (``lowbit.nn`` quantized modules, any format, calibrated parameters frozen in their
  specs): ``{"kind": "simulated", "class": "QuantLinear", "formats": formats.to_dict()}``, rebuilt from the
  given model's module and the recorded formats; their weights are in the state as for any module;
- wrappers a model-level transform puts in (rotation's ``HadamardGatedMLP``, online Hadamard before
  down_proj): ``{"kind": "structure", "class": ...}``, rebuilt around the given model's module.

Anything quantized that fits neither (a graph's retargeted quantized functions, the experimental LUTNet /
LogicNets layers, a lowbit module of an unknown class) makes ``save`` refuse with the reason: nothing is
dropped silently.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from lowbit.errors import LowbitError
from lowbit.export._errors import SerializationError
from lowbit.graph.plan import Ready, Simulated, apply, build
from lowbit.nn.modules import MODULE_FOR_OP, QuantModule
from lowbit.nn.roles import RoleFormats

ModuleClasses = Mapping[str, type] | Iterable[type] | None
SIMULATED = {cls.__name__: cls for cls in MODULE_FOR_OP.values()}


def real_module_classes(extra: ModuleClasses = None) -> dict[str, type]:
    """Class name -> class of every real-quantized module: ``lowbit.ops.REAL_MODULES`` plus ``extra``."""
    from lowbit.ops import REAL_MODULES

    registry: dict[str, type] = dict(REAL_MODULES)
    if isinstance(extra, Mapping):
        registry.update(extra)
    elif extra is not None:
        registry.update({cls.__name__: cls for cls in extra})
    return registry


def module_records(model: nn.Module, registry: dict[str, type]) -> dict[str, dict[str, Any]]:
    """The header's record of every quantized submodule of ``model`` (SerializationError for one it cannot keep)."""
    _refuse_graph_functions(model)
    records, covered, structures = {}, set(), _structures()
    for qualname, module in model.named_modules():
        cls = type(module)
        if qualname in covered:
            continue
        if structures.get(cls.__name__) is cls:  # a wrapper a transform put in: rebuilt around the given module
            records[qualname] = {"kind": "structure", "class": cls.__name__}
            covered.update(f"{qualname}.{child}".lstrip(".") for child in cls.rebuilt_children)
        elif registry.get(cls.__name__) is cls:
            records[qualname] = {"class": cls.__name__, "config": _json(qualname, cls, module.config())}
        elif isinstance(module, QuantModule) and SIMULATED.get(cls.__name__) is cls:
            formats = _json(qualname, cls, module.formats.to_dict())
            records[qualname] = {"kind": "simulated", "class": cls.__name__, "formats": formats}
        elif cls.__module__.startswith("lowbit.") and cls.__module__.split(".")[1] in ("nn", "ops"):
            raise SerializationError(f"module {qualname!r} ({cls.__name__}) has no record in lowbit files; "
                                     "save its state_dict with safetensors and rebuild it in code")  # fmt: skip
    return records


def _refuse_graph_functions(model: nn.Module) -> None:
    graph = getattr(model, "graph", None)
    nodes = getattr(graph, "nodes", ())
    for node in nodes:
        if getattr(node, "op", None) == "call_function" and "config" in getattr(node, "kwargs", {}):
            target = getattr(node.target, "__module__", "")
            if target.startswith("lowbit."):
                raise SerializationError(
                    f"node {node.name!r} calls a quantized function ({node.target.__name__}): a graph's functional "
                    "quantization lives in its graph; save it with lowbit.graph.save_graph")  # fmt: skip


def _json(qualname: str, cls: type, value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise SerializationError(f"module {qualname!r} ({cls.__name__}): its record is not JSON: {error}") from None
    return value


def rebuild_modules(model: nn.Module, records: dict[str, Any], registry: dict[str, type],
                    state: Mapping[str, Any] | None = None) -> nn.Module:  # fmt: skip
    """Swap into ``model`` the module each record describes; returns the model (a new one for a root record).
    With ``state`` (the file's tensors by name), a real module is first built on the meta device and its
    tensors' shapes compared with the file's, so a config that does not fit them allocates nothing."""
    for qualname, record in records.items():
        if not isinstance(record, dict):
            raise SerializationError(f"module {qualname!r}: bad record {record!r}")
        if record.get("kind") == "simulated":
            replacement = _simulated(model, qualname, record)
        elif record.get("kind") == "structure":
            replacement = _structure(model, qualname, record)
        else:
            if state is not None:
                with torch.device("meta"):
                    _fits(qualname, _real(qualname, record, registry), state)
            replacement = _real(qualname, record, registry)
        if not qualname:
            model = replacement
            continue
        _existing(model, qualname)
        apply(model, {qualname: Ready(replacement)})
    return model


def _fits(qualname: str, module: nn.Module, state: Mapping[str, Any]) -> None:
    prefix = f"{qualname}." if qualname else ""
    for name, tensor in module.state_dict().items():
        saved = state.get(prefix + name)
        if saved is not None and tuple(saved.shape) != tuple(tensor.shape):
            raise SerializationError(f"module {qualname!r}: its recorded config makes {name!r} of shape "
                                     f"{list(tensor.shape)}, the file holds {list(saved.shape)}")  # fmt: skip


def _existing(model: nn.Module, qualname: str) -> nn.Module:
    try:
        return model.get_submodule(qualname)
    except AttributeError:
        raise SerializationError(
            f"module {qualname!r} recorded in the file does not exist in the given model (another architecture?)"
        ) from None


def _real(qualname: str, record: dict[str, Any], registry: dict[str, type]) -> nn.Module:
    cls = registry.get(record.get("class"))
    if cls is None:
        known = ", ".join(sorted(registry)) or "none"
        raise SerializationError(f"module {qualname!r}: unknown real-quantized class {record!r}; known: {known}")
    try:
        return cls.from_config(record["config"])
    except (LowbitError, KeyError, TypeError, ValueError, RuntimeError, MemoryError) as error:
        raise SerializationError(f"module {qualname!r}: {cls.__name__}.from_config failed: {error}") from None


def _structures() -> dict[str, type]:
    """Class name -> wrapper class of the modules a model-level transform puts in (each rebuilt by
    ``cls(<the given model's module>)``, its ``rebuilt_children`` made by the wrapper itself)."""
    from lowbit.flows.rotation import HadamardGatedMLP

    return {HadamardGatedMLP.__name__: HadamardGatedMLP}


def _structure(model: nn.Module, qualname: str, record: dict[str, Any]) -> nn.Module:
    cls = _structures().get(record.get("class"))
    if cls is None or not qualname:
        raise SerializationError(f"module {qualname!r}: unknown structure record {record!r}; known: "
                                 f"{', '.join(_structures())}")  # fmt: skip
    try:
        return cls(_existing(model, qualname))
    except (LowbitError, AttributeError, TypeError, ValueError) as error:
        raise SerializationError(f"module {qualname!r}: cannot rebuild {cls.__name__}: {error}") from None


def _simulated(model: nn.Module, qualname: str, record: dict[str, Any]) -> nn.Module:
    cls = SIMULATED.get(record.get("class"))
    if cls is None:
        raise SerializationError(f"module {qualname!r}: unknown simulated class {record.get('class')!r}; "
                                 f"known: {', '.join(sorted(SIMULATED))}")  # fmt: skip
    original = _existing(model, qualname) if qualname else model
    try:
        formats = RoleFormats.from_dict(record.get("formats"))
        return build(original, Simulated(formats, cls.mase_op), qualname)
    except (LowbitError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise SerializationError(f"module {qualname!r}: cannot rebuild {cls.__name__}: {error}") from None


def untie_where_the_file_differs(model: nn.Module, state: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Give every name of a tied parameter of ``model`` its own parameter where the file holds different
    values under those names (a model saved after its tie was broken: ``rotate`` unties lm_head from the
    embedding), so that loading gives back the saved model instead of one value in both places. Says so in a
    warning; returns the groups of names untied."""
    groups: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    untied = []
    for names in groups.values():
        saved = [name for name in names if isinstance(state.get(name), torch.Tensor)]
        first = state[saved[0]] if saved else None
        if len(saved) < 2 or all(state[name].shape == first.shape and torch.equal(state[name], first)
                                 for name in saved[1:]):  # fmt: skip
            continue
        for name in names[1:]:
            owner_name, _, attribute = name.rpartition(".")
            owner = model.get_submodule(owner_name)
            tied = getattr(owner, attribute)
            setattr(owner, attribute, nn.Parameter(tied.detach().clone(), requires_grad=tied.requires_grad))
        untied.append(tuple(names))
    if untied:
        _no_retie(model)
        warnings.warn(f"load: the file holds different values for the tied parameters {', '.join(map(str, untied))}; "
                      "they are untied in the model to load them as saved", stacklevel=4)  # fmt: skip
    return untied


def _no_retie(model: nn.Module) -> None:
    """A Hugging Face model's own records of its ties, cleared so that nothing ties them again."""
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):  # transformers 5 re-ties by this mapping
        model.all_tied_weights_keys = {}
