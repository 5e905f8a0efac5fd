"""The plan: what each module of a model becomes, and the one function that makes it so.

Every way into the model floor (``lowbit.quantize_`` and its recipes, ``lowbit.ptq``, both MASE passes, the
search's trials, a saved model's rebuild, the GGUF reader) states its result as a plan, a mapping from
qualified module names to entries, and hands it to :func:`apply`; :func:`build` makes one entry's module
without placing it (the search keeps the modules it built). This file is the only place above ``nn`` and
``ops`` that builds a quantized module or swaps one into a model.

Entries:

- :class:`Simulated`: the ``lowbit.nn`` quantized module of the layer's op computing these role formats
  (fake quantization, any format);
- :class:`Real` with ``formats``: the ``lowbit.ops`` module a kernel computes those formats with, its codes
  the simulated twin's own codes (one rounding rule), a ConfigError where no kernel computes them;
- :class:`Real` with ``module``: that real class built from the float layer by its ``from_float`` with
  ``options`` (int4's searched or GPTQ / HQQ-solved codes, int8 convolutions);
- :class:`MakeReal`: a layer that is a simulated ``QuantLinear`` already, made real where a kernel computes
  its formats and kept (with the reason) where none does;
- :class:`Ready`: a module built already (a GPTQ stage's layers, codes read from a file, the float layer
  put back, an attention layer's new quantizer child);
- :class:`Transform`: a model-level change made in place to the named module (``""``: the root) and what
  lies under it (a Hadamard rotation, SmoothQuant's or AWQ's scales folded into the ops before a layer); the
  transforms of a plan run first, before any module is built.

``Real`` and ``Ready`` entries may carry ``record``, merged into the real module's ``algorithm`` record
(what the method did, for the report). A recipe whose layers are built from transformed weights applies
its transform's plan first and then its layers' plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from lowbit.errors import ConfigError
from lowbit.nn.modules import MODULE_FOR_OP, QuantLinear, QuantModule
from lowbit.nn.roles import RoleFormats


@dataclasses.dataclass(frozen=True)
class Simulated:
    """The layer's quantized ``lowbit.nn`` module computing ``formats``; ``op`` (a mase op such as
    ``"linear"``) picks the module class, found from the layer's class when empty."""

    formats: RoleFormats
    op: str = ""


@dataclasses.dataclass(frozen=True)
class Real:
    """A real-quantized module: by ``formats`` (the kernel computing them) or by ``module`` (a
    ``lowbit.ops.REAL_MODULES`` class name whose ``from_float`` takes ``options``)."""

    formats: RoleFormats | None = None
    module: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    record: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if (self.formats is None) == (self.module is None):
            raise ConfigError("a Real plan entry names either formats or a real module class, not both / neither")


@dataclasses.dataclass(frozen=True)
class MakeReal:
    """The layer (a simulated QuantLinear) made real where a kernel computes its formats, else kept."""

    compute_dtype: str | None = None


@dataclasses.dataclass(frozen=True)
class Ready:
    """A module built already, placed as it is."""

    module: nn.Module
    record: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Transform:
    """``run(module) -> info``: a change made in place to the named module; ``info`` says what it did."""

    run: Callable[[nn.Module], Any]


Entry = Simulated | Real | MakeReal | Ready | Transform


@dataclasses.dataclass
class Applied:
    """What :func:`apply` did: name -> class name of each module placed, name -> why a layer was kept, name ->
    what each transform said it did."""

    placed: dict[str, str] = dataclasses.field(default_factory=dict)
    kept: dict[str, str] = dataclasses.field(default_factory=dict)
    transformed: dict[str, Any] = dataclasses.field(default_factory=dict)


def build(layer: nn.Module, entry: Entry, name: str = "") -> nn.Module | None:
    """The module ``entry`` makes of ``layer`` (left untouched); None for a MakeReal no kernel computes.
    ``name`` only words the errors."""
    return _made(layer, entry, name)[0]


def apply(root: nn.Module, plan: Mapping[str, Entry]) -> Applied:
    """Carry ``plan`` out on ``root`` (in place): its transforms run first; then every module is built, then
    all are placed, so a refusal while building leaves the layers as they were. Returns what was placed, what
    was kept (a MakeReal without a kernel) and what the transforms did."""
    built, applied = {}, Applied()
    for name, entry in plan.items():
        if isinstance(entry, Transform):
            applied.transformed[name] = entry.run(root.get_submodule(name))
    for name, entry in plan.items():
        if isinstance(entry, Transform):
            continue
        layer = None if isinstance(entry, Ready) else root.get_submodule(name)  # a Ready module may add a child
        new, reason = _made(layer, entry, name)
        if new is None:
            applied.kept[name] = reason
        else:
            built[name] = new
    for name, new in built.items():
        place(root, name, new)
        applied.placed[name] = type(new).__name__
    return applied


def _made(layer: nn.Module, entry: Entry, name: str) -> tuple[nn.Module | None, str]:
    if isinstance(entry, Simulated):
        return _simulated_class(layer, entry.op, name).from_float(layer, entry.formats), ""
    if isinstance(entry, Ready):
        return _stamped(entry.module, entry.record), ""
    if isinstance(entry, MakeReal):
        return _converted(layer, entry.compute_dtype)
    if isinstance(entry, Real):
        return _stamped(_real(layer, entry, name), entry.record), ""
    if isinstance(entry, Transform):
        raise ConfigError(f"{name or 'the model'}: a Transform changes a module in place and builds none; apply it")
    raise ConfigError(f"{name or 'a layer'}: unknown plan entry {type(entry).__name__}")


def place(root: nn.Module, name: str, module: nn.Module) -> None:
    """``root.<name> = module`` for a dotted qualified name (``encoder.layer.0.output.dense``)."""
    if not name:
        raise ConfigError("a plan entry needs a submodule's qualified name; the root itself cannot be replaced")
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


def _simulated_class(layer: nn.Module, op: str, name: str) -> type[QuantModule]:
    if op:
        if op not in MODULE_FOR_OP:
            raise ConfigError(f"{name or 'a layer'}: no quantized module for op {op!r}; "
                              f"ops: {', '.join(MODULE_FOR_OP)}")
        return MODULE_FOR_OP[op]
    for cls in MODULE_FOR_OP.values():
        if isinstance(layer, cls.float_class):
            return cls
    raise ConfigError(f"{name or 'a layer'} ({type(layer).__name__}) has no quantized counterpart (quantizable "
                      f"module types: {', '.join(cls.float_class.__name__ for cls in MODULE_FOR_OP.values())})")  # fmt: skip


def _converted(layer: nn.Module, compute_dtype: str | None = None) -> tuple[nn.Module | None, str]:
    from lowbit.ops.from_fake import convert_quant_linear

    if not isinstance(layer, QuantLinear):
        return None, f"a {type(layer).__name__}, not a simulated QuantLinear"
    return convert_quant_linear(layer, compute_dtype=compute_dtype)


def _real(layer: nn.Module, entry: Real, name: str) -> nn.Module:
    if entry.formats is not None:
        new, reason = _converted(QuantLinear.from_float(layer, entry.formats), **entry.options)
        if new is None:
            raise ConfigError(f"no real kernel computes {entry.formats.describe()}: {reason}")
        return new
    from lowbit.ops import REAL_MODULES

    cls = REAL_MODULES.get(entry.module)
    if cls is None:
        raise ConfigError(f"{name or 'a layer'}: unknown real module {entry.module!r}; "
                          f"known: {', '.join(REAL_MODULES)}")
    return cls.from_float(layer, **entry.options)


def _stamped(module: nn.Module, record: Mapping[str, Any] | None) -> nn.Module:
    """``module`` with ``record`` merged into its algorithm record (modules without one are left as they are)."""
    if record and hasattr(module, "algorithm"):
        module.algorithm = {**(module.algorithm or {}), **record}
    return module


__all__ = ["Applied", "Entry", "MakeReal", "Ready", "Real", "Simulated", "Transform", "apply", "build", "place"]
