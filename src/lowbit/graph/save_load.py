"""Save a (quantized) QGraph to a directory and load it back, without pickle unless asked.

A saved graph is a folder of three files, published whole (built in a temporary sibling folder, fsynced,
swapped in with one rename by :func:`lowbit._persist.write_folder`, so a reader sees the previous save or
the new one, never a mixture):

- ``state.safetensors``: every parameter and buffer of the GraphModule by qualified name.
- ``node_meta.toml``: ``{node_name: node.meta["mase"].parameters}`` (None written as MASE's "NA").
- ``graph.json``: ``{"schema": "lowbit.graph", "version": 2, ...}`` with the fx nodes, the constructor
  arguments of every module (plus lowbit formats), how each tensor is held, the SHA-256 of the other
  files, and ``seal_sha256``, the seal of graph.json itself (its schema, ``GRAPH_SCHEMA``, is declared over
  :mod:`lowbit._persist`): any changed byte of any of the files is refused instead of loading a wrong model.

Loading rebuilds modules only from torch.nn / lowbit.nn and functions only from an allowlist (see
:mod:`lowbit.graph._serialize` and :mod:`lowbit.graph._serialize_modules`), and puts the tensors in place after
checking their shapes (:mod:`lowbit.graph._place_state`). A graph with a custom module class can be saved with
``allow_pickle=True`` (adds ``graph_module.pt``); loading that needs ``trust_pickle=True``, since unpickling runs
arbitrary code.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from lowbit._io import atomic_write_text
from lowbit._persist import json_bytes, write_folder
from lowbit.config.toml_config import na_to_none
from lowbit.errors import LowbitError
from lowbit.graph._graph_files import (GRAPH_FILE, GRAPH_SCHEMA, META_FILE, PICKLE_FILE, SCHEMA, STATE_FILE, VERSION,
                                      read_files)  # fmt: skip
from lowbit.graph._place_state import assemble, check_sizes, named_tensors, place_state
from lowbit.graph._serialize import GraphFileError, NotPortable, decode_nodes, encode_node
from lowbit.graph._serialize_modules import decode_modules, encode_modules, saveable_path
from lowbit.graph.metadata import REQUIRED, MaseMetadata, read_pass_args
from lowbit.graph.qgraph import GraphError, QGraph
from lowbit.nn.functional import QUANT_FUNCTIONS
from lowbit.nn.modules import QuantModule


# ---- public API -----------------------------------------------------------------------------------------
def save_graph(graph: QGraph | fx.GraphModule, directory: str | os.PathLike, *, allow_pickle: bool = False,
               extra_files: Mapping[str, bytes] | None = None) -> list[Path]:  # fmt: skip
    """Write ``graph`` to ``directory``; returns the files written. Raises NotPortable naming the module /
    function that has no pickle-free form, unless ``allow_pickle`` lets it pickle the GraphModule instead.
    ``extra_files`` (name -> bytes, e.g. a run description) are published in the same swap as the graph; a
    name mapped to None is removed in that swap (a file of another kind of save that would shadow this one)."""
    extra = dict(extra_files or {})
    reserved = {GRAPH_FILE, STATE_FILE, META_FILE, PICKLE_FILE} & set(extra)
    if reserved or any(not isinstance(data, (bytes, type(None))) or os.sep in name or name in ("", ".", "..")
                       for name, data in extra.items()):  # fmt: skip
        raise GraphError(f"extra_files must map plain file names (not {sorted(reserved)}) to bytes or None")
    gm, directory = _graph_module(graph), Path(directory)
    state, tensors = _collect_state(gm)
    # everything is serialized before the first write, so a failure leaves an earlier save intact
    payloads = {STATE_FILE: _safetensors_bytes(state), META_FILE: node_meta_toml(gm).encode()}
    training = [path for path, module in gm.named_modules(remove_duplicate=False) if module.training]
    doc: dict[str, Any] = {"format": "fx", "class_name": type(gm).__name__, "training": training}
    try:
        doc["nodes"], doc["modules"] = _encode_nodes(gm.graph), encode_modules(gm)
    except NotPortable as error:
        if not allow_pickle:
            raise NotPortable(f"{error}. Save with allow_pickle=True to pickle the GraphModule instead "
                              "(loading it then needs trust_pickle=True)") from None  # fmt: skip
        payloads[PICKLE_FILE] = _pickle_bytes(gm)
        doc.update(format="pickle", pickle_reason=str(error), node_names=[n.name for n in gm.graph.nodes])
    doc["tensors"] = tensors
    doc["files"] = {name: hashlib.sha256(data).hexdigest() for name, data in payloads.items()}
    payloads[GRAPH_FILE] = json_bytes(GRAPH_SCHEMA, doc)  # sealed: any changed byte of it is refused
    # built in a temporary sibling folder and swapped in whole: a reader (or a crash) sees the previous save
    # or this one; other files in the folder are kept, a stale graph_module.pt is not
    owned = (GRAPH_FILE, STATE_FILE, META_FILE, PICKLE_FILE, *extra)
    write_folder(directory, {**extra, **payloads}, owned=owned, last=GRAPH_FILE)  # graph.json commits the save
    return [directory / name for name in (*payloads, *extra) if extra.get(name, b"") is not None]


def load_graph(directory: str | os.PathLike, trust_pickle: bool = False) -> QGraph:
    """The QGraph saved in ``directory`` (tensors on the CPU). Missing, corrupt or tampered files and
    non-allowlisted classes or functions raise GraphFileError (a LowbitError) naming the file."""
    directory = Path(directory)
    doc, data = read_files(directory)
    with _about(directory / STATE_FILE):  # a safetensors error here means a bad header or sizes
        state = _require("safetensors.torch").load(data[STATE_FILE])
    if doc["format"] == "pickle":
        gm = _unpickle(directory, doc, data[PICKLE_FILE], trust_pickle)
        with _about(directory / GRAPH_FILE):
            place_state(gm, state, doc["tensors"])
    else:
        with _about(directory / GRAPH_FILE):
            check_sizes(doc["modules"], state, doc["tensors"])
            tree = decode_modules(doc["modules"])
            place_state(tree, state, doc["tensors"])
            gm = assemble(tree, decode_nodes(doc["nodes"]), doc.get("class_name"))
    with _about(directory / GRAPH_FILE):
        training = set(doc["training"])
        for path, module in gm.named_modules(remove_duplicate=False):
            module.training = path in training
    with _about(directory / META_FILE):
        _restore_meta(gm, data[META_FILE])
    return QGraph(gm)


def node_meta_toml(graph: QGraph | fx.GraphModule) -> str:
    """``{node_name: parameters}`` as TOML for every node with ``node.meta["mase"]``."""
    tomli_w = _require("tomli_w")
    table = {node.name: _meta_to_toml(params) for node in _graph_module(graph).graph.nodes
             if (params := _node_parameters(node)) is not None}  # fmt: skip
    return tomli_w.dumps(table)


# ---- MASE-named passes ----------------------------------------------------------------------------------
def save_mase_graph_interface_pass(graph: QGraph, pass_args: Mapping[str, Any] | str | None = None):
    """MASE's pass: ``pass_args = {"save_dir": ..., "allow_pickle": False}`` -> ``(graph, {"files": [...]})``."""
    args = _pass_args("save_mase_graph_interface_pass", pass_args, {"save_dir": REQUIRED, "allow_pickle": False})
    files = save_graph(graph, args["save_dir"], allow_pickle=bool(args["allow_pickle"]))
    return graph, {"files": [str(path) for path in files]}


def load_mase_graph_interface_pass(graph: QGraph | None = None, pass_args: Mapping[str, Any] | str | None = None):
    """MASE's pass: ``pass_args = {"load_dir": ..., "trust_pickle": False}`` -> ``(graph, {})``. With a
    QGraph, its ``model`` is replaced by the loaded one (MASE loads into the graph it is given); with None, a
    new QGraph is returned."""
    args = _pass_args("load_mase_graph_interface_pass", pass_args, {"load_dir": REQUIRED, "trust_pickle": False})
    if isinstance(graph, tuple):
        raise GraphError("load_mase_graph_interface_pass got a tuple: passes return (graph, info), pass the graph")
    if graph is not None and not isinstance(graph, QGraph):
        raise GraphError(f"load_mase_graph_interface_pass needs a QGraph or None, got {type(graph).__name__}")
    loaded = load_graph(args["load_dir"], trust_pickle=bool(args["trust_pickle"]))
    if graph is None:
        return loaded, {}
    graph.model = loaded.model
    return graph, {}


def save_node_meta_param_interface_pass(graph: QGraph, pass_args: Mapping[str, Any] | str | None = None):
    """MASE's pass: writes ``{node_name: parameters}`` to ``pass_args["save_path"]`` -> ``(graph, {})``, with
    the statistics file's sealed header line (a TOML comment: MASE's readers still read it), since
    ``lowbit stats-to-config`` reads this file as statistics."""
    from lowbit.graph.stats_file import sealed_statistics_text

    args = _pass_args("save_node_meta_param_interface_pass", pass_args, {"save_path": REQUIRED})
    atomic_write_text(args["save_path"], sealed_statistics_text(node_meta_toml(graph)))
    return graph, {}


def _pass_args(pass_name: str, given: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """A fresh dict of the pass's arguments; a bare path stands for the first key (MASE's older form)."""
    if isinstance(given, (str, os.PathLike)):
        given = {next(iter(defaults)): given}
    return read_pass_args(pass_name, given, defaults)


# ---- saving helpers -------------------------------------------------------------------------------------
def _graph_module(graph: Any) -> fx.GraphModule:
    model = graph.model if isinstance(graph, QGraph) else graph
    if not isinstance(model, fx.GraphModule):
        raise GraphError(f"expected a QGraph or fx.GraphModule, got {type(graph).__name__}")
    return model


def _encode_nodes(graph: fx.Graph) -> list[dict[str, Any]]:
    nodes = [encode_node(node) for node in graph.nodes]
    try:  # decode what will be written, so a graph that would not load is caught now
        decoded = decode_nodes(json.loads(json.dumps(nodes)))
    except GraphFileError as error:
        raise NotPortable(str(error)) from None
    if [encode_node(node) for node in decoded.nodes] != nodes:
        raise NotPortable("the graph does not survive a JSON round trip")
    return nodes


def _collect_state(gm: fx.GraphModule) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors to write (one per distinct tensor) and the table of every name (aliases as same_as)."""
    state, table, first, storages = {}, {}, {}, set()
    for name, tensor, entry in named_tensors(gm):
        saveable_path(name, "tensor")
        if id(tensor) in first:
            entry["same_as"] = first[id(tensor)]
        else:
            first[id(tensor)] = name
            data = tensor.detach().cpu().contiguous()
            if data.numel() and data.untyped_storage().data_ptr() in storages:
                data = data.clone()  # safetensors refuses tensors that share memory (views of one another)
            storages.add(data.untyped_storage().data_ptr())
            state[name] = data
        table[name] = entry
    return state, table


def _safetensors_bytes(state: dict[str, torch.Tensor]) -> bytes:
    safetensors_torch = _require("safetensors.torch")
    try:
        return safetensors_torch.save(state, metadata={"format": "pt"})
    except Exception as error:  # e.g. a dtype safetensors has no code for
        raise GraphError(f"cannot write {STATE_FILE}: {error}") from None


class _PickleTracer(fx.Tracer):
    # fx re-traces a pickled GraphModule's code with this class: quantized functions must stay single nodes
    # (as in QGraph's tracer), and it must take no constructor arguments (QGraph's tracer does)
    def __init__(self) -> None:
        super().__init__(autowrap_modules=(math,), autowrap_functions=QUANT_FUNCTIONS)

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return isinstance(module, QuantModule) or super().is_leaf_module(module, qualified_name)


def _pickle_bytes(gm: fx.GraphModule) -> bytes:
    saved, gm._tracer_cls = gm._tracer_cls, _PickleTracer
    try:
        buffer = io.BytesIO()
        torch.save(gm, buffer)
        return buffer.getvalue()
    except Exception as error:  # pickle raises many types for objects it cannot handle
        raise NotPortable(f"the GraphModule cannot be pickled either: {error}") from None
    finally:
        gm._tracer_cls = saved


def _node_parameters(node: fx.Node) -> dict[str, Any] | None:
    """``node.meta["mase"].parameters`` (or a plain dict stored there), None when absent."""
    meta = node.meta.get("mase")
    parameters = getattr(meta, "parameters", meta)
    return parameters if isinstance(parameters, dict) else None


def _meta_to_toml(value: Any) -> Any:
    """A TOML-writable copy: None -> "NA" (MASE's marker), tensors/arrays -> shape and dtype, not values."""
    if value is None:
        return "NA"
    if isinstance(value, (bool, float, str)):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else str(value)  # TOML integers are 64-bit
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        return {str(key): _meta_to_toml(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_meta_to_toml(item) for item in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # numpy scalars
        return _meta_to_toml(value.item())
    return str(value)


# ---- loading helpers ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _about(path: Path) -> Iterator[None]:
    """Re-raise a failure while reading ``path`` as a GraphFileError naming it: a user sees which file is
    bad, never a traceback from deep inside torch or json."""
    try:
        yield
    except GraphFileError as error:
        raise GraphFileError(f"{path}: {error}") from None
    except LowbitError:
        raise
    except Exception as error:  # anything else means the file's content is not what a save writes
        raise GraphFileError(f"{path} is malformed ({type(error).__name__}: {error})") from error


def _unpickle(directory: Path, doc: dict[str, Any], data: bytes, trust_pickle: bool) -> fx.GraphModule:
    path = directory / PICKLE_FILE
    if not trust_pickle:
        raise LowbitError(
            f"{path} is a pickled GraphModule (saved with allow_pickle=True because: {doc.get('pickle_reason')}). "
            "Unpickling runs whatever code the file names, so load_graph reads it only with trust_pickle=True; "
            "pass that only for files you made or trust."
        )
    try:
        gm = torch.load(io.BytesIO(data), weights_only=False)
    except Exception as error:  # unpickling can fail with any exception type
        raise GraphFileError(f"{path} cannot be unpickled: {error}") from None
    if not isinstance(gm, fx.GraphModule) or [n.name for n in gm.graph.nodes] != doc.get("node_names"):
        raise GraphFileError(f"{path} does not hold the GraphModule that graph.json describes")
    return gm


def _restore_meta(gm: fx.GraphModule, data: bytes) -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = _require("tomli")
    nodes = {node.name: node for node in gm.graph.nodes}
    for name, parameters in tomllib.loads(data.decode()).items():
        if name not in nodes:
            raise GraphFileError(f"metadata for node {name!r}, which the graph does not have")
        meta = nodes[name].meta["mase"] = MaseMetadata(nodes[name], gm)
        meta.parameters = na_to_none(parameters)


def _require(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        raise LowbitError(f"saving and loading graphs needs {name.split('.')[0]}: pip install lowbit[graph]") from None


__all__ = [
    "GRAPH_FILE", "META_FILE", "PICKLE_FILE", "SCHEMA", "STATE_FILE", "VERSION", "GraphFileError", "NotPortable",
    "load_graph", "load_mase_graph_interface_pass", "node_meta_toml", "save_graph",
    "save_mase_graph_interface_pass", "save_node_meta_param_interface_pass",
]  # fmt: skip
