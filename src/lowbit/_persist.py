"""The one persistence layer: every file lowbit writes and later reads back is a :class:`Schema` declared here.

A schema says what a format is called, which version this lowbit writes, which older versions it still reads
(and how: sealed, possibly unsealed, or refused with a reason), where the layout keeps the name, the version and
the seal, which error its readers raise, and the most bytes such a file may have.

- One seal style: a SHA-256 over every byte of the file, kept inside the file in place of a placeholder
  (:func:`lowbit._io.sealed`). A file that cannot hold its own seal (a torch checkpoint) keeps it in a
  ``.sha256`` sidecar beside it (:mod:`lowbit._checksum`, a schema of this layer too).
- Writing: the bytes are made and sealed whole before anything is written, then published atomically (one
  file: :func:`write_json`; a folder: :func:`write_folder`).
- Reading: a regular file only, no larger than the schema's limit (checked before its bytes are allocated),
  then the name, the version (:func:`check_version`: the error names the file, the version found and the
  versions this lowbit reads), then the seal (:func:`check_seal`). A file of an older version that was written
  before seals existed loads with a warning that it was not verified.

Formats whose layout is not a JSON document (the safetensors header, the statistics TOML's comment line) use
the same steps on their own framing: :func:`check_document`, :func:`comment_header` / :func:`read_comment_header`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lowbit._io import PLACEHOLDER, atomic_directory, atomic_write_bytes, read_regular_file, seal_matches, sealed
from lowbit._io import write_file
from lowbit.errors import LowbitError

_log = logging.getLogger("lowbit")
DEFAULT_LIMIT = 1 << 26  # 64 MiB: far above any document lowbit writes; a larger file is not ours


@dataclasses.dataclass(frozen=True)
class Older:
    """How this lowbit reads a file of an older (or alternative) version.

    ``unsealed``: such a file may lack its seal (written before seals existed): it loads with a warning,
    unless it holds one of ``sealed_marks``, keys only a sealing writer wrote (then a missing seal is damage).
    ``refused``: the reason such files are not read (the error says it, then ``remedy``)."""

    unsealed: bool = False
    sealed_marks: tuple[str, ...] = ()
    refused: str | None = None
    remedy: str = ""


@dataclasses.dataclass(frozen=True)
class Schema:
    """One on-disk format. ``name_key`` / ``version_key`` / ``seal_key``: where the layout keeps them (None:
    it does not, e.g. a cache keyed by its content keeps no version). ``what``: the words messages use;
    ``limit``: the most bytes a file of this format may have."""

    name: str
    version: int
    what: str
    error: type[LowbitError] = LowbitError
    older: Mapping[int, Older] = dataclasses.field(default_factory=dict)
    name_key: str | None = "schema"
    version_key: str | None = "version"
    seal_key: str | None = "seal"
    limit: int | None = DEFAULT_LIMIT  # None: no bound (model weights); still no further than the file's size
    nonfinite: bool = False  # JSON's NaN / Infinity allowed (a graph's arguments, e.g. masked_fill's -inf)

    def readable(self) -> tuple[int, ...]:
        """The versions this lowbit reads, current first."""
        return (self.version, *sorted(v for v, rule in self.older.items() if rule.refused is None))

    def fail(self, message: str) -> LowbitError:
        return self.error(message)


SCHEMAS: dict[str, Schema] = {}


def register(schema: Schema) -> Schema:
    """Add ``schema`` to the registry (tests round-trip every registered schema); returns it."""
    known = SCHEMAS.setdefault(schema.name, schema)
    if known != schema:
        raise LowbitError(f"two different schemas are named {schema.name!r}")
    return schema


# ---- versions and seals ------------------------------------------------------------------------------------
def _readable_words(schema: Schema) -> str:
    return " or ".join(str(version) for version in schema.readable())


def check_version(schema: Schema, found: Any, where: str) -> int:
    """``found`` if this lowbit reads that version of ``schema``; its error otherwise, naming ``where``, the
    version found and the versions read (and, for a refused older version, why and what to do)."""
    if type(found) is int and found in schema.readable():
        return found
    rule = schema.older.get(found) if type(found) is int else None
    if rule is not None and rule.refused is not None:
        raise schema.fail(f"{where} was written by an earlier lowbit ({rule.refused}): it cannot be verified, so "
                          f"this lowbit does not read it (it reads version {_readable_words(schema)}). "
                          f"{rule.remedy}".rstrip())  # fmt: skip
    raise schema.fail(f"{where} uses {schema.what} schema version {found!r}; this lowbit ({_lowbit_version()}) reads "
                      f"version {_readable_words(schema)}")  # fmt: skip


def check_seal(schema: Schema, version: int, blob: bytes, recorded: Any, where: str, *, begin: int = 0,
               end: int | None = None, marks: Iterable[str] = ()) -> bool:  # fmt: skip
    """True when ``recorded`` seals ``blob`` (the placeholder searched in ``blob[begin:end]``); False, with a
    warning, for a file of a version that may be unsealed and has no seal; the schema's error otherwise.
    ``marks``: the keys the file holds (a missing seal beside one of the version's sealed marks is damage)."""
    rule = schema.older.get(version, Older())
    if recorded is None and rule.unsealed and not set(rule.sealed_marks) & set(marks):
        _log.warning(f"{where} has no checksum (an older lowbit wrote it): not verified; save it again to seal it")
        return False
    if not seal_matches(blob, recorded, begin, end):
        raise schema.fail(f"{where} is corrupt: its bytes do not match the SHA-256 checksum it was sealed with "
                          f"(the {schema.what} was damaged or edited)")  # fmt: skip
    return True


def seal(schema: Schema, blob: bytes, begin: int = 0, end: int | None = None) -> bytes:
    """``blob`` with its one placeholder (in ``blob[begin:end]``) replaced by its seal; the schema's error if a
    value the writer was given holds the placeholder itself."""
    try:
        return sealed(blob, begin, end)
    except ValueError:
        raise schema.fail(f"a {schema.what} may not contain {PLACEHOLDER[:8]}... (reserved for its seal)") from None


# ---- JSON documents ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Document:
    """A document read back: its version, its fields (name, version and seal taken out), whether it was sealed."""

    version: int
    fields: dict[str, Any]
    verified: bool


def json_bytes(schema: Schema, fields: Mapping[str, Any], *, version: int | None = None, indent: int | None = 1,
               ensure_ascii: bool = True, default: Callable[[Any], Any] | None = None) -> bytes:  # fmt: skip
    """The sealed JSON bytes of ``fields`` under ``schema`` (``version``: one the schema reads, for a writer
    that still writes an older layout)."""
    version = schema.version if version is None else check_version(schema, version, f"a new {schema.what}")
    head = {key: value for key, value in ((schema.name_key, schema.name), (schema.version_key, version)) if key}
    doc = {**head, **fields, **({schema.seal_key: PLACEHOLDER} if schema.seal_key else {})}
    try:
        blob = json.dumps(doc, indent=indent, ensure_ascii=ensure_ascii, allow_nan=schema.nonfinite, default=default).encode()
    except (TypeError, ValueError) as error:
        raise schema.fail(f"a {schema.what} holds plain data only: {error}") from None
    return seal(schema, blob) if schema.seal_key else blob


def write_json(schema: Schema, path: str | os.PathLike, fields: Mapping[str, Any], **options: Any) -> None:
    """Write ``fields`` as a sealed ``schema`` document to ``path`` atomically (see :func:`json_bytes`)."""
    atomic_write_bytes(path, json_bytes(schema, fields, **options))


def read_bytes(schema: Schema, path: str | os.PathLike) -> bytes:
    """The bytes of a regular file of at most ``schema.limit`` bytes (refused before allocating otherwise)."""
    try:
        return read_regular_file(path, schema.limit)
    except OSError as error:
        raise schema.fail(f"cannot read the {schema.what} {path}: {error.strerror or error}") from None


def read_json(schema: Schema, path: str | os.PathLike) -> Document:
    """A ``schema`` document read back from ``path`` and checked (see :func:`decode_json`)."""
    return decode_json(schema, read_bytes(schema, path), str(path))


def decode_json(schema: Schema, blob: bytes, where: str) -> Document:
    """The document in ``blob``: strict JSON (no duplicate keys, no NaN), its name, version and seal checked."""
    return check_document(schema, strict_json(blob, where, schema), blob, where)


def check_document(schema: Schema, doc: Any, blob: bytes, where: str, *, begin: int = 0,
                   end: int | None = None) -> Document:  # fmt: skip
    """Name, version and seal of the parsed document ``doc`` whose bytes (and seal) lie in ``blob[begin:end]``."""
    if not isinstance(doc, dict) or (schema.name_key and doc.get(schema.name_key) != schema.name):
        named = f" (its {schema.name_key!r} must be {schema.name!r})" if schema.name_key else ""
        raise schema.fail(f"{where} is not a lowbit {schema.what}{named}")
    version = check_version(schema, doc.get(schema.version_key), where) if schema.version_key else schema.version
    fields = {key: value for key, value in doc.items() if key not in (schema.name_key, schema.version_key)}
    verified = False
    if schema.seal_key:
        recorded = fields.pop(schema.seal_key, None)
        verified = check_seal(schema, version, blob, recorded, where, begin=begin, end=end, marks=fields)
    return Document(version, fields, verified)


def strict_json(text: bytes | str, where: str, schema: Schema, what: str | None = None) -> Any:
    """JSON without duplicate keys, and without NaN / Infinity unless the schema allows them (lowbit writes
    neither otherwise); the schema's error for anything else."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result = dict(pairs)
        if len(result) != len(pairs):
            raise ValueError("duplicate key")
        return result

    def no_constant(name: str) -> Any:
        if schema.nonfinite:
            return float(name)
        raise ValueError(f"non-standard constant {name}")

    try:
        return json.loads(text, object_pairs_hook=unique, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise schema.fail(f"cannot read {where}: it is corrupt or not a lowbit {schema.what} ({what or 'the file'} "
                          f"is not JSON; not valid JSON: truncated or corrupted? {error})") from None  # fmt: skip


# ---- a comment line heading a text file (TOML) --------------------------------------------------------------
def comment_header(schema: Schema, mark: str = "#") -> str:
    """``# <name> version <v> sha256 <placeholder>``: the first line of a text file whose format has comments
    (the rest of the layout stays another tool's); seal the whole text with :func:`seal`."""
    return f"{mark} {schema.name} version {schema.version} sha256 {PLACEHOLDER}"


def read_comment_header(schema: Schema, text: str, where: str, mark: str = "#") -> bool | None:
    """Check the header line of ``text``: None when it has none (another tool's file), True when its version
    and seal are good; the schema's error otherwise."""
    first = text.split("\n", 1)[0]
    opening = f"{mark} {schema.name} "
    if not first.startswith(opening):
        return None
    words = first[len(opening) :].split()
    if len(words) != 4 or words[0] != "version" or words[2] != "sha256":
        raise schema.fail(f"{where}: its header line is damaged ({first[:80]!r})")
    readable = {str(version): version for version in schema.readable()}
    version = check_version(schema, readable.get(words[1], words[1]), where)  # a text word: shown as found
    return check_seal(schema, version, text.encode("utf-8"), words[3], where)


# ---- folders ------------------------------------------------------------------------------------------------
def write_folder(path: str | os.PathLike, files: Mapping[str, bytes | None], *, owned: Iterable[str] | None = None,
                 last: str | None = None) -> list[Path]:  # fmt: skip
    """Publish the folder ``path`` whole (:func:`lowbit._io.atomic_directory`) holding ``files`` (name -> bytes;
    None: a name of ``owned`` removed in the same swap); ``last`` commits the save. Returns the files written."""
    with atomic_directory(path, owned=owned, last=last) as building:
        for name, data in files.items():
            if data is not None:
                write_file(building / name, data)
    return [Path(path) / name for name, data in files.items() if data is not None]


def _lowbit_version() -> str:
    from lowbit._version import __version__

    return __version__


__all__ = ["DEFAULT_LIMIT", "SCHEMAS", "Document", "Older", "Schema", "check_document", "check_seal", "check_version",
           "comment_header", "decode_json", "json_bytes", "read_bytes", "read_comment_header", "read_json",
           "register", "seal", "strict_json", "write_folder", "write_json"]  # fmt: skip
