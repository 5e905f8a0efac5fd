"""The ``log`` format: exhaustive value sets and decision points, MASE's examples, specials, properties."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit.errors import FormatError
from lowbit.formats import ROUNDING_MODES, Log

DETERMINISTIC_MODES = [mode for mode in ROUNDING_MODES if mode != "stochastic"]

# (width, exponent_bias) pairs: every width up to 8, default / zero / negative / large biases.
CONFIGS = [(2, None), (2, 0), (2, -3), (3, None), (3, 4), (4, None), (4, 2), (4, -1), (5, None), (5, 20)]
CONFIGS += [(6, None), (6, 40), (7, None), (7, -50), (8, None), (8, 63), (8, 128), (8, 0), (8, 150)]


def exponent_range(width: int, bias: int | None) -> tuple[int, int]:
    """(e_min, e_max) written out from the documented formulas."""
    exponent_width = width - 1
    bias = 2 ** (exponent_width - 1) - 1 if bias is None else bias
    return 1 - bias, 2**exponent_width - 1 - bias


def reference(x: float, e_min: int, e_max: int, mode: str, log_domain: bool = False) -> float:
    """A slow scalar oracle in exact rational arithmetic: the neighbours of |x| and the mode's choice."""
    if math.isnan(x):
        return math.nan
    negative = math.copysign(1.0, x) < 0
    magnitude, top = abs(x), math.ldexp(1.0, e_max)
    if magnitude >= top:
        return math.copysign(top, x)
    if magnitude < math.ldexp(1.0, e_min):
        low, high, low_code = 0.0, math.ldexp(1.0, e_min), 0
    else:
        k = math.frexp(magnitude)[1] - 1
        low, high, low_code = math.ldexp(1.0, k), math.ldexp(1.0, k + 1), k - e_min + 1
    if magnitude == low:
        return math.copysign(low, x)
    directed = {"toward_zero": False, "away_from_zero": True, "up": not negative, "down": negative}
    if mode in directed:
        return math.copysign(high if directed[mode] else low, x)
    if log_domain and low > 0:  # past the geometric mean? (never a tie: it is irrational)
        distance = Fraction(magnitude) ** 2 - Fraction(low) * Fraction(high)
    else:
        distance = 2 * Fraction(magnitude) - Fraction(low) - Fraction(high)
    ties = {"nearest_even": low_code % 2 == 1, "nearest_away": True, "nearest_toward_zero": False,
            "nearest_up": not negative, "nearest_down": negative}  # fmt: skip
    pick_high = distance > 0 or (distance == 0 and ties[mode])
    return math.copysign(high if pick_high else low, x)


def probe_points(values: list[float]) -> list[float]:
    """Every value, every linear midpoint, its float64 neighbours, and quarter points; both signs."""
    positives = [v for v in values if v >= 0]
    points = []
    for low, high in zip(positives, positives[1:]):
        middle = (low + high) / 2
        points += [low, middle, math.nextafter(middle, 0), math.nextafter(middle, math.inf)]
        points += [low + (high - low) / 4, low + 3 * (high - low) / 4]
    top = positives[-1]
    points += [top, top * 1.25, top * 1.5, top * 4, math.inf, 0.0]
    return points + [-p for p in points]


def test_reference_matches_hand_computed_examples():
    # W=4, B=2: e in [-1, 5], values 0, 0.5, 1, ..., 32.
    assert reference(3.0, -1, 5, "nearest_even") == 4.0  # tie 2 (code 3) / 4 (code 4): even code
    assert reference(0.25, -1, 5, "nearest_even") == 0.0  # tie 0 (code 0) / 0.5 (code 1)
    assert reference(0.75, -1, 5, "nearest_even") == 1.0  # tie 0.5 (code 1) / 1 (code 2)
    assert reference(-3.0, -1, 5, "nearest_up") == -2.0
    assert reference(100.0, -1, 5, "up") == 32.0
    assert reference(1.45, -1, 5, "nearest_even", log_domain=True) == 2.0


@pytest.mark.parametrize("width, bias", CONFIGS)
def test_value_set_is_documented(width, bias):
    spec = Log(width=width, exponent_bias=bias)
    e_min, e_max = exponent_range(width, bias)
    values = spec.value_set()
    assert (spec.min_exponent, spec.max_exponent) == (e_min, e_max)
    assert values.numel() == 2**width - 1
    assert torch.all(values[1:] > values[:-1])
    positives = values[values > 0]
    assert positives.tolist() == [2.0**e for e in range(e_min, e_max + 1)]
    assert torch.equal(values, torch.cat([-positives.flip(0), torch.zeros(1, dtype=torch.float64), positives]))
    assert spec.max_value == 2.0**e_max and spec.min_value == 2.0**e_min
    assert spec.bits == spec.bits_per_element((3, 4)) == width


@pytest.mark.parametrize("width, bias", CONFIGS)
def test_every_value_maps_to_itself(width, bias):
    spec = Log(width=width, exponent_bias=bias)
    values = spec.value_set()
    for mode in ROUNDING_MODES:
        assert torch.equal(spec.replace(rounding=mode)(values, seed=0), values), mode
    if spec.min_exponent >= -149 and spec.max_exponent <= 127:  # the whole set fits float32
        assert torch.equal(spec(values.float()), values.float())


@pytest.mark.parametrize("width, bias", CONFIGS)
@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
def test_midpoints_and_neighbours_round_per_mode(width, bias, mode):
    spec = Log(width=width, exponent_bias=bias, rounding=mode)
    e_min, e_max = exponent_range(width, bias)
    points = probe_points(spec.value_set().tolist())
    expected = torch.tensor([reference(p, e_min, e_max, mode) for p in points], dtype=torch.float64)
    assert torch.equal(spec(torch.tensor(points, dtype=torch.float64)), expected)


@pytest.mark.parametrize("width, bias", CONFIGS)
def test_linear_midpoint_ties_follow_the_even_code(width, bias):
    spec = Log(width=width, exponent_bias=bias)
    positives = spec.value_set()[spec.value_set() >= 0].tolist()
    codes = {v: (0 if v == 0 else int(math.log2(v)) + spec.exponent_bias) for v in positives}
    for low, high in zip(positives, positives[1:]):
        even = low if codes[low] % 2 == 0 else high
        assert codes[low] + 1 == codes[high]
        result = spec(torch.tensor([(low + high) / 2, -(low + high) / 2], dtype=torch.float64))
        assert result.tolist() == [even, -even]


@pytest.mark.parametrize("width, bias", CONFIGS)
def test_log_domain_decision_point_is_the_geometric_mean(width, bias):
    spec = Log(width=width, exponent_bias=bias, log_domain=True)
    below_sqrt2 = math.sqrt(2.0) if Fraction(math.sqrt(2.0)) ** 2 < 2 else math.nextafter(math.sqrt(2.0), 0)
    for e in range(spec.min_exponent, spec.max_exponent):
        low = 2.0**e
        just_below, just_above = low * below_sqrt2, low * math.nextafter(below_sqrt2, 2)
        result = spec(torch.tensor([just_below, just_above, 1.5 * low, -just_above], dtype=torch.float64))
        assert result.tolist() == [low, 2 * low, 2 * low, -2 * low]
    # Between 0 and 2^e_min zero has no logarithm: the linear rule (tie at 2^(e_min - 1) -> 0, even code).
    smallest = spec.min_value
    probes = [smallest / 2, math.nextafter(smallest / 2, math.inf), 0.4 * smallest]
    result = spec(torch.tensor(probes, dtype=torch.float64))
    assert result.tolist() == [0.0, smallest, 0.0]


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
def test_log_domain_float32_matches_reference(mode):
    spec = Log(width=6, exponent_bias=10, rounding=mode, log_domain=True)
    x = torch.linspace(-40, 40, 4001, dtype=torch.float32)
    x = torch.cat([x, torch.tensor([1.4142135, 1.4142137, -0.70710677, -0.7071068, 2.828427, 2.8284273])])
    expected = [reference(v, -9, 21, mode, log_domain=True) for v in x.tolist()]
    assert torch.equal(spec(x), torch.tensor(expected, dtype=torch.float32))


def test_mase_verified_examples_and_our_differences():
    spec = Log(width=8)  # B = None -> 63, as MASE
    assert spec.exponent_bias == 63 and (spec.min_exponent, spec.max_exponent) == (-62, 64)
    x = torch.tensor([-3.0, 0.09375, 0.0, 2.0**-63, -0.01])
    # -3 = 1.5 * 2 is a linear tie between 2 (code 64, even) and 4 (code 65): ours -2, MASE -4.
    # 0.09375 = 1.5 * 2^-4: a tie between 2^-4 (code 59) and 2^-3 (code 60): 0.125, as MASE.
    # 0 is exact (MASE: +2^-63 = 1.08e-19); 2^-63 is the tie between 0 and 2^-62: zero's even code.
    assert spec(x).tolist() == [-2.0, 0.125, 0.0, 0.0, -0.0078125]
    mase_rule = spec.replace(log_domain=True)
    assert mase_rule(x).tolist() == [-4.0, 0.125, 0.0, 0.0, -0.0078125]
    # MASE turns small negatives positive (W=4, B=2: -0.01 -> +0.25); ours keep the sign: -0.
    small = Log(width=4, exponent_bias=2)(torch.tensor([-0.01]))
    assert small.item() == 0.0 and math.copysign(1.0, small.item()) < 0
    # MASE's test config W=8, B=128: e_max = -1, so everything from 0.75 up saturates to 0.5 (as MASE).
    assert Log(width=8, exponent_bias=128)(torch.tensor([0.7, 0.75, 3.0, -1e9])).tolist() == [0.5, 0.5, 0.5, -0.5]


def test_special_values():
    spec = Log(width=5, exponent_bias=7)  # e in [-6, 8]
    x = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38, 256.0, 384.0])
    result = spec(x)
    assert torch.isnan(result[0])
    assert result[1:].tolist() == [256.0, -256.0, 0.0, -0.0, 0.0, -0.0, 256.0, -256.0, 256.0, 256.0]
    assert [math.copysign(1.0, v) for v in result[3:7].tolist()] == [1.0, -1.0, 1.0, -1.0]
    for mode in ROUNDING_MODES:  # saturation and NaN in every mode
        out = spec.replace(rounding=mode)(torch.tensor([math.inf, -math.inf, 1e30, math.nan]), seed=1)
        assert out[:3].tolist() == [256.0, -256.0, 256.0] and torch.isnan(out[3])


def test_directed_rounding_of_tiny_values_below_the_smallest_power():
    spec = Log(width=3, exponent_bias=-100)  # e in [101, 103]: float32 subnormals are far below 2^101
    x = torch.tensor([1e-45, -1e-45, 1e-30], dtype=torch.float32)
    assert spec.replace(rounding="up")(x).tolist() == [2.0**101, -0.0, 2.0**101]
    assert spec.replace(rounding="away_from_zero")(x).tolist() == [2.0**101, -(2.0**101), 2.0**101]
    assert spec.replace(rounding="down")(x).tolist() == [0.0, -(2.0**101), 0.0]
    assert spec(x).tolist() == [0.0, 0.0, 0.0]


def test_saturation_at_the_largest_power_the_dtype_holds():
    spec = Log(width=9)  # B = 127: e in [-126, 128]; 2^128 is beyond float32
    assert spec.max_exponent == 128
    x = torch.tensor([math.inf, 3.0e38, -math.inf, 2.0**127])
    assert spec(x).tolist() == [2.0**127, 2.0**127, -(2.0**127), 2.0**127]
    assert spec(x.double()).tolist() == [2.0**128, 2.0**128, -(2.0**128), 2.0**127]
    widest = Log(width=11, exponent_bias=1075)  # e in [-1074, -52]: down to float64's smallest subnormal
    assert widest.value_set()[widest.value_set() > 0][0].item() == 2.0**-1074
    assert widest(torch.tensor([2.0**-1074, 3 * 2.0**-1074], dtype=torch.float64)).tolist() == [2.0**-1074, 2.0**-1073]


def test_shapes_dtypes_and_gradient():
    spec = Log(width=6)
    assert spec(torch.empty(0, 3)).shape == (0, 3)
    assert spec(torch.tensor(3.1)).shape == () and spec(torch.tensor(3.1)).item() == 4.0
    x = torch.tensor([[0.3, -5.0], [100.0, 1e-9]])
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        result = spec(x.to(dtype))
        assert result.dtype == dtype and result.tolist() == [[0.25, -4.0], [128.0, 0.0]]
    leaf = torch.randn(2, 3, 4, 5, requires_grad=True)
    out = spec(leaf)
    out.backward(torch.arange(120.0).reshape(2, 3, 4, 5))
    assert torch.equal(leaf.grad, torch.arange(120.0).reshape(2, 3, 4, 5))
    assert torch.equal(lowbit.quantize(x, "log", width=6), spec(x))


def test_stochastic_rounding_is_unbiased_and_reproducible():
    spec = Log(width=5, exponent_bias=7, rounding="stochastic")  # e in [-6, 8]
    targets = torch.tensor([3.0, -3.0, 0.7, -5.5, 0.01, -0.004, 200.0])
    x = targets.repeat(40000, 1)
    samples = spec(x, seed=123)
    assert torch.equal(samples, spec(x, seed=123))
    assert not torch.equal(samples, spec(x, seed=124))
    assert torch.allclose(samples.mean(dim=0), targets, rtol=0.01, atol=2e-4)
    for column, value in enumerate(targets.tolist()):  # only the two neighbours appear
        neighbours = {reference(value, -6, 8, "down"), reference(value, -6, 8, "up")}
        assert set(samples[:, column].tolist()) == neighbours


def test_bad_parameters_name_the_parameter():
    bad = [("width", 1), ("width", 12), ("width", 4.5), ("width", "8"), ("exponent_bias", 2000),
           ("exponent_bias", 1.5), ("exponent_bias", -1000), ("log_domain", 2), ("log_domain", "yes")]  # fmt: skip
    for name, value in bad:
        with pytest.raises(FormatError, match=name):
            Log(**{name: value})
    with pytest.raises(FormatError, match="rounding"):
        Log(rounding="nearest_odd")
    with pytest.raises(FormatError, match="exponent_width"):
        Log.create(exponent_width=4)
    assert Log(width=8, exponent_bias="NA").exponent_bias == 63
    assert Log(width=5, log_domain=1).log_domain is True
    assert lowbit.get_format("log") is Log


finite_or_special = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
float32_configs = st.sampled_from(
    [config for config in CONFIGS if exponent_range(*config)[0] >= -149 and exponent_range(*config)[1] <= 127]
)


@given(st.lists(finite_or_special, max_size=20), float32_configs, st.sampled_from(DETERMINISTIC_MODES), st.booleans())
def test_property_matches_scalar_reference(values, config, mode, log_domain):
    spec = Log(width=config[0], exponent_bias=config[1], rounding=mode, log_domain=log_domain)
    x = torch.tensor(values, dtype=torch.float32)
    expected = [reference(v, spec.min_exponent, spec.max_exponent, mode, log_domain) for v in x.tolist()]
    assert torch.equal(spec(x).isnan(), torch.tensor([math.isnan(v) for v in expected], dtype=torch.bool))
    assert torch.equal(spec(x).nan_to_num(), torch.tensor(expected, dtype=torch.float32).nan_to_num())


@given(st.lists(finite_or_special, min_size=1, max_size=20), float32_configs, st.booleans())
def test_property_idempotent_and_sign_symmetric(values, config, log_domain):
    spec = Log(width=config[0], exponent_bias=config[1], log_domain=log_domain)
    x = torch.tensor(values, dtype=torch.float32)
    once = spec(x)
    assert torch.equal(spec(once).nan_to_num(), once.nan_to_num())
    assert torch.equal(spec(-x).nan_to_num(), (-once).nan_to_num())
    finite = once[~once.isnan()].abs()
    assert torch.all(finite <= spec.max_value)
    assert torch.all((finite == 0) | (finite >= spec.min_value))
