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


@pytest.fixture(scope="module")
def digits_fp32(tmp_path_factory) -> tuple[Path, float]:
    """The digits MLP trained with configs/digits_int8_static.toml's settings: (root, fp32 test accuracy)."""
    root = tmp_path_factory.mktemp("digits")
    common = ["--project-dir", str(root), "--project", "fp32", *QUIET]
    assert main(["train", "--config", str(CONFIGS / "digits_int8_static.toml"), *common]) == 0
    best = root / "fp32" / "software" / "training_ckpts" / "best.ckpt"
    assert main(["test", "digits_mlp", "digits", "--load", str(best), *common]) == 0
    return root, _metrics(root, "fp32", "test")["accuracy"]


def _transform_and_test(root: Path, config: str, project: str) -> float:
    best = root / "fp32" / "software" / "training_ckpts" / "best.ckpt"
    common = ["--project-dir", str(root), "--project", project, *QUIET]
    assert main(["transform", "--config", str(CONFIGS / config), "--load", str(best), *common]) == 0
    transformed = root / project / "software" / "transform" / "transformed_ckpt"
    assert main(["test", "digits_mlp", "digits", "--load", str(transformed), *common]) == 0
    return _metrics(root, project, "test")["accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("config, allowed_drop", [("digits_int8_static.toml", 0.005), ("digits_w4.toml", 0.015)])
def test_digits_ptq_configs(digits_fp32, config, allowed_drop):
    root, fp32 = digits_fp32
    quantized = _transform_and_test(root, config, config.removesuffix(".toml"))
    print(f"{config}: fp32 {fp32:.4f}, quantized {quantized:.4f}")
    assert fp32 >= 0.95
    assert quantized >= fp32 - allowed_drop
    if config == "digits_int8_static.toml":  # the calibration state was saved beside the model
        state = json.loads((root / "digits_int8_static" / "software" / "transform" / "calibration.json").read_text())
        assert set(state["ranges"]) == {"fc1", "fc2", "fc3"}


@pytest.mark.slow
def test_ternary_qat_on_digits_recovers_within_1_5_points(digits_fp32):
    root, fp32 = digits_fp32
    ptq = _transform_and_test(root, "digits_ternary.toml", "ptq")
    transformed = root / "ptq" / "software" / "transform" / "transformed_ckpt"
    common = ["--project-dir", str(root), *QUIET]
    assert main(["train", "digits_mlp", "digits", "--load", str(transformed), "--max-epochs", "15", "--learning-rate", "0.0005",
                 "--project", "qat", *common]) == 0  # fmt: skip
    qat_model = root / "qat" / "software" / "training_ckpts" / "transformed_ckpt"
    assert main(["test", "digits_mlp", "digits", "--load", str(qat_model), "--project", "qat", *common]) == 0
    qat = _metrics(root, "qat", "test")["accuracy"]
    print(f"digits test accuracy: fp32 {fp32:.4f}, ternary PTQ {ptq:.4f}, ternary QAT {qat:.4f}")
    assert qat >= fp32 - 0.015
    assert qat > ptq  # training with the quantizer in the loop is what recovered the accuracy
    # the QAT model really is ternary: each output channel's weights take at most 3 values
    from lowbit.pipeline.checkpoints import load_lowbit

    model = load_lowbit(qat_model)
    weight = model.fc2.formats.weight(model.fc2.weight.detach())
    assert all(len(row.unique()) <= 3 for row in weight)
