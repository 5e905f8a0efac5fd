"""HQQ (lowbit.ops.hqq): the optimised int4 group parameters are never worse than min-max rounding in squared
error and better on random and heavy-tailed weights, deterministic, in the stored layout, and what the real
module computes with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lowbit

from lowbit.ops import Int4WeightOnlyLinear
from lowbit.ops.hqq import hqq_quantize, kept_residual, shrink
from lowbit.ops.int4 import quantize_groups


def weights(kind: str, rows: int = 64, columns: int = 256) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    if kind == "normal":
        return torch.randn(rows, columns, generator=generator) * 0.05
    if kind == "student_t":  # heavy tails: a few weights many standard deviations out
        normal = torch.randn(rows, columns, generator=generator)
        chi = torch.randn(rows, columns, 3, generator=generator).square().sum(-1)
        return normal / (chi / 3).sqrt() * 0.02
    weight = torch.randn(rows, columns, generator=generator) * 0.02  # "outliers": 1 % of weights x 20
    mask = torch.rand(rows, columns, generator=generator) < 0.01
    return torch.where(mask, weight * 20, weight)


def group_errors(weight, codes, scale, zero_point, group_size):
    n, k = weight.shape
    groups = codes.float().reshape(n, k // group_size, group_size) - zero_point.float().unsqueeze(-1)
    rebuilt = groups.mul(scale.float().unsqueeze(-1)).reshape(n, k)
    return (rebuilt - weight).square().reshape(n, k // group_size, group_size).sum(-1)


@pytest.mark.parametrize("kind", ["normal", "student_t", "outliers"])
@pytest.mark.parametrize("group_size", [32, 64, 256])
def test_never_worse_than_min_max_and_better_overall(kind, group_size):
    weight = weights(kind)
    plain = group_errors(weight, *quantize_groups(weight, group_size, search=False), group_size)
    tuned = group_errors(weight, *hqq_quantize(weight, group_size), group_size)
    assert bool((tuned <= plain).all())  # every group
    assert float(tuned.sum()) < 0.97 * float(plain.sum())  # and at least 3 % lower in total


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_layout_ranges_and_determinism(scale_dtype):
    weight = weights("student_t")
    first, second = hqq_quantize(weight, 64, scale_dtype), hqq_quantize(weight.clone(), 64, scale_dtype)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert first.codes.shape == (64, 256) and first.codes.dtype == torch.uint8 and int(first.codes.max()) <= 15
    assert first.scale.shape == (64, 4) and first.scale.dtype == scale_dtype and bool((first.scale > 0).all())
    assert first.zero_point.shape == (64, 4) and first.zero_point.dtype == torch.uint8
    assert int(first.zero_point.max()) <= 15


def test_codes_are_the_format_rounding_of_the_stored_scale():
    """The final codes are chosen with the stored (rounded) scale and zero point: rounding the weight again
    with them gives the same codes."""
    weight = weights("outliers")
    codes, scale, zero_point = hqq_quantize(weight, 64)
    groups = weight.reshape(64, 4, 64)
    inverse = 1.0 / scale.float().unsqueeze(-1)
    again = torch.round(groups * inverse).add_(zero_point.float().unsqueeze(-1)).clamp_(0, 15)
    assert torch.equal(again.reshape(64, 256).to(torch.uint8), codes)


def test_real_module_computes_the_dequantized_weight():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 64)
    with torch.no_grad():
        linear.weight.copy_(weights("student_t"))
    result = hqq_quantize(linear.weight, 64)
    module = Int4WeightOnlyLinear.from_float(linear, group_size=64, codes=result.codes, scale=result.scale,
                                             zero_point=result.zero_point)  # fmt: skip
    groups = result.codes.float().reshape(64, 4, 64) - result.zero_point.float().unsqueeze(-1)
    expected = groups.mul(result.scale.float().unsqueeze(-1)).reshape(64, 256)
    assert torch.equal(module.dequantized_weight(), expected)
    x = torch.randn(5, 256)
    module.path = "reference"
    assert torch.allclose(module(x), x @ expected.T + linear.bias, atol=1e-5)
    module.path = "auto"
    assert torch.allclose(module(x), x @ expected.T + linear.bias, atol=1e-4)


def test_constant_and_zero_groups():
    weight = torch.zeros(16, 128)
    weight[1] = 0.3
    weight[2, :64] = -1.0
    codes, scale, zero_point = hqq_quantize(weight, 64)
    assert bool(torch.isfinite(scale.float()).all()) and bool((scale > 0).all())
    tuned = group_errors(weight, codes, scale, zero_point, 64)
    assert bool((tuned <= group_errors(weight, *quantize_groups(weight, 64, search=False), 64)).all())
    assert float(tuned.max()) < 1e-3  # only the bfloat16 rounding of the scale is left


def test_shrink_is_the_lp_soft_threshold():
    error = torch.tensor([0.0, 0.01, -0.01, 1.0, -2.0])
    out = shrink(error, beta=10.0, p=0.7)
    assert float(out[0]) == 0.0 and float(out[1]) == 0.0 and float(out[2]) == 0.0  # small errors: all noise
    assert out[3] == pytest.approx(1.0 - 1.0 / 10.0) and out[4] == pytest.approx(-(2.0 - 2.0 ** -0.3 / 10.0))


@pytest.mark.parametrize("p", [0.5, 0.7])
def test_kept_residual_is_the_residual_less_its_shrunk_part(p):
    residual = torch.cat([torch.zeros(1), torch.randn(999, generator=torch.Generator().manual_seed(3))])
    expected = residual - shrink(residual, 12.0, p)
    assert torch.allclose(kept_residual(residual, 12.0, p), expected, atol=1e-6)


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_float_form_moves_only_the_zero_point_and_lowers_the_l1_error(scale_dtype):
    from lowbit.ops.hqq import hqq_float_quantize
    from lowbit.ops.int4 import quantize_groups

    weight = torch.randn(48, 256, generator=torch.Generator().manual_seed(5)) * 0.05
    weight[0, :32] = 0.0  # a group with no span
    codes, scale, minimum = hqq_float_quantize(weight, 32, scale_dtype)
    assert codes.dtype == torch.uint8 and scale.dtype == minimum.dtype == scale_dtype and int(codes.max()) <= 15
    plain = quantize_groups(weight, 32, scale_dtype, search=False, float_zero=True)
    assert torch.equal(scale, plain[1])  # min-max's scale, kept
    groups = weight.reshape(48, 8, 32)
    values = codes.float().reshape(48, 8, 32) * scale.float().unsqueeze(-1) + minimum.float().unsqueeze(-1)
    rounded = torch.round((groups - minimum.float().unsqueeze(-1)) / scale.float().unsqueeze(-1)).clamp(0, 15)
    assert torch.equal(codes.float().reshape(48, 8, 32), rounded)  # the float domain's rule on the stored values
    plain_values = plain[0].float().reshape(48, 8, 32) * plain[1].float().unsqueeze(-1) + plain[2].float().unsqueeze(-1)
    low, step = groups.amin(-1, keepdim=True), scale.float().unsqueeze(-1)
    start_minimum = (-torch.round(-low / step) * step).to(scale_dtype).float()  # the integer start, stored
    start_values = torch.round((groups - start_minimum) / step).clamp(0, 15) * step + start_minimum
    fitted_l1, plain_l1, start_l1 = ((v - groups).abs().mean() for v in (values, plain_values, start_values))
    assert float(fitted_l1) < float(plain_l1) and float(fitted_l1) < 0.99 * float(start_l1), (fitted_l1, start_l1)
    assert torch.equal(values[0, 0], torch.zeros(32))  # the zero group stays exact


@torch.no_grad()
def test_the_recipe_runs_the_float_form():
    model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32))
    quantized = lowbit.quantize_(model, "int4_weight_only", method="hqq", zero_point_domain="float")
    assert quantized[0].float_zero and quantized[0].algorithm["method"] == "hqq"
    assert torch.isfinite(quantized(torch.randn(4, 128))).all()
