"""Loading and saving the checkpoints the ``lowbit`` commands exchange. Nothing here unpickles code.

Load types (``--load-type``; by default inferred from the path):

- ``pt``: a state dict saved with ``torch.save`` (read with ``weights_only=True``), a dict holding one under
  ``"state_dict"``, or a ``.safetensors`` file of tensors; loaded strictly into the built-in model.
- ``pl``: a Lightning checkpoint (``.ckpt``, read with ``weights_only=True``); its ``model.`` key prefix,
  added by the Lightning wrapper, is removed.
- ``lowbit``: a folder written by ``lowbit transform`` / ``lowbit train``: a graph saved by
  :func:`lowbit.graph.save_graph`, or a module-style model (``module.json`` + ``state.safetensors``:
  the built-in model name and the quantize pass_args that rebuild it, then its tensors).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lowbit._checksum import digest_file, verify_sidecar
from lowbit._io import atomic_directory, read_regular_file, write_file
from lowbit._persist import Older, Schema, json_bytes, read_bytes, read_json, register, write_folder
from lowbit.errors import ConfigError, FormatError, LowbitError

LOAD_TYPES = ("pt", "pl", "lowbit")
MODULE_SCHEMA, MODULE_VERSION = "lowbit.module", 1
WEIGHTS_FILE = "model.safetensors"  # version 2: written by lowbit.save (real modules recorded in its header)
RUN_SCHEMA, RUN_FILE = "lowbit.run", "run.json"  # which built-in model / dataset a saved graph came from
# module.json: version 2 (a recipe; weights by lowbit.save) and version 1 (state.safetensors, its digest listed)
# are both written today; version 1 files from before the seal (no "files" either) load with a warning
MODULE_FILE_SCHEMA = register(Schema(MODULE_SCHEMA, 2, "module checkpoint", ConfigError,
                                     {1: Older(unsealed=True, sealed_marks=("files",))}))  # fmt: skip
# run.json: unsealed and unversioned (a note read leniently by saved_origin; the graph.json beside it is sealed)
RUN_FILE_SCHEMA = register(Schema(RUN_SCHEMA, 1, "run description", ConfigError, version_key=None, seal_key=None))
MODULE_FILE, STATE_FILE = "module.json", "state.safetensors"
# a module-style save owns these names (a graph save's files are removed in the same swap, so no stale graph
# shadows it); other files in the folder (metrics, another tool's) are carried over
MODULE_OWNED = (MODULE_FILE, STATE_FILE, WEIGHTS_FILE, "graph.json", "node_meta.toml", "graph_module.pt", RUN_FILE)
_log = logging.getLogger("lowbit")


def infer_load_type(path: str | os.PathLike) -> str:
    path = Path(path)
    if path.is_dir():
        return "lowbit"
    return "pl" if path.suffix == ".ckpt" else "pt"


def load_checkpoint(model: nn.Module | None, path: str | os.PathLike, load_type: str | None) -> nn.Module:
    """``model`` with the checkpoint's weights (``pt`` / ``pl``), or the saved model itself (``lowbit``)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"checkpoint {path} does not exist")
    load_type = load_type or infer_load_type(path)
    if load_type == "lowbit":
        return load_lowbit(path)
    if model is None:
        raise ConfigError(f"a {load_type} checkpoint holds weights only: name the model it belongs to")
    verified = path.is_file() and verify_file(path)
    state = _read_state(path)
    if load_type == "pl":
        state = _lightning_state(state, path)
    elif isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    load_state_strict(model, state, str(path))
    if not verified:  # another tool's file (the usual case for --load): said with -v only
        _log.debug(f"checkpoint {path} has no lowbit checksum beside it (another tool or an older lowbit wrote "
                   f"it): not verified")  # fmt: skip
    return model


def _read_state(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; a pt / pl checkpoint is a file (a folder loads with --load-type lowbit)")
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} is not a regular file")
    if path.stat().st_size == 0:
        raise ConfigError(f"checkpoint {path} is empty (0 bytes): a save was interrupted, or this is the wrong file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(path)))
        state = torch.load(io.BytesIO(read_regular_file(path)), map_location="cpu", weights_only=True)  # no FIFO hang
    except Exception as error:  # corrupt, truncated, or holding objects that weights_only refuses
        first_line = (str(error).strip().splitlines() or ["(no message)"])[0]
        raise ConfigError(f"cannot read checkpoint {path}: {type(error).__name__}: {first_line}") from None
    if not isinstance(state, Mapping):
        raise ConfigError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict")
    return dict(state)


def verify_file(path: Path) -> bool:
    """A checkpoint file against its ``.sha256`` sidecar (written with every checkpoint lowbit writes):
    ConfigError naming the file on a mismatch; False if it has none (another tool or an older lowbit)."""
    try:
        return verify_sidecar(path)
    except FormatError as error:
        raise ConfigError(str(error)) from None


def _lightning_state(checkpoint: Mapping[str, Any], path: Path) -> dict[str, Any]:
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise ConfigError(f"{path} is not a Lightning checkpoint (no 'state_dict' entry); try --load-type pt")
    prefix = "model."
    return {key[len(prefix):] if key.startswith(prefix) else key: value for key, value in state.items()}


def load_state_strict(model: nn.Module, state: Mapping[str, Any], where: str) -> None:
    """Load every tensor; ConfigError listing missing / unexpected / mis-shaped keys otherwise."""
    own = model.state_dict()
    missing = [key for key in own if key not in state]
    unexpected = [key for key in state if key not in own]
    shapes = [f"{key} {tuple(state[key].shape)} != {tuple(own[key].shape)}" for key in own
              if key in state and isinstance(state[key], torch.Tensor) and state[key].shape != own[key].shape]  # fmt: skip
    problems = [f"{label}: {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
                for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)) if items]  # fmt: skip
    if problems:
        raise ConfigError(f"checkpoint {where} does not match the model {type(model).__name__} ({'; '.join(problems)})")
    model.load_state_dict(state, strict=True)


# ---- lowbit folders ---------------------------------------------------------------------------------------
def save_lowbit(model: nn.Module, directory: str | os.PathLike, *, model_name: str | None = None,
                dataset: str | None = None, quantize_args: Any = None, recipe: Any = None) -> list[Path]:  # fmt: skip
    """Save a transformed model: an fx graph with :func:`save_graph`; any other module in module style
    (with ``recipe``, the ``[passes.quantize_model]`` table: tensors and real modules through
    :func:`lowbit.save`, version 2)."""
    from torch import fx

    from lowbit.graph import QGraph, save_graph

    directory = Path(directory)
    if isinstance(model, (QGraph, fx.GraphModule)):  # graph.json commits the swap; a module-style save is removed
        about = json_bytes(RUN_FILE_SCHEMA, {"model": model_name, "dataset": dataset}) + b"\n"
        extra = {RUN_FILE: about, MODULE_FILE: None, WEIGHTS_FILE: None}
        return [*save_graph(model, directory, extra_files=extra)]
    if model_name is None:
        raise ConfigError("saving a module-style model needs the built-in model name that rebuilds it")
    if recipe is not None:
        return _save_version_2(model, directory, model_name, dataset, quantize_args, recipe)
    from safetensors.torch import save as to_bytes

    state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
    data = to_bytes(state)
    doc = {"model": model_name, "dataset": dataset, "quantize": quantize_args,
           "files": {STATE_FILE: hashlib.sha256(data).hexdigest()}}  # fmt: skip
    text = _sealed_json(doc, MODULE_VERSION)  # serialized before the first write: a failure leaves the earlier save
    return write_folder(directory, {STATE_FILE: data, MODULE_FILE: text}, owned=MODULE_OWNED, last=MODULE_FILE)


def _save_version_2(model: nn.Module, directory: Path, model_name: str, dataset: str | None, quantize_args: Any,
                    recipe: Any) -> list[Path]:  # fmt: skip
    from lowbit.export import save
    from lowbit.pipeline.progress import waiting

    doc = {"model": model_name, "dataset": dataset, "quantize": quantize_args, "quantize_model": recipe,
           "weights": WEIGHTS_FILE, "files": {WEIGHTS_FILE: "sealed by lowbit.save"}}  # fmt: skip
    text = _sealed_json(doc, 2)  # the weights file seals itself (lowbit.save)
    with waiting(f"saving {directory}", slow=False), \
            atomic_directory(directory, owned=MODULE_OWNED, last=MODULE_FILE) as building:  # fmt: skip
        save(model, building / WEIGHTS_FILE)
        write_file(building / MODULE_FILE, text)
    return [directory / WEIGHTS_FILE, directory / MODULE_FILE]


def _sealed_json(doc: dict[str, Any], version: int) -> bytes:
    return json_bytes(MODULE_FILE_SCHEMA, doc, version=version, default=_not_json)


def _not_json(value: Any) -> Any:
    raise ConfigError(f"a module-style model's quantize config must be plain data; {value!r} is not")


def load_lowbit(directory: Path) -> nn.Module:
    from lowbit.graph import load_graph

    if not directory.is_dir():
        raise ConfigError(f"a lowbit checkpoint is a folder written by lowbit transform / train; {directory} is a file")
    if (directory / "module.json").exists():
        return _load_module_style(directory)
    return load_graph(directory).model


def saved_origin(directory: str | os.PathLike) -> tuple[str | None, str | None]:
    """(model, dataset) names recorded beside a saved model, (None, None) if none were."""
    directory = Path(directory)
    for name, schema in (("module.json", MODULE_FILE_SCHEMA), (RUN_FILE, RUN_FILE_SCHEMA)):
        try:  # best effort, but never reads more than the schema's size limit
            doc = json.loads(read_bytes(schema, directory / name))
        except (LowbitError, ValueError):
            continue
        if isinstance(doc, dict):
            return doc.get("model"), doc.get("dataset")
    return None, None


def _load_module_style(directory: Path) -> nn.Module:
    from lowbit.graph import quantize_module_transform_pass
    from lowbit.pipeline.catalog import build_model

    doc = _read_module_json(directory / MODULE_FILE)
    model = build_model(doc.get("model"), doc.get("dataset"))
    if doc.get("quantize") is not None:
        model, _ = quantize_module_transform_pass(model, doc["quantize"])
    if doc["version"] == 2:
        return _load_version_2(model, directory, doc)
    state_path = directory / STATE_FILE
    recorded = (doc.get("files") or {}).get(STATE_FILE) if isinstance(doc.get("files"), dict) else None
    if recorded is not None and (not state_path.is_file() or digest_file(state_path) != recorded):
        raise ConfigError(f"{state_path} does not match the checksum in {MODULE_FILE}: the file is corrupt or "
                          "was changed")
    load_state_strict(model, _read_state(state_path), str(directory))
    return model


def _read_module_json(path: Path) -> dict[str, Any]:
    """module.json, its version and seal checked (saves from before the seal load with a warning)."""
    document = read_json(MODULE_FILE_SCHEMA, path)
    return {**document.fields, "version": document.version}


def _load_version_2(model: nn.Module, directory: Path, doc: dict[str, Any]) -> nn.Module:
    from lowbit.export import load
    from lowbit.pipeline.quantizing import rebuild_structure

    if isinstance(doc.get("quantize_model"), dict):
        model = rebuild_structure(model, doc["quantize_model"])
    path = directory / str(doc.get("weights", WEIGHTS_FILE))
    if not path.is_file():
        raise ConfigError(f"{directory} has no {path.name}: the checkpoint is incomplete")
    try:
        return load(path, model=model)
    except LowbitError as error:
        raise ConfigError(f"cannot load {path}: {error}") from None


__all__ = ["LOAD_TYPES", "infer_load_type", "load_checkpoint", "load_lowbit", "load_state_strict", "save_lowbit",
           "saved_origin"]  # fmt: skip
