"""The files of a saved graph folder and how a reader checks them (see :mod:`lowbit.graph.save_load`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from lowbit._io import read_regular_file
from lowbit._persist import Older, Schema, read_json, register
from lowbit.graph._serialize import GraphFileError

SCHEMA, VERSION = "lowbit.graph", 2  # 1: graph.json was not sealed; refused
GRAPH_SCHEMA = register(Schema(SCHEMA, VERSION, "graph file", GraphFileError, {1: Older(
    refused="version 1, graph.json not sealed", remedy="Save the graph again")}, seal_key="seal_sha256",
    nonfinite=True))  # fmt: skip
GRAPH_FILE, STATE_FILE, META_FILE, PICKLE_FILE = "graph.json", "state.safetensors", "node_meta.toml", "graph_module.pt"


def read_files(directory: Path, attempts: int = 3) -> tuple[dict[str, Any], dict[str, bytes]]:
    """graph.json and the files it lists, checked. A save swapped in while they are read (the folder is
    replaced whole, so files can come from two saves) makes the checksums disagree: read again."""
    for attempt in range(attempts):
        doc = read_doc(directory / GRAPH_FILE)
        try:
            return doc, {name: read_checked(directory / name, digest) for name, digest in doc["files"].items()}
        except GraphFileError:
            if attempt + 1 == attempts or read_doc(directory / GRAPH_FILE) == doc:
                raise  # the same save throughout: the files really are bad
    raise AssertionError("unreachable")


def read_doc(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise GraphFileError(f"{path} is missing: {path.parent} is not a graph saved by lowbit's save_graph")
    doc = read_json(GRAPH_SCHEMA, path).fields
    files, fmt = doc.get("files"), doc.get("format")
    wanted = {STATE_FILE, META_FILE} | ({PICKLE_FILE} if fmt == "pickle" else set())
    if fmt not in ("fx", "pickle") or not isinstance(files, dict) or set(files) != wanted:
        raise GraphFileError(f"{path}: bad 'format' or 'files' entry (expected files: {', '.join(sorted(wanted))})")
    return doc


def read_checked(path: Path, digest: Any) -> bytes:
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        raise GraphFileError(f"{path} is missing (graph.json lists it)") from None
    except OSError as error:
        raise GraphFileError(f"{path} cannot be read: {error.strerror or error}") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise GraphFileError(f"{path} does not match its checksum in graph.json: it is truncated, corrupted "
                             "or from another save")  # fmt: skip
    return data
