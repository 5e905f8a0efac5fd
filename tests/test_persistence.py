"""The one persistence layer (lowbit._persist): files written by an earlier lowbit still load the same; every
registered schema round-trips; truncated, flipped, wrong-version, non-regular and oversized files are each one
clear LowbitError of the format's own class, naming the file."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import tomli_w
import torch

import lowbit
from lowbit import _checksum, _persist
from lowbit.datasets import wikipedia
from lowbit.errors import LowbitError
from lowbit.export import safetensors_io
from lowbit.flows.ptq import CalibrationState
from lowbit.graph import _graph_files, stats_file
from lowbit.pipeline import checkpoints
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


# ---- every registered schema: round trip and faults ----------------------------------------------------------
# the modules above declare every schema; a new on-disk format adds its name here and a sample below
NAMES = {"lowbit.calibration", "lowbit.statistics", "lowbit.module", "lowbit.run", "lowbit.graph",
         "lowbit.safetensors", "lowbit.checksum", "lowbit.corpus_cache"}  # fmt: skip
SAMPLE = {"model": "toy", "dataset": None, "files": {"state.safetensors": "0" * 64}, "numbers": [1, 2.5, -3],
          "text": "Été ✓", "nested": {"empty": {}, "list": [[], [True, False, None]]}}  # fmt: skip
DOCUMENTS = sorted(NAMES - {"lowbit.statistics", "lowbit.safetensors"})  # layouts that are one JSON document


def test_the_registry_holds_every_format():
    assert set(_persist.SCHEMAS) == NAMES
    assert checkpoints.MODULE_FILE_SCHEMA.readable() == (2, 1) and _graph_files.GRAPH_SCHEMA.readable() == (2,)
    assert _checksum.SIDECAR_SCHEMA.seal_key is None and wikipedia.CACHE_SCHEMA.version_key is None


@pytest.mark.parametrize("name", DOCUMENTS)
def test_every_document_schema_round_trips(tmp_path, name):
    schema = _persist.SCHEMAS[name]
    path = tmp_path / "file.json"
    _persist.write_json(schema, path, SAMPLE)
    document = _persist.read_json(schema, path)
    assert document.fields == SAMPLE and document.version == schema.version
    assert document.verified == (schema.seal_key is not None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.json"]  # atomic: no temporary left behind


def test_the_format_level_writers_round_trip(tmp_path):
    tensors = {"w": torch.randn(3, 5), "codes": lowbit.qtensor.encode(torch.randn(4, 8), "affine", bits=4, axis=0)}
    lowbit.save(tensors, tmp_path / "t.safetensors")
    loaded = lowbit.load(tmp_path / "t.safetensors")
    assert torch.equal(loaded["w"], tensors["w"]) and torch.equal(loaded["codes"].dequantize(),
                                                                   tensors["codes"].dequantize())  # fmt: skip
    state = CalibrationState("min_max", 8, True, False, {"fc": {"min": [-1.0], "max": [2.0]}}, 3, "affine")
    state.save(tmp_path / "c.json")
    assert CalibrationState.load(tmp_path / "c.json") == state
    table = {"fc": {"common": {"mase_type": "module_related_func", "mase_op": "linear"},
                    "software": {"args": {"weight": {"stat": {"range_min_max": {
                        "min": -1.0, "max": 1.0, "range": 2.0, "count": 4}}}}}}}  # fmt: skip
    (tmp_path / "s.toml").write_text(stats_file.sealed_statistics_text(tomli_w.dumps(table)))
    assert stats_file.load_statistics(tmp_path / "s.toml") == table


# ---- faults: each a LowbitError of the format's own class, naming the file ----------------------------------
def _written(tmp_path, name):
    schema = _persist.SCHEMAS[name]
    path = tmp_path / f"{name}.json"
    _persist.write_json(schema, path, SAMPLE)
    return schema, path


def _refused(schema, path, *words):
    with pytest.raises(schema.error) as caught:
        _persist.read_json(schema, path)
    assert isinstance(caught.value, LowbitError) and str(path) in str(caught.value)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize("name", DOCUMENTS)
def test_a_truncated_document_is_refused(tmp_path, name):
    schema, path = _written(tmp_path, name)
    blob = path.read_bytes()
    for size in (0, 1, len(blob) // 2, len(blob) - 2):
        path.write_bytes(blob[:size])
        _refused(schema, path)


@pytest.mark.parametrize("name", [name for name in DOCUMENTS if _persist.SCHEMAS[name].seal_key])
def test_a_flipped_byte_breaks_the_seal(tmp_path, name):
    schema, path = _written(tmp_path, name)
    blob = path.read_bytes()
    for index in range(0, len(blob), 7):
        flipped = bytearray(blob)
        flipped[index] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(schema.error):
            _persist.read_json(schema, path)


@pytest.mark.parametrize("name", [name for name in DOCUMENTS if _persist.SCHEMAS[name].version_key])
def test_a_wrong_version_names_the_file_the_version_and_what_is_read(tmp_path, name):
    schema, path = _written(tmp_path, name)
    path.write_bytes(path.read_bytes().replace(f'"{schema.version_key}": {schema.version}'.encode(),
                                               f'"{schema.version_key}": 97'.encode()))  # fmt: skip
    _refused(schema, path, "version 97", f"reads version {schema.version}")


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_folder_or_a_fifo_is_refused_before_reading(tmp_path, name):
    schema = _persist.SCHEMAS[name]
    (tmp_path / "folder").mkdir()
    _refused(schema, tmp_path / "folder", "a folder, not a regular file")
    os.mkfifo(tmp_path / "fifo")  # no writer: a blocking open would hang forever
    with pytest.raises(schema.error, match="a FIFO, not a regular file"):
        _persist.read_bytes(schema, tmp_path / "fifo")


def test_a_file_over_its_schema_limit_is_refused_before_allocating(tmp_path):
    schema = _checksum.SIDECAR_SCHEMA
    path = tmp_path / "big.sha256"
    with open(path, "wb") as stream:
        stream.truncate(schema.limit + 1)  # sparse: nothing of it is ever read
    _refused(schema, path, "larger than")


def test_an_older_refused_version_says_why(tmp_path):
    schema, path = _written(tmp_path, "lowbit.graph")
    path.write_bytes(path.read_bytes().replace(b'"version": 2', b'"version": 1'))
    _refused(schema, path, "earlier lowbit", "Save the graph again", "reads version 2")


def test_an_unsealed_older_version_loads_with_a_warning_only_without_sealed_marks(tmp_path, caplog):
    schema = checkpoints.MODULE_FILE_SCHEMA
    path = tmp_path / "module.json"
    path.write_text('{"schema": "lowbit.module", "version": 1, "model": "toy"}')
    assert _persist.read_json(schema, path).verified is False and "not verified" in caplog.text
    path.write_text('{"schema": "lowbit.module", "version": 1, "model": "toy", "files": {}}')
    _refused(schema, path, "checksum")  # a sealing writer's file without its seal: damage


def test_safetensors_faults(tmp_path):
    path = tmp_path / "t.safetensors"
    lowbit.save({"w": torch.randn(4, 4)}, path)
    blob = path.read_bytes()
    path.write_bytes((len(blob) * 2).to_bytes(8, "little") + blob[8:])  # a size field past the end of the file
    with pytest.raises(safetensors_io.SerializationError, match="truncated"):
        lowbit.load(path)
    path.write_bytes(blob[: len(blob) - 5])
    with pytest.raises(safetensors_io.SerializationError, match="truncated"):
        lowbit.load(path)
    edited = blob.replace(b'schema_version\\": 2', b'schema_version\\": 7')  # JSON inside the safetensors JSON
    assert edited != blob
    path.write_bytes(edited)
    with pytest.raises(safetensors_io.SerializationError, match="schema version 7; this lowbit .* reads version 2"):
        lowbit.load(path)
    flipped = bytearray(blob)
    flipped[-1] ^= 0x80
    path.write_bytes(bytes(flipped))
    with pytest.raises(safetensors_io.SerializationError, match="checksum"):
        lowbit.load(path)


def test_statistics_header_faults(tmp_path):
    path = tmp_path / "s.toml"
    text = stats_file.sealed_statistics_text('[fc.common]\nmase_type = "module_related_func"\nmase_op = "linear"\n')
    path.write_text(text.replace("version 1 sha256", "version 4 sha256"))
    with pytest.raises(stats_file.ConfigError, match="version '4'.* reads version 1"):
        stats_file.load_statistics(path)
    path.write_text(text[:-3] + "X\n")
    with pytest.raises(stats_file.ConfigError, match="checksum"):
        stats_file.load_statistics(path)


def test_saved_origin_reads_no_more_than_the_schema_allows(tmp_path, monkeypatch):
    import dataclasses

    from lowbit.pipeline import checkpoints

    (tmp_path / "module.json").write_text('{"model": "toy", "dataset": "toy_tiny", "padding": "' + "x" * 200 + '"}')
    (tmp_path / checkpoints.RUN_FILE).write_text('{"model": "mlp", "dataset": "digits"}')
    assert checkpoints.saved_origin(tmp_path) == ("toy", "toy_tiny")
    small = dataclasses.replace(checkpoints.MODULE_FILE_SCHEMA, limit=64)
    monkeypatch.setattr(checkpoints, "MODULE_FILE_SCHEMA", small)
    assert checkpoints.saved_origin(tmp_path) == ("mlp", "digits")  # the oversized file is passed over, unread
    assert checkpoints.saved_origin(tmp_path / "missing") == (None, None)
