"""Pickle-free codecs behind :mod:`lowbit.graph.save_load`: node arguments, call targets and module trees,
each checked on the way back in.

Loading must never run code that a file names. So functions resolve only from a few namespaces of tensor and
number operations, module classes only from ``torch.nn`` and ``lowbit.nn``, and every string that torch.fx
pastes into the Python source it generates (placeholder names, method names, attribute paths, keyword
names) must be a plain identifier. ``getattr`` and ``call_method`` may only name public attributes of
torch.Tensor: otherwise a crafted graph could walk from a tensor to ``os.system`` (through dunders) or to
a file write (``x.numpy().tofile(path)``) when the model runs.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import json
import keyword
import math
import operator
import re
import types
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from lowbit.errors import LowbitError
from lowbit.graph.qgraph import GraphError
from lowbit.nn import functional as qf
from lowbit.nn.modules import QuantModule
from lowbit.nn.roles import RoleFormats


class GraphFileError(GraphError):
    """A saved graph is missing a file, is corrupt or tampered with, or names something not allowed."""


class NotPortable(GraphError):
    """Part of a graph has no pickle-free form (a custom module class, an unlisted function, ...)."""


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SEGMENT = re.compile(r"[A-Za-z0-9_]+\Z")  # attribute path parts; digits alone for Sequential children
_PLACEHOLDER = re.compile(r"\*{0,2}([A-Za-z_][A-Za-z0-9_]*)\Z")  # fx writes *args / **kwargs this way
_OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
_TENSOR_ATTRIBUTES = frozenset(name for name in dir(torch.Tensor) if not name.startswith("_"))
_MISSING = object()


# ---- tagged values --------------------------------------------------------------------------------------
def encode_value(value: Any, where: str) -> Any:
    """A JSON form of a node argument. JSON objects are reserved for tags, so real dicts are tagged too."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, (list, tuple)):
        items = [encode_value(item, where) for item in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {"dict": [[encode_value(k, where), encode_value(v, where)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"slice": [encode_value(part, where) for part in (value.start, value.stop, value.step)]}
    for kind in (torch.dtype, torch.memory_format, torch.layout):
        if isinstance(value, kind):
            return {kind.__name__: str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if value is Ellipsis:
        return {"ellipsis": None}
    raise NotPortable(f"{where}: a {type(value).__qualname__} value has no pickle-free form")


def decode_value(data: Any, nodes: dict[str, fx.Node], where: str) -> Any:
    """The inverse of :func:`encode_value`; node references resolve to earlier nodes only."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode_value(item, nodes, where) for item in data]
    try:
        ((tag, body),) = data.items()
        value = _decode_tagged(tag, body, lambda item: decode_value(item, nodes, where), nodes)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError):  # any malformed tag or body
        value = _MISSING
    if value is _MISSING:
        raise GraphFileError(f"{where}: unreadable value {str(data)[:80]} (or a node that does not come before)")
    return value


def _decode_tagged(tag: str, body: Any, decode, nodes: dict[str, fx.Node]) -> Any:
    if tag in ("tuple", "dict", "slice") and not isinstance(body, list):
        return _MISSING
    if tag == "node":
        return nodes[body]
    if tag == "tuple":
        return tuple(map(decode, body))
    if tag == "dict":
        return {decode(key): decode(value) for key, value in body}
    if tag == "slice":
        return slice(*map(decode, body))
    if tag in ("dtype", "memory_format", "layout") and _IDENT.match(body):
        value = getattr(torch, body, None)
        return value if isinstance(value, getattr(torch, tag)) else _MISSING
    if tag == "device":
        return torch.device(body)
    return Ellipsis if tag == "ellipsis" else _MISSING


# ---- call_function targets ------------------------------------------------------------------------------
# The namespaces a call_function target may come from, in the order a function is looked up when saving.
NAMESPACES: dict[str, types.ModuleType] = {
    "lowbit.nn.functional": qf, "operator": operator, "builtins": builtins, "math": math,
    "torch.nn.functional": F, "torch": torch,
}  # fmt: skip
# operator's function factories return callables a graph could then invoke with arguments of its choosing.
_OPERATOR_BLOCKED = {"call", "methodcaller", "attrgetter", "itemgetter"}
_TORCH_BLOCKED = {"from_file", "import_ir_module", "import_ir_module_from_buffer"}  # file / TorchScript loading


def _allowed(namespace: str, name: str, fn: Any) -> bool:
    if not _IDENT.match(name) or isinstance(fn, (type, types.ModuleType)) or not callable(fn):
        return False
    if namespace == "builtins":
        return name == "getattr"  # attribute reads (x.shape); the attribute name is checked per node
    if namespace == "lowbit.nn.functional":
        return fn in qf.QUANT_FUNCTIONS
    if name.startswith("_"):
        return namespace == "torch" and name == "_assert"  # fx emits torch._assert for traced asserts
    if namespace == "operator":
        return name not in _OPERATOR_BLOCKED
    if namespace == "torch":  # ATen ops are builtins; torch.functional holds the Python-level math ops
        math_op = isinstance(fn, types.BuiltinFunctionType) or getattr(fn, "__module__", "") == "torch.functional"
        return math_op and name not in _TORCH_BLOCKED and not name.startswith("set_")
    return inspect.isfunction(fn) or inspect.isbuiltin(fn)


def function_path(fn: Any, where: str) -> str:
    """``"namespace:name"`` for an allowlisted function; NotPortable for any other."""
    for namespace, module in NAMESPACES.items():
        name = getattr(fn, "__name__", None)
        if not (isinstance(name, str) and getattr(module, name, None) is fn):
            name = next((key for key, value in vars(module).items() if value is fn), None)
        if name is not None and _allowed(namespace, name, fn):
            return f"{namespace}:{name}"
    label = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    raise NotPortable(f"{where}: function {label} is not on the allowlist ({', '.join(NAMESPACES)})")


def resolve_function(path: Any, where: str) -> Any:
    namespace, _, name = path.partition(":") if isinstance(path, str) else ("", "", "")
    module = NAMESPACES.get(namespace)
    fn = getattr(module, name, None) if module is not None and _IDENT.match(name) else None
    if fn is None or not _allowed(namespace, name, fn):
        raise GraphFileError(f"{where}: function {path!r} is not on the allowlist ({', '.join(NAMESPACES)})")
    return fn


# ---- nodes ----------------------------------------------------------------------------------------------
def _is_config(target: Any, key: str) -> bool:  # a quantized function's config: a plain dict, not tagged
    return key == "config" and target in qf.QUANT_FUNCTIONS


def _plain_config(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, RoleFormats):
        value = value.to_dict()
    if not isinstance(value, dict) or json.loads(json.dumps(value)) != value:
        raise NotPortable(f"{where}: its config is not a plain JSON dict")
    return value


def encode_node(node: fx.Node) -> dict[str, Any]:
    where = f"node {node.name!r}"
    target = function_path(node.target, where) if node.op == "call_function" else node.target
    if not isinstance(target, str):
        raise NotPortable(f"{where}: a {node.op} target of type {type(target).__name__}")
    kwargs = {key: _plain_config(value, where) if _is_config(node.target, key) else encode_value(value, where)
              for key, value in node.kwargs.items()}  # fmt: skip
    args = [encode_value(arg, where) for arg in node.args]
    return {"name": node.name, "op": node.op, "target": target, "args": args, "kwargs": kwargs}


def check_path(path: Any, where: str) -> str:
    """An attribute path that fx may paste after ``self.``: identifier-like parts, no dunders, and no part
    that would shadow a GraphModule attribute (``forward``, ``graph``, ...)."""
    parts = path.split(".") if isinstance(path, str) else [""]
    if any(not _SEGMENT.match(part) or part.startswith("__") for part in parts) or hasattr(fx.GraphModule, parts[0]):
        raise GraphFileError(f"{where}: {path!r} is not an allowed attribute path")
    return path


def _check_target(op: str, target: Any, where: str) -> Any:
    if op == "call_function":
        return resolve_function(target, where)
    if op in ("get_attr", "call_module"):
        return check_path(target, where)
    placeholder = _PLACEHOLDER.match(target) if op == "placeholder" and isinstance(target, str) else None
    if not (placeholder and not keyword.iskeyword(placeholder[1]) or op == "output" and target == "output"
            or op == "call_method" and isinstance(target, str) and target in _TENSOR_ATTRIBUTES):  # fmt: skip
        raise GraphFileError(f"{where}: {target!r} is not an allowed {op} target")
    return target


def _check_config(value: Any, where: str) -> dict[str, Any]:
    try:
        RoleFormats.from_dict(value)
    except LowbitError as error:
        raise GraphFileError(f"{where}: bad quantization config: {error}") from None
    return value


def decode_nodes(items: Any) -> fx.Graph:
    """An fx.Graph from saved nodes, every field checked (see the module docstring for why)."""
    if not isinstance(items, list):
        raise GraphFileError("'nodes' must be a list")
    graph, nodes = fx.Graph(), {}
    for index, item in enumerate(items):
        where = f"node #{index}"
        if not isinstance(item, dict) or set(item) != {"name", "op", "target", "args", "kwargs"}:
            raise GraphFileError(f"{where}: needs exactly name, op, target, args, kwargs")
        name, op = item["name"], item["op"]
        where = f"node {name!r}"
        if op not in _OPS or not isinstance(item["args"], list) or not isinstance(item["kwargs"], dict):
            raise GraphFileError(f"{where}: bad op {op!r}, args or kwargs")
        target = _check_target(op, item["target"], where)
        if any(not _IDENT.match(key) for key in item["kwargs"]):
            raise GraphFileError(f"{where}: keyword names must be identifiers")
        args = tuple(decode_value(arg, nodes, where) for arg in item["args"])
        kwargs = {key: _check_config(value, where) if _is_config(target, key) else decode_value(value, nodes, where)
                  for key, value in item["kwargs"].items()}  # fmt: skip
        if target is builtins.getattr and not (len(args) in (2, 3) and isinstance(args[1], str)
                                               and args[1] in _TENSOR_ATTRIBUTES):  # a constant, not a node
            raise GraphFileError(f"{where}: getattr may only read public torch.Tensor attributes named by a constant")
        node = graph.create_node(op, target, args, kwargs, name=name if isinstance(name, str) else None)
        if node.name != name:  # fx renames invalid or duplicate names; a saved graph never has those
            raise GraphFileError(f"{where}: not a valid, unique node name")
        nodes[name] = node
    try:
        graph.lint()
    except Exception as error:  # fx raises RuntimeError / AssertionError for structural problems
        raise GraphFileError(f"the graph is not well formed: {error}") from None
    return graph


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
