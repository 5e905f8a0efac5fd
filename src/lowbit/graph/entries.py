"""The common-metadata entries of argument and result values: a tensor as its type, precision, shape and
torch dtype (and its value when asked), any other value with its tensors described the same way."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.immutable_collections import immutable_dict, immutable_list

def dtype_bits(dtype: torch.dtype) -> int:
    return dtype.itemsize * 8


def _tensor_type(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return "bool" if dtype == torch.bool else "int"


def tensor_entry(tensor: torch.Tensor, add_value: bool) -> dict[str, Any]:
    entry = {"type": _tensor_type(tensor.dtype), "precision": [dtype_bits(tensor.dtype)],
             "shape": list(tensor.shape), "torch_dtype": str(tensor.dtype)}  # fmt: skip
    if add_value:
        entry["value"] = tensor.detach().clone()
    return entry


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(item) for item in value)
    if isinstance(value, dict):
        return any(_has_tensor(item) for item in value.values())
    return False


def _described(value: Any, add_value: bool) -> Any:
    """``value`` with every tensor inside replaced by its tensor entry, and fx's immutable lists / dicts
    (what an interpreted node receives) turned back into plain ones."""
    if isinstance(value, torch.Tensor):
        return tensor_entry(value, add_value)
    if isinstance(value, dict):
        return {key: _described(item, add_value) for key, item in value.items()}
    if type(value) in (list, immutable_list) or (_has_tensor(value) and isinstance(value, (list, tuple))):
        return [_described(item, add_value) for item in value]
    return value


def _type_name(value: Any) -> str:
    if isinstance(value, immutable_list):
        return "list"
    return "dict" if isinstance(value, immutable_dict) else type(value).__name__


def value_entry(value: Any, add_value: bool) -> dict[str, Any]:
    """The common entry of any argument or result value."""
    if isinstance(value, torch.Tensor):
        return tensor_entry(value, add_value)
    return {"type": _type_name(value), "precision": [], "shape": [], "value": _described(value, add_value)}


def result_entries(value: Any, add_value: bool) -> dict[str, dict[str, Any]]:
    # torch.Size is a tuple but one value (a shape), as in MASE's size() results
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size) and len(value) > 0:
        return {f"data_out_{i}": value_entry(item, add_value) for i, item in enumerate(value)}
    return {"data_out_0": value_entry(value, add_value)}


def entry_dtype(entry: Any) -> torch.dtype | None:
    """The torch dtype of a tensor entry (None for anything else)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("torch_dtype"), str):
        return None
    dtype = getattr(torch, entry["torch_dtype"].removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) else None


def is_float_tensor_entry(entry: Any) -> bool:
    dtype = entry_dtype(entry)
    return dtype is not None and dtype.is_floating_point


__all__ = ["dtype_bits", "entry_dtype", "is_float_tensor_entry", "result_entries", "tensor_entry", "value_entry"]
