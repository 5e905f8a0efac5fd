"""Seed 002 end to end through the command line: train toy on toy_tiny -> profile statistics ->
stats-to-config with --base -> scaled-ternary transform of the checkpoint -> test; plus seed 000's integer
configs and every checkpoint load type."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from lowbit.cli import main
from lowbit.datasets import toy_tiny

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A toy model trained for 4 epochs; returns the project's software folder."""
    root = tmp_path_factory.mktemp("seed002")
    status = main(["train", "--config", str(CONFIGS / "toy_ternary_collect_stats.toml"), "--max-epochs", "4",
                   "--project-dir", str(root), "--project", "toy", "--no-progress", "--print-config", "false"])
    assert status == 0
    return root / "toy" / "software"


def test_training_leaves_best_and_last_and_learns(trained):
    checkpoints = trained / "training_ckpts"
    assert (checkpoints / "best.ckpt").is_file() and (checkpoints / "last.ckpt").is_file()
    metrics = json.loads((checkpoints / "metrics.json").read_text())
    assert metrics["val_accuracy"] >= 0.9  # sum > 0 is linearly separable
    assert metrics["val_samples"] == 512


def _toy_activations(state: dict) -> dict[str, np.ndarray]:
    """seq_blocks_0 input / output and relu output on the first training batch (128 samples: num_samples = 32 still takes a whole batch, as MASE; seed 002 shows count = 512 = 128 x 4), by hand in numpy."""
    x = toy_tiny("train").tensors[0][:128].reshape(128, -1).double().numpy()
    w0, b0 = state["seq_blocks.0.weight"].double().numpy(), state["seq_blocks.0.bias"].double().numpy()
    linear0 = x @ w0.T + b0
    return {"x": x, "linear0": linear0, "relu1": np.maximum(linear0, 0)}


def test_profile_statistics_match_numpy_and_config_is_per_node(lowbit_cli, trained):
    best = trained / "training_ckpts" / "best.ckpt"
    status, out, err = lowbit_cli("transform", "--config", str(CONFIGS / "toy_ternary_collect_stats.toml"),
                                  "--load", str(best), "--load-type", "pl", "--project", "stats")  # fmt: skip
    assert status == 0, err
    stats_path = lowbit_cli.software("stats") / "transform" / "stats_for_quantisation.toml"
    stats = tomllib.loads(stats_path.read_text())
    state = {k.removeprefix("model."): v for k, v in torch.load(best, weights_only=True)["state_dict"].items()}
    acts = _toy_activations(state)
    data_in = stats["seq_blocks_0"]["software"]["args"]["data_in_0"]["stat"]
    assert math.isclose(data_in["range_min_max"]["max"], acts["x"].max(), rel_tol=1e-6)
    assert math.isclose(data_in["range_min_max"]["min"], acts["x"].min(), rel_tol=1e-6)
    assert data_in["range_min_max"]["count"] == acts["x"].size
    weight = stats["seq_blocks_0"]["software"]["args"]["weight"]["stat"]["range_min_max"]
    assert math.isclose(weight["max"], float(state["seq_blocks.0.weight"].max()), rel_tol=1e-6)
    relu_in = stats["seq_blocks_1"]["software"]["args"]["data_in_0"]["stat"]
    assert math.isclose(relu_in["range_min_max"]["max"], acts["linear0"].max(), rel_tol=1e-5)
    # the stated error of the quantile sketch is relative; the median is within 1 % of numpy's
    median = relu_in["range_quantile"]["max"]
    assert abs(median - np.quantile(acts["linear0"], 0.5)) <= 0.01 * abs(np.quantile(acts["linear0"], 0.5)) + 1e-6

    dest = lowbit_cli.root / "scaled.toml"
    status, out, err = lowbit_cli("stats-to-config", str(stats_path), str(dest), "--base", str(CONFIGS / "toy_ternary_base.toml"))
    assert status == 0, err
    assert "5 nodes" in out
    quantize = tomllib.loads(dest.read_text())["passes"]["quantize"]
    assert quantize["by"] == "name"
    # every node has its own statistics (MASE's script aliased the linear nodes to seq_blocks_0's)
    assert quantize["seq_blocks_0"]["config"]["weight_max"] == pytest.approx(weight["max"])
    assert quantize["seq_blocks_2"]["config"]["weight_max"] != quantize["seq_blocks_0"]["config"]["weight_max"]
    assert quantize["default"]["config"].get("weight_max") is None
    assert quantize["seq_blocks_1"]["config"]["data_in_max"] == pytest.approx(relu_in["range_min_max"]["max"])

    status, out, err = lowbit_cli("transform", "--config", str(dest), "--load", str(best), "--project", "ternary")
    assert status == 0, err
    transformed = lowbit_cli.software("ternary") / "transform" / "transformed_ckpt"
    status, out, err = lowbit_cli("test", "toy", "toy_tiny", "--load", str(transformed), "--project", "ternary")
    assert status == 0, err
    ternary = lowbit_cli.metrics("ternary")["accuracy"]
    status, out, err = lowbit_cli("test", "toy", "toy_tiny", "--load", str(best), "--project", "fp32")
    fp32 = lowbit_cli.metrics("fp32")["accuracy"]
    assert fp32 >= 0.9
    # 2-bit inputs, weights and biases cost accuracy, but the model is far better than chance
    assert 0.6 <= ternary < fp32


@pytest.mark.parametrize("config, floor", [("toy_integer.toml", 0.03), ("toy_integer4.toml", 0.08)])
def test_seed000_integer_configs(lowbit_cli, trained, config, floor):
    best = trained / "training_ckpts" / "best.ckpt"
    status, out, err = lowbit_cli("transform", "--config", str(CONFIGS / config), "--load", str(best), "--project", "int")
    assert status == 0, err
    table = (lowbit_cli.software("int") / "transform" / "quantize" / "quantize_table.csv").read_text()
    assert table.count("QuantLinear") == 3 and "QuantReLU" not in table
    lowbit_cli("test", "toy", "toy_tiny", "--load", str(best), "--project", "fp32")
    lowbit_cli("test", "toy", "toy_tiny", "--load", str(lowbit_cli.software("int") / "transform" / "transformed_ckpt"),
               "--project", "int")  # fmt: skip
    drop = lowbit_cli.metrics("fp32")["accuracy"] - lowbit_cli.metrics("int")["accuracy"]
    print(f"{config}: fp32 - quantized accuracy = {drop:.4f}")
    assert drop <= floor


def test_every_load_type_gives_the_same_model(lowbit_cli, trained, tmp_path):
    best = trained / "training_ckpts" / "best.ckpt"
    state = {k.removeprefix("model."): v for k, v in torch.load(best, weights_only=True)["state_dict"].items()}
    torch.save(state, tmp_path / "plain.pt")
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "wrapped.pth")
    from safetensors.torch import save_file

    save_file(state, str(tmp_path / "weights.safetensors"))
    results = {}
    for name, path, kind in [("pl", best, "pl"), ("pt", tmp_path / "plain.pt", "pt"),
                             ("wrapped", tmp_path / "wrapped.pth", None), ("st", tmp_path / "weights.safetensors", "pt")]:  # fmt: skip
        argv = ["test", "toy", "toy_tiny", "--load", str(path), "--project", name]
        status, out, err = lowbit_cli(*(argv + (["--load-type", kind] if kind else [])))
        assert status == 0, err
        results[name] = lowbit_cli.metrics(name)
    # a lowbit folder: an identity transform (quantize nothing) saved by transform
    none_config = tmp_path / "none.toml"
    none_config.write_text('[passes.quantize]\nby = "type"\n[passes.quantize.default.config]\nname = "NA"\n')
    status, out, err = lowbit_cli("transform", "toy", "toy_tiny", "--config", str(none_config), "--load", str(best), "--project", "lb")
    assert status == 0, err
    folder = lowbit_cli.software("lb") / "transform" / "transformed_ckpt"
    status, out, err = lowbit_cli("test", "toy", "toy_tiny", "--load", str(folder), "--load-type", "lowbit", "--project", "lb")
    assert status == 0, err
    results["lowbit"] = lowbit_cli.metrics("lb")
    assert len({(r["accuracy"], round(r["loss"], 6)) for r in results.values()}) == 1, results
