"""Tests of the integer / fixed formats: y = clamp(round(x * 2^f), q_min, q_max) / 2^f."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit import FormatError
from lowbit.formats import Fixed, Integer
from lowbit.formats.rounding import ROUNDING_MODES

from helpers import DETERMINISTIC, FLOATS32, code_limits, equal_with_nan, reference_round


def reference_quantize(x: torch.Tensor, width: int, frac_width: int, signed: bool, mode: str) -> torch.Tensor:
    """Elementwise exact model: NaN stays, +-inf saturate, everything else rounds then clamps."""
    q_min, q_max = code_limits(width, signed)
    out = []
    for value in x.tolist():
        if math.isnan(value):
            out.append(value)
            continue
        if math.isinf(value):
            code = q_max if value > 0 else q_min
        else:
            code = min(max(reference_round(Fraction(value) * Fraction(2) ** frac_width, mode), q_min), q_max)
        out.append(math.ldexp(code, -frac_width))
    return torch.tensor(out, dtype=torch.float64).to(x.dtype)


# ---- MASE's verified examples (mase-behaviour.md 2.0 / 2.1) ------------------------------------------------
def test_mase_round_half_to_even_examples():
    out = lowbit.quantize(torch.tensor([0.125, 0.375, 0.625]), "integer", width=4, frac_width=2)
    assert out.tolist() == [0.0, 0.5, 0.5]


def test_mase_width8_frac3_examples():
    x = torch.tensor([-3.0, -0.3125, 7.9, 100.0, 0.0625])
    for name in ("integer", "fixed"):
        assert lowbit.quantize(x, name, width=8, frac_width=3).tolist() == [-3.0, -0.25, 7.875, 15.875, 0.0]


def test_frac_width_larger_than_width():
    spec = Integer(width=8, frac_width=9)  # all values below 1/4 in magnitude, step 2^-9
    x = torch.tensor([0.001, 0.3, -0.26, 0.1, -1.0])
    assert spec.quantize(x).tolist() == [1 / 512, 127 / 512, -128 / 512, 51 / 512, -128 / 512]
    assert spec.value_set()[-1].item() == 127 / 512


def test_negative_frac_width():
    spec = Integer(width=4, frac_width=-2)  # steps of 4, codes [-8, 7] -> values [-32, 28]
    x = torch.tensor([5.9, 6.0, 10.0, -33.0, 1000.0, 1.9])
    assert spec.quantize(x).tolist() == [4.0, 8.0, 8.0, -32.0, 28.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_directed_modes_see_values_that_underflow_when_scaled(dtype):
    """With frac_width < 0, x * 2^f can flush a tiny x to zero; its side of zero must still count."""
    tiny = torch.finfo(dtype).smallest_normal * 2**-10  # a subnormal
    x = torch.tensor([tiny, -tiny], dtype=dtype)
    expected = {"away_from_zero": [4.0, -4.0], "up": [4.0, 0.0], "down": [0.0, -4.0], "toward_zero": [0.0, 0.0],
                "nearest_even": [0.0, 0.0], "nearest_away": [0.0, 0.0]}  # fmt: skip
    for mode, values in expected.items():
        assert Integer(width=8, frac_width=-2, rounding=mode)(x).tolist() == values, mode


def test_api_example_deterministic():
    x = torch.tensor([0.03, 0.09, -0.09, 1.53125, -8.5, 7.96875, 7.97, 100.0, -float("inf"), float("nan")])
    out = lowbit.quantize(x, "integer", width=8, frac_width=4)
    expected = [0.0, 0.0625, -0.0625, 1.5, -8.0, 8.0 - 1 / 16, 8.0 - 1 / 16, 8.0 - 1 / 16, -8.0]
    assert out[:-1].tolist() == expected and math.isnan(out[-1].item())


def test_api_example_stochastic_draws_one_uniform_per_element():
    """seed=s means torch.Generator().manual_seed(s); up with probability frac, one draw per element."""
    x = torch.linspace(-9, 9, 101)
    out = lowbit.quantize(x, "integer", width=8, frac_width=4, rounding="stochastic", seed=0)
    scaled = x * 16
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(0))
    expected = (torch.floor(scaled) + (noise < scaled - torch.floor(scaled)).float()).clamp(-128, 127) / 16
    assert torch.equal(out, expected)
    low, high = torch.floor(scaled).clamp(-128, 127) / 16, torch.ceil(scaled).clamp(-128, 127) / 16
    assert torch.all((out == low) | (out == high))


def test_defaults_and_fixed_is_integer():
    assert Integer().width == 8 and Integer().frac_width == 4 and Integer().signed is True
    assert Integer(width=7).frac_width == 3
    assert Integer(width=6, frac_width="NA").frac_width == 3
    assert Integer(width=6, signed=0).signed is False
    assert lowbit.get_format("fixed") is Fixed and issubclass(Fixed, Integer)
    x = torch.randn(500, generator=torch.Generator().manual_seed(0)) * 5
    for mode in ROUNDING_MODES:
        assert torch.equal(Fixed(width=6, frac_width=2, rounding=mode)(x, seed=1),
                           Integer(width=6, frac_width=2, rounding=mode)(x, seed=1))  # fmt: skip
    assert Integer(width=5).bits == 5 and Integer(width=5).bits_per_element((4, 4)) == 5.0


# ---- exhaustive: every representable value, midpoint and quarter point for widths <= 8 ----------------------
FRAC_WIDTHS = (-3, 0, 2, 5, 9, 12)


@functools.lru_cache(maxsize=None)
def exhaustive_grid(width: int, signed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Quarter points t = m / 4 from two codes below to two above the range, and the expected codes."""
    q_min, q_max = code_limits(width, signed)
    quarters = [Fraction(m, 4) for m in range(4 * (q_min - 2), 4 * (q_max + 2) + 1)]
    expected = {
        mode: torch.tensor([min(max(reference_round(t, mode), q_min), q_max) for t in quarters], dtype=torch.float32)
        for mode in DETERMINISTIC
    }
    return torch.tensor([float(t) for t in quarters]), expected


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("width", range(1, 9))
def test_exhaustive_every_mode(width, signed):
    t, expected = exhaustive_grid(width, signed)
    q_min, q_max = code_limits(width, signed)
    for frac_width in FRAC_WIDTHS:
        step = math.ldexp(1.0, -frac_width)
        x = t * step  # exact: a power-of-two scaling of values with few bits
        values = Integer(width=width, frac_width=frac_width, signed=signed).value_set()
        assert values.tolist() == [k * step for k in range(q_min, q_max + 1)]
        for mode in DETERMINISTIC:
            spec = Integer(width=width, frac_width=frac_width, signed=signed, rounding=mode)
            assert torch.equal(spec.quantize(x), expected[mode] * step), (width, signed, frac_width, mode)
            assert torch.equal(spec.quantize(values.float()), values.float())
        stochastic = Integer(width=width, frac_width=frac_width, signed=signed, rounding="stochastic")
        out = stochastic(x.repeat(8), seed=frac_width + 100).reshape(8, -1) / step
        low = torch.floor(t).clamp(q_min, q_max)
        high = torch.ceil(t).clamp(q_min, q_max)
        assert torch.all((out == low) | (out == high))
        assert torch.equal(stochastic(values.float(), seed=0), values.float())


def test_exhaustive_grid_covers_ties_and_saturation():
    """The grid of the exhaustive test really contains ties, non-ties and out-of-range points."""
    t, expected = exhaustive_grid(3, True)
    assert (t == -4.5).any() and (t == 3.5).any() and (t == 0.25).any() and (t == -6.0).any()
    assert expected["nearest_even"][t == 0.5].item() == 0 and expected["nearest_up"][t == 0.5].item() == 1
    assert expected["up"][t == 5.0].item() == 3 and expected["down"][t == -5.75].item() == -4


# ---- against the scalar reference, random inputs ----------------------------------------------------------
CONFIGS = [(8, 4, True), (4, 1, False), (6, 2, True), (8, -2, True), (5, 9, False), (16, 8, True), (3, 0, True)]


@pytest.mark.parametrize("width, frac_width, signed", CONFIGS)
@given(values=st.lists(FLOATS32, min_size=1, max_size=30), mode=st.sampled_from(DETERMINISTIC))
def test_matches_scalar_reference(width, frac_width, signed, values, mode):
    x = torch.tensor(values, dtype=torch.float32)
    spec = Integer(width=width, frac_width=frac_width, signed=signed, rounding=mode)
    assert equal_with_nan(spec.quantize(x), reference_quantize(x, width, frac_width, signed, mode))


# ---- properties --------------------------------------------------------------------------------------------
SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.0e38, -3.0e38, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("width, frac_width, signed", CONFIGS)
@given(values=st.lists(FLOATS32, max_size=30), special=st.lists(st.sampled_from(SPECIAL), max_size=5))
def test_properties(width, frac_width, signed, values, special):
    spec = Integer(width=width, frac_width=frac_width, signed=signed)
    low, high = spec.value_set()[[0, -1]].tolist()
    x = torch.tensor(values + special, dtype=torch.float32)
    out = spec(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out.isnan(), x.isnan())
    assert equal_with_nan(spec(out), out)  # idempotent
    finite = out[~out.isnan()]
    assert torch.all((finite >= low) & (finite <= high))
    assert torch.all(out[x == math.inf] == high) and torch.all(out[x == -math.inf] == low)
    assert torch.equal(finite * 2.0**frac_width, torch.round(finite * 2.0**frac_width))  # on the grid
    ordered = torch.sort(x[~x.isnan()]).values
    assert torch.all(torch.diff(spec(ordered)) >= 0)  # monotonic
    if signed:
        inside = x[x.abs() <= high]
        assert torch.equal(spec(-inside), -spec(inside))  # sign symmetric inside the symmetric range


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes(dtype):
    x = (torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(4)) * 6).to(dtype)
    x[0, 0, :3] = torch.tensor([math.inf, -math.inf, math.nan], dtype=dtype)
    spec = Integer(width=8, frac_width=4)
    out = spec(x)
    assert out.dtype == dtype and out.shape == x.shape
    assert equal_with_nan(out, spec(x.float()).to(dtype))  # every value of the grid is exact in dtype
    assert equal_with_nan(spec(out), out)


def test_float64_is_exact_beyond_float32():
    spec = Integer(width=32, frac_width=0)
    x = torch.tensor([2.0**31 - 1.4, 2.0**30 + 0.5, 1e12, -1e12], dtype=torch.float64)
    assert spec(x).tolist() == [2.0**31 - 1, 2.0**30, 2.0**31 - 1, -(2.0**31)]


def test_empty_zero_dim_and_high_rank():
    spec = Integer(width=4, frac_width=2)
    empty = torch.empty(0, 3)
    assert spec(empty).shape == (0, 3)
    assert spec(torch.tensor(0.3)).shape == () and spec(torch.tensor(0.3)).item() == 0.25
    x = torch.full((2, 1, 3, 1, 2, 2), 0.3)
    assert torch.equal(spec(x), torch.full_like(x, 0.25))


# ---- stochastic rounding ------------------------------------------------------------------------------------
def test_stochastic_is_unbiased():
    draws = 20000
    x = torch.tensor([0.01, 0.3, -0.3, 1.03, -2.97, 5.55, 7.9, -7.9])
    spec = Integer(width=8, frac_width=4, rounding="stochastic")
    out = spec(x.expand(draws, -1).contiguous(), seed=123)
    step = 1 / 16
    frac = x / step - torch.floor(x / step)
    sigma = step * torch.sqrt(frac * (1 - frac) / draws)
    assert torch.all((out.mean(0) - x).abs() <= 5 * sigma)
    nearest = Integer(width=8, frac_width=4)(x)
    assert torch.all((nearest - x).abs() > 5 * sigma)  # the bound would catch a biased rounding


def test_stochastic_seeds_and_generators():
    x = torch.randn(2000, generator=torch.Generator().manual_seed(9)) * 3
    spec = Integer(width=6, frac_width=3, rounding="stochastic")
    assert torch.equal(spec(x, seed=5), spec(x, seed=5))
    assert not torch.equal(spec(x, seed=5), spec(x, seed=6))
    assert torch.equal(spec(x, seed=5), spec(x, generator=torch.Generator().manual_seed(5)))
    gen = torch.Generator().manual_seed(5)
    first, second = spec(x, generator=gen), spec(x, generator=gen)
    assert not torch.equal(first, second)  # a generator advances between calls
    with pytest.raises(FormatError, match="not both"):
        spec(x, seed=1, generator=torch.Generator())


def test_deterministic_modes_ignore_the_seed():
    x = torch.randn(100, generator=torch.Generator().manual_seed(9))
    assert torch.equal(Integer()(x, seed=1), Integer()(x, seed=2))


# ---- bad parameters -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, name",
    [
        ({"width": 0}, "width"),
        ({"width": 33}, "width"),
        ({"width": 1.5}, "width"),
        ({"width": "8"}, "width"),
        ({"width": True}, "width"),
        ({"frac_width": "a"}, "frac_width"),
        ({"frac_width": 65}, "frac_width"),
        ({"frac_width": 2.5}, "frac_width"),
        ({"signed": 2}, "signed"),
        ({"rounding": "nearest_evn"}, "rounding"),
        ({"widht": 4}, "widht"),
    ],
)
def test_bad_parameters_name_the_parameter(params, name):
    with pytest.raises(FormatError, match=name):
        lowbit.quantize(torch.ones(3), "integer", **params)


def test_integral_floats_are_accepted():
    assert Integer(width=8.0, frac_width=-2.0).params() == {"rounding": "nearest_even", "width": 8, "frac_width": -2,
                                                          "signed": True}  # fmt: skip
