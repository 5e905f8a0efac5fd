"""Pickle-free codecs behind :mod:`lowbit.graph.save_load`: node arguments and call targets, each checked on
the way back in (module trees: :mod:`lowbit.graph._serialize_modules`).

Loading must never run code that a file names. So functions resolve only from a few namespaces of tensor and
number operations, module classes only from ``torch.nn`` and ``lowbit.nn``, and every string that torch.fx
pastes into the Python source it generates (placeholder names, method names, attribute paths, keyword
names) must be a plain identifier. ``getattr`` and ``call_method`` may only name public attributes of
torch.Tensor: otherwise a crafted graph could walk from a tensor to ``os.system`` (through dunders) or to
a file write (``x.numpy().tofile(path)``) when the model runs.
"""

from __future__ import annotations

import builtins
import inspect
import json
import keyword
import math
import operator
import re
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from lowbit.errors import LowbitError
from lowbit.graph.qgraph import GraphError
from lowbit.nn import functional as qf
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
