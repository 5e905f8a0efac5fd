"""What chose an int4 layer's codes, kept on the module (``algorithm``): the method and its options, the grid's
span against each group's weight span, AWQ's exponent and scale range; saved and loaded with the module and
shown by the report."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError
from lowbit.ops import Int4WeightOnlyLinear
from lowbit.report import quantization_report_analysis_pass
import tiny_llama  # noqa: E402 (tests/ is on sys.path: conftest.py)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32)).eval()


def _batches() -> list[torch.Tensor]:
    return [torch.randn(32, 128, generator=torch.Generator().manual_seed(seed)) for seed in range(4)]


@pytest.mark.parametrize("options,method", [
    ({"search": False}, "min-max"), ({}, "range search"), ({"calibration_data": "batches"}, "range search (weighted by the inputs)"),
    ({"method": "hqq"}, "hqq"), ({"method": "gptq", "calibration_data": "batches"}, "gptq"),
    ({"zero_point_domain": "float", "search": False}, "min-max"),
])  # fmt: skip
def test_each_method_is_recorded_with_its_grid_span(options, method):
    options = {key: _batches() if value == "batches" else value for key, value in options.items()}
    model = _mlp()
    quantized = lowbit.quantize_(copy.deepcopy(model), "int4_weight_only", **options)
    record = quantized[0].algorithm
    assert record["method"] == method
    if method == "gptq":
        assert record["damping"] == 0.1 and record["act_order"] is False and record["block_size"] == 128
    if method == "hqq":
        assert record["iterations"] == 20
    # the span by hand: 15 scale steps over each group's weight span (holding 0 for integer zero points)
    groups = model[0].weight.detach().reshape(64, 4, 32)
    low, high = groups.amin(-1), groups.amax(-1)
    if not quantized[0].float_zero:
        low, high = low.clamp(max=0.0), high.clamp(min=0.0)
    ratio = quantized[0].weight_scale.float() * 15 / (high - low)
    assert record["grid_span_mean"] == pytest.approx(float(ratio.mean()), abs=1e-4)
    assert record["grid_span_min"] == pytest.approx(float(ratio.min()), abs=1e-4)
    if method == "min-max":
        assert abs(record["grid_span_mean"] - 1) < 0.01  # only the bf16 rounding of the scale
    if method.startswith("range search"):
        assert record["grid_span_min"] < 0.95  # some group's ends were clipped


def test_awq_layers_record_their_exponent_and_scale_range():
    model, batches = tiny_llama.outlier_llama(10), tiny_llama.token_batches(2, 32)
    quantized, info = lowbit.quantize_model(model, "int4_weight_only", method="awq", calibration_data=batches,
                                            group_size=32, skip=["lm_head"])  # fmt: skip
    for producer, entry in info["awq"].items():
        for layer in entry["layers"]:
            record = quantized.get_submodule(layer).algorithm
            assert record["method"] == "awq" and record["awq_alpha"] == entry["alpha"]
            assert record["awq_scale_range"] == entry["scale_range"] and entry["scale_range"][0] <= entry["scale_range"][1]


def test_the_record_is_saved_and_loaded_and_reported(tmp_path):
    model, batches = _mlp(), _batches()
    quantized = lowbit.quantize_(copy.deepcopy(model), "int4_weight_only", method="gptq", calibration_data=batches)
    lowbit.save(quantized, tmp_path / "model.safetensors")
    loaded = lowbit.load(tmp_path / "model.safetensors", _mlp())
    assert isinstance(loaded[0], Int4WeightOnlyLinear) and loaded[0].algorithm == quantized[0].algorithm
    report = quantization_report_analysis_pass(loaded, {"float_model": model, "inputs": batches, "histogram_layers": 0,
                                                        "latency_runs": 1})[1]["report"]  # fmt: skip
    row = next(row for row in report["layers"] if row["name"] == "0")
    assert "by gptq (damping 0.1, act order False, block size 128; grid span mean" in row["formats"]


def test_a_bad_record_in_a_file_is_refused():
    config = {**Int4WeightOnlyLinear(64, 8).config(), "algorithm": "gptq"}
    with pytest.raises(ConfigError, match="algorithm"):
        Int4WeightOnlyLinear.from_config(config)
    assert Int4WeightOnlyLinear.from_config(Int4WeightOnlyLinear(64, 8).config()).algorithm is None  # older files


@pytest.mark.parametrize("recipe", ["int8_dynamic", "w8a8_static"])
def test_smoothquant_layers_record_alpha_and_scale_range(recipe):
    model, batches = tiny_llama.outlier_llama(10), tiny_llama.token_batches(2, 32)
    quantized, info = lowbit.quantize_model(model, recipe, smoothquant=0.5, calibration_data=batches, skip=["lm_head"])
    assert info["smoothed"]
    for producer, layers in info["smoothed"].items():
        low, high = info["smoothing_scale_ranges"][producer]
        assert 1e-5 <= low <= high <= 1e5
        for layer in layers:
            record = quantized.get_submodule(layer).algorithm
            assert record == {"method": "smoothquant", "alpha": 0.5, "scale_range": [low, high]}
    assert "by smoothquant (alpha 0.5, scale range" in lowbit.report.real.describe(quantized.get_submodule(layers[0]))
