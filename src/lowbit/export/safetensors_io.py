"""lowbit.save / lowbit.load: safetensors files with a versioned JSON header, loaded without pickle.

The file is a plain safetensors file. Its metadata holds one key, ``lowbit``, whose value is the JSON header
(schema documented field by field in docs/storage.md): what each entry is (a plain tensor, or a QTensor
with its format, parameters, packing, block shape and scale dtypes), the real-quantized modules of a saved
model (class name + ``config()``), and a SHA-256 of the tensor data. Reading checks the framing, the schema
and version, the checksum and every tensor the header names, and reports any problem as a
:class:`SerializationError` (never a raw safetensors exception).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lowbit._io import atomic_write_bytes
from lowbit.errors import LowbitError
from lowbit.export._errors import SerializationError
from lowbit.export.records import ModuleClasses, module_records, real_module_classes, rebuild_modules
from lowbit.qtensor.tensor import QTensor

SCHEMA = "lowbit.safetensors"
SCHEMA_VERSION = 1
METADATA_KEY = "lowbit"
SEPARATOR = "#"  # QTensor parts are stored as "<name>#codes", "<name>#params.scale", ...
_PLACEHOLDER = "?" * 64  # same length as a SHA-256 hex digest, patched in after hashing the data section
_HEADER_KEYS = ("schema", "schema_version", "kind", "data_sha256", "entries", "modules")


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
              "data_sha256": _PLACEHOLDER, "entries": entries, "modules": records}  # fmt: skip
    atomic_write_bytes(path, _serialize(_unshared(tensors), header))


def _store_entry(name: str, value: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    if SEPARATOR in name:
        raise SerializationError(f"tensor name {name!r} contains {SEPARATOR!r}, which lowbit files reserve")
    if isinstance(value, QTensor):
        parts, entry = value.to_state()
        for local, tensor in parts.items():
            tensors[f"{name}{SEPARATOR}{local}"] = tensor
        return {**entry, "prefix": f"{name}{SEPARATOR}"}
    if isinstance(value, torch.Tensor):
        tensors[name] = value
        return {"type": "tensor", "key": name}
    raise SerializationError(
        f"cannot save {name!r} of type {type(value).__name__}: lowbit files hold tensors and QTensors only (no pickle)"
    )


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors; a tensor sharing memory with an earlier one (tied weights) is copied."""
    seen, result = set(), {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
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
    safetensors_save = _safetensors().save

    blob = bytearray(safetensors_save(tensors, metadata={METADATA_KEY: json.dumps(header, allow_nan=False)}))
    size = int.from_bytes(blob[:8], "little")
    digest = hashlib.sha256(memoryview(blob)[8 + size :]).hexdigest()
    start = blob.find(_PLACEHOLDER.encode(), 8, 8 + size)
    blob[start : start + len(digest)] = digest.encode()  # same length: offsets stay valid
    return bytes(blob)


# ---- load -------------------------------------------------------------------------------------------------
def load(path: str | os.PathLike, model: nn.Module | None = None, *, modules: ModuleClasses = None,
         strict: bool = True) -> dict[str, torch.Tensor | QTensor] | nn.Module:  # fmt: skip
    """Read a file written by :func:`save`.

    Without ``model``: a dict name -> Tensor / QTensor. With ``model`` (the float architecture): the recorded
    quantized modules are rebuilt (real ones with ``cls.from_config(config)``, simulated ones from the
    model's own module and the recorded formats) and swapped in, then the state is loaded with
    ``load_state_dict(strict=strict)``; returns the model.
    """
    header, tensors = read_file(path)
    state = {name: _load_entry(name, entry, tensors) for name, entry in header["entries"].items()}
    if model is None:
        return state
    if not isinstance(model, nn.Module):
        raise SerializationError(f"load(model=...) expects an nn.Module, got {type(model).__name__}")
    model = rebuild_modules(model, header["modules"], real_module_classes(modules))
    try:
        model.load_state_dict(state, strict=strict)
    except (RuntimeError, ValueError, TypeError) as error:
        raise SerializationError(f"{str(path)!r} does not fit the model: {error}") from None
    return model


def read_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(validated lowbit header, tensors by key) of a lowbit file."""
    where = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise SerializationError(f"cannot read {where!r}: {error.strerror or error}") from None
    raw, size = _safetensors_header(data, where)
    header = _lowbit_header(raw, where)
    if hashlib.sha256(memoryview(data)[8 + size :]).hexdigest() != header["data_sha256"]:
        raise SerializationError(f"{where!r} is corrupt: the tensor data does not match its SHA-256 checksum")
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
    try:
        raw = json.loads(data[8 : 8 + size])
    except (UnicodeDecodeError, ValueError):
        raise SerializationError(f"{where!r} is corrupt or not a safetensors file: its header is not JSON") from None
    if not isinstance(raw, dict):
        raise SerializationError(f"{where!r} is corrupt: its safetensors header is not a JSON object")
    ends = [info.get("data_offsets", [0, 0])[1] for key, info in raw.items() if key != "__metadata__"
            and isinstance(info, dict) and isinstance(info.get("data_offsets"), list)]  # fmt: skip
    expected, actual = max(ends, default=0), len(data) - 8 - size
    if not isinstance(expected, int) or expected > actual:
        raise SerializationError(f"{where!r} is truncated: the tensors need {expected} bytes of data, {actual} remain")
    if expected < actual:
        raise SerializationError(f"{where!r} is corrupt: {actual - expected} unexpected bytes after the tensor data")
    return raw, size


def _lowbit_header(raw: dict[str, Any], where: str) -> dict[str, Any]:
    metadata = raw.get("__metadata__") or {}
    if not isinstance(metadata, dict) or METADATA_KEY not in metadata:
        raise SerializationError(f"{where!r} is a safetensors file without a lowbit header "
                                 "(not written by lowbit.save)")
    try:
        header = json.loads(metadata[METADATA_KEY])
    except (TypeError, ValueError):
        raise SerializationError(f"{where!r}: the lowbit header is not valid JSON (the file was altered)") from None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise SerializationError(f"{where!r}: the lowbit header does not declare schema {SCHEMA!r}")
    version = header.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SerializationError(
            f"{where!r} uses lowbit header schema version {version!r}; this lowbit ({_version()}) reads version "
            f"{SCHEMA_VERSION}"
        )
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
    except (LowbitError, KeyError, TypeError, ValueError, IndexError, RuntimeError) as error:
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
