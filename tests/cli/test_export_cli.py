"""``lowbit export``: a transformed toy model to QDQ ONNX (run in onnxruntime, compared with lowbit) and
to lowbit's safetensors file; bad requests fail with one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lowbit.cli import main

pytest.importorskip("onnxruntime", reason="the export extra is not installed")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def transformed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    argv = ["transform", "--config", str(CONFIGS / "toy_integer.toml"), "--project-dir", str(root), "--project", "int8",
            "--no-progress", "--print-config", "false"]  # fmt: skip
    assert main(argv) == 0
    return root / "int8" / "software" / "transform" / "transformed_ckpt"


def test_onnx_export_runs_in_onnxruntime_and_matches(transformed, tmp_path, capsys):
    import onnx
    import onnxruntime

    from lowbit.datasets import toy_tiny
    from lowbit.pipeline.checkpoints import load_lowbit

    path = tmp_path / "toy.onnx"
    assert main(["export", "--load", str(transformed), "--onnx", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    graph = onnx.load(str(path)).graph
    kinds = [node.op_type for node in graph.node]
    assert kinds.count("QuantizeLinear") >= 3 and kinds.count("DequantizeLinear") >= 6  # inputs; weights + biases
    x = toy_tiny("test").tensors[0][:64]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (theirs,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        ours = load_lowbit(transformed).eval()(x).numpy()
    assert theirs.shape == ours.shape == (64, 2)
    # the same fixed-point grid: outputs agree to float rounding (a rare tie may move one input by one step)
    close = np.isclose(theirs, ours, atol=1e-4).all(axis=1)
    assert close.mean() >= 0.95
    assert (theirs.argmax(1) == ours.argmax(1)).mean() >= 0.98


def test_safetensors_export_records_the_model(transformed, tmp_path):
    from lowbit.export.safetensors_io import read_file
    from lowbit.pipeline.checkpoints import load_lowbit

    path = tmp_path / "toy.safetensors"
    assert main(["export", "--load", str(transformed), "--safetensors", str(path)]) == 0
    header, tensors = read_file(path)
    state = load_lowbit(transformed).state_dict()
    assert header["kind"] == "module"
    for name, value in state.items():
        assert torch.equal(tensors[name], value)


@pytest.mark.parametrize("argv, expected", [
    (["export", "--load", "nowhere"], "say what to write"),
    (["export", "--load", "nowhere", "--onnx", "x.onnx"], "does not exist"),
    (["export", "--load", "nowhere", "--gguf", "x.gguf"], "does not exist"),
    (["export", "--load", "nowhere", "--compressed-tensors", "ckpt"], "does not exist"),
])  # fmt: skip
def test_bad_export_requests(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and expected in error[0]


def test_serving_formats_refuse_what_they_cannot_hold_in_one_line(transformed, tmp_path, capsys):
    """The toy model is no Llama (GGUF) and its layers are simulated (compressed-tensors): one line, exit 2,
    nothing written."""
    assert main(["export", "--load", str(transformed), "--gguf", str(tmp_path / "toy.gguf")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "model_type" in error[0]
    assert main(["export", "--load", str(transformed), "--compressed-tensors", str(tmp_path / "ckpt")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "export_compressed_tensors: layer" in error[0]
    assert not (tmp_path / "toy.gguf").exists() and not (tmp_path / "ckpt").exists()


def test_gguf_export_of_a_smollm2_checkpoint_carries_its_vocabulary(tmp_path, monkeypatch):
    """llama.cpp cannot run a GGUF file without a vocabulary: `lowbit export --gguf` of a SmolLM2 checkpoint
    writes SmolLM2's tokenizer with llama.cpp's pre-tokenizer name for it; other models write none."""
    import json

    import lowbit.models.smollm2 as smollm2
    from lowbit.pipeline.exporting import _gguf_vocabulary

    sentinel = object()
    monkeypatch.setattr(smollm2, "load_smollm2_tokenizer", lambda: sentinel)
    (tmp_path / "module.json").write_text(json.dumps({"model": "smollm2"}))
    assert _gguf_vocabulary(tmp_path) == (sentinel, "smollm")
    (tmp_path / "module.json").write_text(json.dumps({"model": "toy_mlp"}))
    assert _gguf_vocabulary(tmp_path) == (None, "default")
