"""Checksum sidecars: ``<file>.sha256`` beside a file that cannot hold its own seal (a Lightning / torch
checkpoint, report.json). The sidecar is JSON, ``{"schema": "lowbit.checksum", "version": 1, "sha256": [...]}``
(the schema :data:`SIDECAR_SCHEMA` of :mod:`lowbit._persist`; it holds digests, so it carries no seal itself): the
digests the file may have. :func:`write_with_sidecar` lists the new digest and the old one while the file
is being replaced, then the new one alone, so a crash at any moment leaves a file whose digest is listed.

:func:`verify_sidecar` raises FormatError naming the file on a mismatch; a file without a sidecar (written
by another tool or an older lowbit) is reported as ``False`` so the caller can warn and go on.

Text files seal themselves instead (:mod:`lowbit._persist`: one SHA-256 over every byte, written in place of
:data:`lowbit._io.PLACEHOLDER` in a JSON key or a TOML comment).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from lowbit._io import atomic_write_bytes, check_regular_file
from lowbit._persist import Schema, decode_json, json_bytes, read_bytes, register
from lowbit.errors import FormatError, LowbitError

SCHEMA, VERSION, SUFFIX = "lowbit.checksum", 1, ".sha256"
SIDECAR_SCHEMA = register(Schema(SCHEMA, VERSION, "checksum file", FormatError, seal_key=None, limit=1 << 16))


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
    return json_bytes(SIDECAR_SCHEMA, {"file": name, "sha256": digests}, indent=None).decode() + "\n"


def _write_sidecar(path: Path, digests: list[str]) -> None:
    atomic_write_bytes(sidecar_of(path), _sidecar_text(path.name, digests).encode())


def _listed(path: Path) -> list[str]:
    """The digests the sidecar of ``path`` lists; [] when it is missing, damaged or not a sidecar."""
    sidecar = sidecar_of(path)
    try:
        digests = decode_json(SIDECAR_SCHEMA, read_bytes(SIDECAR_SCHEMA, sidecar), str(sidecar)).fields.get("sha256")
    except LowbitError:
        return []
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


__all__ = ["SIDECAR_SCHEMA", "digest_file", "sidecar_of", "sidecar_text", "verify_sidecar",
           "write_sidecar_for", "write_with_sidecar"]  # fmt: skip
