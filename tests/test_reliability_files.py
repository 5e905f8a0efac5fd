"""Issue 47, files and the command line: every reader refuses what is not a regular file before reading (a
device never ends, a FIFO without a writer would block its open); lowbit.save refuses tensors it cannot
store, naming them; a statistics TOML cut anywhere is refused; bad CLI names and $LOWBIT_BACKEND end in one
line and exit 2."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import lowbit
from lowbit import _io, backend
from lowbit._checksum import digest_file, verify_sidecar
from lowbit.cli import EXIT_USAGE, main
from lowbit.config.toml_config import read_toml
from lowbit.errors import LowbitError
from lowbit.graph.stats_file import load_statistics, sealed_statistics_text
from lowbit.report.files import read_report

NODE = '[fc1.common]\nmase_type = "module_related_func"\nmase_op = "linear"\n'


def _answers_within(call, seconds: float = 20.0):
    """``call()``'s exception (None if it returned), failing the test if it is still running after ``seconds``."""
    outcome = {}

    def run():
        try:
            call()
            outcome["error"] = None
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert "error" in outcome, f"no answer within {seconds} s: it blocks"
    return outcome["error"]


def _readers(path: Path) -> dict:
    """Every reader of a file lowbit has, pointed at ``path`` (a folder reader at a folder holding it)."""
    from lowbit.flows.ptq import CalibrationState
    from lowbit.graph._graph_files import read_doc
    from lowbit.pipeline.checkpoints import _read_module_json
    from lowbit.pipeline.checkpoints import _read_state as load_checkpoint_state
    from lowbit.train.fit import _check_resumable

    return {
        "lowbit.load": lambda: lowbit.load(path),
        "load_statistics": lambda: load_statistics(path),
        "read_toml": lambda: read_toml(path),
        "read_report": lambda: read_report(path),
        "graph.json": lambda: read_doc(path),
        "module.json": lambda: _read_module_json(path),
        "calibration state": lambda: CalibrationState.load(path),
        "sidecar check": lambda: verify_sidecar(path),
        "checkpoint": lambda: load_checkpoint_state(path),
        "resumed checkpoint": lambda: _check_resumable(torch.nn.Linear(2, 2), path),
    }


def _special_files(tmp_path: Path) -> list[Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return [Path("/dev/zero"), Path("/dev/urandom"), fifo, tmp_path]


@pytest.mark.filterwarnings("ignore:.*has no checksum file")
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs and /dev/zero")
def test_every_reader_refuses_devices_fifos_and_folders_at_once(tmp_path):
    for special in _special_files(tmp_path):
        if special == tmp_path:
            (tmp_path / "report.json.sha256").write_text('{"schema": "lowbit.checksum", "version": 1, "sha256": ["0"]}')
        for name, read in _readers(special).items():
            error = _answers_within(read)
            if name == "sidecar check" and error is None:
                continue  # no sidecar beside a device: nothing to check, nothing read
            assert isinstance(error, LowbitError), f"{name} on {special}: {error!r}"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_sidecar_of_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "last.ckpt"
    os.mkfifo(fifo)
    (tmp_path / "last.ckpt.sha256").write_text('{"schema": "lowbit.checksum", "version": 1, "sha256": ["0"]}')
    error = _answers_within(lambda: verify_sidecar(fifo))
    assert isinstance(error, LowbitError) and "FIFO" in str(error)
    assert isinstance(_answers_within(lambda: digest_file(fifo)), OSError)


def test_read_regular_file_reads_no_more_than_its_size_and_limit(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 1000)
    assert _io.read_regular_file(path) == b"x" * 1000
    with pytest.raises(OSError, match="larger than the 100 bytes"):
        _io.read_regular_file(path, limit=100)
    with pytest.raises(OSError, match="a folder, not a regular file"):
        _io.read_regular_file(tmp_path)


# ---- lowbit.save: tensors it cannot store --------------------------------------------------------------------
@pytest.mark.parametrize("make, words", [
    (lambda: torch.empty(3, device="meta"), "meta device"),
    (lambda: torch.eye(3).to_sparse(), "sparse_coo"),
    (lambda: torch.eye(3).to_sparse_csr(), "sparse_csr"),
    (lambda: torch.quantize_per_tensor(torch.zeros(2), 1.0, 0, torch.quint8), "quantized"),
    (lambda: torch.zeros(2, dtype=torch.complex64), "complex64"),
    (lambda: torch.zeros(2, dtype=torch.float8_e8m0fnu), "float8_e8m0fnu"),
])  # fmt: skip
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta", "ignore:torch.quantize_per_tensor")
def test_save_refuses_tensors_it_cannot_store_naming_them(tmp_path, make, words):
    target = tmp_path / "out.lowbit"
    with pytest.raises(LowbitError, match=words) as error:
        lowbit.save({"weights.w0": make()}, target)
    assert "'weights.w0'" in str(error.value)
    assert not target.exists() and os.listdir(tmp_path) == []


def test_save_of_a_meta_module_names_its_parameter(tmp_path):
    with pytest.raises(LowbitError, match="'weight'.*meta device"):
        lowbit.save(nn.Linear(2, 2, device="meta"), tmp_path / "m.lowbit")


# ---- a statistics TOML cut anywhere ---------------------------------------------------------------------------
def test_statistics_file_cut_at_any_length_is_refused(tmp_path):
    data = sealed_statistics_text(NODE).encode()
    path = tmp_path / "stats.toml"
    for length in range(len(data)):
        path.write_bytes(data[:length])
        with pytest.raises(LowbitError):
            load_statistics(path)
    path.write_bytes(data)
    assert load_statistics(path)["fc1"]["common"]["mase_op"] == "linear"


def test_unsealed_statistics_without_tables_are_refused_but_masestyle_files_load(tmp_path):
    path = tmp_path / "stats.toml"
    path.write_text("# a comment only\n")
    with pytest.raises(LowbitError, match="holds no statistics"):
        load_statistics(path)
    path.write_text(NODE)  # MASE's files have no header: they load (with a warning)
    assert "fc1" in load_statistics(path)


# ---- the command line --------------------------------------------------------------------------------------------
def _one_line_exit_2(capsys, argv) -> str:
    capsys.readouterr()
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == EXIT_USAGE and len(err) == 1 and err[0].startswith("lowbit: error: "), err
    return err[0]


@pytest.mark.parametrize("name", ["", " ", "ternery"])
def test_formats_with_an_unknown_name(capsys, name):
    assert "unknown format" in _one_line_exit_2(capsys, ["formats", name])


def test_a_bad_backend_variable_is_refused_before_any_work(capsys, monkeypatch):
    monkeypatch.setenv("LOWBIT_BACKEND", "bogus")
    monkeypatch.setitem(backend._state, "backend", None)  # read the variable again, as a new process would
    assert "LOWBIT_BACKEND" in _one_line_exit_2(capsys, ["formats", "ternary"])
    assert backend._state["backend"] is None  # nothing cached: the next command reads it again


@pytest.mark.parametrize("config", [
    '[passes.quantize.default.config]\nname = "ternery"\n',
    '[passes.quantize.fc1.config]\nname = "integr"\n',
    '[passes.quantize.fc1.config]\nname = "ternary"\ndata_in_name = "bogus"\n',
])  # fmt: skip
def test_stats_to_config_with_an_unknown_base_format(tmp_path, capsys, config):
    stats, base = tmp_path / "stats.toml", tmp_path / "base.toml"
    stats.write_text(sealed_statistics_text(NODE))
    base.write_text(config)
    line = _one_line_exit_2(capsys, ["stats-to-config", str(stats), str(tmp_path / "out.toml"), "--base", str(base)])
    assert "unknown format" in line and not (tmp_path / "out.toml").exists()
