"""lowbit.save / lowbit.load: safetensors files with a versioned JSON header, loaded without pickle.

The file is a plain safetensors file. Its metadata holds one key, ``lowbit``, whose value is the JSON header
(schema documented field by field in docs/storage.md): what each entry is (a plain tensor, or a QTensor
with its format, parameters, packing, block shape and scale dtypes), the real-quantized modules of a saved
model (class name + ``config()``), and a seal: the SHA-256 of the whole file (header and data). Reading
checks the framing and every tensor's size against the bytes present, the schema and version, the seal, and
every tensor the header names, and reports any problem as a
:class:`SerializationError` (never a raw safetensors exception).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lowbit._io import PLACEHOLDER, atomic_write_bytes, seal_of
from lowbit._persist import Older, Schema, check_seal, check_version, read_bytes, register, strict_json
from lowbit._persist import seal as seal_bytes
from lowbit.errors import LowbitError
from lowbit.export._errors import SerializationError
from lowbit.export.records import (
    ModuleClasses,
    module_records,
    real_module_classes,
    rebuild_modules,
    untie_where_the_file_differs,
)
from lowbit.qtensor.tensor import QTensor

SCHEMA = "lowbit.safetensors"
SCHEMA_VERSION = 2  # 1: the checksum covered only the tensor data; such files are refused (docs/storage.md)
METADATA_KEY = "lowbit"
SEPARATOR = "#"  # QTensor parts are stored as "<name>#codes", "<name>#params.scale", ...
_PLACEHOLDER = PLACEHOLDER  # where the seal goes; see lowbit._io
_HEADER_KEYS = ("schema", "schema_version", "kind", "seal_sha256", "entries", "modules")
# the lowbit header inside the safetensors metadata; its seal covers the whole file (length prefix, header, data)
FILE_SCHEMA = register(Schema(SCHEMA, SCHEMA_VERSION, "lowbit header", SerializationError, {1: Older(
    refused="header schema 1, whose checksum covers only the tensor data", remedy="Save the model again.")},
    version_key="schema_version", seal_key="seal_sha256", limit=None))  # fmt: skip


# ---- save -------------------------------------------------------------------------------------------------
def save(obj: nn.Module | Mapping[str, torch.Tensor | QTensor], path: str | os.PathLike, *,
         modules: ModuleClasses = None) -> None:  # fmt: skip
    """Write ``obj`` (a dict name -> Tensor / QTensor, or a module) to ``path`` atomically.

    For a module: its state dict, plus a record of every quantized submodule (real ones: class name and
    ``config()``, for classes in ``lowbit.ops.REAL_MODULES`` or given in ``modules``; simulated ones: class
    name and formats; see :mod:`lowbit.export.records`), so that ``load`` can rebuild them. A quantized
    module it cannot record makes it refuse.
    """
    registry = real_module_classes(modules)
    if isinstance(obj, nn.Module):
        kind, state, records = "module", obj.state_dict(), module_records(obj, registry)
    elif isinstance(obj, Mapping):
        kind, state, records = "tensors", obj, {}
    else:
        raise SerializationError(f"lowbit.save expects a dict of tensors or an nn.Module, got {type(obj).__name__}")
    entries, tensors = {}, {}
    for name, value in state.items():
        entries[name] = _store_entry(str(name), value, tensors)
    header = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "lowbit_version": _version(), "kind": kind,
              "seal_sha256": _PLACEHOLDER, "entries": entries, "modules": records}  # fmt: skip
    atomic_write_bytes(path, _serialize(_unshared(tensors), header))


def _store_entry(name: str, value: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    if SEPARATOR in name:
        raise SerializationError(f"tensor name {name!r} contains {SEPARATOR!r}, which lowbit files reserve")
    if isinstance(value, QTensor):
        parts, entry = value.to_state()
        for local, tensor in parts.items():
            tensors[f"{name}{SEPARATOR}{local}"] = _storable(f"{name} ({local})", tensor)
        return {**entry, "prefix": f"{name}{SEPARATOR}"}
    if isinstance(value, torch.Tensor):
        tensors[name] = _storable(name, value)
        return {"type": "tensor", "key": name}
    raise SerializationError(
        f"cannot save {name!r} of type {type(value).__name__}: lowbit files hold tensors and QTensors only (no pickle)"
    )


# The dtypes a lowbit file holds (the safetensors names load accepts, _ITEMSIZE below).
_STORABLE_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.float8_e5m2, torch.float8_e4m3fn, torch.int16,
                              torch.uint16, torch.float16, torch.bfloat16, torch.int32, torch.uint32, torch.float32,
                              torch.int64, torch.uint64, torch.float64})  # fmt: skip


def _storable(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` if a lowbit file can hold its values; SerializationError naming it otherwise (before any
    byte is written): only dense, materialized tensors of a dtype that load reads back."""
    problem = None
    if tensor.is_meta:
        problem = "is on the meta device: it has no values to save (materialize it first)"
    elif tensor.layout != torch.strided or tensor.is_nested:
        layout = "nested" if tensor.is_nested else str(tensor.layout).removeprefix("torch.")
        problem = f"is a {layout} tensor; lowbit files hold dense tensors (save tensor.to_dense())"
    elif tensor.is_quantized:
        problem = "is a torch quantized tensor; save a lowbit QTensor, or its int_repr() and scales"
    elif tensor.dtype not in _STORABLE_DTYPES:
        problem = f"has dtype {tensor.dtype}, which lowbit files do not hold"
    elif type(tensor) not in (torch.Tensor, nn.Parameter, nn.Buffer):
        problem = f"is a {type(tensor).__name__}, a tensor subclass; save plain tensors"
    if problem is not None:
        raise SerializationError(f"cannot save {name!r}: it {problem}")
    return tensor


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors; a tensor sharing memory with an earlier one (tied weights) is copied."""
    seen, result = set(), {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().resolve_neg().contiguous()
        pointer = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        result[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return result


def _safetensors():
    try:
        import safetensors.torch
    except ImportError:
        raise SerializationError("lowbit files need safetensors: pip install 'lowbit[graph]'") from None
    return safetensors.torch


def _serialize(tensors: dict[str, torch.Tensor], header: dict[str, Any]) -> bytes:
    """The safetensors bytes, sealed: SHA-256 of the whole file (length prefix, header, data) in the header."""
    safetensors_save = _safetensors().save

    blob = safetensors_save(tensors, metadata={METADATA_KEY: json.dumps(header, allow_nan=False)})
    return seal_bytes(FILE_SCHEMA, blob, 8, 8 + int.from_bytes(blob[:8], "little"))


seal = seal_of  # the seal of a lowbit file: see lowbit._io


# ---- load -------------------------------------------------------------------------------------------------
def load(path: str | os.PathLike, model: nn.Module | None = None, *, modules: ModuleClasses = None,
         strict: bool = True) -> dict[str, torch.Tensor | QTensor] | nn.Module:  # fmt: skip
    """Read a file written by :func:`save`.

    Without ``model``: a dict name -> Tensor / QTensor. With ``model`` (the float architecture): the recorded
    quantized modules are rebuilt (real ones with ``cls.from_config(config)``, simulated ones from the
    model's own module and the recorded formats) and swapped in, parameters the model ties but the file holds
    with different values are untied (with a warning), then the state is loaded with
    ``load_state_dict(strict=strict)``; returns the model.
    """
    header, tensors = read_file(path)
    state = {name: _load_entry(name, entry, tensors) for name, entry in header["entries"].items()}
    if model is None:
        return state
    if not isinstance(model, nn.Module):
        raise SerializationError(f"load(model=...) expects an nn.Module, got {type(model).__name__}")
    model = rebuild_modules(model, header["modules"], real_module_classes(modules), state)
    untie_where_the_file_differs(model, state)
    try:
        model.load_state_dict(state, strict=strict)
    except (RuntimeError, ValueError, TypeError) as error:
        raise SerializationError(f"{str(path)!r} does not fit the model: {error}") from None
    return model


def read_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(validated lowbit header, tensors by key) of a lowbit file."""
    return parse(read_bytes(FILE_SCHEMA, path), str(path))


def parse(data: bytes, where: str = "<bytes>") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(validated lowbit header, tensors by key) of the bytes of a lowbit file. Every size is checked against
    the bytes present and the seal verified before any tensor is made."""
    raw, size = _safetensors_header(data, where)
    header = _lowbit_header(raw, where)
    check_seal(FILE_SCHEMA, header["schema_version"], data, header["seal_sha256"], repr(where), begin=8, end=8 + size)
    safetensors_load = _safetensors().load
    try:
        tensors = safetensors_load(data)
    except Exception as error:  # safetensors raises its own SafetensorError for malformed files
        raise SerializationError(f"{where!r} is not a readable safetensors file: {error}") from None
    return header, tensors


def _safetensors_header(data: bytes, where: str) -> tuple[dict[str, Any], int]:
    if len(data) < 8:
        raise SerializationError(f"{where!r} is truncated or not a safetensors file ({len(data)} bytes)")
    size = int.from_bytes(data[:8], "little")
    if 8 + size > len(data):
        raise SerializationError(f"{where!r} is truncated: its header needs {size} bytes, {len(data) - 8} remain")
    raw = _strict_json(data[8 : 8 + size], where, "its header")
    if not isinstance(raw, dict):
        raise SerializationError(f"{where!r} is corrupt: its safetensors header is not a JSON object")
    _check_layout(raw, len(data) - 8 - size, where)
    return raw, size


def _strict_json(text: bytes | str, where: str, what: str) -> Any:
    """JSON without duplicate keys or NaN / Infinity (neither is ever written)."""
    return strict_json(text, repr(where), FILE_SCHEMA, what)


def _check_layout(raw: dict[str, Any], available: int, where: str) -> None:
    """Every tensor's dtype, shape and byte range valid, its size = itemsize x elements, the ranges in order
    without gaps or overlaps, covering the data section exactly: checked before anything is allocated."""
    spans = []
    for key, info in raw.items():
        if key == "__metadata__":
            continue
        spans.append((*_span(key, info, where), key))
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            problem = "overlaps another" if begin < position else "leaves a gap before it"
            raise SerializationError(f"{where!r} is corrupt: tensor {key!r}'s data {problem}")
        position = end
    if position > available:
        raise SerializationError(f"{where!r} is truncated: the tensors need {position} bytes of data, "
                                 f"{available} remain")  # fmt: skip
    if position < available:
        raise SerializationError(f"{where!r} is corrupt: {available - position} unexpected bytes after the tensor data")


def _span(key: str, info: Any, where: str) -> tuple[int, int]:
    bad = f"{where!r} is corrupt: tensor {key!r} has"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise SerializationError(f"{bad} a malformed entry (needs dtype, shape and data_offsets)")
    itemsize, shape, offsets = _ITEMSIZE.get(info["dtype"]), info["shape"], info["data_offsets"]
    if itemsize is None:
        raise SerializationError(f"{bad} an unknown dtype {info['dtype']!r}")
    if not isinstance(shape, list) or not all(_natural(n) for n in shape):
        raise SerializationError(f"{bad} a malformed shape {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_natural(n) for n in offsets):
        raise SerializationError(f"{bad} malformed data_offsets {offsets!r} (needs [begin, end])")
    elements = math.prod(shape)
    if offsets[1] - offsets[0] != itemsize * elements:
        raise SerializationError(f"{bad} {offsets[1] - offsets[0]} bytes of data for {elements} elements of "
                                 f"{info['dtype']} ({itemsize * elements} bytes)")  # fmt: skip
    return offsets[0], offsets[1]


def _natural(value: Any) -> bool:
    return type(value) is int and value >= 0


_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}  # fmt: skip


def _lowbit_header(raw: dict[str, Any], where: str) -> dict[str, Any]:
    metadata = raw.get("__metadata__") or {}
    if not isinstance(metadata, dict) or METADATA_KEY not in metadata:
        raise SerializationError(f"{where!r} is a safetensors file without a lowbit header "
                                 "(not written by lowbit.save)")
    header = _strict_json(metadata[METADATA_KEY], where, "the lowbit header") if isinstance(
        metadata[METADATA_KEY], str) else None  # fmt: skip
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise SerializationError(f"{where!r}: the lowbit header does not declare schema {SCHEMA!r}")
    check_version(FILE_SCHEMA, header.get("schema_version"), repr(where))
    missing = [key for key in _HEADER_KEYS if key not in header]
    if missing or not isinstance(header["entries"], dict) or not isinstance(header["modules"], dict):
        problem = missing or ["entries / modules"]
        raise SerializationError(f"{where!r}: the lowbit header is incomplete (missing or malformed: {problem})")
    return header


def _load_entry(name: str, entry: Any, tensors: dict[str, torch.Tensor]) -> torch.Tensor | QTensor:
    try:
        if entry["type"] == "tensor":
            return _tensor(tensors, entry["key"], name)
        if entry["type"] == "qtensor":
            prefix = entry["prefix"]
            parts = {key[len(prefix) :]: value for key, value in tensors.items() if key.startswith(prefix)}
            for local in _qtensor_keys(entry):
                if local not in parts:
                    raise SerializationError(f"entry {name!r}: tensor {prefix + local!r} is missing from the file")
            return QTensor.from_state(parts, entry)
        raise SerializationError(f"entry {name!r} has unknown type {entry['type']!r}")
    except SerializationError:
        raise
    except (LowbitError, KeyError, TypeError, ValueError, IndexError, RuntimeError, ArithmeticError, MemoryError,
            AttributeError) as error:  # a resealed (forged) entry the QTensor checks did not catch by name
        raise SerializationError(f"entry {name!r} is malformed: {type(error).__name__}: {error}") from None


def _qtensor_keys(entry: dict[str, Any]) -> list[str]:
    keys = [entry["codes"]["key"], *(item["key"] for item in entry["params"].values())]
    return keys + ([entry["zero_sign"]["key"]] if entry.get("zero_sign") else [])


def _tensor(tensors: dict[str, torch.Tensor], key: str, name: str) -> torch.Tensor:
    if key not in tensors:
        raise SerializationError(f"entry {name!r}: tensor {key!r} is missing from the file")
    return tensors[key]


def _version() -> str:
    from lowbit._version import __version__

    return __version__
