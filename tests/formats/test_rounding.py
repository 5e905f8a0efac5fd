"""Tests of lowbit.formats.rounding: the ten rounding modes, their aliases, and seeded stochastic rounding."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit import FormatError
from lowbit.formats.rounding import (
    ROUNDING_ALIASES,
    ROUNDING_MODES,
    canonical_rounding,
    make_generator,
    round_to_integer,
    stochastic_round,
)

from helpers import DETERMINISTIC, reference_round

NEAREST = [mode for mode in DETERMINISTIC if mode.startswith("nearest")]


def reference_tensor(x: torch.Tensor, mode: str) -> torch.Tensor:
    """reference_round elementwise; NaN and +-inf pass through, zero results carry the input's sign."""
    out = []
    for value in x.tolist():
        if not math.isfinite(value):
            out.append(value)
        else:
            out.append(math.copysign(float(reference_round(Fraction(value), mode)), value))
    return torch.tensor(out, dtype=x.dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, equal NaN positions and equal signs of zero."""
    return (
        a.dtype == b.dtype
        and torch.equal(torch.isnan(a), torch.isnan(b))
        and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
        and torch.equal(torch.signbit(a), torch.signbit(b))
    )


F32_BELOW_HALF = float(np.nextafter(np.float32(0.5), np.float32(0)))  # 0.49999997
F32_ABOVE_HALF = float(np.nextafter(np.float32(0.5), np.float32(1)))  # 0.50000006
BIG_TIE = 2.0**23 - 0.5  # the largest float32 tie: 8388607.5 (odd lower neighbour)
INF, NAN = math.inf, math.nan

# (value, results in DETERMINISTIC order) -- a list, since 0.0 and -0.0 would collide as dict keys:
# nearest_even, nearest_away, nearest_toward_zero, nearest_up, nearest_down, toward_zero, away_from_zero, up, down
HAND_TABLE = [
    (0.5, (0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0)),
    (-0.5, (-0.0, -1.0, -0.0, -0.0, -1.0, -0.0, -1.0, -0.0, -1.0)),
    (1.5, (2.0, 2.0, 1.0, 2.0, 1.0, 1.0, 2.0, 2.0, 1.0)),
    (-1.5, (-2.0, -2.0, -1.0, -1.0, -2.0, -1.0, -2.0, -1.0, -2.0)),
    (2.5, (2.0, 3.0, 2.0, 3.0, 2.0, 2.0, 3.0, 3.0, 2.0)),
    (-2.5, (-2.0, -3.0, -2.0, -2.0, -3.0, -2.0, -3.0, -2.0, -3.0)),
    (F32_BELOW_HALF, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0)),
    (-F32_BELOW_HALF, (-0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -1.0, -0.0, -1.0)),
    (F32_ABOVE_HALF, (1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0)),
    (-F32_ABOVE_HALF, (-1.0, -1.0, -1.0, -1.0, -1.0, -0.0, -1.0, -0.0, -1.0)),
    (1.25, (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 1.0)),
    (-1.75, (-2.0, -2.0, -2.0, -2.0, -2.0, -1.0, -2.0, -1.0, -2.0)),
    (-0.25, (-0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -1.0, -0.0, -1.0)),
    (BIG_TIE, (2.0**23, 2.0**23, BIG_TIE - 0.5, 2.0**23, BIG_TIE - 0.5, BIG_TIE - 0.5, 2.0**23, 2.0**23,
               BIG_TIE - 0.5)),
    (-BIG_TIE, (-(2.0**23), -(2.0**23), 0.5 - BIG_TIE, 0.5 - BIG_TIE, -(2.0**23), 0.5 - BIG_TIE, -(2.0**23),
               0.5 - BIG_TIE, -(2.0**23))),
    (2.0**23 + 1, (2.0**23 + 1,) * 9),
    (-(2.0**24), (-(2.0**24),) * 9),
    (1e30, (1e30,) * 9),
    (0.0, (0.0,) * 9),
    (-0.0, (-0.0,) * 9),
    (INF, (INF,) * 9),
    (-INF, (-INF,) * 9),
    (NAN, (NAN,) * 9),
]  # fmt: skip
HAND_VALUES = [value for value, _ in HAND_TABLE]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_hand_table(mode, dtype):
    column = DETERMINISTIC.index(mode)
    x = torch.tensor(HAND_VALUES, dtype=dtype)
    expected = torch.tensor([row[column] for _, row in HAND_TABLE], dtype=dtype)
    assert same(round_to_integer(x, mode), expected), (mode, round_to_integer(x, mode), expected)


@pytest.mark.parametrize("mode", NEAREST)
def test_float64_value_just_below_half_rounds_to_zero(mode):
    below = math.nextafter(0.5, 0.0)  # 0.49999999999999994
    x = torch.tensor([below, -below, math.nextafter(1.5, 0.0), -math.nextafter(1.5, 0.0)], dtype=torch.float64)
    assert round_to_integer(x, mode).tolist() == [0.0, -0.0, 1.0, -1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_every_tie_and_its_neighbours_match_the_reference(mode, dtype):
    ties = torch.arange(-2000, 2000, dtype=dtype) + 0.5
    x = torch.cat([ties, torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1), ties - 0.5])
    assert same(round_to_integer(x, mode), reference_tensor(x, mode))


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_result_is_an_integer_neighbour(mode):
    x = torch.randn(5000, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 100
    out = round_to_integer(x, mode)
    assert torch.equal(out, torch.round(out))
    assert torch.all((out == torch.floor(x)) | (out == torch.ceil(x)))


@pytest.mark.parametrize("mode", DETERMINISTIC)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=40))
def test_float32_matches_scalar_reference(mode, values):
    x = torch.tensor(values, dtype=torch.float32)
    assert same(round_to_integer(x, mode), reference_tensor(x, mode))


@pytest.mark.parametrize(
    "mode", ["nearest_even", "nearest_away", "nearest_toward_zero", "toward_zero", "away_from_zero"]
)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=True), min_size=1, max_size=40))
def test_symmetric_modes_are_sign_symmetric(mode, values):
    x = torch.tensor(values, dtype=torch.float64)
    assert same(round_to_integer(-x, mode), -round_to_integer(x, mode))


def test_up_and_down_mirror_each_other():
    x = torch.tensor(HAND_VALUES, dtype=torch.float32)
    x = x[~torch.isnan(x)]
    assert same(round_to_integer(-x, "up"), -round_to_integer(x, "down"))
    assert same(round_to_integer(-x, "nearest_up"), -round_to_integer(x, "nearest_down"))


# ---- stochastic -------------------------------------------------------------------------------------------
def test_stochastic_lands_on_a_neighbour_and_keeps_specials():
    gen = torch.Generator().manual_seed(0)
    x = torch.tensor([0.5, -0.5, 1.25, -2.75, F32_BELOW_HALF, -F32_BELOW_HALF, 3.0, -0.0, 0.0, INF, -INF, NAN])
    draws = torch.stack([stochastic_round(x, gen) for _ in range(2000)])  # [2000, 12]
    finite = x[:-1]
    assert torch.all((draws[:, :-1] == torch.floor(finite)) | (draws[:, :-1] == torch.ceil(finite)))
    assert torch.isnan(draws[:, -1]).all()
    for column in range(6):  # the non-integers: both neighbours occur
        assert (draws[:, column] == torch.floor(x[column])).any() and (draws[:, column] == torch.ceil(x[column])).any()
    assert torch.equal(draws[:, 6], torch.full((2000,), 3.0))
    assert torch.signbit(draws[:, 7]).all() and not torch.signbit(draws[:, 8]).any()
    assert torch.signbit(draws[draws[:, 1] == 0, 1]).all()  # -0.5 rounded up to zero is -0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stochastic_is_unbiased(dtype):
    """P(round up) = frac(x): the mean of N draws stays within 5 standard errors of x."""
    draws = 20000
    x = torch.tensor([0.1, 0.5, -0.3, 2.9, -7.25, 100.01, 0.02], dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    out = stochastic_round(x.expand(draws, -1).contiguous(), gen)
    frac = x - torch.floor(x)
    sigma = torch.sqrt(frac * (1 - frac) / draws)
    assert torch.all((out.mean(0) - x).abs() <= 5 * sigma + 1e-9)
    # The bound is tight enough to catch a biased rounding (nearest would miss every non-tie).
    assert torch.all((torch.round(x) - x).abs()[frac != 0.5] > 5 * sigma[frac != 0.5])


def test_stochastic_is_reproducible_with_a_generator():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 4
    first = round_to_integer(x, "stochastic", torch.Generator().manual_seed(7))
    again = round_to_integer(x, "stochastic", torch.Generator().manual_seed(7))
    other = round_to_integer(x, "stochastic", torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_stochastic_without_generator_uses_the_global_rng():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 4
    torch.manual_seed(11)
    first = round_to_integer(x, "stochastic")
    torch.manual_seed(11)
    assert torch.equal(first, round_to_integer(x, "stochastic"))


# ---- names ------------------------------------------------------------------------------------------------
NGRAPH_NAMES = {
    "ROUND_NEAREST_TOWARD_EVEN": "nearest_even",
    "ROUND_NEAREST_TOWARD_INFINITY": "nearest_away",
    "ROUND_NEAREST_TOWARD_ZERO": "nearest_toward_zero",
    "ROUND_NEAREST_UPWARD": "nearest_up",
    "ROUND_NEAREST_DOWNWARD": "nearest_down",
    "ROUND_TOWARD_ZERO": "toward_zero",
    "ROUND_TOWARD_INFINITY": "away_from_zero",
    "ROUND_UP": "up",
    "ROUND_DOWN": "down",
}


def test_there_are_ten_modes():
    assert len(ROUNDING_MODES) == len(set(ROUNDING_MODES)) == 10
    assert lowbit.ROUNDING_MODES == ROUNDING_MODES


@pytest.mark.parametrize("name, canonical", sorted(NGRAPH_NAMES.items()))
def test_ngraph_names(name, canonical):
    assert canonical_rounding(name) == canonical
    assert canonical_rounding(name.lower()) == canonical
    assert lowbit.formats.Integer(rounding=name).rounding == canonical


def test_every_alias_points_at_a_mode_and_canonical_names_are_fixed_points():
    assert all(target in ROUNDING_MODES for target in ROUNDING_ALIASES.values())
    assert [canonical_rounding(mode) for mode in ROUNDING_MODES] == list(ROUNDING_MODES)
    assert canonical_rounding("  Nearest_Even ") == "nearest_even"
    assert canonical_rounding("floor") == "down" and canonical_rounding("ceil") == "up"


def test_aliases_round_like_their_mode():
    x = torch.tensor(HAND_VALUES, dtype=torch.float32)
    for name, mode in NGRAPH_NAMES.items():
        spec = lowbit.formats.Integer(width=32, frac_width=0, rounding=name)
        assert same(spec.quantize(x[torch.isfinite(x) & (x.abs() < 2**30)]),
                    round_to_integer(x[torch.isfinite(x) & (x.abs() < 2**30)], mode))  # fmt: skip


def test_unknown_mode_names_the_legal_modes_and_the_nearest():
    with pytest.raises(FormatError) as error:
        canonical_rounding("nearest_eve")
    message = str(error.value)
    assert "did you mean 'nearest_even'" in message
    assert all(mode in message for mode in ROUNDING_MODES)
    with pytest.raises(FormatError, match="rounding"):
        lowbit.quantize(torch.ones(2), "integer", rounding="banker")
    with pytest.raises(FormatError, match="legal"):
        canonical_rounding(3)


def test_make_generator():
    gen = torch.Generator()
    assert make_generator(None, gen, torch.device("cpu")) is gen
    assert make_generator(None, None, torch.device("cpu")) is None
    seeded = make_generator(5, None, torch.device("cpu"))
    assert torch.equal(torch.rand(4, generator=seeded), torch.rand(4, generator=torch.Generator().manual_seed(5)))
    for seed in ("1", 1.5, True):
        with pytest.raises(FormatError, match="seed"):
            make_generator(seed, None, torch.device("cpu"))
    with pytest.raises(FormatError, match="not both"):
        make_generator(1, gen, torch.device("cpu"))
