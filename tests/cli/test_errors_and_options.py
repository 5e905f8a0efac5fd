"""Bad input on the command line ends with one line on stderr and exit status 2; option precedence is
default < TOML < command line; ``lowbit formats`` lists every format."""

from __future__ import annotations


import pytest

from lowbit.cli import main
from lowbit.cli.commands import resolve
from lowbit.cli.parser import build_parser
from lowbit.formats import list_formats

TOY = 'model = "toy"\ndataset = "toy_tiny"\n'
QUANTIZE = ('[passes.quantize]\nby = "type"\n[passes.quantize.linear.config]\nname = "integer"\n'
            'data_in_width = 8\ndata_in_frac_width = 4\nweight_width = 8\nweight_frac_width = 4\n')


def _write(tmp_path, text: str, name: str = "c.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _one_line_error(lowbit_cli, *argv) -> str:
    status, _out, err = lowbit_cli(*argv)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("lowbit: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("text, expected", [
    (TOY + "[passes.quantize\n", "TOML syntax error"),
    (TOY + "batch_sise = 8\n" + QUANTIZE, "unknown top-level key 'batch_sise' (did you mean 'batch_size'?)"),
    (TOY + 'batch_size = "eight"\n' + QUANTIZE, "batch_size must be an integer"),
    (TOY + "batch_size = 0\n" + QUANTIZE, "batch_size must be at least 1"),
    (TOY + "[passes.quantise]\nby = 'type'\n", "unknown pass [passes.quantise] (did you mean 'quantize'?)"),
    (TOY + "[passes.calibrate]\nnum_batchs = 2\n", "unknown key 'num_batchs' (did you mean 'num_batches'?)"),
    (TOY + QUANTIZE + "data_in_widht = 8\n", "data_in_widht"),
    (TOY + "[transform]\nstyle = 'tree'\n" + QUANTIZE, "transform.style"),
    ('model = "toy"\ndataset = "mnist"\n' + QUANTIZE, "unknown dataset 'mnist'"),
    ('model = "digits_mlp"\ndataset = "toy_tiny"\n' + QUANTIZE, "does not take dataset"),
    (TOY, "no [passes.*] tables"),
])  # fmt: skip
def test_bad_config_fails_with_one_line(lowbit_cli, tmp_path, text, expected):
    line = _one_line_error(lowbit_cli, "transform", "--config", _write(tmp_path, text))
    assert expected in line


def test_bad_config_is_found_before_any_work(lowbit_cli, tmp_path):
    # the profile pass comes first, the bad quantize key after it: nothing may have been written
    text = TOY + "[passes.save_statistics]\nsave_path = 's.toml'\n" + QUANTIZE + "weight_frac_widht = 3\n"
    line = _one_line_error(lowbit_cli, "transform", "--config", _write(tmp_path, text))
    assert "weight_frac_widht" in line
    assert not list(tmp_path.rglob("s.toml")) and not list(tmp_path.rglob("transformed_ckpt"))


@pytest.mark.parametrize("argv, expected", [
    (["transform", "--config", "missing.toml"], "does not exist"),
    (["transform", "toy", "toy_tiny"], "needs --config"),
    (["test", "toy", "toy_tiny"], "needs --load"),
    (["test", "toy", "toy_tiny", "--load", "nowhere.ckpt"], "does not exist"),
    (["train", "toy", "toy_tiny", "--batch-size", "x"], "invalid int value"),
    (["train", "toy", "toy_tiny", "--load-type", "mz"], "invalid choice"),
    (["train", "toy"], "no dataset given"),
    (["train", "toy", "toy_tiny", "--model", "digits_mlp"], "model given twice"),
    (["frobnicate"], "invalid choice"),
    (["stats-to-config", "missing.toml", "out.toml"], "cannot read statistics file"),
    (["formats", "minifloat"], "unknown format"),
])  # fmt: skip
def test_bad_command_lines(lowbit_cli, argv, expected):
    assert expected in _one_line_error(lowbit_cli, *argv)


def test_corrupt_and_mismatched_checkpoints(lowbit_cli, tmp_path):
    import torch

    (tmp_path / "broken.ckpt").write_bytes(b"PK\x03\x04 not really a zip")
    assert "cannot read checkpoint" in _one_line_error(lowbit_cli, "test", "toy", "toy_tiny", "--load", str(tmp_path / "broken.ckpt"))
    torch.save({"fc1.weight": torch.zeros(3)}, tmp_path / "other.pt")
    line = _one_line_error(lowbit_cli, "test", "toy", "toy_tiny", "--load", str(tmp_path / "other.pt"))
    assert "does not match the model ToyNet" in line and "missing: seq_blocks.0.weight" in line
    torch.save({"state_dict": {"x": object()}}, tmp_path / "pickled.ckpt")  # needs unpickling of code: refused
    assert "cannot read checkpoint" in _one_line_error(lowbit_cli, "test", "toy", "toy_tiny", "--load", str(tmp_path / "pickled.ckpt"))


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="needs --load"):
        main(["test", "toy", "toy_tiny", "--debug"])


def test_precedence_default_then_toml_then_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _write(tmp_path, TOY + "batch_size = 32\nlearning_rate = 0.01\nload_name = 'a.ckpt'\n" + QUANTIZE)
    args = build_parser().parse_args(["transform", "--config", config, "--batch-size", "16", "--print-config", "false"])
    options, run_config = resolve(args, needs_config=True)
    assert options["batch_size"] == 16 and options.source("batch_size") == "command line"
    assert options["learning_rate"] == 0.01 and options.source("learning_rate") == "config"
    assert options["max_epochs"] == 20 and options.source("max_epochs") == "default"
    assert options["load"] == "a.ckpt"  # MASE's key name is accepted
    assert options["project"] == "toy_classification_toy_tiny"
    assert [name for name, _ in run_config.passes] == ["quantize"]
    rows = {row["option"]: row for row in options.rows()}
    assert rows["batch_size"] == {"option": "batch_size", "default": 128, "config": 32, "command line": 16, "effective": 16}


def test_effective_configuration_is_printed(lowbit_cli, tmp_path):
    status, out, _err = lowbit_cli("test", "toy", "toy_tiny", "--load", "x.ckpt", "--batch-size", "7", quiet=False)
    assert status == 2  # x.ckpt does not exist; the table came first
    assert "Effective configuration" in out and "batch_size" in out and "7" in out


def test_formats_lists_every_format(lowbit_cli):
    status, out, _err = lowbit_cli("formats")
    assert status == 0
    for name in list_formats():
        assert name in out
    status, out, _err = lowbit_cli("formats", "e4m3")
    assert status == 0 and "448" in out and "253 values" in out  # OCP E4M3: +-448, 253 finite values


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert "lowbit" in capsys.readouterr().out


def test_a_saved_model_of_another_kind_is_refused(lowbit_cli, tmp_path):
    config = _write(tmp_path, TOY + QUANTIZE)
    status, _out, err = lowbit_cli("transform", "--config", config, "--project", "t")
    assert status == 0, err
    folder = lowbit_cli.software("t") / "transform" / "transformed_ckpt"
    line = _one_line_error(lowbit_cli, "test", "digits_mlp", "digits", "--load", str(folder))
    assert "holds a 'toy' model, not 'digits_mlp'" in line
