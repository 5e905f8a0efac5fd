"""Checksums of the files lowbit writes besides lowbit.save: the calibration JSON and the statistics TOML seal
themselves (every single-bit flip is refused, naming the file), checkpoints carry a .sha256 sidecar that is
true at every moment of a replacement; files without a checksum (older lowbit, MASE, other tools) load."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from lowbit import _checksum
from lowbit._checksum import sidecar_of, verify_sidecar, write_with_sidecar
from lowbit.errors import ConfigError, FormatError
from lowbit.flows.ptq import CalibrationState
from lowbit.graph.stats_file import load_statistics, save_statistics


def _flips(blob: bytes):
    for index in range(len(blob)):
        damaged = bytearray(blob)
        damaged[index] ^= 1 << (index % 8)
        yield index, bytes(damaged)


@pytest.fixture
def calibration(tmp_path):
    state = CalibrationState("min_max", 8, True, False, {"fc": {"min": [-1.5], "max": [2.25]}}, 4)
    path = tmp_path / "calibration.json"
    state.save(path)
    return state, path


def test_calibration_state_round_trips_sealed(calibration):
    state, path = calibration
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and len(doc["seal"]) == 64
    assert CalibrationState.load(path) == state


def test_every_bit_flip_of_a_calibration_state_is_refused(calibration):
    _, path = calibration
    blob = path.read_bytes()
    for index, damaged in _flips(blob):
        path.write_bytes(damaged)
        with pytest.raises(ConfigError, match="calibration"):
            CalibrationState.load(path)
            pytest.fail(f"a flip at byte {index} loaded")


def test_an_unsealed_version_1_state_loads_with_a_warning(calibration, caplog):
    state, path = calibration
    doc = json.loads(path.read_text())
    doc.pop("seal")
    doc["version"] = 1
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="lowbit"):
        assert CalibrationState.load(path) == state
    assert "no checksum" in caplog.text
    doc["version"] = 2  # a sealed version without its seal: refused
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="checksum"):
        CalibrationState.load(path)


def _fake_graph():
    stat = {"range_min_max": {"min": -1.0, "max": 2.0, "range": 3.0, "count": 8}}
    parameters = {"common": {"mase_type": "module_related_func", "mase_op": "linear"},
                  "software": {"args": {"data_in_0": {"stat": stat}, "weight": {"stat": stat}}}}  # fmt: skip
    node = SimpleNamespace(name="fc1", meta={"mase": SimpleNamespace(parameters=parameters)})
    return SimpleNamespace(model=SimpleNamespace(graph=SimpleNamespace(nodes=[node])))


def test_every_bit_flip_of_a_statistics_file_is_refused_or_harmless(tmp_path):
    path = tmp_path / "stats.toml"
    table = save_statistics(_fake_graph(), path)
    blob = path.read_bytes()
    assert blob.startswith(b"# lowbit.statistics version 1 sha256 ") and load_statistics(path) == table
    unverified = []
    for index, damaged in _flips(blob):
        path.write_bytes(damaged)
        try:
            loaded = load_statistics(path)
        except ConfigError as error:
            assert str(path) in str(error)
            continue
        assert loaded == table, f"a flip at byte {index} loaded different statistics"
        unverified.append(index)
    assert all(index < len("# lowbit.statistics ") for index in unverified), unverified  # flips that unmark the header


def test_a_statistics_file_without_the_header_loads_with_a_warning(tmp_path, caplog):
    path = tmp_path / "stats.toml"
    table = save_statistics(_fake_graph(), path)
    path.write_bytes(path.read_bytes().split(b"\n", 1)[1])  # MASE's layout: no header
    with caplog.at_level(logging.WARNING, logger="lowbit"):
        assert load_statistics(path) == table
    assert "not verified" in caplog.text
    path.write_text("# lowbit.statistics version 9 sha256 " + "0" * 64 + "\n")
    with pytest.raises(ConfigError, match="version '9'"):
        load_statistics(path)


def test_sidecar_refuses_every_flipped_byte_position_sampled(tmp_path):
    path = tmp_path / "model.ckpt"
    write_with_sidecar(path, b"checkpoint bytes " * 64)
    assert verify_sidecar(path) is True
    blob = path.read_bytes()
    for index, damaged in list(_flips(blob))[::7]:
        path.write_bytes(damaged)
        with pytest.raises(FormatError, match="model.ckpt"):
            verify_sidecar(path)
    sidecar_of(path).write_text("{not json")
    with pytest.raises(FormatError, match="damaged"):
        verify_sidecar(path)
    sidecar_of(path).unlink()
    assert verify_sidecar(path) is False  # no sidecar: the caller decides (warning)


def test_a_crash_while_replacing_leaves_a_file_its_sidecar_accepts(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    write_with_sidecar(path, b"old version")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_checksum, "atomic_write_bytes", crash)
    with pytest.raises(KeyboardInterrupt):
        write_with_sidecar(path, b"new version")
    assert path.read_bytes() == b"old version" and verify_sidecar(path)
    monkeypatch.undo()
    write_with_sidecar(path, b"new version")
    assert verify_sidecar(path) and len(json.loads(sidecar_of(path).read_text())["sha256"]) == 1


def test_a_bit_flipped_checkpoint_is_refused_by_the_loader(tmp_path):
    from lowbit.models import ToyNet
    from lowbit.pipeline.checkpoints import load_checkpoint

    model = ToyNet((1, 2, 2), 2)
    path = tmp_path / "weights.pt"
    import io

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    write_with_sidecar(path, buffer.getvalue())
    load_checkpoint(ToyNet((1, 2, 2), 2), path, None)
    damaged = bytearray(path.read_bytes())
    damaged[-200] ^= 4
    path.write_bytes(bytes(damaged))
    with pytest.raises(ConfigError, match="weights.pt does not match its checksum"):
        load_checkpoint(ToyNet((1, 2, 2), 2), path, None)
