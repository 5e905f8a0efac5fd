"""``lowbit report``: the config's transform, then the quantization report on test batches; a checkpoint
that does not fit the config's model is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lowbit.cli import main

pytest.importorskip("matplotlib", reason="the report extra is not installed")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
COMMON = ["--no-progress", "--print-config", "false"]


def test_report_writes_json_and_html(tmp_path, capsys):
    argv = ["report", "--config", str(CONFIGS / "toy_integer4.toml"), "--project-dir", str(tmp_path), "--project", "r",
            "--sensitivity", "false", *COMMON]  # fmt: skip
    assert main(argv) == 0
    folder = tmp_path / "r" / "software" / "transform" / "report"
    report = json.loads((folder / "report.json").read_text())
    html = (folder / "report.html").read_text()
    assert "Quantization report" in capsys.readouterr().out
    names = [layer["name"] for layer in report["layers"]]
    assert names == ["seq_blocks_0", "seq_blocks_2", "seq_blocks_4"]
    assert "data:image/png;base64," in html
    assert (tmp_path / "r" / "software" / "transform" / "transformed_ckpt").is_dir()


def test_report_with_a_checkpoint_of_another_model_fails_clearly(tmp_path, capsys):
    from lowbit.models import DigitsMLP

    torch.save(DigitsMLP().state_dict(), tmp_path / "digits.pt")
    argv = ["report", "--config", str(CONFIGS / "toy_integer.toml"), "--load", str(tmp_path / "digits.pt"),
            "--project-dir", str(tmp_path), *COMMON]  # fmt: skip
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert "does not match the model ToyNet" in error[0] and "fc1.weight" in error[0]
