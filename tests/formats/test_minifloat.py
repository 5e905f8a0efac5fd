"""minifloat_ieee / minifloat_denorm, and the exhaustive grid checks of every float format of 8 bits or fewer.

The value sets are checked against independent enumerations (decoding every bit pattern, or the defining
formula), then every value, every midpoint and the quarter points between neighbours are rounded in every
mode and compared with what the mode prescribes. Oracle comparisons with torch / ml_dtypes casts are in
test_ocp_float.py.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit import FormatError
from lowbit.formats import MinifloatDenorm, MinifloatIEEE

DIRECTED = ("up", "down", "toward_zero", "away_from_zero")
NEAREST = ("nearest_even", "nearest_away", "nearest_toward_zero", "nearest_up", "nearest_down")

# (width, exponent_width, exponent_bias) of the grids checked exhaustively; None = default bias.
IEEE_CONFIGS = [(8, 4, 7), (8, 4, None), (8, 5, 15), (8, 3, 2), (7, 4, 10), (6, 3, 3), (6, 3, None), (6, 2, 1),
                (5, 3, -1), (4, 2, 1), (4, 1, None), (5, 4, 7), (3, 2, 1)]  # fmt: skip
DENORM_CONFIGS = [(8, 4, 7), (8, 3, 2), (6, 3, 3), (6, 2, None), (5, 2, 1), (4, 2, 1), (4, 1, 0), (7, 4, -3)]
OCP_SIZES = {"e5m2": 247, "e4m3": 253, "e3m2": 63, "e2m3": 63, "e2m1": 15}


def ieee(width, exponent_width, exponent_bias, **kw):
    return MinifloatIEEE(width=width, exponent_width=exponent_width, exponent_bias=exponent_bias, **kw)


def denorm(width, exponent_width, exponent_bias, **kw):
    return MinifloatDenorm(width=width, exponent_width=exponent_width, exponent_bias=exponent_bias, **kw)


def default_bias(exponent_width, exponent_bias):
    return 2 ** (exponent_width - 1) - 1 if exponent_bias is None else exponent_bias


# ---- independent value-set oracles ----------------------------------------------------------------------
def decode_ieee_all_finite(width, exponent_width, exponent_bias) -> list[float]:
    """Decode every magnitude code: exponent field 0 = subnormal 0.f * 2^(1-B), else 1.f * 2^(field-B)."""
    mantissa = width - exponent_width - 1
    magnitudes = []
    for code in range(2 ** (width - 1)):
        field, fraction = code >> mantissa, code & (2**mantissa - 1)
        if field == 0:
            magnitudes.append(math.ldexp(fraction / 2**mantissa, 1 - exponent_bias))
        else:
            magnitudes.append(math.ldexp(1 + fraction / 2**mantissa, field - exponent_bias))
    return magnitudes


def denorm_definition(width, exponent_width, exponent_bias) -> list[float]:
    """MASE's definition: {2^e * m / 2^M : e in [-B, 2^E-1-B], m in [0, 2^M-1]}."""
    mantissa = width - exponent_width - 1
    exponents = range(-exponent_bias, 2**exponent_width - exponent_bias)
    return [math.ldexp(m / 2**mantissa, e) for e in exponents for m in range(2**mantissa)]


def ocp_finite_values(name) -> list[float]:
    """Every finite value of the dtype, by decoding every bit pattern with torch / ml_dtypes."""
    if name in ("e5m2", "e4m3"):
        dtype = {"e5m2": torch.float8_e5m2, "e4m3": torch.float8_e4m3fn}[name]
        decoded = torch.arange(256, dtype=torch.uint8).view(dtype).double()
        return decoded[torch.isfinite(decoded)].tolist()
    dtype, bits = {"e3m2": (ml_dtypes.float6_e3m2fn, 6), "e2m3": (ml_dtypes.float6_e2m3fn, 6),
                   "e2m1": (ml_dtypes.float4_e2m1fn, 4)}[name]  # fmt: skip
    return np.arange(2**bits, dtype=np.uint8).view(dtype).astype(np.float64).tolist()


def signed_sorted(magnitudes) -> torch.Tensor:
    positive = sorted({abs(v) for v in magnitudes})
    return torch.tensor([-v for v in reversed(positive[1:])] + positive, dtype=torch.float64)


def small_float_cases():
    """(id, spec, oracle value set, fraction bits of the grid) for every float format of <= 8 bits."""
    for w, e, b in IEEE_CONFIGS:
        bias = default_bias(e, b)
        yield f"ieee-{w}-{e}-{b}", ieee(w, e, b), signed_sorted(decode_ieee_all_finite(w, e, bias)), w - e - 1
    for w, e, b in DENORM_CONFIGS:
        bias = default_bias(e, b)
        yield f"denorm-{w}-{e}-{b}", denorm(w, e, b), signed_sorted(denorm_definition(w, e, bias)), w - e - 2
    for name, fraction_bits in (("e5m2", 2), ("e4m3", 3), ("e3m2", 2), ("e2m3", 3), ("e2m1", 1)):
        yield name, lowbit.get_format(name)(), signed_sorted(ocp_finite_values(name)), fraction_bits


SMALL_CASES = list(small_float_cases())
SMALL_IDS = [case[0] for case in SMALL_CASES]


# ---- value sets -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("case_id", "spec", "oracle", "fraction_bits"), SMALL_CASES, ids=SMALL_IDS)
def test_value_set_equals_independent_enumeration(case_id, spec, oracle, fraction_bits):
    values = spec.value_set()
    assert values.dtype == torch.float64
    assert torch.equal(values, oracle)
    assert bool((values[1:] > values[:-1]).all())  # sorted, no duplicates, a single zero
    positives = values[values > 0]
    assert spec.max_value == values[-1].item() == -values[0].item()
    assert spec.min_subnormal == positives[0].item()
    assert spec.min_normal == positives[positives >= spec.min_normal][0].item()


@pytest.mark.parametrize(("w", "e", "b"), IEEE_CONFIGS)
def test_ieee_limits_follow_the_formulas(w, e, b):
    spec, m, bias = ieee(w, e, b), w - e - 1, default_bias(e, b)
    assert spec.exponent_bias == bias
    assert spec.value_set().numel() == 2**w - 1
    assert spec.max_value == 2.0 ** (2**e - 1 - bias) * (2 - 2.0**-m)
    assert spec.min_normal == 2.0 ** (1 - bias)
    assert spec.min_subnormal == 2.0 ** (1 - bias - m)
    assert spec.bits == spec.bits_per_element((3, 5)) == w


@pytest.mark.parametrize(("w", "e", "b"), DENORM_CONFIGS)
def test_denorm_limits_follow_the_formulas(w, e, b):
    spec, m, bias = denorm(w, e, b), w - e - 1, default_bias(e, b)
    assert spec.value_set().numel() == 2 * (2**e * 2 ** (m - 1) + 2 ** (m - 1) - 1) + 1
    assert spec.max_value == 2.0 ** (2**e - 1 - bias) * (1 - 2.0**-m)
    assert spec.min_subnormal == 2.0 ** (-bias - m)


def test_documented_sizes_and_limits_of_common_configurations():
    e4m3 = ieee(8, 4, 7)
    assert (e4m3.max_value, e4m3.min_normal, e4m3.min_subnormal) == (480.0, 2.0**-6, 2.0**-9)
    d = denorm(8, 4, 7)
    assert (d.max_value, d.min_subnormal, d.value_set().numel()) == (224.0, 2.0**-10, 135)
    for name, size in OCP_SIZES.items():
        assert lowbit.get_format(name)().value_set().numel() == size


# ---- exhaustive rounding --------------------------------------------------------------------------------
def expected_between(low, high, fraction, mode, fraction_bits, positives):
    """What ``mode`` gives for low + fraction * (high - low), fraction in (0, 1), low and high neighbours."""
    smaller = torch.where(low.abs() < high.abs(), low, high)  # nearer zero
    larger = torch.where(low.abs() < high.abs(), high, low)
    directed = {"up": high, "down": low, "toward_zero": smaller, "away_from_zero": larger}
    if mode in directed:
        return directed[mode]
    if fraction != 0.5:
        return low if fraction < 0.5 else high
    index_of_low = torch.searchsorted(positives, low.abs())
    low_is_even = index_of_low % 2 == 0  # even code = even last mantissa bit (codes of a sign are consecutive)
    even = torch.where(low_is_even, low, high)
    if fraction_bits == 0:  # no mantissa bit to be even: a tie between powers of two goes up in magnitude
        even = torch.where(smaller == 0, smaller, larger)
    ties = {"nearest_even": even, "nearest_up": high, "nearest_down": low, "nearest_away": larger,
            "nearest_toward_zero": smaller}  # fmt: skip
    return ties[mode]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("case_id", "spec", "oracle", "fraction_bits"), SMALL_CASES, ids=SMALL_IDS)
def test_every_value_midpoint_and_quarter_point_rounds_as_the_mode_says(case_id, spec, oracle, fraction_bits, dtype):
    values = oracle
    positives = values[values >= 0]
    low, high = values[:-1], values[1:]
    for mode in (*NEAREST, *DIRECTED, "stochastic"):
        mode_spec = spec.replace(rounding=mode)
        assert torch.equal(mode_spec.quantize(values.to(dtype), None).double(), values), mode
        for fraction in (0.25, 0.5, 0.75):
            points = (low + fraction * (high - low)).to(dtype)
            got = mode_spec.quantize(points, torch.Generator().manual_seed(0)).double()
            if mode == "stochastic":
                assert bool(((got == low) | (got == high)).all())
                continue
            want = expected_between(low, high, fraction, mode, fraction_bits, positives)
            assert torch.equal(got, want), (mode, fraction, points[got != want][:4], got[got != want][:4])


@pytest.mark.parametrize(("case_id", "spec", "oracle", "fraction_bits"), SMALL_CASES, ids=SMALL_IDS)
def test_out_of_range_and_infinities_saturate_in_every_mode(case_id, spec, oracle, fraction_bits):
    top = spec.max_value
    x = torch.tensor([top * 1.01, top * 2.5, 1e30, math.inf], dtype=torch.float64)
    x = torch.cat([x, -x])
    for mode in (*NEAREST, *DIRECTED, "stochastic"):
        got = spec.replace(rounding=mode).quantize(x, torch.Generator().manual_seed(1))
        assert torch.equal(got, top * torch.sign(x)), mode


# ---- MASE's examples, and where we deliberately differ ---------------------------------------------------
def test_ieee_e4m3_examples_including_mantissa_carry():
    spec = ieee(8, 4, 7)
    x = torch.tensor([1.9, 1.95, 0.96875, 7.9, 100.0, 500.0, 2.0**-7, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 5e-9, -0.0])
    want = [1.875, 2.0, 1.0, 8.0, 96.0, 480.0, 2.0**-7, 2.0**-9, 0.0, 2.0**-9, 0.0, -0.0]
    got = spec(x)
    assert got.tolist() == want
    assert torch.signbit(got[-1])  # -0 keeps its sign (MASE's sign(x + 1e-9) would make it +0)


def test_denorm_powers_of_two_are_exact():
    spec = denorm(8, 4, 7)
    x = torch.tensor([1.0, 2.0, 8.0, 0.5, 7.5, 100.0, 224.0, 1e6, 2.0**-10, 2.0**-11])
    assert spec(x).tolist() == [1.0, 2.0, 8.0, 0.5, 8.0, 96.0, 224.0, 224.0, 2.0**-10, 0.0]


def mase_ieee(x: torch.Tensor, w, e, b) -> torch.Tensor:
    """MASE's minifloat_ieee formula in float32 as MASE runs it: no carry, |x| <= 1e-8 passes through."""
    m = w - e - 1
    exponent = torch.floor(torch.log2(x.abs() + 1e-9)).clamp(-b, 2**e - 1 - b)
    mant = x.abs() / 2.0**exponent
    normal_f = torch.round(mant * 2**m - 2**m).clamp(0, 2**m - 1)
    subnormal_f = torch.round(mant * 2**m / 2).clamp(0, 2**m - 1)
    value = torch.where(exponent == -b, 2.0 ** (-b) * 2 * subnormal_f / 2**m, 2.0**exponent * (1 + normal_f / 2**m))
    return torch.where(x.abs() <= 1e-8, x, torch.sign(x + 1e-9) * value)


def mase_denorm(x: torch.Tensor, w, e, b) -> torch.Tensor:
    """MASE's minifloat_denorm formula in float32: powers of two from 2^-5 up lose an ulp."""
    m = w - e - 1
    exponent = torch.ceil(torch.log2(x.abs() + 1e-9)).clamp(-b, 2**e - 1 - b)
    mantissa = torch.round(x.abs() / 2.0**exponent * 2**m).clamp(0, 2**m - 1)
    value = 2.0**exponent * mantissa / 2**m
    return torch.where(x.abs() <= 1e-8, x, torch.sign(x + 1e-9) * value)


@pytest.mark.parametrize(("kind", "config"), [("ieee", (8, 4, 7)), ("ieee", (6, 3, 3)), ("denorm", (8, 4, 7)),
                                              ("denorm", (6, 2, 1))])  # fmt: skip
def test_differences_from_mase_are_only_the_documented_ones(kind, config):
    """Where we differ from MASE, ours is a power of two (carry / exact power) and MASE's is one step below."""
    generator = torch.Generator().manual_seed(7)
    magnitude = 2.0 ** (torch.rand(20000, generator=generator) * 24 - 14)
    x = torch.cat([magnitude * torch.randn(20000, generator=generator).sign(), 2.0 ** torch.arange(-12.0, 9.0)])
    spec, reference = (ieee(*config), mase_ieee) if kind == "ieee" else (denorm(*config), mase_denorm)
    ours = spec(x)
    theirs = reference(x, *config[:2], default_bias(config[1], config[2]))
    differ = ours != theirs
    assert differ.any()  # the quirks are real: this test would notice if MASE's formula were copied
    mantissa, _ = torch.frexp(ours[differ].abs())
    assert bool((mantissa == 0.5).all())  # ours is a power of two ...
    values = spec.value_set().float()
    index = torch.searchsorted(values, ours[differ])
    one_below = torch.where(ours[differ] > 0, values[index - 1], values[(index + 1).clamp(max=len(values) - 1)])
    assert torch.equal(theirs[differ], one_below)  # ... and MASE's is the next value toward zero


def test_values_below_1e_8_are_rounded_not_passed_through():
    got = ieee(8, 4, 7)(torch.tensor([5e-9, -5e-9, 1e-8]))
    assert got.tolist() == [0.0, -0.0, 0.0]


# ---- properties -----------------------------------------------------------------------------------------
PROPERTY_SPECS = [ieee(8, 4, 7), ieee(6, 3, None), ieee(16, 5, 15), ieee(12, 8, 160), denorm(8, 4, 7),
                  denorm(5, 2, 1), denorm(13, 6, 40)]  # fmt: skip
PROPERTY_IDS = [f"{s.format_name}-{s.width}-{s.exponent_width}-{s.exponent_bias}" for s in PROPERTY_SPECS]
float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
finite32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("spec", PROPERTY_SPECS, ids=PROPERTY_IDS)
@given(values=st.lists(float32s, min_size=1, max_size=40))
def test_properties_idempotent_symmetric_bounded_nan_inf(spec, values):
    x = torch.tensor(values, dtype=torch.float32)
    q = spec(x)
    torch.testing.assert_close(spec(q), q, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(spec(-x), -q, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.isnan(q), torch.isnan(x))
    assert bool((q[~torch.isnan(q)].abs() <= spec.max_value).all())
    infinite = torch.isinf(x)
    assert torch.equal(q[infinite], torch.sign(x[infinite]) * spec.max_value)


@pytest.mark.parametrize("spec", PROPERTY_SPECS, ids=PROPERTY_IDS)
@given(values=st.lists(finite32s, min_size=2, max_size=40))
def test_property_monotone(spec, values):
    x = torch.tensor(sorted(values), dtype=torch.float32)
    q = spec(x)
    assert bool((q[1:] >= q[:-1]).all())


@functools.lru_cache(maxsize=None)
def cached_value_set(spec) -> torch.Tensor:
    return spec.value_set()


@pytest.mark.parametrize("spec", PROPERTY_SPECS, ids=PROPERTY_IDS)
@given(value=finite32s)
def test_property_result_is_a_nearest_neighbour(spec, value):
    """Nearest: the result is in the value set and no value of the set is strictly closer."""
    values = cached_value_set(spec)
    if abs(value) > spec.max_value:
        return
    q = spec(torch.tensor([value], dtype=torch.float64)).item()
    distances = (values - value).abs()
    assert bool((values == q).any())
    assert abs(q - value) == distances.min().item()


def test_stochastic_rounding_is_unbiased_and_reproducible():
    spec = ieee(8, 4, 7, rounding="stochastic")
    x = torch.full((200_000,), 1.3)  # between 1.25 and 1.375
    first = spec(x, seed=3)
    assert set(first.unique().tolist()) == {1.25, 1.375}
    assert abs(first.double().mean().item() - 1.3) < 1e-3  # standard error of the mean: 1.4e-4
    assert torch.equal(first, spec(x, seed=3))
    assert not torch.equal(first, spec(x, seed=4))


# ---- wide formats, dtypes, gradients ----------------------------------------------------------------------
def test_grids_outside_float32_range_are_rounded_in_float64():
    spec = ieee(12, 8, 160)  # min normal 2^-159, min subnormal 2^-162: below float32's 2^-149
    assert spec.min_subnormal == 2.0**-162
    x = torch.tensor([2.0**-140, 1.5 * 2.0**-149, 2.0**-149], dtype=torch.float32)  # float32 subnormals
    assert torch.equal(spec(x), x)  # all on the grid: not flushed, not NaN
    tiny = torch.tensor([2.0**-162, 1.5 * 2.0**-162, 2.0**-163], dtype=torch.float64)
    assert spec(tiny).tolist() == [2.0**-162, 2.0**-161, 0.0]
    assert spec.value_set().numel() == 2**12 - 1


def test_wide_formats_have_no_enumerated_value_set_but_quantize():
    spec = ieee(24, 8, 127)
    assert spec.value_set() is None and spec.bits == 24
    x = torch.tensor([1.0 + 2.0**-15, 1.0 + 2.0**-16, 1.0 + 3 * 2.0**-16])
    assert spec(x).tolist() == [1.0 + 2.0**-15, 1.0, 1.0 + 2.0**-14]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("spec", [ieee(8, 4, 7), denorm(8, 4, 7)], ids=["ieee", "denorm"])
def test_dtype_shape_and_straight_through_gradient(spec, dtype):
    x = (torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0)) * 10).to(dtype).requires_grad_()
    y = spec(x)
    assert y.dtype == dtype and y.shape == x.shape
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    assert torch.equal(y.detach(), spec(x.detach().double()).to(dtype))  # 16-bit inputs: float32 math, same values


@pytest.mark.parametrize("spec", [ieee(8, 4, 7), denorm(6, 3, 3)], ids=["ieee", "denorm"])
def test_empty_and_zero_dimensional(spec):
    assert spec(torch.empty(0, 3)).shape == (0, 3)
    assert spec(torch.tensor(1.95)).item() == 2.0
    assert spec(torch.tensor(1.95)).dim() == 0


def test_registry_names_aliases_and_mase_none_bias():
    spec = lowbit.formats.resolve("minifloat_ieee", width=8, exponent_width=4, exponent_bias="NA")
    assert isinstance(spec, MinifloatIEEE) and spec.exponent_bias == 7
    assert denorm(8, 5, "None").exponent_bias == 15
    x = torch.tensor([0.3, -1.7, 300.0])
    assert torch.equal(lowbit.quantize(x, "minifloat_denorm", width=8, exponent_width=4), denorm(8, 4, None)(x))


# ---- bad parameters -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "params", "name"),
    [
        (MinifloatIEEE, {"width": 4, "exponent_width": 4}, "width"),  # no room for a sign
        (MinifloatIEEE, {"width": 33, "exponent_width": 8}, "width"),
        (MinifloatIEEE, {"width": 8, "exponent_width": 0}, "exponent_width"),
        (MinifloatIEEE, {"width": 8, "exponent_width": 12}, "exponent_width"),
        (MinifloatIEEE, {"width": 8.5, "exponent_width": 4}, "width"),
        (MinifloatIEEE, {"width": 8, "exponent_width": 4, "exponent_bias": "seven"}, "exponent_bias"),
        (MinifloatIEEE, {"width": 8, "exponent_width": 4, "exponent_bias": 1100}, "exponent_bias"),
        (MinifloatIEEE, {"width": 16, "exponent_width": 11, "exponent_bias": -200}, "exponent_bias"),
        (MinifloatDenorm, {"width": 5, "exponent_width": 4}, "width"),  # M = 0: every value would be zero
        (MinifloatDenorm, {"width": 8, "exponent_width": True}, "exponent_width"),
        (MinifloatIEEE, {"width": 8, "exponent_width": 4, "rounding": "sideways"}, "rounding"),
    ],
)
def test_bad_parameters_name_the_parameter(cls, params, name):
    with pytest.raises(FormatError, match=name):
        cls(**params)


def test_unknown_parameter_is_named():
    with pytest.raises(FormatError, match="exponent_bias_width"):
        lowbit.quantize(torch.ones(2), "minifloat_ieee", exponent_bias_width=4)
