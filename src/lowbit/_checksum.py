"""Checksum sidecars: ``<file>.sha256`` beside a file that cannot hold its own seal (a Lightning / torch
checkpoint). The sidecar is JSON, ``{"schema": "lowbit.checksum", "version": 1, "sha256": [...]}``: the
digests the file may have. :func:`write_with_sidecar` lists the new digest and the old one while the file
is being replaced, then the new one alone, so a crash at any moment leaves a file whose digest is listed.

:func:`verify_sidecar` raises FormatError naming the file on a mismatch; a file without a sidecar (written
by another tool or an older lowbit) is reported as ``False`` so the caller can warn and go on.

Text files seal themselves instead (:func:`seal_text`: one SHA-256 over every byte, written in place of
:data:`lowbit._io.PLACEHOLDER` in a JSON key or a TOML comment).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from lowbit._io import (atomic_write_bytes, atomic_write_text, check_regular_file, read_regular_text, seal_matches,
                        sealed)  # fmt: skip
from lowbit.errors import FormatError

SCHEMA, VERSION, SUFFIX = "lowbit.checksum", 1, ".sha256"


def sidecar_of(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def digest_file(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a regular file (OSError for a device or FIFO: see :func:`lowbit._io.check_regular_file`)."""
    digest = hashlib.sha256()
    size = check_regular_file(path).st_size
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(min(1 << 20, size)), b""):  # no further than its size at the stat
            digest.update(block)
            size -= len(block)
            if size <= 0:
                break
    return digest.hexdigest()


def write_with_sidecar(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and keep its sidecar true at every moment."""
    path = Path(path)
    new = hashlib.sha256(data).hexdigest()
    old = _listed(path) if path.exists() else []
    _write_sidecar(path, [new, *old[:1]])
    atomic_write_bytes(path, data)
    _write_sidecar(path, [new])


def write_sidecar_for(path: str | os.PathLike) -> None:
    """A sidecar for a file already in place (written by someone else, e.g. Lightning)."""
    _write_sidecar(Path(path), [digest_file(path)])


def sidecar_text(name: str, data: bytes) -> str:
    """The sidecar of a file named ``name`` holding ``data``, for a writer that publishes both together (a
    folder swapped whole by :func:`lowbit._io.atomic_directory`)."""
    return _sidecar_text(name, [hashlib.sha256(data).hexdigest()])


def _sidecar_text(name: str, digests: list[str]) -> str:
    return json.dumps({"schema": SCHEMA, "version": VERSION, "file": name, "sha256": digests}) + "\n"


def _write_sidecar(path: Path, digests: list[str]) -> None:
    atomic_write_text(sidecar_of(path), _sidecar_text(path.name, digests))


def _listed(path: Path) -> list[str]:
    sidecar = sidecar_of(path)
    try:
        doc = json.loads(read_regular_text(sidecar, limit=1 << 16))
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    digests = doc.get("sha256") if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None
    return [d for d in digests if isinstance(d, str)] if isinstance(digests, list) else []


def verify_sidecar(path: str | os.PathLike) -> bool:
    """True when ``path`` matches its sidecar; False when it has none; FormatError when they differ (or the
    sidecar itself is damaged)."""
    path = Path(path)
    sidecar = sidecar_of(path)
    if not sidecar.exists():
        return False
    listed = _listed(path)
    if not listed:
        raise FormatError(f"{sidecar} is damaged (not a lowbit checksum file): cannot check {path}")
    try:
        digest = digest_file(path)
    except OSError as error:
        raise FormatError(f"cannot read {path} to check it: {error.strerror or error}") from None
    if digest not in listed:
        raise FormatError(f"{path} does not match its checksum ({sidecar.name}): the file is corrupt or was changed")
    return True


# ---- seals inside text files (JSON keys, TOML comments) ----------------------------------------------------
def seal_text(text: str) -> str:
    """``text`` (holding :data:`lowbit._io.PLACEHOLDER` once) with the placeholder replaced by its seal."""
    return sealed(text.encode("utf-8")).decode("utf-8")


def text_seal_matches(blob: bytes, recorded: object) -> bool:
    return seal_matches(blob, recorded)


__all__ = ["digest_file", "seal_text", "sidecar_of", "sidecar_text", "text_seal_matches", "verify_sidecar",
           "write_sidecar_for", "write_with_sidecar"]  # fmt: skip
