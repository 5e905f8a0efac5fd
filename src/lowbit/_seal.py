"""Seals: one SHA-256 over every byte of a file, stored inside the file itself.

The writer puts 64 ``?`` where the digest goes, hashes the whole file, and writes the 64 hex digits in
their place (same length, so nothing else moves). The reader finds the recorded digest (it must occur
exactly once in the sealed region), reads it back as 64 ``?`` and hashes again. Any changed byte, the
digest's own included, makes the two differ. A seal detects corruption and accidental edits; it is not a
signature (whoever edits a file on purpose can seal it again).
"""

from __future__ import annotations

import hashlib

PLACEHOLDER = "?" * 64
_HEX = frozenset("0123456789abcdef")


def seal_of(blob: bytes, start: int) -> str:
    """SHA-256 (hex) of ``blob`` with the 64 bytes at ``start`` read as ``?``."""
    digest = hashlib.sha256(memoryview(blob)[:start])
    digest.update(PLACEHOLDER.encode())
    digest.update(memoryview(blob)[start + len(PLACEHOLDER) :])
    return digest.hexdigest()


def sealed(blob: bytes, begin: int = 0, end: int | None = None) -> bytes:
    """``blob`` with its one placeholder (searched in ``blob[begin:end]``) replaced by the seal; ValueError
    when the placeholder is missing or occurs more than once."""
    token = PLACEHOLDER.encode()
    start = blob.find(token, begin, end)
    if start < 0 or blob.find(token, start + 1, end) >= 0:
        raise ValueError("the seal placeholder must occur exactly once")
    return blob[:start] + seal_of(blob, start).encode() + blob[start + len(token) :]


def seal_matches(blob: bytes, recorded: object, begin: int = 0, end: int | None = None) -> bool:
    """Whether ``recorded`` (the digest a reader parsed) is the valid seal of ``blob``."""
    if not isinstance(recorded, str) or len(recorded) != 64 or not set(recorded) <= _HEX:
        return False
    token = recorded.encode()
    start = blob.find(token, begin, end)
    if start < 0 or blob.find(token, start + 1, end) >= 0:
        return False
    return seal_of(blob, start) == recorded
