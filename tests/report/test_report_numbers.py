"""The report's numbers against independent computations: forward hooks and numpy for SQNR and relative
error, hand-counted bits and bytes, separately quantized models for the sensitivity ranking."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.graph import QGraph, quantize_module_transform_pass, quantize_transform_pass
from lowbit.report import quantization_report_analysis_pass

PATHS = {"seq_blocks_0": "seq_blocks.0", "seq_blocks_1": "seq_blocks.1", "seq_blocks_2": "seq_blocks.2",
         "seq_blocks_4": "seq_blocks.4"}  # fmt: skip


def _report(graph, float_model, batches, labels=None, **extra):
    args = {"float_model": float_model, "inputs": batches, "labels": labels, "histogram_layers": 0, **extra}
    return quantization_report_analysis_pass(graph, args)[1]["report"]


def _hooked(model: nn.Module, paths: list[str], batches, inputs: bool = False):
    """Each module's output (or first input) over all batches, float64 numpy, by plain forward hooks."""
    seen = {path: [] for path in paths}
    modules = dict(model.named_modules())

    def hook(path, module, args, output):
        seen[path].append((args[0] if inputs else output).detach().double().numpy().reshape(-1).copy())

    handles = [modules[p].register_forward_hook(lambda m, a, o, p=p: hook(p, m, a, o)) for p in paths]
    with torch.no_grad():
        finals = [model(batch) for batch in batches]
    for handle in handles:
        handle.remove()
    return {path: np.concatenate(values) for path, values in seen.items()}, finals


def _sqnr(f: np.ndarray, q: np.ndarray) -> float:
    return 10.0 * math.log10(float(np.sum(f * f)) / float(np.sum((q - f) ** 2)))


def test_sqnr_and_relative_error_match_hooks(mixed_graph, toy_model, toy_batches):
    batches, labels = toy_batches
    report = _report(mixed_graph, toy_model, batches, labels, sensitivity=False)
    floats, _ = _hooked(toy_model, list(PATHS.values()), batches)
    quantized, _ = _hooked(mixed_graph.model, list(PATHS.values()), batches)
    rows = {row["name"]: row for row in report["layers"]}
    assert list(rows) == list(PATHS)  # only the quantized layers, in execution order
    for name, path in PATHS.items():
        f, q = floats[path], quantized[path]
        assert rows[name]["sqnr_db"] == pytest.approx(_sqnr(f, q), rel=1e-9)
        assert rows[name]["relative_error"] == pytest.approx(np.linalg.norm(q - f) / np.linalg.norm(f), rel=1e-9)
        assert rows[name]["output_elements"] == f.size and rows[name]["nonfinite_outputs"] == 0
    assert 5.0 < rows["seq_blocks_0"]["sqnr_db"] < 80.0  # a real, finite error


def test_layer_alone_sqnr_applies_the_layer_to_float_inputs(mixed_graph, toy_model, toy_batches):
    batches, _ = toy_batches
    report = _report(mixed_graph, toy_model, batches, sensitivity=False)
    rows = {row["name"]: row for row in report["layers"]}
    float_inputs, _ = _hooked(toy_model, ["seq_blocks.2"], batches, inputs=True)
    float_outputs, _ = _hooked(toy_model, ["seq_blocks.2"], batches)
    layer = mixed_graph.model.get_submodule("seq_blocks.2")
    with torch.no_grad():  # one call per batch: the affine data_in scale is per call
        alone = np.concatenate([layer(torch.from_numpy(chunk).float().reshape(-1, 100)).double().numpy().reshape(-1)
                                for chunk in np.split(float_inputs["seq_blocks.2"], len(batches))])  # fmt: skip
    assert rows["seq_blocks_2"]["local_sqnr_db"] == pytest.approx(_sqnr(float_outputs["seq_blocks.2"], alone), rel=1e-9)
    # the first layer sees the same (float) input in both models, so both SQNRs agree
    assert rows["seq_blocks_0"]["local_sqnr_db"] == pytest.approx(rows["seq_blocks_0"]["sqnr_db"], rel=1e-12)


def test_bits_per_element_and_bytes_are_counted_by_hand(mixed_graph, toy_model, toy_batches):
    batches, _ = toy_batches
    report = _report(mixed_graph, toy_model, batches, sensitivity=False)
    rows = {row["name"]: row for row in report["layers"]}
    bits = {name: {role: entry["bits_per_element"] for role, entry in row["roles"].items()}
            for name, row in rows.items()}
    assert bits["seq_blocks_0"] == {"data_in": 8.0, "weight": 8.0, "bias": 8.0}
    assert bits["seq_blocks_1"] == {"data_in": 4.0}
    # 4-bit codes + one f32 scale per output channel (100 of 100 x 100); the float bias at 32 bits;
    # 8-bit asymmetric activations: one f32 scale and one 8-bit zero point per [128, 100] batch
    assert bits["seq_blocks_2"] == {"data_in": 8.0 + 40 / 12800, "weight": 4.0 + 32 * 100 / 10000, "bias": 32.0}
    # MX int8: one 8-bit scale per block of 32 along the last axis (100 -> 4 blocks, padded)
    assert bits["seq_blocks_4"] == {"data_in": 8.0 + 8 * 128 * 4 / 12800, "weight": 8.0 + 8 * 2 * 4 / 200, "bias": 32.0}
    assert {name: row["bytes"] for name, row in rows.items()} == {
        "seq_blocks_0": 400 + 100, "seq_blocks_1": 0, "seq_blocks_2": 5400 + 400, "seq_blocks_4": 208 + 8,
    }  # fmt: skip
    assert rows["seq_blocks_2"]["fp32_bytes"] == (10000 + 100) * 4
    summary = report["summary"]
    total_bits = (400 + 100) * 8 + (10000 * 4 + 3200) + 100 * 32 + (200 * 8 + 64) + 2 * 32
    assert summary["parameters"] == 10802 and summary["fp32_bytes"] == 10802 * 4
    assert summary["total_bytes"] == total_bits // 8 == 6516
    assert summary["average_bits_per_weight"] == pytest.approx(total_bits / 10802, rel=1e-12)
    assert summary["compression"] == pytest.approx(43208 / 6516, rel=1e-12)
    assert summary["quantized_parameters"] == 500 + 10000 + 200  # biases of layers 2 and 4 stay float


def test_clamped_share_counts_values_outside_the_format_range(mixed_graph, toy_model, toy_batches):
    batches, _ = toy_batches
    report = _report(mixed_graph, toy_model, batches, sensitivity=False)
    rows = {row["name"]: row for row in report["layers"]}
    inputs, _ = _hooked(mixed_graph.model, ["seq_blocks.1"], batches, inputs=True)
    x = inputs["seq_blocks.1"]  # unsigned Q2.2 at the ReLU input: [0, 3.75], steps of 0.25
    expected = float(np.mean((x < -0.125) | (x > 3.875)))  # more than half a step outside
    assert rows["seq_blocks_1"]["roles"]["data_in"]["clamped_share"] == pytest.approx(expected, rel=1e-12)
    assert 0.1 < expected < 0.9
    weight = toy_model.seq_blocks[0].weight.detach().numpy()  # Q4.4: [-8, 7.9375], steps of 1/16
    limits = (weight < -8 - 1 / 32) | (weight > 7.9375 + 1 / 32)
    assert rows["seq_blocks_0"]["roles"]["weight"]["clamped_share"] == float(np.mean(limits))
    assert rows["seq_blocks_2"]["roles"]["weight"]["clamped_share"] == 0.0  # min-max scales never clip
    assert rows["seq_blocks_2"]["roles"]["bias"]["clamped_share"] is None  # float


def test_accuracy_and_sensitivity_match_separately_quantized_models(mixed_graph, mixed_config, toy_model, toy_batches):
    batches, labels = toy_batches
    report = _report(mixed_graph, toy_model, batches, labels)
    images, targets = torch.cat(batches), torch.cat(labels)

    def accuracy(model) -> float:
        with torch.no_grad():
            return float((model(images).argmax(-1) == targets).double().mean())

    summary = report["summary"]
    assert summary["metric"] == "accuracy"
    assert summary["float_metric"] == accuracy(toy_model) and summary["quantized_metric"] == accuracy(mixed_graph.model)
    ranking = {entry["layer"]: entry["metric"] for entry in report["sensitivity"]}
    for name in PATHS:
        alone, _ = quantize_transform_pass(QGraph(toy_model), {"by": "name", name: mixed_config[name]})
        assert ranking[name] == accuracy(alone.model), name
    metrics = [entry["metric"] for entry in report["sensitivity"]]
    assert metrics == sorted(metrics)  # most sensitive first
    ranks = {row["name"]: row["sensitivity_rank"] for row in report["layers"]}
    # competition ranking: 1 + the number of layers strictly worse; equal accuracies share a rank
    assert ranks == {name: 1 + sum(other < ranking[name] for other in ranking.values()) for name in PATHS}
    assert [entry["rank"] for entry in report["sensitivity"]] == [ranks[e["layer"]] for e in report["sensitivity"]]


def test_cosine_metric_without_labels(mixed_graph, toy_model, toy_batches):
    batches, _ = toy_batches
    report = _report(mixed_graph, toy_model, batches, sensitivity=False)
    with torch.no_grad():
        f, q = toy_model(torch.cat(batches)).double(), mixed_graph.model(torch.cat(batches)).double()
    expected = float(torch.nn.functional.cosine_similarity(f, q, dim=1).mean())
    assert report["summary"]["metric"] == "cosine" and report["summary"]["float_metric"] == 1.0
    assert report["summary"]["quantized_metric"] == pytest.approx(expected, rel=1e-12)


def test_module_swap_model_gives_the_graph_numbers(toy_model, toy_batches):
    batches, labels = toy_batches
    config = {"name": "integer", "data_in_width": 6, "data_in_frac_width": 3, "weight_width": 5, "weight_frac_width": 4}
    graph, _ = quantize_transform_pass(QGraph(toy_model), {"by": "type", "linear": {"config": config}})
    swapped, _ = quantize_module_transform_pass(copy.deepcopy(toy_model), {"by": "type", "linear": {"config": config}})
    from_graph = _report(graph, toy_model, batches, labels, sensitivity=False)
    from_modules = _report(swapped, toy_model, batches, labels, sensitivity=False)
    assert [row["name"] for row in from_modules["layers"]] == ["seq_blocks.0", "seq_blocks.2", "seq_blocks.4"]
    assert [row["kind"] for row in from_modules["layers"]] == ["module"] * 3
    for by_node, by_module in zip(from_graph["layers"], from_modules["layers"]):
        assert by_module["sqnr_db"] == pytest.approx(by_node["sqnr_db"], rel=1e-12)
        assert by_module["bytes"] == by_node["bytes"] and by_module["module"] == by_node["module"]
    assert from_modules["summary"] == from_graph["summary"]


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h + torch.relu(h)


def test_quantized_function_nodes_are_layers():
    torch.manual_seed(0)
    model = _Residual().eval()
    config = {"name": "integer", "data_in_width": 6, "data_in_frac_width": 3}
    graph, info = quantize_transform_pass(QGraph(model), {"by": "type", "add": {"config": config}})
    assert info["quantized"] == ["add"]
    batches = [torch.randn(16, 4), torch.randn(16, 4)]
    report = _report(graph, model, batches, sensitivity=False)
    (row,) = report["layers"]
    assert (row["name"], row["op"], row["kind"], row["module"]) == ("add", "add", "function", None)
    with torch.no_grad():
        h = torch.cat([model.fc(b) for b in batches]).double()
    quantize = lambda t: lowbit.quantize(t, "integer", width=6, frac_width=3)  # noqa: E731
    float_out, quantized_out = (h + torch.relu(h)).numpy(), (quantize(h) + quantize(torch.relu(h))).numpy()
    assert row["sqnr_db"] == pytest.approx(_sqnr(float_out, quantized_out), rel=1e-9)
    both = torch.cat([h.reshape(-1), torch.relu(h).reshape(-1)])  # both operands go through data_in
    expected_share = float(((both < -4.0625) | (both > 3.9375)).double().mean())  # Q3.3 +- half a step
    assert row["roles"]["data_in"]["clamped_share"] == pytest.approx(expected_share, rel=1e-12)


def test_the_pass_leaves_both_models_as_it_found_them(toy_model, toy_batches):
    batches, labels = toy_batches
    config = {"name": "integer", "data_in_width": 6, "data_in_frac_width": 3, "weight_width": 5, "weight_frac_width": 4}
    swapped, _ = quantize_module_transform_pass(copy.deepcopy(toy_model), {"by": "type", "linear": {"config": config}})
    formats = [module.formats for module in swapped.modules() if hasattr(module, "formats")]
    float_model = copy.deepcopy(toy_model).train()
    with torch.no_grad():
        before = swapped(batches[0])
    graph, info = quantization_report_analysis_pass(swapped, {"float_model": float_model, "inputs": batches,
                                                              "labels": labels})  # fmt: skip
    assert graph is swapped and float_model.training and all(m.training for m in float_model.modules())
    assert [module.formats for module in swapped.modules() if hasattr(module, "formats")] == formats
    with torch.no_grad():
        assert torch.equal(swapped(batches[0]), before)  # sensitivity runs put every format back
    assert len(info["report"]["sensitivity"]) == 3
