"""Builders: [min, max] -> (scale, zero point), checked exhaustively on small code widths, against torch.ao's
qparams and by property tests; affine_spec plugs the result into the affine format."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.ao.quantization.observer import MinMaxObserver as TorchMinMaxObserver

import lowbit
from lowbit.calibrate import affine_spec, scale_zero_point
from lowbit.calibrate.builders import FLOAT32_EPS, expected_squared_error
from lowbit.errors import ConfigError

RANGES = [(-1.3, 2.7), (0.5, 3.0), (-4.0, -0.25), (-1.0, 1.0), (0.0, 0.0), (2.0, 2.0), (-3.0, -3.0),
          (-1e-9, 1e-9), (-0.0, 5.0), (-1000.5, 0.001)]  # fmt: skip


def code_limits(bits: int, signed: bool, narrow_range: bool = False) -> tuple[int, int]:
    return (-(2 ** (bits - 1)) + narrow_range, 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


def reference_fake_quantize(x, scale: float, zero_point: int, q_min: int, q_max: int) -> np.ndarray:
    """Independent model: float64 division, numpy's round half to even, clamp, back to reals."""
    codes = np.clip(np.round(np.asarray(x, dtype=np.float64) / scale) + zero_point, q_min, q_max)
    return (codes - zero_point) * scale


def combinations():
    for bits, signed, symmetric, power_of_two, narrow in itertools.product(
        range(2, 9), (True, False), (False, True), (False, True), (False, True)
    ):
        if not (narrow and not signed):
            yield bits, signed, symmetric, power_of_two, narrow


@pytest.mark.parametrize("bits, signed, symmetric, power_of_two, narrow_range", list(combinations()))
def test_ranges_round_trip_and_zero_is_exact(bits, signed, symmetric, power_of_two, narrow_range):
    q_min, q_max = code_limits(bits, signed, narrow_range)
    for low, high in RANGES:
        scale, zero_point = scale_zero_point(low, high, bits, signed, symmetric, power_of_two, narrow_range)
        s, z = float(scale), int(zero_point)
        assert math.isfinite(s) and s > 0 and q_min <= z <= q_max
        assert scale.dtype == torch.float32 and zero_point.dtype == torch.int64
        assert reference_fake_quantize(0.0, s, z, q_min, q_max) == 0.0  # zero is a code
        ends = np.array([min(low, 0.0), max(high, 0.0)])  # the range the builders widen to
        error = np.abs(reference_fake_quantize(ends, s, z, q_min, q_max) - ends)
        assert (error <= s * (0.5 + 2.0 ** (bits - 22))).all(), (low, high, s, z, error)  # half a step
        if power_of_two:
            assert math.frexp(s)[0] == 0.5
            plain = float(scale_zero_point(low, high, bits, signed, symmetric, False, narrow_range).scale)
            assert plain <= s < 2 * plain
        if symmetric:
            assert z == (0 if signed else 2 ** (bits - 1))


@pytest.mark.parametrize(
    "bits, signed, symmetric", [(8, True, False), (4, False, False), (3, True, True), (8, False, True)]
)
def test_zero_range_gives_eps_scale(bits, signed, symmetric):
    """min == max == 0 (an all-zero activation): torch.ao's eps floor, the zero point of zero, no NaN."""
    q_min, _ = code_limits(bits, signed)
    scale, zero_point = scale_zero_point(0.0, 0.0, bits, signed, symmetric)
    assert float(scale) == FLOAT32_EPS
    assert int(zero_point) == ((0 if signed else 2 ** (bits - 1)) if symmetric else q_min)
    assert float(scale_zero_point(0.0, 0.0, bits, signed, symmetric, power_of_two=True).scale) == 2.0**-23


def test_per_channel_tensors_broadcast():
    low, high = torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([1.0, 0.0, 3.0])
    scale, zero_point = scale_zero_point(low, high, 8, signed=False)
    assert scale.shape == zero_point.shape == (3,)
    for index in range(3):
        single = scale_zero_point(low[index], high[index], 8, signed=False)
        assert float(single.scale) == float(scale[index]) and int(single.zero_point) == int(zero_point[index])
    assert scale_zero_point(torch.zeros(2, 3), 1.0, 4).scale.shape == (2, 3)


@pytest.mark.parametrize("low, high", [(math.nan, 1.0), (-math.inf, 1.0), (0.0, math.inf), (2.0, 1.0)])
def test_bad_ranges_raise_config_error(low, high):
    with pytest.raises(ConfigError, match="min|max|finite"):
        scale_zero_point(low, high, 8)
    with pytest.raises(ConfigError, match="index"):
        scale_zero_point(torch.tensor([0.0, low]), torch.tensor([1.0, high]), 8)


BAD_FORMATS = [{"bits": 0}, {"bits": 17}, {"bits": 8.0}, {"bits": 1, "symmetric": True},
               {"bits": 4, "signed": False, "narrow_range": True}, {"bits": 4, "eps": 0.0}]  # fmt: skip


@pytest.mark.parametrize("options", BAD_FORMATS)
def test_bad_formats_raise_config_error(options):
    with pytest.raises(ConfigError):
        scale_zero_point(-1.0, 1.0, **options)


@pytest.mark.parametrize("dtype, symmetric", list(itertools.product((torch.qint8, torch.quint8), (False, True))))
def test_equals_torch_ao_qparams_on_random_ranges(dtype, symmetric):
    """The formulas are torch.ao's, evaluated in float32: equal bit for bit, per tensor and per channel."""
    generator = torch.Generator().manual_seed(0)
    scheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    observer = TorchMinMaxObserver(dtype=dtype, qscheme=scheme)
    ends = torch.randn(2, 500, generator=generator) * torch.logspace(-6, 6, 500)
    ends[:, :5] = torch.tensor([[0.0, 0.0, 3.0, -2.0, 0.0], [0.0, 1.0, 3.0, -2.0, 1e-12]])
    low, high = ends.min(0).values, ends.max(0).values
    expected_scale, expected_zero_point = observer._calculate_qparams(low, high)
    scale, zero_point = scale_zero_point(low, high, 8, signed=dtype == torch.qint8, symmetric=symmetric)
    assert torch.equal(scale, expected_scale) and torch.equal(zero_point, expected_zero_point.to(torch.int64))


range_ends = st.floats(-1e6, 1e6, width=32)


@given(range_ends, range_ends, st.integers(1, 16), st.booleans(), st.booleans(), st.booleans())
def test_property_valid_parameters_and_round_trip(a, b, bits, signed, symmetric, power_of_two):
    assume(not (symmetric and signed and bits == 1))
    low, high = min(a, b), max(a, b)
    q_min, q_max = code_limits(bits, signed)
    scale, zero_point = scale_zero_point(low, high, bits, signed, symmetric, power_of_two)
    s, z = float(scale), int(zero_point)
    assert math.isfinite(s) and s >= FLOAT32_EPS and q_min <= z <= q_max
    assert reference_fake_quantize(0.0, s, z, q_min, q_max) == 0.0
    ends = np.array([min(low, 0.0), max(high, 0.0)])
    error = np.abs(reference_fake_quantize(ends, s, z, q_min, q_max) - ends)
    # half a step, plus float32 rounding of low / scale in the zero point (2^-24 of up to 2^bits steps)
    assert (error <= s * (0.5 + 2.0 ** (bits - 22))).all()


@given(range_ends, range_ends, st.integers(2, 16), st.booleans())
def test_property_power_of_two_is_the_next_power(a, b, bits, symmetric):
    low, high = min(a, b), max(a, b)
    plain = float(scale_zero_point(low, high, bits, symmetric=symmetric).scale)
    rounded = float(scale_zero_point(low, high, bits, symmetric=symmetric, power_of_two=True).scale)
    assert rounded == 2.0 ** math.ceil(math.log2(plain)) or (rounded == plain and math.frexp(plain)[0] == 0.5)


def test_affine_spec_quantizes_like_torch_fake_quantize():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 3
    parameters = scale_zero_point(x.min(), x.max(), 8, signed=False)
    spec = affine_spec(parameters, 8, signed=False)
    assert isinstance(spec, lowbit.formats.Affine) and spec.scale == (float(parameters.scale),)
    expected = torch.fake_quantize_per_tensor_affine(x, float(parameters.scale), int(parameters.zero_point), 0, 255)
    assert torch.equal(spec(x), expected)
    assert torch.equal(lowbit.quantize(x, spec), expected)


def test_affine_spec_per_channel_and_its_errors():
    w = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    parameters = scale_zero_point(w.amin(1), w.amax(1), 4, symmetric=True)
    spec = affine_spec(parameters, 4, axis=0)
    zero_point = parameters.zero_point.to(torch.int32)
    expected = torch.fake_quantize_per_channel_affine(w, parameters.scale, zero_point, 0, -8, 7)
    assert torch.equal(spec(w), expected)
    with pytest.raises(ConfigError, match="axis"):
        affine_spec(parameters, 4)
    with pytest.raises(ConfigError, match="per block"):
        affine_spec(scale_zero_point(torch.zeros(2, 2), torch.ones(2, 2), 4), 4, axis=0)


def test_expected_squared_error_matches_numeric_integration():
    """The closed-form integral against a dense midpoint sum, across clipped, inside and straddling bins."""
    counts = torch.tensor([[3, 0, 5, 1, 7, 2, 4, 6]])
    lowest_edge, width = torch.tensor([-0.75], dtype=torch.float64), torch.tensor([0.25], dtype=torch.float64)
    scale, zero_point = torch.tensor([[0.3, 0.07, 1.1]]), torch.tensor([[1, 0, 2]])
    found = expected_squared_error(counts, lowest_edge, width, scale, zero_point, -2, 1)[0]
    points = 20_000
    for candidate in range(3):
        s, z = float(scale[0, candidate]), int(zero_point[0, candidate])
        total = 0.0
        for column, count in enumerate(counts[0].tolist()):
            start = -0.75 + column * 0.25
            t = start + (np.arange(points) + 0.5) / points * 0.25
            total += count * np.mean((reference_fake_quantize(t, s, z, -2, 1) - t) ** 2)
        assert found[candidate].item() == pytest.approx(total / int(counts.sum()), rel=1e-6)
