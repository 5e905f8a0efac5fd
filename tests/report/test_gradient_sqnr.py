"""The report's gradient pass: each layer's weight-gradient SQNR against the float model's, checked with
formats whose effect on the gradient is known exactly (a rounded grad_weight, a forward-only change)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from lowbit.errors import ReportError
from lowbit.formats import resolve
from lowbit.nn import QuantLinear, RoleFormats
from lowbit.report import quantization_report_analysis_pass, sqnr_db

STEP = 2.0**-4


def _models():
    torch.manual_seed(0)
    original = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    quantized = copy.deepcopy(original)
    # layer 0: only its bias gradient is rounded, so its weight gradient is the float one
    quantized[0] = QuantLinear.from_float(quantized[0], RoleFormats(grad_bias=resolve("integer", width=8, frac_width=1)))
    # layer 2: its weight gradient is rounded to multiples of 2^-4 (nearest even); nothing else changes
    quantized[2] = QuantLinear.from_float(quantized[2], RoleFormats(grad_weight=resolve("integer", width=16, frac_width=4)))
    return original, quantized


def _report(original, quantized, inputs, labels=None, **args):
    pass_args = {"float_model": original, "inputs": inputs, "labels": labels, "sensitivity": False,
                 "histogram_layers": 0, "latency_runs": 0, **args}  # fmt: skip
    return quantization_report_analysis_pass(quantized, pass_args)[1]["report"]


def _float_weight_grad(original, x, y):
    loss = nn.functional.cross_entropy(original(x), y)
    return torch.autograd.grad(loss, [original[2].weight])[0]


def test_rounded_weight_gradient_has_the_sqnr_of_its_rounding():
    original, quantized = _models()
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    report = _report(original, quantized, [x, torch.randn(4, 6)], [y, torch.zeros(4, dtype=torch.long)], gradients=True)
    rows = {row["name"]: row for row in report["layers"]}
    exact = _float_weight_grad(original, x, y)  # first batch only
    expected = sqnr_db(exact, torch.round(exact / STEP) * STEP)
    assert math.isfinite(expected)
    assert rows["2"]["grad_weight_sqnr_db"] == pytest.approx(expected, abs=1e-9)
    assert rows["0"]["grad_weight_sqnr_db"] == math.inf  # the same gradient exactly


def test_without_labels_the_loss_is_half_the_mean_square_output():
    original, quantized = _models()
    x = torch.randn(5, 6)
    report = _report(original, quantized, [x], gradients=True)
    exact = torch.autograd.grad(0.5 * original(x).square().mean(), [original[2].weight])[0]
    row = next(row for row in report["layers"] if row["name"] == "2")
    assert row["grad_weight_sqnr_db"] == pytest.approx(sqnr_db(exact, torch.round(exact / STEP) * STEP), abs=1e-9)


def test_gradient_pass_leaves_grads_and_frozen_weights_alone():
    original, quantized = _models()
    for parameter in [*original.parameters(), *quantized.parameters()]:
        parameter.requires_grad_(False)
    report = _report(original, quantized, [torch.randn(4, 6)], gradients=True)
    assert all(row["grad_weight_sqnr_db"] is not None for row in report["layers"])
    assert all(not p.requires_grad and p.grad is None for p in [*original.parameters(), *quantized.parameters()])


def test_off_by_default_and_checked():
    original, quantized = _models()
    report = _report(original, quantized, [torch.randn(4, 6)])
    assert all("grad_weight_sqnr_db" not in row for row in report["layers"])
    with pytest.raises(ReportError, match="gradients"):
        _report(original, quantized, [torch.randn(4, 6)], gradients="yes")


def test_table_and_html_show_the_column_only_when_measured():
    from rich.console import Console

    from lowbit.report import print_report
    from lowbit.report.table import GRADIENT_COLUMN, layer_cells, layer_columns

    original, quantized = _models()
    with_gradients = _report(original, quantized, [torch.randn(4, 6)], gradients=True)
    without = _report(original, quantized, [torch.randn(4, 6)])
    assert layer_columns(with_gradients)[-1] == GRADIENT_COLUMN and GRADIENT_COLUMN not in layer_columns(without)
    row = next(row for row in with_gradients["layers"] if row["name"] == "0")
    assert layer_cells(row, "cosine")[-1] == "inf" and len(layer_cells(row, "cosine")) == len(layer_columns(with_gradients))
    console = Console(width=250, record=True)
    print_report(with_gradients, console)
    assert GRADIENT_COLUMN in console.export_text()
