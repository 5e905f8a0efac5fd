"""Tests of Burn's integer presets q8s q4s q2s (symmetric, narrow) and q8f q4f q2f (full range)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit import FormatError
from lowbit.formats import Q2F, Q2S, Q4F, Q4S, Q8F, Q8S, Affine

from helpers import DETERMINISTIC, FLOATS32, equal_with_nan, reference_round, short_scale

# name -> (bits, code range, divisor of max|x| that gives the scale when the positive side is the larger)
PRESETS = {
    "q8s": (8, (-127, 127), 127.0),
    "q4s": (4, (-7, 7), 7.0),
    "q2s": (2, (-1, 1), 1.0),
    "q8f": (8, (-128, 127), 127.0),
    "q4f": (4, (-8, 7), 7.0),
    "q2f": (2, (-2, 1), 1.0),
}


def raw_scale(x: np.ndarray, name: str) -> tuple[np.float32, np.float32, np.float32]:
    """presets.py's rule, computed independently: (scale before storage rounding, low, high). qNs:
    max|x| / q_max; qNf: max(-min / -q_min, max / q_max) over the range widened to include zero."""
    _, (q_min, q_max), _ = PRESETS[name]
    low, high = np.float32(min(x.min(), 0.0)), np.float32(max(x.max(), 0.0))
    if name.endswith("s"):
        amax = max(-low, high)
        return np.float32(amax / np.float32(q_max)), -amax, amax
    return max(np.float32(low / np.float32(q_min)), np.float32(high / np.float32(q_max))), low, high


def expected_scale(x: torch.Tensor, name: str) -> float:
    return short_scale(raw_scale(x.numpy(), name)[0], PRESETS[name][0])


CLASSES = {"q8s": Q8S, "q4s": Q4S, "q2s": Q2S, "q8f": Q8F, "q4f": Q4F, "q2f": Q2F}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_parameters(name):
    bits, codes, _ = PRESETS[name]
    spec = lowbit.get_format(name)()
    assert isinstance(spec, Affine) and type(spec) is CLASSES[name]
    assert getattr(lowbit.formats, name.upper()) is CLASSES[name]
    assert lowbit.get_format(name.upper()) is CLASSES[name]
    assert spec.bits == bits and spec.signed and spec.symmetric
    assert spec.code_range == codes == spec.clamp_range
    assert spec.narrow_range == name.endswith("s")
    assert spec.params()["bits"] == bits and lowbit.get_format(name).create(**spec.params()) == spec


@pytest.mark.parametrize("name", PRESETS)
def test_scale_and_code_range_per_tensor(name):
    bits, (q_min, q_max), divisor = PRESETS[name]
    x = torch.randn(40, 30, generator=torch.Generator().manual_seed(bits)) * 3
    x[3, 4] = -x.abs().max() * 1.5  # the largest magnitude is negative
    scale = expected_scale(x, name)
    got_scale = lowbit.get_format(name)().scale_and_zero_point(x)
    assert torch.all(got_scale.scale == torch.tensor(float(scale))) and torch.all(got_scale.zero_point == 0)
    out = lowbit.quantize(x, name)
    codes = out / torch.tensor(float(scale))
    assert torch.allclose(codes, torch.round(codes), atol=1e-4)
    codes = torch.round(codes)
    assert codes.min() >= q_min and codes.max() <= q_max
    expected_low = q_min if name.endswith("f") else -q_max  # the larger (negative) side takes the end code
    assert codes[3, 4].item() == expected_low
    y = lowbit.quantize(-x, name)  # now the largest magnitude is positive: it lands on q_max
    flipped_scale = expected_scale(-x, name)
    assert torch.round(y / torch.tensor(flipped_scale))[3, 4].item() == q_max


@pytest.mark.parametrize("name", PRESETS)
def test_exhaustive_every_mode(name):
    """Data whose max|x| makes the scale a power of two: every code, midpoint and quarter point in range."""
    _, (q_min, q_max), divisor = PRESETS[name]
    step = 2.0**-3
    quarters = [Fraction(m, 4) for m in range(int(-4 * divisor), int(4 * divisor) + 1)]  # |t| <= divisor
    x = torch.tensor([float(t) * step for t in quarters])  # max|x| = divisor * step, so scale = step exactly
    assert lowbit.get_format(name)().scale_and_zero_point(x).scale[0].item() == step
    for mode in DETERMINISTIC:
        expected = [min(max(reference_round(t, mode), q_min), q_max) * step for t in quarters]
        assert lowbit.quantize(x, name, rounding=mode).tolist() == expected, mode
    out = lowbit.quantize(x.repeat(5), name, rounding="stochastic", seed=3) / step
    t = x.repeat(5) / step
    assert torch.all((out == torch.floor(t).clamp(q_min, q_max)) | (out == torch.ceil(t).clamp(q_min, q_max)))


def stored_scale(raw: np.float32, amax: np.float32, q_low: int, q_max: int, dtype, low=None) -> np.float32:
    """The scale in a narrow dtype (via ml_dtypes, independent of lowbit): nearest, or the next one up where
    nearest would put the block's low (default -amax) or high (amax) more than half a step past the codes."""
    info = ml_dtypes.finfo(dtype)
    stored = np.clip(raw, float(info.tiny), float(info.max)).astype(dtype)
    inverse = np.float32(1) / np.float32(stored)
    low = -amax if low is None else low
    if amax * inverse > q_max + 0.5 or low * inverse < q_low - 0.5:
        stored = np.nextafter(stored, dtype(np.inf))
    return np.float32(stored)


def test_api_example_q4s_blocks_bf16():
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(0)) * torch.logspace(-2, 2, 70)
    out = lowbit.quantize(x, "q4s", block_size=[1, 32], scale_dtype="bf16")
    expected = np.zeros((3, 70), dtype=np.float32)
    for row, start in itertools.product(range(3), range(0, 70, 32)):
        block = x[row, start : start + 32].numpy()
        amax = np.abs(block).max()
        scale = stored_scale(np.float32(amax / np.float32(7)), amax, -7, 7, ml_dtypes.bfloat16)
        codes = np.clip(np.round(block * (np.float32(1) / scale)), -7, 7)
        expected[row, start : start + 32] = codes * scale
    assert np.array_equal(out.numpy(), expected)
    assert Q4S(block_size=[1, 32], scale_dtype="bf16").bits_per_element((3, 64)) == 4 + 16 / 32


GRANULARITIES = [({"axis": 0}, (1, 48)), ({"axis": -1}, (6, 1)), ({"block_size": [2, 16]}, (2, 16)),
                 ({"block_size": [1, 32]}, (1, 32))]  # fmt: skip
NARROW = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("granularity, extent", GRANULARITIES)
@pytest.mark.parametrize("scale_dtype", ["f32", "f16", "bf16"])
def test_granularity_and_scale_dtype(name, granularity, extent, scale_dtype):
    _, (q_min, q_max), divisor = PRESETS[name]
    x = torch.randn(6, 48, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 3, 48)
    spec = lowbit.get_format(name)(scale_dtype=scale_dtype, **granularity)
    scale = spec.scale_and_zero_point(x).scale
    for row, column in itertools.product(range(0, 6, extent[0]), range(0, 48, extent[1])):
        where = (slice(row, row + extent[0]), slice(column, column + extent[1]))
        raw, low, high = raw_scale(x[where].numpy(), name)
        want = raw if scale_dtype == "f32" else stored_scale(raw, high, q_min, q_max, NARROW[scale_dtype], low)
        want = short_scale(want, PRESETS[name][0])
        assert torch.all(scale[where] == float(want)), (where, scale[where], want)
    codes = spec(x) / scale
    assert torch.allclose(codes, torch.round(codes), atol=1e-4)
    assert codes.min() >= q_min - 1e-4 and codes.max() <= q_max + 1e-4


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize(
    "params",
    [{"bits": 3}, {"bits": 16}, {"symmetric": False}, {"signed": False}, {"narrow_range": "yes"}, {"bits": "4"}],
)
def test_fixed_parameters_cannot_be_overridden(name, params):
    with pytest.raises(FormatError, match=next(iter(params))):
        lowbit.quantize(torch.ones(3), name, **params)


@pytest.mark.parametrize("name", PRESETS)
def test_affine_defaults_cannot_sneak_in(name):
    """Even Affine's own defaults are refused where the preset fixes something else (q4s with bits=8)."""
    bits, _, _ = PRESETS[name]
    other_bits = 4 if bits == 8 else 8
    with pytest.raises(FormatError, match="bits"):
        lowbit.get_format(name)(bits=other_bits)
    with pytest.raises(FormatError, match="narrow_range"):
        lowbit.get_format(name)(narrow_range=not name.endswith("s"))
    same = {"bits": bits, "signed": True, "symmetric": True, "narrow_range": name.endswith("s")}
    assert lowbit.get_format(name)(**same) == lowbit.get_format(name)()  # the preset's own values are fine
    assert lowbit.get_format(name)(bits=float(bits), signed=1).bits == bits


def test_spec_replace_and_override():
    spec = Q4S(axis=0)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(lowbit.quantize(x, spec, block_size=[1, 4]), Q4S(block_size=[1, 4])(x))
    with pytest.raises(FormatError, match="bits"):
        lowbit.quantize(x, spec, bits=8)


def test_given_scale_uses_the_preset_codes():
    x = torch.tensor([100.0, -100.0, 0.26, -0.26])
    assert torch.equal(lowbit.quantize(x, "q8s", scale=0.5), torch.tensor([63.5, -63.5, 0.5, -0.5]))
    assert torch.equal(lowbit.quantize(x, "q8f", scale=0.5), torch.tensor([63.5, -64.0, 0.5, -0.5]))


# ---- properties -----------------------------------------------------------------------------------------------
SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 3.0e38, -3.0e38, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("name", ["q8s", "q4s", "q2s"])
@given(values=st.lists(FLOATS32, max_size=30), special=st.lists(st.sampled_from(SPECIAL), max_size=4))
def test_symmetric_presets_properties(name, values, special):
    x = torch.tensor(values + special, dtype=torch.float32)
    spec = lowbit.get_format(name)()
    out = spec(x)
    assert out.shape == x.shape and torch.equal(out.isnan(), x.isnan())
    assert equal_with_nan(spec(out), out)  # idempotent
    assert equal_with_nan(spec(-x), -out)  # sign symmetric, inf included
    ordered = torch.sort(x[~x.isnan()]).values
    assert torch.all(torch.diff(spec(ordered)) >= 0)
    if x.numel():  # within the data's own range, up to float rounding of scale * q_max (inf saturates there)
        top = spec.scale_and_zero_point(x).scale.max() * spec.code_range[1]
        finite = x[torch.isfinite(x)]
        assert torch.all(out[~out.isnan()].abs() <= top)
        assert top <= max(finite.abs().max().item() * (1 + 2**-21) if finite.numel() else 0.0, 1e-35)


@pytest.mark.parametrize("name", ["q8f", "q4f", "q2f"])
@given(values=st.lists(st.floats(-(2.0**100), 2.0**100, width=32), min_size=1, max_size=30))
def test_full_range_presets_properties(name, values):
    """qNf puts the larger side of the range on its end code, so re-quantizing gives the output back."""
    x = torch.tensor(values, dtype=torch.float32)
    spec = lowbit.get_format(name)()
    out = spec(x)
    scale = spec.scale_and_zero_point(x).scale
    assert torch.all((out - x).abs() <= scale * 0.5001)  # nearest, within half a step everywhere
    assert torch.equal(spec(out), out)  # idempotent
    ordered = torch.sort(x).values
    assert torch.all(torch.diff(spec(ordered)) >= 0)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes_and_shapes(name, dtype):
    spec = lowbit.get_format(name)()
    x = (torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    out = spec(x)
    assert out.dtype == dtype and out.shape == x.shape
    if dtype != torch.float64:
        assert torch.equal(out, spec(x.float()).to(dtype))
    assert spec(torch.empty(0, dtype=dtype)).shape == (0,) and spec(torch.tensor(0.5, dtype=dtype)).shape == ()
    lone = spec(torch.tensor(0.5, dtype=dtype)).item()  # a lone value is its own max: kept by qNs
    expected = 0.5 if name.endswith("s") else 0.5 * PRESETS[name][1][1] / PRESETS[name][2]  # qNf: q_max / divisor
    assert lone == pytest.approx(expected, rel=2**-8)  # up to the (f32 scale, then dtype) rounding
    assert torch.equal(spec(torch.zeros(5, dtype=dtype)), torch.zeros(5, dtype=dtype))


def test_stochastic_presets_are_reproducible_and_unbiased():
    draws = 20000
    x = torch.cat([torch.tensor([1.0]), torch.linspace(-0.95, 0.95, 21)])  # max|x| = 1 anchors the scale
    data = x.expand(draws, -1).contiguous()
    out = lowbit.quantize(data, "q4s", rounding="stochastic", seed=4)
    assert torch.equal(out, lowbit.quantize(data, "q4s", rounding="stochastic", seed=4))
    scale = lowbit.get_format("q4s")().scale_and_zero_point(x).scale[0].item()  # 1/7 to 20 significant bits
    assert scale == pytest.approx(1.0 / 7, rel=2**-20)
    frac = x / scale - torch.floor(x / scale)
    sigma = scale * torch.sqrt(frac * (1 - frac) / draws)
    assert torch.all((out.mean(0) - x).abs() <= 5 * sigma + 1e-6)
