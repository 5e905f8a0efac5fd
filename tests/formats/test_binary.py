"""binary (bipolar / unipolar, scaled, stochastic) and binary_residual: numbers, not just "it ran"."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

import lowbit
from lowbit import FormatError
from lowbit.formats import Binary, BinaryResidual

from helpers import assert_near, assert_same, t

NAN, INF = math.nan, math.inf
RANK_SHAPES = [(), (7,), (3, 5), (2, 3, 4), (2, 3, 2, 2)]


# ---- binary: deterministic values -------------------------------------------------------------------
def test_bipolar_is_sign_with_zero_and_negative_zero_positive():
    x = t([-2.0, -0.5, -1e-30, -0.0, 0.0, 0.3, 5.0])
    assert_same(lowbit.quantize(x, "binary"), t([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0]))


def test_unipolar_is_indicator_of_positive():
    x = t([-2.0, -0.5, -0.0, 0.0, 1e-30, 0.3, 5.0])
    assert_same(lowbit.quantize(x, "binary", bipolar=False), t([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]))


def test_nan_stays_nan_and_infinities_take_their_sign():
    x = t([NAN, INF, -INF, 0.5])
    assert_same(lowbit.quantize(x, "binary"), t([NAN, 1.0, -1.0, 1.0]))
    assert_same(lowbit.quantize(x, "binary", bipolar=False), t([NAN, 1.0, 0.0, 1.0]))


def test_scaled_bipolar_per_tensor_uses_mean_abs():
    x = t([1.0, -3.0, 2.0, -2.0])  # mean |x| = 2
    assert_near(lowbit.quantize(x, "binary", scaling_factor=True), t([2.0, -2.0, 2.0, -2.0]))


def test_scaled_bipolar_per_axis():
    x = t([[1.0, -3.0], [0.5, 0.5]])
    rows = lowbit.quantize(x, "binary", scaling_factor=True, axis=0)  # alphas 2, 0.5
    assert_near(rows, t([[2.0, -2.0], [0.5, 0.5]]))
    columns = lowbit.quantize(x, "binary", scaling_factor=True, axis=1)  # alphas 0.75, 1.75
    assert_near(columns, t([[0.75, -1.75], [0.75, 1.75]]))
    assert_near(lowbit.quantize(x, "binary", scaling_factor=True, axis=-1), columns)


def test_scaled_unipolar_uses_mean_of_positive_values():
    x = t([[1.0, -3.0, 2.0, 0.0], [-1.0, -1.0, -0.5, 0.0]])
    assert_near(lowbit.quantize(x, "binary", bipolar=False, scaling_factor=True), t([[1.5, 0, 1.5, 0], [0, 0, 0, 0]]))
    per_row = lowbit.quantize(x, "binary", bipolar=False, scaling_factor=True, axis=0)
    assert_near(per_row, t([[1.5, 0, 1.5, 0], [0, 0, 0, 0]]))  # a row with no positive value -> zeros


@pytest.mark.parametrize("bipolar", [True, False])
def test_scale_is_the_least_squares_optimum(bipolar):
    x = torch.randn(64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = lowbit.quantize(x, "binary", bipolar=bipolar, scaling_factor=True)
    alpha = y.abs().max()
    signs = y / alpha
    error = lambda a: ((x - a * signs) ** 2).sum()  # noqa: E731
    assert error(alpha) < error(alpha * 1.01) and error(alpha) < error(alpha * 0.99)


def test_scaled_non_finite_elements_are_left_out():
    x = t([NAN, 1.0, -2.0, INF])  # alpha = (1 + 2) / 2: NaN and inf are neither summed nor counted
    y = lowbit.quantize(x, "binary", scaling_factor=True)
    assert_near(y, t([NAN, 1.5, -1.5, 1.5]))
    zeros_instead = lowbit.quantize(t([0.0, 1.0, -2.0, 0.0]), "binary", scaling_factor=True)
    assert_near(zeros_instead[1:3], t([0.75, -0.75]))  # a zero, unlike a NaN or an inf, counts


@pytest.mark.parametrize("params", [{}, {"bipolar": False}, {"axis": 1}, {"bipolar": False, "axis": 0}])
def test_scaled_is_idempotent_with_nan_and_inf(params):
    x = torch.tensor([[1.0, NAN, -3.0, 0.5], [INF, -2.0, NAN, -INF], [0.25, 2.0, 1.5, -0.0]])
    once = lowbit.quantize(x, "binary", scaling_factor=True, **params)
    twice = lowbit.quantize(once, "binary", scaling_factor=True, **params)
    assert torch.equal(torch.isnan(once), torch.isnan(x))
    assert torch.equal(once.nan_to_num(7.0), twice.nan_to_num(7.0))  # bit for bit, NaN where x had NaN


@pytest.mark.parametrize("params", [{"scaling_factor": True}, {"scaling_factor": True, "axis": 1}])
def test_scaled_all_zero_gives_zeros(params):
    y = lowbit.quantize(torch.zeros(3, 4), "binary", **params)
    assert torch.isfinite(y).all() and (y == 0).all()


# ---- binary: any rank ----------------------------------------------------------------------------------
def reference_binary(x: torch.Tensor, bipolar: bool, scaled: bool, axis: int | None) -> torch.Tensor:
    """Slow reference: per-group alpha computed element by element in Python floats."""
    per_tensor = axis is None or x.dim() == 0
    moved = x.double().reshape(1, -1) if per_tensor else x.double().movedim(axis, 0)
    flat = moved.reshape(moved.shape[0], -1)
    out = torch.empty_like(flat)
    for row_index, row in enumerate(flat.tolist()):
        if not scaled:
            alpha = 1.0
        elif bipolar:
            alpha = sum(abs(v) for v in row) / len(row)
        else:
            positive = [v for v in row if v > 0]
            alpha = sum(positive) / len(positive) if positive else 0.0
        for i, v in enumerate(row):
            high = v >= 0 if bipolar else v > 0
            out[row_index, i] = alpha if high else (-alpha if bipolar else 0.0)
    if per_tensor:
        return out.reshape(x.shape).to(x.dtype)
    return out.reshape(moved.shape).movedim(0, axis).to(x.dtype)


@pytest.mark.parametrize("shape", RANK_SHAPES, ids=str)
@pytest.mark.parametrize("bipolar", [True, False], ids=["bipolar", "unipolar"])
@pytest.mark.parametrize("scaled,axis", [(False, None), (True, None), (True, 0)], ids=["unscaled", "tensor", "axis0"])
def test_any_rank_matches_reference(shape, bipolar, scaled, axis):
    # MASE crashes on 2-D with bipolar=False (its scale is hard-wired to 4-D); every rank works here.
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)), dtype=torch.float64)
    y = lowbit.quantize(x, "binary", bipolar=bipolar, scaling_factor=scaled, axis=axis)
    torch.testing.assert_close(y, reference_binary(x, bipolar, scaled, axis), rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)], ids=str)
@pytest.mark.parametrize("params", [{}, {"scaling_factor": True, "axis": 0}, {"stochastic": True}])
def test_empty_tensors(shape, params):
    y = lowbit.quantize(torch.empty(shape, dtype=torch.float16), "binary", **params)
    assert y.shape == shape and y.dtype == torch.float16


def test_half_precision_keeps_dtype_and_values():
    x = torch.tensor([-0.3, 0.0, 2.0, -7.0], dtype=torch.bfloat16)
    assert_same(lowbit.quantize(x, "binary"), torch.tensor([-1.0, 1.0, 1.0, -1.0], dtype=torch.bfloat16))
    y = lowbit.quantize(x.half(), "binary", scaling_factor=True)
    alpha = x.float().abs().mean().half()  # computed in float32, rounded once to float16
    assert_same(y, torch.stack([-alpha, alpha, alpha, -alpha]))


# ---- binary: value set and idempotence -----------------------------------------------------------------
def test_value_set():
    assert_same(Binary().value_set(), t([-1.0, 1.0], torch.float64))
    assert_same(Binary(bipolar=False).value_set(), t([0.0, 1.0], torch.float64))
    assert Binary(scaling_factor=True).value_set() is None
    for spec in (Binary(), Binary(bipolar=False)):
        values = spec.value_set()
        assert_same(spec(values), values)
    assert Binary().bits == 1 and Binary(scaling_factor=True).bits_per_element() == 1.0


@pytest.mark.parametrize("bipolar", [True, False])
@pytest.mark.parametrize("scaled,axis", [(False, None), (True, None), (True, 0), (True, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_idempotent(bipolar, scaled, axis, dtype):
    x = (torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(9)) * 3).to(dtype)
    spec = Binary(bipolar=bipolar, scaling_factor=scaled, axis=axis)
    once = spec(x)
    assert_same(spec(once), once)


# ---- binary: parameters ---------------------------------------------------------------------------------
def test_mase_zero_one_ints_are_bools():
    spec = Binary(bipolar=0, stochastic=1, scaling_factor=0)
    assert (spec.bipolar, spec.stochastic, spec.scaling_factor) == (False, True, False)
    assert spec.rounding == "stochastic"
    assert Binary(bipolar=1).bipolar is True


@pytest.mark.parametrize(
    "params,name",
    [
        ({"width": 2}, "width"),
        ({"bipolar": 2}, "bipolar"),
        ({"bipolar": "yes"}, "bipolar"),
        ({"stochastic": 0.5}, "stochastic"),
        ({"scaling_factor": -1}, "scaling_factor"),
        ({"axis": 1.5}, "axis"),
        ({"rounding": "up"}, "rounding"),
        ({"bipolr": True}, "bipolr"),
    ],
)
def test_bad_parameters_name_the_parameter(params, name):
    with pytest.raises(FormatError, match=name):
        lowbit.get_format("binary").create(**params)


def test_axis_out_of_range_is_a_format_error():
    with pytest.raises(FormatError, match="axis"):
        lowbit.quantize(torch.ones(2, 3), "binary", scaling_factor=True, axis=2)


# ---- binary: stochastic ---------------------------------------------------------------------------------
def test_stochastic_flag_and_rounding_mode_are_the_same_format():
    by_flag, by_mode = Binary(stochastic=True), Binary(rounding="stochastic")
    assert by_flag == by_mode and by_flag.is_stochastic
    x = torch.linspace(-1, 1, 101)
    assert_same(by_flag(x, seed=5), by_mode(x, seed=5))


def test_stochastic_is_reproducible_with_seed_or_generator():
    x = torch.linspace(-1, 1, 1000)
    spec = Binary(stochastic=True)
    assert_same(spec(x, seed=7), spec(x, seed=7))
    assert_same(spec(x, generator=torch.Generator().manual_seed(7)), spec(x, seed=7))
    assert not torch.equal(spec(x, seed=7), spec(x, seed=8))
    assert set(spec(x, seed=7).unique().tolist()) == {-1.0, 1.0}


def assert_unbiased(samples: torch.Tensor, x: torch.Tensor, spread: torch.Tensor) -> None:
    """Mean of N draws within 5 standard errors of x: the chance of a false failure is below 1e-6 per point."""
    draws = samples.shape[0]
    bound = 5 * spread / math.sqrt(draws) + 1e-12
    assert ((samples.double().mean(0) - x.double()).abs() <= bound).all()


def test_stochastic_bipolar_is_unbiased():
    x = torch.linspace(-1, 1, 21)
    samples = Binary(stochastic=True)(x.expand(20000, -1).contiguous(), seed=0)
    # Each draw is +-1 with mean x, so its standard deviation is sqrt(1 - x^2).
    assert_unbiased(samples, x, (1 - x.double() ** 2).sqrt())
    assert_same(samples[:, 0], torch.full((20000,), -1.0))
    assert_same(samples[:, -1], torch.ones(20000))


def test_stochastic_unipolar_is_unbiased():
    x = torch.linspace(0, 1, 11)
    samples = Binary(stochastic=True, bipolar=False)(x.expand(20000, -1).contiguous(), seed=1)
    assert_unbiased(samples, x, (x.double() * (1 - x.double())).sqrt())


def test_stochastic_scaled_is_unbiased_inside_alpha():
    row = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0, 0.5, -0.5, 1.5])  # mean |x| = 1.0625
    alpha = row.abs().mean().item()
    samples = Binary(stochastic=True, scaling_factor=True, axis=0)(row.expand(20000, -1).contiguous(), seed=2)
    inside = row.abs() <= alpha
    assert set(samples.abs().unique().tolist()) == {alpha}
    spread = alpha * (1 - (row.double() / alpha) ** 2).clamp(min=0).sqrt()
    assert_unbiased(samples[:, inside], row[inside], spread[inside])
    assert (samples[:, row == 2.0] == alpha).all() and (samples[:, row == -2.0] == -alpha).all()


def test_stochastic_saturates_and_keeps_nan():
    x = t([3.0, -3.0, INF, -INF, NAN])
    assert_same(Binary(stochastic=True)(x, seed=0), t([1.0, -1.0, 1.0, -1.0, NAN]))
    assert_same(Binary(stochastic=True, bipolar=False)(x, seed=0), t([1.0, 0.0, 1.0, 0.0, NAN]))


# ---- binary_residual ------------------------------------------------------------------------------------
def greedy_residual_sign(value: Fraction, means: list[Fraction]) -> Fraction:
    """MASE's residual sign in exact rationals, sign(0) = +1: r = x; s_l = sign(r) m_l; r -= s_l."""
    residual, total = value, Fraction(0)
    for magnitude in means:
        level = magnitude if residual >= 0 else -magnitude
        total, residual = total + level, residual - level
    return total


def default_means(levels: int) -> list[Fraction]:
    total = levels * (levels + 1) // 2
    return [Fraction(levels - i, total) for i in range(levels)]


def test_residual_mase_example_levels_2():
    # MASE (verified): 0.5 -> levels [0.667, -0.333], summed 0.333.
    spec = BinaryResidual(levels=2)
    assert spec.means == pytest.approx((2 / 3, 1 / 3), rel=1e-15)
    y = spec(t([0.5], torch.float64))
    assert y.item() == pytest.approx(2 / 3 - 1 / 3, rel=1e-15)


@pytest.mark.parametrize("levels", range(1, 9))
def test_residual_equals_greedy_residual_sign_for_default_means(levels):
    means = default_means(levels)
    x = torch.cat([torch.linspace(-1.3, 1.3, 2001, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])
    y = BinaryResidual(levels=levels)(x)
    total = levels * (levels + 1) // 2  # values and midpoints are all multiples of 1 / total
    for value, got in zip(x.tolist(), y.tolist()):
        if abs(value * total - round(value * total)) > 1e-9:  # at a midpoint float rounding decides
            assert got == pytest.approx(float(greedy_residual_sign(Fraction(value), means)), abs=1e-15)


@pytest.mark.parametrize("levels,size", [(1, 2), (2, 4), (3, 7), (4, 11), (8, 37)])
def test_residual_default_value_set_is_uniform_grid(levels, size):
    values = BinaryResidual(levels=levels).value_set()
    total = levels * (levels + 1) // 2
    expected = torch.tensor([k / total for k in range(-total, total + 1, 2)], dtype=torch.float64)
    assert values.numel() == size
    assert (size == 2**levels) == (levels <= 2)
    torch.testing.assert_close(values, expected, rtol=0, atol=1e-15)
    assert (values == -values.flip(0)).all()  # exactly sign-symmetric
    if total % 2 == 0:
        assert (values == 0).any()  # 1/2 - 1/3 - 1/6 must be the value zero, not 2.8e-17


@pytest.mark.parametrize("means", [(4 / 7, 2 / 7, 1 / 7), (1.0, 0.8, 0.6), (0.3, 0.5), (1.0, 0.25, 0.1, 0.05)])
def test_residual_value_set_has_2_to_the_levels_values_when_sums_are_distinct(means):
    spec = BinaryResidual(levels=len(means), means=means)
    values = spec.value_set()
    assert values.numel() == 2 ** len(means)
    sums = sorted(sum(s * m for s, m in zip(signs, means)) for signs in itertools.product((-1, 1), repeat=len(means)))
    torch.testing.assert_close(values, torch.tensor(sums, dtype=torch.float64), rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "spec",
    [BinaryResidual(levels=n) for n in range(1, 9)] + [BinaryResidual(levels=3, means=(1.0, 0.8, 0.6))],
    ids=lambda s: s.describe(),
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_residual_every_value_maps_to_itself(spec, dtype):
    values = spec.value_set().to(dtype)
    assert_same(spec(values), values)
    assert (spec.value_set().diff() > 0).all()


def test_residual_is_nearest_for_any_magnitudes():
    # (1, 0.8, 0.6): the greedy residual sign sends -0.4 to -0.8; the nearest value is -0.4 itself.
    spec = BinaryResidual(levels=3, means=(1.0, 0.8, 0.6))
    x = torch.rand(500, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 6 - 3
    values = spec.value_set()
    nearest_distance = (x[:, None] - values[None, :]).abs().min(1).values
    assert_same((spec(x) - x).abs(), nearest_distance)
    assert spec(t([-0.4], torch.float64)).item() == pytest.approx(-0.4, abs=1e-15)


def test_residual_ties_go_away_from_zero_saturates_and_keeps_nan():
    spec = BinaryResidual(levels=2)  # values +-1/3, +-1: 0 lies exactly between -1/3 and 1/3
    y = spec(t([0.0, -0.0, 10.0, -10.0, INF, -INF, NAN, 2 / 3, -2 / 3], torch.float64))
    third = float(Fraction(1, 3))  # 2/3 in float64 lies below the exact midpoint of the float64 grid values
    assert_same(y, t([1 / 3, -1 / 3, 1.0, -1.0, 1.0, -1.0, NAN, third, -third], torch.float64))
    assert_same(BinaryResidual(levels=3)(t([0.5, -0.5])), t([2 / 3, -2 / 3]))  # exact ties: away from zero


@pytest.mark.parametrize("shape", RANK_SHAPES + [(0,), (3, 0)], ids=str)
def test_residual_any_rank(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    y = lowbit.quantize(x, "binary_residual", levels=2)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.isin(y, BinaryResidual(levels=2).value_set().float()).all()


def test_residual_parameters():
    assert BinaryResidual(levels=3, means="NA").means == BinaryResidual(levels=3).means
    assert BinaryResidual(levels=2, means=[0.6, 0.2]).means == (0.6, 0.2)
    assert BinaryResidual(levels=2, means=torch.tensor([0.5, 0.25])).means == (0.5, 0.25)
    assert BinaryResidual(levels=5).bits == 5


@pytest.mark.parametrize(
    "params,name",
    [
        ({"levels": 2, "means": (0.5,)}, "means"),
        ({"levels": 2, "means": (0.5, 0.0)}, "means"),
        ({"levels": 2, "means": (0.5, -0.1)}, "means"),
        ({"levels": 2, "means": (0.5, NAN)}, "means"),
        ({"levels": 2, "means": (INF, 0.5)}, "means"),
        ({"levels": 2, "means": "ab"}, "means"),
        ({"levels": 1, "means": 0.5}, "means"),
        ({"levels": 0}, "levels"),
        ({"levels": 9}, "levels"),
        ({"levels": 2.5}, "levels"),
        ({"width": 2}, "width"),
        ({"rounding": "stochastic"}, "rounding"),
    ],
)
def test_residual_bad_parameters(params, name):
    with pytest.raises(FormatError, match=name):
        BinaryResidual(**params)


def test_bits_per_element_counts_the_scales():
    from lowbit.formats import Binary

    assert Binary().bits_per_element((10, 8)) == 1.0
    assert Binary(scaling_factor=True).bits_per_element((10, 8)) == 1 + 32 / 80
    assert Binary(scaling_factor=True, axis=1).bits_per_element((10, 8)) == 1 + 32 * 8 / 80


def test_residual_issue_examples():
    spec = BinaryResidual(levels=3)
    x = torch.tensor([-0.166666672, 0.166666672], dtype=torch.float32)  # just past -1/6 and 1/6 (float32)
    assert spec(x).tolist() == [torch.tensor(-1 / 3).item(), torch.tensor(1 / 3).item()]


def test_residual_issue_example_levels_3_float32():
    spec = BinaryResidual(levels=3)
    x = torch.tensor([0.83333337, -0.83333337], dtype=torch.float32)
    assert spec(x).tolist() == [1.0, -1.0]
