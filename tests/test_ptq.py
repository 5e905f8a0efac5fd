"""Post-training quantization on real data (scikit-learn digits): an MLP and a small CNN trained here, then
int8 and fp8 (e4m3) static PTQ, dynamic PTQ and 4-bit weight-only, each against the fp32 accuracy."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from lowbit import ConfigError
from lowbit.formats import E5M2
from lowbit.nn import QuantConv2d, QuantLinear
from lowbit.ptq import CalibrationState, calibrate, quantize_dynamic, quantize_static, quantize_weight_only

pytest.importorskip("sklearn", reason="the data extra (scikit-learn) is not installed")

from lowbit.datasets.digits import digits  # noqa: E402
from lowbit.models import DigitsCNN, DigitsMLP  # noqa: E402


def _train(model: torch.nn.Module, epochs: int) -> torch.nn.Module:
    torch.manual_seed(0)
    images, labels = digits("train").tensors
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        for index in torch.randperm(len(images), generator=generator).split(64):
            optimizer.zero_grad()
            F.cross_entropy(model(images[index]), labels[index]).backward()
            optimizer.step()
    return model.eval()


@torch.no_grad()
def accuracy(model: torch.nn.Module, split: str = "test") -> float:
    images, labels = digits(split).tensors
    return 100.0 * (model(images).argmax(-1) == labels).float().mean().item()


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    mlp = _train(DigitsMLP(), epochs=25)
    torch.manual_seed(0)
    cnn = _train(DigitsCNN(), epochs=25)
    return {"mlp": mlp, "cnn": cnn}


def _calibration_batches(count: int = 8, size: int = 32):
    images, labels = digits("validation").tensors
    return [(images[i : i + size], labels[i : i + size]) for i in range(0, count * size, size)]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_fp32_models_learn_digits(trained, name):
    assert accuracy(trained[name]) >= 94.0


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_int8_static_ptq_within_half_a_point(trained, name, tmp_path):
    model = copy.deepcopy(trained[name])
    state = calibrate(model, _calibration_batches(), num_batches=6)
    assert state.batches == 6 and set(state.ranges) == {n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))}
    state.save(tmp_path / "calibration.json")
    reloaded = CalibrationState.load(tmp_path / "calibration.json")
    assert reloaded == state
    quantized, info = quantize_static(model, reloaded)
    layers = [m for m in quantized.modules() if isinstance(m, (QuantLinear, QuantConv2d))]
    assert len(layers) == len(state.ranges) == len(info["quantized"])
    assert all(layer.formats.data_in.scale is not None for layer in layers)  # frozen, not per call
    fp32, int8 = accuracy(trained[name]), accuracy(quantized)
    assert abs(fp32 - int8) <= 0.5, (fp32, int8)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_4bit_per_channel_weights_within_one_and_a_half_points(trained, name):
    quantized, info = quantize_weight_only(copy.deepcopy(trained[name]), bits=4)
    layer = next(m for m in quantized.modules() if isinstance(m, (QuantLinear, QuantConv2d)))
    assert layer.formats.data_in is None and layer.formats.weight.bits == 4 and layer.formats.weight.axis == 0
    fp32, int4 = accuracy(trained[name]), accuracy(quantized)
    assert fp32 - int4 <= 1.5, (fp32, int4)


@pytest.mark.parametrize("granularity", ["tensor", "token"])
def test_int8_dynamic_ptq(trained, granularity):
    quantized, info = quantize_dynamic(copy.deepcopy(trained["mlp"]), granularity=granularity)
    assert info["counts"] == {"linear": 3}
    assert abs(accuracy(trained["mlp"]) - accuracy(quantized)) <= 0.5


def test_bad_calibration_inputs(tmp_path):
    model = DigitsMLP()
    with pytest.raises(ConfigError, match="no batches"):
        calibrate(model, [])
    with pytest.raises(ConfigError, match="lienar"):
        calibrate(model, _calibration_batches(1), ops=("lienar",))
    with pytest.raises(ConfigError, match="observer"):
        calibrate(model, _calibration_batches(1), observer="minmax")
    (tmp_path / "bad.json").write_text('{"version": 1, "observer": "min_max"}')
    with pytest.raises(ConfigError, match="missing"):
        CalibrationState.load(tmp_path / "bad.json")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        CalibrationState.load(tmp_path / "garbage.json")


def test_ternary_with_statistics_reaches_90_percent(trained):
    """Seed 002's flow on digits: profile statistics, turn them into a scaled-ternary config, quantize."""
    from lowbit.graph import (QGraph, add_common_metadata_analysis_pass, add_software_metadata_analysis_pass,
                              init_metadata_analysis_pass, profile_statistics_analysis_pass, quantize_transform_pass,
                              stats_to_config)  # fmt: skip

    graph = QGraph(copy.deepcopy(trained["mlp"]))
    graph, _ = init_metadata_analysis_pass(graph, {})
    graph, _ = add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.zeros(1, 1, 8, 8)}})
    graph, _ = add_software_metadata_analysis_pass(graph, {})
    # |w| statistics: the median magnitude gives a TWN-like threshold (0.75 median |w|); the signed median of
    # weights is about 0, which would make the "ternary" weights nearly binary
    statistics = {"range_min_max": {"dims": "all", "abs": True}, "range_quantile": {"quantile": 0.5, "abs": True}}
    graph, info = profile_statistics_analysis_pass(graph, {
        "by": "type", "target_weight_nodes": ["linear"], "target_activation_nodes": ["linear", "relu"],
        "weight_statistics": statistics, "activation_statistics": {"range_min_max": {}, "range_quantile": {"quantile": 0.5}},
        "input_generator": _calibration_batches(4), "num_samples": 128,
    })  # fmt: skip
    assert info["batches"] == 4
    quantize = stats_to_config(graph)["passes"]["quantize"]
    layers = {name: entry["config"] for name, entry in quantize.items() if name.startswith("fc")}
    assert set(layers) == {"fc1", "fc2", "fc3"}
    # weights ternary with statistics-driven thresholds; activations and biases stay float (weight-only)
    keep_float = {"data_in_name": "NA", "bias_name": "NA", "weight_axis": 0}  # one alpha per output channel
    args = {"by": "name", **{name: {"config": {**config, **keep_float}} for name, config in layers.items()}}
    graph, info = quantize_transform_pass(graph, args)
    assert info["counts"] == {"linear": 3}
    assert graph.model.fc2.formats.weight.format_name == "ternary"
    ternary_accuracy = accuracy(graph.model)
    print(f"ternary weights (statistics thresholds): {ternary_accuracy:.2f} %")
    assert ternary_accuracy >= 90.0


@pytest.mark.parametrize("observer", ["percentile", "mse", "histogram", "moving_average"])
def test_other_observers_calibrate_int8_static_ptq(trained, observer):
    model = copy.deepcopy(trained["cnn"])
    state = calibrate(model, _calibration_batches(), num_batches=4, observer=observer)
    assert state.observer == observer
    quantized, _ = quantize_static(model, state)
    assert abs(accuracy(trained["cnn"]) - accuracy(quantized)) <= 1.0


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_static_fp8_activations_within_one_test_image(trained, name, tmp_path):
    """activation_format="e4m3": one calibrated scale per module input (frozen), int8 weights per channel.
    Measured: the same accuracy as fp32 for both models (MLP 97.41 %, CNN 98.52 %); one test image is 0.37."""
    from lowbit.formats import E4M3
    from lowbit.formats.ocp_float import covering_scale

    model = copy.deepcopy(trained[name])
    state = calibrate(model, _calibration_batches(), num_batches=6, activation_format="e4m3")
    state.save(tmp_path / "calibration.json")
    reloaded = CalibrationState.load(tmp_path / "calibration.json")
    assert reloaded == state and reloaded.activation_format == "e4m3"
    quantized, info = quantize_static(model, reloaded)
    layers = dict(quantized.named_modules())
    for module_name, entry in state.ranges.items():
        data_in = layers[module_name].formats.data_in
        amax = torch.tensor(max(-min(entry["min"]), max(entry["max"])), dtype=torch.float32)
        assert isinstance(data_in, E4M3) and data_in.axis is None
        assert data_in.scale == (covering_scale(amax, 448.0, "f32").item(),)  # frozen: the calibrated max -> 448
        assert layers[module_name].formats.weight.format_name == "affine"
    fp32, fp8 = accuracy(trained[name]), accuracy(quantized)
    print(f"{name}: fp32 {fp32:.2f} %, static e4m3 activations {fp8:.2f} %")
    assert abs(fp32 - fp8) <= 0.4, (fp32, fp8)


def test_activation_format_choices(trained, tmp_path):
    model = copy.deepcopy(trained["mlp"])
    state = calibrate(model, _calibration_batches(2), activation_format="E2M1")
    assert state.activation_format == "e2m1"  # stored by its canonical name
    legacy = {key: value for key, value in dataclasses.asdict(state).items() if key != "activation_format"}
    (tmp_path / "old.json").write_text(json.dumps({"version": 1, **legacy}))
    assert CalibrationState.load(tmp_path / "old.json").activation_format == "affine"  # saved before the field
    quantized, _ = quantize_static(copy.deepcopy(model), state, activation_format=E5M2(scale_dtype="bf16"))
    assert quantized.fc1.formats.data_in.format_name == "e5m2" and quantized.fc1.formats.data_in.scale_dtype == "bf16"
    quantized, _ = quantize_static(copy.deepcopy(model), state, activation_format="q8s")
    assert quantized.fc2.formats.data_in.format_name == "q8s" and len(quantized.fc2.formats.data_in.scale) == 1
    for bad, message in [("mxint8", "part of each block's encoding"), ("binary", "MagnitudeObserver"),
                         ("log", "has no scale"), ("e4m4", "unknown format")]:  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            calibrate(model, _calibration_batches(1), activation_format=bad)
        with pytest.raises(ConfigError, match=message):
            quantize_static(copy.deepcopy(model), state, activation_format=bad)
