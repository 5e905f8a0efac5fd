"""Pickle-free codec of module trees behind :mod:`lowbit.graph.save_load` (the node and value codecs are in
:mod:`lowbit.graph._serialize`): each module is saved as its class path and constructor arguments, and rebuilt
only from classes in ``torch.nn`` and ``lowbit.nn``; a module whose arguments cannot be read back is refused
at save time (rebuilt from the JSON text and compared), never guessed at load time.
"""

from __future__ import annotations

import importlib
import inspect
import json
import weakref
from typing import Any

import torch
from torch import nn

from lowbit.graph._serialize import _IDENT, _MISSING, GraphFileError, NotPortable, _check_config, check_path
from lowbit.graph._serialize import decode_value, encode_value
from lowbit.nn.modules import QuantModule
from lowbit.nn.roles import RoleFormats


# ---- modules --------------------------------------------------------------------------------------------
_ALLOWED_PACKAGES = ("torch.nn", "lowbit.nn")
_SKIPPED_ARGS = {"device", "dtype"}  # tensors come from the state file with their own dtype; loads go to CPU
_TORCH_STATE = set(vars(nn.Module()))  # nn.Module bookkeeping, not a module's own settings
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _allowed_module(name: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in _ALLOWED_PACKAGES)


def resolve_class(path: Any, where: str) -> type[nn.Module]:
    module_name, _, name = path.partition(":") if isinstance(path, str) else ("", "", "")
    try:  # only modules inside the allowed packages are imported
        ok = _allowed_module(module_name) and _IDENT.match(name) and not name.startswith("_")
        cls = getattr(importlib.import_module(module_name), name, None) if ok else None
    except (ImportError, ValueError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) and _allowed_module(cls.__module__)):
        allowed = ", ".join(_ALLOWED_PACKAGES)
        raise GraphFileError(f"{where}: class {path!r} is not on the allowlist (classes of {allowed})")
    return cls


def _init_parameters(cls: type) -> tuple[dict[str, inspect.Parameter], list[str]]:
    """The named __init__ parameters, following ``*args, **kwargs`` up the MRO (QuantLinear -> Linear), and
    the positional ones reached that way (a subclass may pass some itself: LSTM passes RNNBase's mode)."""
    found: dict[str, inspect.Parameter] = {}
    inherited: list[str] = []
    for depth, klass in enumerate(k for k in cls.__mro__ if "__init__" in vars(k)):
        parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]
        for parameter in parameters:
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                found.setdefault(parameter.name, parameter)
                if depth and parameter.kind is parameter.POSITIONAL_OR_KEYWORD:
                    inherited.append(parameter.name)
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            break
    return found, inherited


def _constructor_kwargs(module: nn.Module, parameters: dict[str, inspect.Parameter], where: str) -> dict[str, Any]:
    """Constructor arguments read back from attributes of the same name; a parameter with a default whose
    attribute is absent or not a plain value keeps its default (the rebuild check catches a wrong guess)."""
    kwargs = {}
    for name, parameter in parameters.items():
        if name in _SKIPPED_ARGS or (name == "formats" and isinstance(module, QuantModule)):
            continue
        value = getattr(module, name, _MISSING)
        if name == "bias" and (value is None or isinstance(value, torch.Tensor)):
            value = value is not None
        try:
            if value is _MISSING or parameter.kind is parameter.POSITIONAL_ONLY:
                raise NotPortable(f"{where}: no attribute for constructor argument {name!r}")
            kwargs[name] = encode_value(value, where)
        except NotPortable:
            if parameter.default is parameter.empty:
                raise
    return kwargs


def build_module(spec: Any, where: str) -> nn.Module:
    """Construct one module from its spec: allowlisted class, decoded keyword arguments, lowbit formats."""
    if not isinstance(spec, dict) or not isinstance(spec.get("kwargs"), dict) or set(spec) - {"class", "kwargs",
                                                                                            "formats"}:
        raise GraphFileError(f"{where}: a module needs 'class' and 'kwargs' (and 'formats' for lowbit modules)")
    cls = resolve_class(spec.get("class"), where)
    if any(not _IDENT.match(key) for key in spec["kwargs"]):
        raise GraphFileError(f"{where}: keyword names must be identifiers")
    kwargs = {key: decode_value(value, {}, where) for key, value in spec["kwargs"].items()}
    if issubclass(cls, QuantModule):
        kwargs["formats"] = RoleFormats.from_dict(_check_config(spec.get("formats", {}), where))
    try:
        return cls(**kwargs)
    except Exception as error:  # constructors reject bad arguments with many exception types
        raise GraphFileError(f"{where}: {spec['class']} cannot be built from {kwargs}: {error}") from None


def _canonical(value: Any, registered: dict[int, str]) -> Any:
    """``value`` with the module's own registered tensors (also behind weak references, as RNNs keep them)
    replaced by their names: a cache of its parameters matches whatever values they hold."""
    if isinstance(value, weakref.ref):
        value = value()
    if isinstance(value, torch.Tensor) and id(value) in registered:
        return ("registered tensor", registered[id(value)])
    if isinstance(value, (list, tuple)):
        return [_canonical(item, registered) for item in value]
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    try:
        return (a == b) is True
    except Exception:  # exotic attributes may refuse comparison (lists of tensors): treat them as different
        return False


def _registered(module: nn.Module) -> dict[int, str]:
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return {id(tensor): name for name, tensor in named}


def _difference(original: nn.Module, rebuilt: nn.Module) -> str | None:
    """Why ``rebuilt`` would not stand in for ``original`` (None if it would)."""
    if type(rebuilt) is not type(original):
        return f"rebuilt as {type(rebuilt).__name__}"
    if any(getattr(original, hooks, None) for hooks in _HOOKS):
        return "it has forward/backward hooks, which cannot be saved"
    ours, theirs = _registered(original), _registered(rebuilt)
    for name, value in vars(original).items():
        other = getattr(rebuilt, name, _MISSING)
        transient = name.startswith("_lowbit_")  # caches (nn.weight_cache): rebuilt on the first forward
        if name not in _TORCH_STATE and not transient and not _same(_canonical(value, ours), _canonical(other, theirs)):
            return f"attribute {name!r} differs after a rebuild"
    for kind in ("_parameters", "_buffers"):  # tensors the constructor makes must be in the original
        own = getattr(original, kind)
        for key, tensor in getattr(rebuilt, kind).items():
            if tensor is not None and (own.get(key) is None or own[key].shape != tensor.shape):
                return f"tensor {key!r} differs after a rebuild"
    return None


def _module_spec(path: str, module: nn.Module) -> tuple[dict[str, Any], bool]:
    """One module's spec, checked by rebuilding it, and whether its constructor builds its children."""
    cls = type(module)
    where = f"module {path!r} ({cls.__module__}.{cls.__qualname__})"
    parameters, inherited = _init_parameters(cls)
    failures = []
    # Every argument first (explicit values keep their meaning if a default changes in a later torch); then
    # without arguments left at their defaults (GRU refuses even proj_size=0), and without inherited ones.
    for dropped in range(min(len(inherited), 2) + 1):
        kept = {name: p for name, p in parameters.items() if name not in inherited[:dropped]}
        for omit_defaults in (False, True):
            try:
                kwargs = _constructor_kwargs(module, kept, where)
                if omit_defaults:
                    kwargs = {k: v for k, v in kwargs.items() if not _is_default(kept[k], v)}
                return _checked_spec(module, kwargs, where)
            except NotPortable as failure:
                failures.append(failure)
    raise failures[0]


def _is_default(parameter: inspect.Parameter, encoded: Any) -> bool:
    try:
        return parameter.default is not parameter.empty and encode_value(parameter.default, "") == encoded
    except NotPortable:
        return False


def _checked_spec(module: nn.Module, kwargs: dict[str, Any], where: str) -> tuple[dict[str, Any], bool]:
    cls = type(module)
    spec: dict[str, Any] = {"class": f"{cls.__module__}:{cls.__qualname__}", "kwargs": kwargs}
    if isinstance(module, QuantModule):
        spec["formats"] = module.formats.to_dict()
    try:  # rebuild from the JSON text itself, exactly as load_graph will
        rebuilt = build_module(json.loads(json.dumps(spec)), where)
    except GraphFileError as error:
        raise NotPortable(str(error)) from None
    builds_children = bool(rebuilt._modules)
    # children a constructor builds are not saved separately, so they must match (settings included)
    originals = dict(module.named_modules()) if builds_children else {"": module}
    rebuilts = dict(rebuilt.named_modules()) if builds_children else {"": rebuilt}
    if list(originals) != list(rebuilts):
        raise NotPortable(f"{where}: its children differ after a rebuild")
    for name, original in originals.items():
        reason = _difference(original, rebuilts[name])
        if reason:
            raise NotPortable(f"{where}{f' child {name!r}' if name else ''}: {reason}")
    return spec, builds_children


def saveable_path(path: str, where: str) -> str:
    """:func:`check_path` at save time: a name load_graph would refuse has no pickle-free form."""
    try:
        return check_path(path, where)
    except GraphFileError as error:
        raise NotPortable(str(error)) from None


def encode_modules(root: nn.Module) -> dict[str, Any]:
    """Every submodule by path, parents and shared originals first; a module that appears under a second
    path is written once and referenced as ``{"same_as": path}``."""
    specs, first, covered = {}, {}, []  # covered: paths whose descendants come with them (built or shared)
    for path, module in list(root.named_modules(remove_duplicate=False))[1:]:
        if any(path.startswith(prefix + ".") for prefix in covered):
            first.setdefault(id(module), path)  # built by its parent's constructor; a later path may share it
        elif id(module) in first:
            specs[saveable_path(path, "module")] = {"same_as": first[id(module)]}
            covered.append(path)
        else:
            first[id(module)] = path
            specs[saveable_path(path, "module")], builds_children = _module_spec(path, module)
            covered += [path] if builds_children else []
    return specs


def decode_modules(specs: Any) -> nn.Module:
    """A plain root module holding every saved module at its path."""
    if not isinstance(specs, dict):
        raise GraphFileError("'modules' must be an object")
    root = nn.Module()
    for path, spec in specs.items():
        where = f"module {path!r}"
        parent_path, _, name = check_path(path, where).rpartition(".")
        shared = spec["same_as"] if isinstance(spec, dict) and set(spec) == {"same_as"} else None
        try:
            parent = root.get_submodule(parent_path)
            module = root.get_submodule(check_path(shared, where)) if shared is not None else None
        except AttributeError:
            raise GraphFileError(f"{where}: its parent, or the module it shares, is not saved before it") from None
        if name in parent._modules:
            raise GraphFileError(f"{where}: listed twice or already built by its parent")
        parent.add_module(name, build_module(spec, where) if module is None else module)
    return root
