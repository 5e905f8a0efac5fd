"""Exit status 2 for usage / config errors, 1 for runtime failures, always one line on stderr; the
command-line cases that used to end in a traceback (issue 19); -q / -v; the untrained-weights warning."""

from __future__ import annotations

import os

import pytest
import torch

from lowbit.cli import EXIT_FAILURE, EXIT_USAGE

TOY = 'model = "toy"\ndataset = "toy_tiny"\n'
QUANTIZE = ('[passes.quantize]\nby = "type"\n[passes.quantize.linear.config]\nname = "integer"\n'
            'data_in_width = 8\ndata_in_frac_width = 4\nweight_width = 8\nweight_frac_width = 4\n')
UNTRAINED = "lowbit: warning: no --load checkpoint: toy runs with random, untrained weights"


def _one_line(lowbit_cli, status: int, *argv) -> str:
    got, _, err = lowbit_cli(*argv)
    lines = err.strip().splitlines()
    assert got == status, err
    assert len(lines) == 1 and lines[0].startswith("lowbit: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("argv, expected", [
    (["train", "toy", "toy_tiny", "--learning-rate", "nan"], "learning_rate must be a finite number"),
    (["train", "toy", "toy_tiny", "--learning-rate", "-1"], "learning_rate must be greater than 0"),
    (["train", "toy", "toy_tiny", "--num-workers", "-1"], "num_workers must be at least 0"),
    (["train", "toy", "toy_tiny", "--max-steps", "0"], "max_steps must be -1 (no limit) or at least 1"),
    (["train", "toy", "toy_tiny", "--strategy", "bogus"], "strategy 'bogus'"),
    (["train", "toy", "toy_tiny", "--seed", "-1"], "seed must be between 0 and 2**32 - 1"),
    (["test", "toy", "toy_tiny", "--seed", str(2**70), "--load", "x.pt"], "seed must be between 0 and 2**32 - 1"),
    (["test", "toy", "toy_tiny", "--task", "embedding", "--load", "x.pt"], "does not fit dataset 'toy_tiny'"),
    (["report", "toy", "toy_tiny", "--sensitivity", "flase"], "expected true or false, got 'flase'"),
    (["transform", "--frobnicate"], "unrecognized arguments"),
])  # fmt: skip
def test_bad_command_lines_exit_2(lowbit_cli, argv, expected):
    assert expected in _one_line(lowbit_cli, EXIT_USAGE, *argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_accelerator_without_a_gpu(lowbit_cli):
    line = _one_line(lowbit_cli, EXIT_USAGE, "train", "toy", "toy_tiny", "--accelerator", "gpu")
    assert "no CUDA GPU is available" in line


@pytest.mark.parametrize("table, expected", [
    ("[passes.calibrate]\nnum_batches = -1\n", "[passes.calibrate]: num_batches=-1 must be a positive int"),
    ("[passes.quantization_report]\nnum_batches = 0\n", "num_batches=0 must be a positive int"),
    ('[passes.quantize_weight_only]\nbits = "8"\n', "bits='8' must be a positive int"),
    ("[passes.calibrate]\nsymmetric = 1\n", "symmetric=1 must be true or false"),
    ("[passes.quantize_dynamic]\ngranularity = 3\n", "[passes.quantize_dynamic]: granularity=3 must be a string"),
    ('[passes.quantize_model]\nrecipe = "int4_weight_only"\nscale_dtype = ["bf16"]\n', "scale_dtype=['bf16']"),
])  # fmt: skip
def test_wrong_typed_pass_values_exit_2(lowbit_cli, tmp_path, table, expected):
    assert expected in _one_line(lowbit_cli, EXIT_USAGE, "transform", "--config", _config(tmp_path, TOY + table))


@pytest.mark.parametrize("suffix", [".ckpt", ".pt"])
def test_empty_checkpoint_exits_2(lowbit_cli, tmp_path, suffix):
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(b"")
    line = _one_line(lowbit_cli, EXIT_USAGE, "test", "toy", "toy_tiny", "--load", str(path))
    assert f"checkpoint {path} is empty (0 bytes)" in line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_fifo_config_is_refused_without_reading_it(lowbit_cli, tmp_path):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)  # reading it would block forever: nobody writes
    line = _one_line(lowbit_cli, EXIT_USAGE, "transform", "--config", str(fifo))
    assert "is not a regular file" in line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("argv", [["stats-to-config", "{fifo}", "{tmp}/dest.toml"],
                                  ["stats-to-config", "{tmp}/stats.toml", "{tmp}/dest.toml", "--base", "{fifo}"],
                                  ["search", "--config", "{fifo}", "--n-trials", "1"]])  # fmt: skip
def test_fifo_inputs_of_the_other_commands_are_refused(lowbit_cli, tmp_path, argv):
    """A reader that did open the FIFO gets garbage after 5 s from a helper thread: the test fails, never hangs."""
    import threading

    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    (tmp_path / "stats.toml").write_text("")
    unblock = threading.Timer(5.0, lambda: fifo.write_bytes(b"garbage = [\n"))
    unblock.daemon = True
    unblock.start()
    try:
        argv = [part.format(fifo=fifo, tmp=tmp_path) for part in argv]
        line = _one_line(lowbit_cli, EXIT_USAGE, *argv)
    finally:
        unblock.cancel()
    assert f"{fifo} is not a regular file" in line


def test_a_project_name_that_is_a_path_is_refused(lowbit_cli, tmp_path):
    for project in ("../elsewhere", "a/b", ".."):
        line = _one_line(lowbit_cli, EXIT_USAGE, "test", "toy", "toy_tiny", "--load", "x.pt", "--project", project)
        assert f"project {project!r} must be a folder name, not a path" in line
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "a").exists()


def test_folder_config_is_refused(lowbit_cli, tmp_path):
    assert "is a folder" in _one_line(lowbit_cli, EXIT_USAGE, "transform", "--config", str(tmp_path))


def test_runtime_failure_exits_1(lowbit_cli, tmp_path, monkeypatch):
    """A model producing NaN is a runtime failure, not a usage error."""
    from lowbit.models import ToyNet

    model = ToyNet((1, 2, 2), 2)
    with torch.no_grad():
        model.seq_blocks[0].weight.fill_(float("nan"))
    torch.save(model.state_dict(), tmp_path / "nan.pt")
    line = _one_line(lowbit_cli, EXIT_FAILURE, "test", "toy", "toy_tiny", "--load", str(tmp_path / "nan.pt"))
    assert "NaN or Inf" in line


def test_unexpected_exception_is_one_line_exit_1(lowbit_cli, monkeypatch):
    import lowbit.cli.tools as tools

    def broken(args):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(tools, "run_formats", broken)
    line = _one_line(lowbit_cli, EXIT_FAILURE, "formats")
    assert line == ("lowbit: error: internal error RuntimeError: something inside broke second line "
                    "(run with --debug for the traceback)")  # fmt: skip


def test_keyboard_interrupt_exits_130_without_traceback(lowbit_cli, monkeypatch):
    import lowbit.cli.tools as tools

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(tools, "run_formats", interrupted)
    status, _, err = lowbit_cli("formats")
    assert status == 130 and err.strip() == "lowbit: interrupted"


def test_untrained_warning_is_one_line_and_quiet_keeps_it(lowbit_cli, tmp_path):
    config = _config(tmp_path, TOY + QUANTIZE)
    status, _, err = lowbit_cli("transform", "--config", config)
    assert status == 0
    assert [line for line in err.splitlines() if "warning" in line] == [line for line in err.splitlines()
                                                                        if line.startswith(UNTRAINED)]  # fmt: skip
    assert sum(line.startswith(UNTRAINED) for line in err.splitlines()) == 1
    status, _out, err = lowbit_cli("transform", "--config", config, "-q")
    assert status == 0 and err.strip().startswith(UNTRAINED) and len(err.strip().splitlines()) == 1


def test_no_untrained_warning_with_a_checkpoint(lowbit_cli, tmp_path):
    from lowbit.models import ToyNet

    torch.save(ToyNet((1, 2, 2), 2).state_dict(), tmp_path / "toy.pt")
    status, _, err = lowbit_cli("transform", "--config", _config(tmp_path, TOY + QUANTIZE), "--load", str(tmp_path / "toy.pt"))
    assert status == 0 and "warning" not in err


def test_verbosity_flags_before_and_after_the_command(lowbit_cli, tmp_path):
    config = _config(tmp_path, TOY + '[passes.quantize_model]\nrecipe = "int8_dynamic"\n')
    status, _, err = lowbit_cli("-v", "transform", "--config", config)
    assert status == 0 and "lowbit: debug: saving" in err
    status, _, err = lowbit_cli("transform", "-q", "--config", config)
    assert status == 0 and "debug" not in err and "quantize_model" not in err


def test_relative_save_dir_is_relative_to_the_working_folder(lowbit_cli, tmp_path):
    config = _config(tmp_path, TOY + QUANTIZE + "[passes.quantization_report]\nnum_batches = 1\nprint_table = false\n")
    status, _, err = lowbit_cli("report", "--config", config, "--save-dir", "my_report", "--sensitivity", "false")
    assert status == 0, err
    assert (tmp_path / "my_report" / "report.html").is_file()  # the test runs in tmp_path
    assert "lowbit: quantization report on 1 test batch, without sensitivity ..." in err


def test_a_ctrl_c_inside_an_import_arrives_once_the_import_has_finished(tmp_path, monkeypatch):
    """torch's import calls Python from C++; a KeyboardInterrupt raised there aborted the process (status -6,
    seen once in CI). The handler defers a Ctrl-C that lands inside an import and sends it again after."""
    import signal
    import sys
    import time

    from lowbit import cli

    (tmp_path / "module_interrupted_while_importing.py").write_text(
        "import signal\nsignal.raise_signal(signal.SIGINT)\nfinished = True\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli._interrupt, "seen", False)
    previous = signal.signal(signal.SIGINT, cli._record_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            import module_interrupted_while_importing  # noqa: F401

            time.sleep(5)  # the interrupt, sent again, ends this sleep
        assert sys.modules["module_interrupted_while_importing"].finished
        assert cli._interrupt["seen"]
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.modules.pop("module_interrupted_while_importing", None)


def test_a_ctrl_c_outside_an_import_raises_at_once(monkeypatch):
    import signal

    from lowbit import cli

    monkeypatch.setitem(cli._interrupt, "seen", False)
    previous = signal.signal(signal.SIGINT, cli._record_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            raise AssertionError("the interrupt was not raised where it arrived")
    finally:
        signal.signal(signal.SIGINT, previous)
