"""Bad input gets a clear ReportError / ConfigError; NaN made by quantization is reported, not raised."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lowbit.errors import ConfigError, LowbitError, ReportError
from lowbit.graph import QGraph, quantize_module_transform_pass, quantize_transform_pass
from lowbit.models import DigitsMLP, ToyNet
from lowbit.report import quantization_report_analysis_pass, to_json


def _run(graph, **args):
    return quantization_report_analysis_pass(graph, {"histogram_layers": 0, "sensitivity": False, **args})


def test_report_error_is_a_config_error():
    assert issubclass(ReportError, ConfigError) and issubclass(ReportError, LowbitError)


def test_float_model_of_another_width(mixed_graph, toy_batches):
    narrower = ToyNet(hidden=50)
    with pytest.raises(ReportError, match=r"layer 'seq_blocks_0': weight has shape \(100, 4\) in the quantized "
                                          r"model but \(50, 4\) in the float model"):  # fmt: skip
        _run(mixed_graph, float_model=narrower, inputs=toy_batches[0])


def test_float_model_of_another_architecture(mixed_graph, toy_batches):
    with pytest.raises(ReportError, match="the float model has no layer 'seq_blocks_0'.*4 of 4 quantized layers"):
        _run(mixed_graph, float_model=DigitsMLP(), inputs=toy_batches[0])


def test_module_swapped_model_against_another_architecture(toy_model, toy_batches):
    config = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 4}
    swapped, _ = quantize_module_transform_pass(copy.deepcopy(toy_model), {"by": "type", "linear": {"config": config}})
    with pytest.raises(ReportError, match=r"no layer 'seq_blocks\.0'"):
        _run(swapped, float_model=DigitsMLP(), inputs=toy_batches[0])


def test_quantized_model_passed_as_the_float_model(mixed_graph, toy_batches):
    with pytest.raises(ReportError, match="of float_model is quantized.*pass the float"):
        _run(mixed_graph, float_model=mixed_graph, inputs=toy_batches[0])


def test_model_without_quantized_layers(toy_model, toy_batches):
    with pytest.raises(ReportError, match="no quantized layers"):
        _run(QGraph(toy_model), float_model=toy_model, inputs=toy_batches[0])


@pytest.mark.parametrize("inputs, message", [([], "inputs is empty"), (torch.zeros(2, 1, 2, 2), "wrap a single batch")])
def test_bad_inputs(mixed_graph, toy_model, inputs, message):
    with pytest.raises(ReportError, match=message):
        _run(mixed_graph, float_model=toy_model, inputs=inputs)


def test_pass_args_keys_are_checked(mixed_graph, toy_model, toy_batches):
    hint = "unknown pass_args key 'histogram_layer' \\(did you mean 'histogram_layers'\\?\\)"
    with pytest.raises(ConfigError, match=hint):
        quantization_report_analysis_pass(mixed_graph, {"float_model": toy_model, "inputs": toy_batches[0],
                                                        "histogram_layer": 2})  # fmt: skip
    with pytest.raises(ConfigError, match="needs the key 'float_model'"):
        quantization_report_analysis_pass(mixed_graph, {"inputs": toy_batches[0]})


def test_metric_and_label_checks(mixed_graph, toy_model, toy_batches):
    batches, labels = toy_batches
    with pytest.raises(ReportError, match="metric='accuracy' needs labels"):
        _run(mixed_graph, float_model=toy_model, inputs=batches, metric="accuracy")
    with pytest.raises(ReportError, match="metric='f1' is invalid"):
        _run(mixed_graph, float_model=toy_model, inputs=batches, metric="f1")
    with pytest.raises(ReportError, match="2 label batches for 3 input batches"):
        _run(mixed_graph, float_model=toy_model, inputs=batches, labels=labels[:2])
    with pytest.raises(ReportError, match=r"label batch 0 is \(128, 1\); expected a tensor of shape \(128,\)"):
        _run(mixed_graph, float_model=toy_model, inputs=batches, labels=[y[:, None] for y in labels])


def test_histogram_layers_are_checked(mixed_graph, toy_model, toy_batches):
    with pytest.raises(ReportError, match="no layer 'seq_block_0' \\(did you mean 'seq_blocks_0'\\?\\)"):
        _run(mixed_graph, float_model=toy_model, inputs=toy_batches[0], histogram_layers=["seq_block_0"])
    with pytest.raises(ReportError, match="histogram_layers must be"):
        _run(mixed_graph, float_model=toy_model, inputs=toy_batches[0], histogram_layers=2.5)


def test_nan_made_by_quantization_is_a_field(toy_model, toy_batches):
    # E4M3 without saturation turns |x| > 464 into NaN: inputs scaled up overflow the first layer's input.
    config = {"name": "e4m3", "data_in_saturate": False, "weight_name": "NA"}
    graph, _ = quantize_transform_pass(QGraph(toy_model), {"by": "name", "seq_blocks_0": {"config": config}})
    batches = [batch * 200.0 for batch in toy_batches[0]]
    report = _run(graph, float_model=toy_model, inputs=batches)[1]["report"]
    (row,) = report["layers"]
    overflowing = sum(int((batch.abs() > 464).any(dim=(1, 2, 3)).sum()) for batch in batches)
    assert overflowing > 0
    assert row["nonfinite_outputs"] == overflowing * 100  # every output of an overflowing sample is NaN
    assert row["output_elements"] == 384 * 100 - overflowing * 100 and math.isfinite(row["sqnr_db"])
    assert row["roles"]["data_in"]["clamped_share"] > 0
    assert math.isnan(report["summary"]["quantized_metric"])  # the cosine of a NaN output
    assert '"nan"' in to_json(report)
