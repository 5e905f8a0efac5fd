"""``[passes.quantization_report] gradients = true``: the report's layer rows carry the weight-gradient
SQNR of the quantized toy model against the float one (4-bit operands: finite, some below 0 dB on the
untrained toy model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lowbit.cli import main

pytest.importorskip("matplotlib", reason="the report extra is not installed")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_transform_report_with_gradients(tmp_path):
    config = tmp_path / "report.toml"
    config.write_text((CONFIGS / "toy_integer4.toml").read_text()
                      + "\n[passes.quantization_report]\ngradients = true\nsensitivity = false\nprint_table = false\n")  # fmt: skip
    argv = ["transform", "--config", str(config), "--project-dir", str(tmp_path), "--project", "g",
            "--no-progress", "--print-config", "false"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "g" / "software" / "transform" / "report" / "report.json").read_text())
    values = [row["grad_weight_sqnr_db"] for row in report["layers"]]
    assert len(values) == 3 and all(isinstance(v, float) and math.isfinite(v) for v in values), values


def test_gradients_must_be_a_boolean(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text((CONFIGS / "toy_integer4.toml").read_text() + "\n[passes.quantization_report]\ngradients = 1\n")
    argv = ["transform", "--config", str(config), "--project-dir", str(tmp_path), "--no-progress", "--print-config", "false"]
    assert main(argv) == 2
