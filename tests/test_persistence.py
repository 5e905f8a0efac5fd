"""The one persistence layer (lowbit._persist): files written by an earlier lowbit still load the same."""

from __future__ import annotations

import json
import shutil

import pytest

from persist_fixtures import FOLDER, load_all


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    copy = tmp_path_factory.mktemp("persist") / "fixtures"
    shutil.copytree(FOLDER, copy)  # reading never writes, but the committed files must stay exactly as they are
    return load_all(copy)


EXPECTED = json.loads((FOLDER / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_files_written_by_lowbit_24a9477_load_the_same(loaded, name):
    assert loaded[name] == EXPECTED[name]
