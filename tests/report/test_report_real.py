"""The report on real-quantized (lowbit.ops) and mixed models: numbers against hooks and the modules' buffers,
latency present, header, readable numbers, tie ranks."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.nn import QuantLinear, RoleFormats
from lowbit.ops import Int4WeightOnlyLinear, W8A8StaticLinear
from lowbit.report import quantization_report_analysis_pass
from lowbit.report.sensitivity import rank_entries
from lowbit.report.table import fmt_significant, readable


def _report(model, float_model, batches, **extra):
    args = {"float_model": float_model, "inputs": batches, "histogram_layers": 0, "latency_runs": 2, **extra}
    return quantization_report_analysis_pass(model, args)[1]["report"]


def _outputs(model: nn.Module, path: str, batches) -> np.ndarray:
    seen = []
    handle = model.get_submodule(path).register_forward_hook(lambda m, a, o: seen.append(o.detach().double().numpy()))
    with torch.no_grad():
        for batch in batches:
            model(batch)
    handle.remove()
    return np.concatenate([s.reshape(-1) for s in seen])


def test_int8_dynamic_model_numbers(toy_model, toy_batches):
    batches, labels = toy_batches
    quantized, _ = lowbit.quantize_model(copy.deepcopy(toy_model), "int8_dynamic")
    report = _report(quantized, toy_model, batches, labels=labels, header={"model": "ToyNet", "dataset": "toy_tiny"})
    rows = {row["name"]: row for row in report["layers"]}
    assert list(rows) == ["seq_blocks.0", "seq_blocks.2", "seq_blocks.4"] and {r["kind"] for r in rows.values()} == {"real"}
    for path, row in rows.items():
        f, q = _outputs(toy_model, path, batches), _outputs(quantized, path, batches)
        sqnr = 10 * math.log10(float(np.sum(f * f)) / float(np.sum((q - f) ** 2)))
        assert row["sqnr_db"] == pytest.approx(sqnr, rel=1e-9)
        twin = toy_model.get_submodule(path)
        k = twin.in_features
        assert row["roles"]["weight"]["bits_per_element"] == pytest.approx(8 + 32 / k)  # int8 + one f32 scale per row
        assert row["roles"]["data_in"]["bits_per_element"] == pytest.approx(8 + 32 / k)  # + one f32 scale per token
        assert row["bytes"] == twin.out_features * (k + 4 + 4)  # codes, scale, float32 bias
        assert row["fp32_bytes"] == 4 * (twin.weight.numel() + twin.bias.numel())
        assert row["roles"]["weight"]["clamped_share"] == 0.0  # max |w| / 127 scales never clip
        latency = row["latency"]
        assert latency["runs"] == 2 and latency["ms"] > 0 and latency["fp32_ms"] > 0
        assert latency["input_shape"] == [128, k]
    summary = report["summary"]
    assert summary["total_bytes"] == sum(r["bytes"] for r in rows.values())
    assert summary["fp32_bytes"] == 4 * sum(p.numel() for p in toy_model.parameters())
    with torch.no_grad():
        accuracy = float((quantized(torch.cat(batches)).argmax(-1) == torch.cat(labels)).double().mean())
    assert summary["quantized_metric"] == accuracy
    header = report["header"]
    assert header["quantization"] == "real" and header["model"] == "ToyNet" and header["torch"] == torch.__version__
    # sensitivity: the layer alone is the real module with the other two float
    for entry in report["sensitivity"]:
        alone = copy.deepcopy(toy_model)
        parent, _, child = entry["layer"].rpartition(".")
        setattr(alone.get_submodule(parent), child, quantized.get_submodule(entry["layer"]))
        with torch.no_grad():
            hits = float((alone(torch.cat(batches)).argmax(-1) == torch.cat(labels)).double().mean())
        assert entry["metric"] == hits


def test_mixed_model_with_int4_static_and_simulated_layers(toy_model, toy_batches):
    batches, _ = toy_batches
    mixed = copy.deepcopy(toy_model)
    blocks = mixed.seq_blocks
    formats = RoleFormats.from_dict({"weight": {"name": "affine", "bits": 4, "symmetric": True, "axis": 0}})
    blocks[0] = QuantLinear.from_float(blocks[0], formats)
    blocks[2] = Int4WeightOnlyLinear.from_float(blocks[2], group_size=20)
    blocks[4] = W8A8StaticLinear.from_float(blocks[4]).set_input_qparams(0.01, 0)  # a narrow range: clamps
    report = _report(mixed, toy_model, batches, sensitivity=False)
    rows = {row["name"]: row for row in report["layers"]}
    assert [row["kind"] for row in rows.values()] == ["module", "real", "real"]
    assert report["header"]["quantization"] == "mixed"
    assert rows["seq_blocks.0"]["latency"] is None
    # int4: 4-bit codes + a bf16 scale and a uint8 zero point per group of 20
    assert rows["seq_blocks.2"]["roles"]["weight"]["bits_per_element"] == pytest.approx(4 + 24 / 20)
    assert rows["seq_blocks.2"]["roles"]["data_in"] == {**rows["seq_blocks.2"]["roles"]["data_in"], "format": "float",
                                                         "bits_per_element": 32.0}  # fmt: skip
    module, weight = blocks[2], toy_model.seq_blocks[2].weight.detach()
    steps = module.weight_scale.float().repeat_interleave(20, dim=1)
    clipped = float(((module.dequantized_weight() - weight).abs() > steps * 0.5 * (1 + 1e-6)).double().mean())
    assert rows["seq_blocks.2"]["roles"]["weight"]["clamped_share"] == pytest.approx(clipped, rel=1e-12)
    x = np.concatenate([b.numpy().reshape(-1) for b in _inputs(mixed, "seq_blocks.4", batches)])
    expected = float(np.mean((x < -0.005) | (x > 2.555)))  # uint8 codes, scale 0.01, zero point 0, +- half a step
    assert rows["seq_blocks.4"]["roles"]["data_in"]["clamped_share"] == pytest.approx(expected, rel=1e-12)
    assert 0.0 < expected < 1.0


def _inputs(model: nn.Module, path: str, batches) -> list[torch.Tensor]:
    seen = []
    handle = model.get_submodule(path).register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        for batch in batches:
            model(batch)
    handle.remove()
    return seen


def test_real_layer_against_a_wrong_float_model_is_refused(toy_model, toy_batches):
    quantized, _ = lowbit.quantize_model(copy.deepcopy(toy_model), "int8_dynamic")
    with pytest.raises(lowbit.errors.ReportError, match="expected a float Linear"):
        _report(quantized, quantized, toy_batches[0])


def test_ties_share_a_rank_in_a_stable_order():
    entries = [{"layer": name, "metric": value} for name, value in
               [("a", 0.9), ("b", 0.8), ("c", 0.9), ("d", float("nan")), ("e", 0.8)]]  # fmt: skip
    ranked = rank_entries(entries)
    assert [(e["layer"], e["rank"]) for e in ranked] == [("d", 1), ("b", 2), ("e", 2), ("a", 4), ("c", 4)]


def test_numbers_are_readable():
    assert readable("affine(bits=8, scale=(0.012345678901234567,), zero_point=(3,))") == \
        "affine(bits=8, scale=(0.01235,), zero_point=(3,))"  # fmt: skip
    assert readable("mxint8(block_size=32) v2.0") == "mxint8(block_size=32) v2.0"
    assert [fmt_significant(v) for v in (49.6012, 1234567.0, 1.5e-7, 0.0, 100.0)] == ["49.6", "1.235e+06", "1.5e-07",
                                                                                      "0", "100"]  # fmt: skip


def test_html_has_the_header_and_no_long_numbers(toy_model, toy_batches, tmp_path):
    import re

    from lowbit.report import write_report

    batches, labels = toy_batches
    state = lowbit.ptq.calibrate(copy.deepcopy(toy_model), batches[:1])
    static, _ = lowbit.ptq.quantize_static(copy.deepcopy(toy_model), state)
    report = _report(static, toy_model, batches[:1], labels=labels[:1], header={"config": "static.toml"})
    page = write_report(report, tmp_path)["html"].read_text()
    assert '<dl class="header">' in page and "static.toml" in page and "simulated" in page
    text = re.sub(r'src="data:image/png;base64,[^"]*"', "", page)  # charts are pictures
    assert not re.findall(r"\d\.\d{7,}", text), re.findall(r"\d\.\d{7,}", text)[:3]
