"""Putting a loaded graph's tensors in place (lowbit.graph.save_load): the modules are first rebuilt on the
meta device so that a constructor argument asking for another shape than the file holds is refused before
anything of that size is allocated, then every tensor is checked against its entry in graph.json's table and
set on its module (aliases as the same tensor), then the GraphModule is assembled around the saved tree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn

from lowbit.graph._graph_files import STATE_FILE
from lowbit.graph._serialize import GraphFileError, check_path
from lowbit.graph._serialize_modules import decode_modules


def named_tensors(root: nn.Module) -> Iterator[tuple[str, torch.Tensor, dict[str, Any]]]:
    """Every parameter and buffer with how it is held; a shared one under each of its names."""
    for prefix, module in root.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, tensor in module._parameters.items():
            if tensor is not None:
                yield dot + name, tensor, {"kind": "parameter", "requires_grad": tensor.requires_grad}
        for name, tensor in module._buffers.items():
            if tensor is not None:
                persistent = name not in module._non_persistent_buffers_set
                yield dot + name, tensor, {"kind": "buffer", "persistent": persistent}


def check_sizes(specs: Any, state: dict[str, torch.Tensor], table: Any) -> None:
    """Build the modules on the meta device first: a constructor argument that makes a tensor of another shape
    than the file holds (or one the file lacks) is refused before anything of that size is allocated."""
    try:
        with torch.device("meta"):
            tree = decode_modules(specs)
    except GraphFileError:
        raise
    except Exception:  # a constructor that cannot run on meta: the real build below reports its problem
        return
    table = table if isinstance(table, dict) else {}
    for name, tensor, _ in named_tensors(tree):
        entry = table.get(name)
        source = entry.get("same_as", name) if isinstance(entry, dict) else name
        saved = state.get(source) if isinstance(source, str) else None
        if saved is None:
            raise GraphFileError(f"tensor {name!r} of the rebuilt model is missing from {STATE_FILE}")
        if tuple(saved.shape) != tuple(tensor.shape):
            raise GraphFileError(f"tensor {name!r} has shape {list(saved.shape)} in {STATE_FILE}, but the rebuilt "
                                 f"module expects {list(tensor.shape)}")  # fmt: skip


def place_state(root: nn.Module, state: dict[str, torch.Tensor], table: Any) -> None:
    """Put every loaded tensor in place, strictly: a tensor missing from the file, one the file has but
    the model does not, or one whose shape differs from what its module was built with is an error."""
    if not isinstance(table, dict) or any(not isinstance(entry, dict) for entry in table.values()):
        raise GraphFileError("'tensors' must map names to entries")
    saved = [name for name, entry in table.items() if "same_as" not in entry]
    for name in saved:
        if name not in state:
            raise GraphFileError(f"tensor {name!r} is missing from {STATE_FILE}")
    for name in set(state) - set(saved):
        raise GraphFileError(f"{STATE_FILE} holds unexpected tensor {name!r}")
    for name, _, _ in named_tensors(root):
        if name not in table:
            raise GraphFileError(f"tensor {name!r} of the rebuilt model is missing from {STATE_FILE}")
    made: dict[str, torch.Tensor] = {}
    for name, entry in table.items():
        _place(root, name, entry, state, made)


def _place(root: nn.Module, name: str, entry: dict[str, Any], state: dict[str, torch.Tensor], made: dict) -> None:
    prefix, _, attr = check_path(name, "tensor").rpartition(".")
    try:
        owner = root.get_submodule(prefix)
        if "same_as" in entry:
            value = made[entry["same_as"]]
        else:
            value, old = state[name], getattr(owner, attr, None)
            if isinstance(old, torch.Tensor) and old.shape != value.shape:
                raise GraphFileError(f"tensor {name!r} has shape {list(value.shape)} in {STATE_FILE}, but the "
                                     f"rebuilt {type(owner).__name__} expects {list(old.shape)}")  # fmt: skip
            if entry.get("kind") == "parameter":
                value = nn.Parameter(value, requires_grad=bool(entry.get("requires_grad", True)))
            made[name] = value
        if entry.get("kind") == "parameter":
            setattr(owner, attr, value)  # setattr, not register_*: modules such as RNNs track their weights there
        elif entry.get("kind") == "buffer":
            if attr in owner._buffers:
                setattr(owner, attr, value)
            owner.register_buffer(attr, value, persistent=bool(entry.get("persistent", True)))
        else:
            raise GraphFileError(f"tensor {name!r}: kind must be 'parameter' or 'buffer'")
    except (AttributeError, KeyError, TypeError, RuntimeError) as error:
        raise GraphFileError(f"tensor {name!r} cannot be put in place: {error}") from None


def assemble(tree: nn.Module, graph: fx.Graph, class_name: Any) -> fx.GraphModule:
    name = class_name if isinstance(class_name, str) and class_name.isidentifier() else "GraphModule"
    try:
        gm = fx.GraphModule(tree, graph, name)
    except (AttributeError, RuntimeError) as error:
        raise GraphFileError(f"a node targets something that is not saved: {error}") from None
    # GraphModule copies only what nodes name, with plain Modules in between: give it the whole saved tree
    for child_name, child in tree.named_children():
        setattr(gm, child_name, child)
    for tensor_name, tensor in tree._parameters.items():
        gm.register_parameter(tensor_name, tensor)
    for tensor_name, tensor in tree._buffers.items():
        gm.register_buffer(tensor_name, tensor, persistent=tensor_name not in tree._non_persistent_buffers_set)
    for node in graph.nodes:  # get_submodule raises for a call_module target that is not a module
        if node.op == "call_module":
            gm.get_submodule(node.target)
    return gm
