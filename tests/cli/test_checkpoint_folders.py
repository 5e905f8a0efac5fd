"""Module-style checkpoint folders (module.json + state.safetensors) are published whole and sealed: a crash
between the two files leaves the previous save, bit flips in either file are refused naming it, and saves
from before the seal still load (with a warning)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from lowbit import _io
from lowbit.errors import ConfigError
from lowbit.pipeline.catalog import build_model
from lowbit.pipeline.checkpoints import load_lowbit, save_lowbit


def _model(fill: float):
    model = build_model("toy", "toy_tiny")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(fill)
    return model


def _weights(model) -> list[float]:
    return [float(p.detach().flatten()[0]) for p in model.parameters()]


def test_round_trip_and_a_crash_between_the_files_leaves_the_old_save(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    save_lowbit(_model(0.25), folder, model_name="toy", dataset="toy_tiny")
    assert set(_weights(load_lowbit(folder))) == {0.25}
    writes = []

    def crash_on_the_second_write(path, data):
        writes.append(path)
        if len(writes) == 2:
            raise KeyboardInterrupt  # as a SIGKILL would stop it: state.safetensors written, module.json not
        real(path, data)

    real = _io.write_file
    monkeypatch.setattr("lowbit._persist.write_file", crash_on_the_second_write)  # the folder writer
    with pytest.raises(KeyboardInterrupt):
        save_lowbit(_model(0.5), folder, model_name="toy", dataset="toy_tiny")
    monkeypatch.undo()
    assert set(_weights(load_lowbit(folder))) == {0.25}  # the previous save, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporaries left
    save_lowbit(_model(0.5), folder, model_name="toy", dataset="toy_tiny")
    assert set(_weights(load_lowbit(folder))) == {0.5}


@pytest.mark.parametrize("name", ["module.json", "state.safetensors"])
def test_bit_flips_are_refused_naming_the_file(tmp_path, name):
    folder = tmp_path / "ckpt"
    save_lowbit(_model(0.25), folder, model_name="toy", dataset="toy_tiny")
    path = folder / name
    blob = path.read_bytes()
    for index in range(0, len(blob), max(1, len(blob) // 97)):
        damaged = bytearray(blob)
        damaged[index] ^= 1 << (index % 8)
        path.write_bytes(bytes(damaged))
        with pytest.raises(ConfigError, match="module.json|state.safetensors"):
            load_lowbit(folder)
            pytest.fail(f"a flip at byte {index} of {name} loaded")
    path.write_bytes(blob)
    assert set(_weights(load_lowbit(folder))) == {0.25}


def test_a_save_from_before_the_seal_loads_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    save_lowbit(_model(0.25), folder, model_name="toy", dataset="toy_tiny")
    doc = json.loads((folder / "module.json").read_text())
    del doc["seal"], doc["files"]
    (folder / "module.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="lowbit"):
        assert set(_weights(load_lowbit(folder))) == {0.25}
    assert "no checksum" in caplog.text
