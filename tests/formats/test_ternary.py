"""ternary: TWN thresholds from the data, thresholds from statistics (seed 002) or given; scaling."""

from __future__ import annotations

import math

import pytest
import torch

import lowbit
from lowbit import FormatError
from lowbit.formats import Ternary

from helpers import assert_near, assert_same, t

NAN, INF = math.nan, math.inf

# MASE's verified HEAD example (it needs this reshaped to 4-D; 2-D crashes there).
W = [[0.5, -0.25, 0.05, 0.0], [1.0, -3.0, 0.2, -0.01]]
W_UNSCALED = [[1.0, -1.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0]]
W_SCALED = [[0.375, -0.375, 0.0, 0.0], [2.0, -2.0, 0.0, 0.0]]


# ---- TWN from the tensor itself ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 4), (2, 4, 1, 1), (2, 1, 2, 2), (2, 2, 2)], ids=str)
@pytest.mark.parametrize("scaled,expected", [(False, W_UNSCALED), (True, W_SCALED)], ids=["unscaled", "scaled"])
def test_mase_head_example_per_row(shape, scaled, expected):
    # Row deltas 0.75 * mean|row| = 0.1509 and 0.7669; alphas mean(0.5, 0.25) and mean(1, 3).
    x = t(W).reshape(shape)
    y = lowbit.quantize(x, "ternary", axis=0, scaling_factor=scaled)
    assert_near(y, t(expected).reshape(shape))


def test_twn_per_tensor():
    # delta = 0.75 * 5.01 / 8 = 0.4697: only 0.5, 1 and -3 pass; alpha = mean(0.5, 1, 3) = 1.5.
    x = t(W)
    assert_same(lowbit.quantize(x, "ternary"), t([[1.0, 0, 0, 0], [1, -1, 0, 0]]))
    assert_near(lowbit.quantize(x, "ternary", scaling_factor=True), t([[1.5, 0, 0, 0], [1.5, -1.5, 0, 0]]))


def test_twn_per_column():
    x = t([[1.0, 0.1], [-3.0, 0.2], [0.2, -4.0]])  # column deltas 1.05 and 1.075
    expected = t([[0.0, 0.0], [-3.0, 0.0], [0.0, -4.0]])
    assert_near(lowbit.quantize(x, "ternary", axis=1, scaling_factor=True), expected)
    assert_near(lowbit.quantize(x, "ternary", axis=-1, scaling_factor=True), expected)


def test_scaled_alpha_is_the_least_squares_optimum_for_its_signs():
    x = torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = lowbit.quantize(x, "ternary", scaling_factor=True)
    alpha = y.abs().max()
    signs = y / alpha
    delta = 0.75 * x.abs().mean()
    assert torch.equal(signs, (x > delta).double() - (x < -delta).double())
    assert alpha.item() == pytest.approx(x.abs()[x.abs() > delta].mean().item(), rel=1e-14)


# ---- thresholds from statistics (seed 002) or given ----------------------------------------------------
@pytest.mark.parametrize(
    "params,threshold",
    [
        ({"mean": 0.4, "median": 0.1, "max": 10.0}, 0.3),
        ({"mean": "NA", "median": 0.1, "max": 10.0}, 0.075),
        ({"mean": None, "median": "NA", "max": 10.0}, 0.5),
        ({"mean": "NA", "median": "NA", "max": "NA"}, None),
        ({"threshold": 0.2, "mean": 0.4, "median": 0.1}, 0.2),
        ({"threshold": -0.2}, 0.2),
        ({"mean": -0.4}, 0.3),
        ({"max": -10.0}, 0.5),
    ],
)
def test_threshold_priorities(params, threshold):
    fixed = Ternary(**params).fixed_threshold
    if threshold is None:
        assert fixed is None
    else:
        assert fixed == pytest.approx(threshold, rel=1e-15)


def test_threshold_is_strict_and_symmetric():
    x = t([-0.6, -0.5, -0.4, 0.0, 0.4, 0.5, 0.6])
    assert_same(lowbit.quantize(x, "ternary", threshold=0.5), t([-1.0, 0, 0, 0, 0, 0, 1]))
    assert_same(lowbit.quantize(x, "ternary", median=2 / 3), t([-1.0, 0, 0, 0, 0, 0, 1]))  # 0.75 * 2/3 = 0.5


def test_negative_median_from_seed_002_does_not_degenerate_to_binary():
    # seed 002 writes weight_mean = "NA", weight_median = -0.0034 (range_quantile.max), weight_max = 0.4998.
    config = {"width": 2, "scaling_factor": True, "mean": "NA", "median": -0.0033772289752960205,
              "max": 0.4998381733894348}  # fmt: skip
    spec = lowbit.get_format("ternary").create(**config)
    assert spec.fixed_threshold == pytest.approx(0.75 * 0.0033772289752960205)  # 0.002533
    x = t([0.001, -0.002, 0.0, 0.003, -0.01, 0.4, -0.2])
    alpha = (0.003 + 0.01 + 0.4 + 0.2) / 4
    expected = torch.tensor([0, 0, 0, alpha, -alpha, alpha, -alpha], dtype=torch.float64).float()
    torch.testing.assert_close(spec(x), expected, rtol=1e-6, atol=0)
    assert (spec(x) == 0).sum() == 3  # MASE's 2023 code gives every element +-alpha here


def test_fixed_threshold_with_scaling_per_axis():
    x = t([[0.2, 0.7, -0.9], [0.1, 0.05, -0.3]])
    y = lowbit.quantize(x, "ternary", threshold=0.25, scaling_factor=True, axis=0)
    assert_near(y, t([[0.0, 0.8, -0.8], [0.0, 0.0, -0.3]]))


# ---- special values ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params", [{}, {"scaling_factor": True}, {"threshold": 0.1}, {"axis": 0, "scaling_factor": True}]
)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 2, 2, 2)], ids=str)
def test_zero_tensors_give_zeros(params, shape):
    y = lowbit.quantize(torch.zeros(shape), "ternary", **params)
    assert torch.isfinite(y).all() and (y == 0).all()


def test_zero_row_among_others_per_axis():
    x = t([[0.0, 0.0, 0.0], [1.0, -2.0, 0.1]])
    assert_near(lowbit.quantize(x, "ternary", axis=0, scaling_factor=True), t([[0.0, 0, 0], [1.5, -1.5, 0]]))


def test_nan_stays_nan_and_counts_as_zero():
    x = t([NAN, 1.0, -2.0, 0.2])  # delta = 0.75 * 3.2 / 4 = 0.6, as with a 0 in place of the NaN
    expected = t([NAN, 1.5, -1.5, 0.0])
    assert_near(lowbit.quantize(x, "ternary", scaling_factor=True), expected)
    assert_near(lowbit.quantize(t([0.0, 1.0, -2.0, 0.2]), "ternary", scaling_factor=True)[1:], expected[1:])


def test_infinities_become_plus_minus_alpha():
    x = t([INF, -INF, 1.0, -3.0, 0.0, 0.0])  # delta = 0.75 * 4 / 4 (finite ones only) = 0.75, alpha: 2
    assert_near(lowbit.quantize(x, "ternary", scaling_factor=True), t([2.0, -2.0, 2.0, -2.0, 0, 0]))
    assert_same(lowbit.quantize(x, "ternary"), t([1.0, -1.0, 1.0, -1.0, 0, 0]))
    only_infinite = lowbit.quantize(t([INF, 0.0]), "ternary", scaling_factor=True)
    assert torch.isfinite(only_infinite).all()


# ---- any rank, dtype, idempotence ----------------------------------------------------------------------
def reference_twn(x: torch.Tensor, scaled: bool, axis: int | None) -> torch.Tensor:
    """Slow reference in Python floats, one group (per tensor or per index of ``axis``) at a time."""
    per_tensor = axis is None or x.dim() == 0
    moved = x.double().reshape(1, -1) if per_tensor else x.double().movedim(axis, 0)
    out = torch.empty_like(moved.reshape(moved.shape[0], -1))
    for index, row in enumerate(moved.reshape(moved.shape[0], -1).tolist()):
        delta = 0.75 * sum(abs(v) for v in row) / len(row)
        above = [abs(v) for v in row if abs(v) > delta]
        alpha = sum(above) / len(above) if scaled and above else (1.0 if not scaled else 0.0)
        values = [alpha if v > delta else -alpha if v < -delta else 0.0 for v in row]
        out[index] = torch.tensor(values, dtype=torch.float64)
    return out.reshape(moved.shape if not per_tensor else x.shape).movedim(0, axis if not per_tensor else 0)


@pytest.mark.parametrize("shape", [(), (1,), (9,), (3, 4), (2, 3, 4), (2, 3, 2, 2)], ids=str)
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled"])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_any_rank_matches_reference(shape, scaled, axis):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape) + 1), dtype=torch.float64)
    y = lowbit.quantize(x, "ternary", scaling_factor=scaled, axis=axis)
    expected = reference_twn(x, scaled, axis).reshape(shape)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0, 2)], ids=str)
def test_empty(shape):
    y = lowbit.quantize(torch.empty(shape, dtype=torch.bfloat16), "ternary", scaling_factor=True, axis=0)
    assert y.shape == shape and y.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "params", [{}, {"scaling_factor": True}, {"scaling_factor": True, "axis": 1}, {"threshold": 0.7},
               {"threshold": 0.7, "scaling_factor": True, "axis": 0}, {"median": 0.3, "scaling_factor": True}],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_idempotent_and_keeps_dtype(params, dtype):
    x = torch.randn(6, 7, 3, generator=torch.Generator().manual_seed(2)).to(dtype) * 2
    spec = Ternary(**params)
    once = spec(x)
    assert once.dtype == dtype and once.shape == x.shape
    assert_same(spec(once), once)


def test_unscaled_threshold_of_one_or_more_is_a_threshold_not_a_rounding():
    # Documented limitation: +-1 themselves fall below such a threshold.
    spec = Ternary(threshold=1.5)
    once = spec(t([3.0, -2.0, 0.5]))
    assert_same(once, t([1.0, -1.0, 0.0]))
    assert_same(spec(once), t([0.0, 0.0, 0.0]))


def test_value_set_and_bits():
    assert_same(Ternary().value_set(), t([-1.0, 0.0, 1.0], torch.float64))
    assert_same(Ternary(threshold=0.3)(Ternary().value_set()), Ternary().value_set())
    assert Ternary(scaling_factor=True).value_set() is None
    assert Ternary().bits == 2


# ---- parameters ----------------------------------------------------------------------------------------
def test_mase_values_are_normalised():
    spec = Ternary(scaling_factor=1, mean="NA", median="na", max="None", threshold="NA")
    assert spec.scaling_factor is True
    assert (spec.mean, spec.median, spec.max, spec.threshold) == (None, None, None, None)
    assert Ternary(median=1).median == 1.0 and isinstance(Ternary(median=1).median, float)


@pytest.mark.parametrize(
    "params,name",
    [
        ({"width": 3}, "width"),
        ({"scaling_factor": 2}, "scaling_factor"),
        ({"threshold": "big"}, "threshold"),
        ({"threshold": INF}, "threshold"),
        ({"mean": NAN}, "mean"),
        ({"median": [0.1]}, "median"),
        ({"max": True}, "max"),
        ({"axis": 1.5}, "axis"),
        ({"rounding": "stochastic"}, "rounding"),
        ({"maximum": 1.0}, "maximum"),
    ],
)
def test_bad_parameters_name_the_parameter(params, name):
    with pytest.raises(FormatError, match=name):
        lowbit.get_format("ternary").create(**params)


def test_axis_out_of_range_is_a_format_error():
    with pytest.raises(FormatError, match="axis"):
        lowbit.quantize(torch.ones(2, 3), "ternary", axis=-3)


def test_bits_per_element_counts_the_scales():
    from lowbit.formats import Ternary

    assert Ternary().bits_per_element((64, 32)) == 2.0
    assert Ternary(scaling_factor=True).bits_per_element((64, 32)) == 2 + 32 / (64 * 32)
    assert Ternary(scaling_factor=True, axis=0).bits_per_element((64, 32)) == 2 + 32 / 32
