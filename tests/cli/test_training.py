"""Training through the command line: two-process DDP on the CPU (gloo) reaches the single-process
accuracy, and quantization-aware training of a ternary digits MLP recovers to within 1.5 points of fp32."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lowbit.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QUIET = ["--no-progress", "--print-config", "false"]


def _metrics(root: Path, project: str, kind: str = "training_ckpts") -> dict:
    return json.loads((root / project / "software" / kind / "metrics.json").read_text())


@pytest.mark.slow
def test_ddp_two_processes_matches_one_process(tmp_path):
    common = ["train", "toy", "toy_tiny", "--max-epochs", "10", "--accelerator", "cpu", "--project-dir", str(tmp_path), *QUIET]
    assert main([*common, "--project", "single"]) == 0
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-m", "lowbit", *common, "--project", "ddp", "--strategy", "ddp", "--devices", "2"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environment)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MEMBER: 2/2" in done.stdout + done.stderr  # two processes really took part
    single, ddp = _metrics(tmp_path, "single"), _metrics(tmp_path, "ddp")
    print(f"val accuracy: one process {single['val_accuracy']:.4f}, two processes {ddp['val_accuracy']:.4f}")
    assert single["val_accuracy"] >= 0.95
    # each process sees half the data per epoch (twice the effective batch): the same accuracy within 2 points
    assert abs(single["val_accuracy"] - ddp["val_accuracy"]) <= 0.02


@pytest.mark.slow
def test_ternary_qat_on_digits_recovers_within_1_5_points(tmp_path):
    root = ["--project-dir", str(tmp_path), *QUIET]
    assert main(["train", "--config", str(CONFIGS / "digits_int8_static.toml"), "--project", "fp32", *root]) == 0
    best = tmp_path / "fp32" / "software" / "training_ckpts" / "best.ckpt"
    assert main(["test", "digits_mlp", "digits", "--load", str(best), "--project", "fp32", *root]) == 0
    assert main(["transform", "--config", str(CONFIGS / "digits_ternary.toml"), "--load", str(best), "--project", "ptq", *root]) == 0
    transformed = tmp_path / "ptq" / "software" / "transform" / "transformed_ckpt"
    assert main(["test", "digits_mlp", "digits", "--load", str(transformed), "--project", "ptq", *root]) == 0
    assert main(["train", "digits_mlp", "digits", "--load", str(transformed), "--max-epochs", "15", "--learning-rate", "0.0005",
                 "--project", "qat", *root]) == 0  # fmt: skip
    qat_model = tmp_path / "qat" / "software" / "training_ckpts" / "transformed_ckpt"
    assert main(["test", "digits_mlp", "digits", "--load", str(qat_model), "--project", "qat", *root]) == 0
    fp32, ptq, qat = (_metrics(tmp_path, p, "test")["accuracy"] for p in ("fp32", "ptq", "qat"))
    print(f"digits test accuracy: fp32 {fp32:.4f}, ternary PTQ {ptq:.4f}, ternary QAT {qat:.4f}")
    assert fp32 >= 0.95
    assert qat >= fp32 - 0.015
    assert qat > ptq  # training with the quantizer in the loop is what recovered the accuracy
    # the QAT model really is ternary: each output channel's weights take at most 3 values
    from lowbit.pipeline.checkpoints import load_lowbit

    model = load_lowbit(qat_model)
    weight = model.fc2.formats.weight(model.fc2.weight.detach())
    assert all(len(row.unique()) <= 3 for row in weight)
