"""Tests of the affine format's derived parameters: min-max scales and zero points per tensor, axis and
block against an independent numpy computation, power-of-two scales, scale dtypes, the eight kinds of
seed 004, stochastic rounding and hypothesis properties. Given parameters: test_affine.py."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit import FormatError
from lowbit.formats import Affine

from helpers import FLOATS32, block_slices, code_limits, equal_with_nan, short_scale

TINY32 = float(np.finfo(np.float32).tiny)


# ---- derived parameters: an independent computation ---------------------------------------------------------
def independent_block_parameters(block: np.ndarray, spec: Affine) -> tuple[np.float32, np.float32]:
    """(scale, zero point) of one block computed from the documented formulas with numpy float32."""
    q_min, q_max = code_limits(spec.bits, spec.signed, spec.narrow_range)
    finite = block[np.isfinite(block)].astype(np.float32)
    if spec.symmetric and type(spec).full_range_scale:  # both end codes in use: the larger side decides
        low = min(finite.min(), np.float32(0)) if finite.size else np.float32(0)
        high = max(finite.max(), np.float32(0)) if finite.size else np.float32(0)
        scale = max(np.float32(low / np.float32(q_min)), np.float32(high / np.float32(q_max)))
    elif spec.symmetric:
        high = np.abs(finite).max() if finite.size else np.float32(0)
        low = -high
        scale = np.float32(high / np.float32(q_max))
        q_min = max(q_min, -q_max)  # -inf saturates at -q_max
    else:
        low = min(finite.min(), np.float32(0)) if finite.size else np.float32(0)
        high = max(finite.max(), np.float32(0)) if finite.size else np.float32(0)
        scale = np.float32(np.float32(high - low) / np.float32(q_max - q_min))
    scale = scale if scale >= TINY32 else np.float32(TINY32)
    if spec.power_of_two:
        mantissa, exponent = math.frexp(float(scale))
        scale = np.float32(math.ldexp(1.0, exponent - 1 if mantissa == 0.5 else exponent))

    def zero_point_for(scale):
        inverse = np.float32(1) / np.float32(scale)
        return np.float32(0) if spec.symmetric else np.float32(np.clip(q_min - np.round(low * inverse), q_min, q_max))

    narrow_dtype = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}.get(spec.scale_dtype)
    if narrow_dtype is not None:  # nearest in the narrow dtype (its smallest normal at least) ...
        info = ml_dtypes.finfo(narrow_dtype)
        stored = np.clip(scale, float(info.tiny), float(info.max)).astype(narrow_dtype)
        inverse, zero_point = np.float32(1) / np.float32(stored), zero_point_for(np.float32(stored))
        if high * inverse + zero_point > q_max + 0.5 or low * inverse + zero_point < q_min - 0.5:
            stored = np.nextafter(stored, narrow_dtype(np.inf))  # ... or up, where nearest would saturate
        scale = np.float32(stored)
    scale = np.float32(short_scale(scale, spec.bits))  # so that code * scale is exact (idempotence)
    return scale, zero_point_for(scale)


def independent_parameters(x: torch.Tensor, spec: Affine, extent: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per-element scale and zero point, looping over blocks of the given extent (edge blocks cropped)."""
    array = x.numpy()
    scale, zero_point = np.zeros_like(array), np.zeros_like(array)
    for where in block_slices(array.shape, extent):
        scale[where], zero_point[where] = independent_block_parameters(array[where], spec)
    return scale, zero_point


def independent_quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, spec: Affine) -> np.ndarray:
    q_min, q_max = code_limits(spec.bits, spec.signed, spec.narrow_range)
    if spec.symmetric and not type(spec).full_range_scale:
        q_min = max(q_min, -q_max)  # a derived symmetric scale saturates -inf at -q_max too
    inverse = np.float32(1) / scale
    codes = np.clip(np.round(x * inverse) + zero_point, q_min, q_max)
    return ((codes - zero_point) * scale).astype(np.float32)


GRANULARITIES = [
    ((7, 50), {}, (7, 50)),
    ((7, 50), {"axis": 0}, (1, 50)),
    ((7, 50), {"axis": 1}, (7, 1)),
    ((3, 4, 9), {"axis": 1}, (3, 1, 9)),
    ((2, 3, 4, 5), {"axis": 0}, (1, 3, 4, 5)),
    ((2, 3, 4, 5), {"axis": -1}, (2, 3, 4, 1)),
    ((4, 64), {"block_size": [1, 32]}, (1, 32)),
    ((5, 37), {"block_size": [2, 16]}, (2, 16)),
    ((3, 6, 70), {"block_size": [1, 32]}, (1, 1, 32)),
    ((3, 6, 70), {"block_size": [4, -1]}, (1, 4, 70)),
    ((9, 11), {"block_size": [5, 5]}, (5, 5)),
    ((6, 10), {"block_size": [3, 4], "skip_first_dim": True}, (1, 4)),
    ((1,), {}, (1,)),
]
KINDS = [
    {"bits": 8},
    {"bits": 4, "symmetric": True},
    {"bits": 8, "signed": False},
    {"bits": 3, "power_of_two": True},
    {"bits": 4, "symmetric": True, "power_of_two": True},
    {"bits": 8, "symmetric": True, "narrow_range": True, "scale_dtype": "bf16"},
    {"bits": 6, "scale_dtype": "f16"},
]


@pytest.mark.parametrize("shape, granularity, extent", GRANULARITIES)
def test_derived_parameters_match_an_independent_computation(shape, granularity, extent):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen) * torch.logspace(-3, 3, shape[-1])  # blocks of very different ranges
    x.view(-1)[:3] = torch.tensor([math.nan, math.inf, -math.inf])[: x.numel()]
    for params in KINDS:
        spec = Affine(**params, **granularity)
        scale, zero_point = spec.scale_and_zero_point(x)
        want_scale, want_zero_point = independent_parameters(x, spec, extent)
        assert np.array_equal(scale.numpy(), want_scale), (params, granularity)
        assert np.array_equal(zero_point.numpy(), want_zero_point), (params, granularity)
        expected = independent_quantize(x.numpy(), want_scale, want_zero_point, spec)
        assert np.array_equal(spec(x).numpy(), expected, equal_nan=True), (params, granularity)


@pytest.mark.parametrize("shape, granularity, extent", GRANULARITIES[:-1])
def test_power_of_two_scales_never_let_the_block_max_overflow(shape, granularity, extent):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5)) * torch.logspace(-4, 4, shape[-1])
    for symmetric in (True, False):
        spec = Affine(bits=4, symmetric=symmetric, power_of_two=True, **granularity)
        scale, zero_point = spec.scale_and_zero_point(x)
        mantissa, _ = torch.frexp(scale)
        assert torch.all(mantissa == 0.5)  # log2(scale) is an integer
        q_min, q_max = code_limits(4, True)
        codes = x / scale + zero_point
        assert torch.all((codes >= q_min - 0.5) & (codes <= q_max + 0.5))  # the block's extremes round in range
        assert torch.all((spec(x) - x).abs() <= scale / 2)  # hence nothing saturates: error <= half a step


@pytest.mark.parametrize("scale_dtype, torch_dtype", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_scale_dtype_makes_the_scale_representable(scale_dtype, torch_dtype):
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 3, 64)
    ulp = torch.finfo(torch_dtype).eps  # the relative spacing of the dtype is at most eps
    for bits, params in itertools.product([4, 8, 16], ({"symmetric": True}, {}, {"power_of_two": True})):
        spec = Affine(bits=bits, block_size=[1, 16], scale_dtype=scale_dtype, **params)
        scale = spec.scale_and_zero_point(x).scale
        assert torch.equal(scale.to(torch_dtype).float(), scale)
        full = Affine(bits=bits, block_size=[1, 16], **params).scale_and_zero_point(x).scale.clamp(
            min=torch.finfo(torch_dtype).tiny)
        assert torch.all((scale - full).abs() <= full * ulp)  # nearest, or the next one up: within one ulp
        # never so far down that a block max saturates (the float32 output rounds by an ulp of x, too)
        assert torch.all((spec(x) - x).abs() <= scale * 0.5 + x.abs() * 2**-22)
        if not params and bits == 4:  # asymmetric: nearest first, so some scales are rounded down ...
            assert torch.any(scale < full)
        if not params and bits == 16:  # ... but 65535 codes would overshoot by dozens of steps: all go up
            assert torch.all(scale >= full)
    given = Affine(scale=0.1, scale_dtype=scale_dtype).scale_and_zero_point(torch.ones(2)).scale
    assert given[0].item() == torch.tensor(0.1).to(torch_dtype).item()


@pytest.mark.parametrize(
    "params", KINDS + [{"bits": 4, "symmetric": True, "axis": 0}, {"bits": 8, "block_size": [2, 2]}]
)
def test_zero_range_inputs_give_finite_outputs(params):
    spec = Affine(**params)
    cases = [torch.zeros(4, 4), torch.full((4, 4), 3.5), torch.full((4, 4), -2.25), torch.tensor([[7.0]]),
             torch.tensor([[1e-40, -1e-40], [0.0, -0.0]]), torch.tensor([[math.nan, 0.0], [0.0, 0.0]])]  # fmt: skip
    for x in cases:
        out = spec(x)
        assert torch.equal(out.isnan(), x.isnan()) and torch.isfinite(out[~x.isnan()]).all(), (params, x)
        scale = spec.scale_and_zero_point(x).scale
        assert torch.all(scale > 0) and torch.all(torch.isfinite(scale))
        assert torch.all((out - x).abs()[~x.isnan()] <= scale[~x.isnan()] * 0.51)  # constants stay (nearly) exact
    assert torch.equal(spec(torch.zeros(3, 4)), torch.zeros(3, 4))


# ---- the eight kinds of seed 004: a in {free, power of two} x b in {integer, 0} x {deterministic, stochastic} ----
EIGHT_KINDS = list(itertools.product([False, True], [False, True], ["nearest_even", "stochastic"]))


@pytest.mark.parametrize("power_of_two, symmetric, rounding", EIGHT_KINDS)
def test_the_eight_kinds(power_of_two, symmetric, rounding):
    spec = Affine(bits=4, power_of_two=power_of_two, symmetric=symmetric, rounding=rounding, block_size=[1, 16])
    x = torch.rand(6, 32, generator=torch.Generator().manual_seed(2)) * 10
    x[:, ::16] = -2.3  # every block spans [-2.3, < 10]: an asymmetric range
    scale, zero_point = spec.scale_and_zero_point(x)
    log2 = torch.log2(scale)
    assert bool(torch.all(log2 == torch.round(log2))) == power_of_two  # log2(a) an integer: a block exponent
    assert torch.all(zero_point == 0) == symmetric  # b = 0 exactly when symmetric
    if not symmetric:
        assert torch.all(zero_point != code_limits(4, True)[0])  # a general integer, not just the code bound
    out = spec(x, seed=3)
    codes = out / scale + zero_point
    assert torch.allclose(codes, torch.round(codes), atol=1e-4)  # on the block's grid
    nearest = spec.replace(rounding="nearest_even")(x)
    assert torch.equal(out, nearest) == (rounding == "nearest_even")
    assert torch.all((out - x).abs() <= scale * (1.0001 if rounding == "stochastic" else 0.5001))


@pytest.mark.parametrize("power_of_two, symmetric", list(itertools.product([False, True], [False, True])))
def test_stochastic_rounding_is_unbiased(power_of_two, symmetric):
    draws = 20000
    x = torch.linspace(-0.9, 3.9, 37)  # strictly inside the range set by two anchors
    spec = Affine(bits=4, symmetric=symmetric, power_of_two=power_of_two, rounding="stochastic")
    data = torch.cat([torch.tensor([-1.05, 4.2]), x]).expand(draws, -1).contiguous()  # one scale for all rows
    scale, zero_point = spec.scale_and_zero_point(data)
    scale, zero_point = scale[0, 2:], zero_point[0, 2:]
    q_min, q_max = code_limits(4, True)
    assert torch.all((x / scale + zero_point >= q_min) & (x / scale + zero_point <= q_max))
    mean = spec(data, seed=7)[:, 2:].mean(0)
    frac = x / scale - torch.floor(x / scale)
    sigma = scale * torch.sqrt(frac * (1 - frac) / draws)
    assert torch.all((mean - x).abs() <= 5 * sigma + 1e-6), (mean - x).abs().max()
    nearest_error = (spec.replace(rounding="nearest_even")(x) - x).abs()
    assert (nearest_error > 5 * sigma + 1e-6).sum() > len(x) // 2  # the bound is tight enough to see a bias


def test_stochastic_reproducibility():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    spec = Affine(bits=4, block_size=[1, 16], rounding="stochastic")
    assert torch.equal(spec(x, seed=1), spec(x, seed=1))
    assert torch.equal(spec(x, seed=1), spec(x, generator=torch.Generator().manual_seed(1)))
    assert not torch.equal(spec(x, seed=1), spec(x, seed=2))
    with pytest.raises(FormatError, match="not both"):
        spec(x, seed=1, generator=torch.Generator())


# ---- properties (hypothesis) -----------------------------------------------------------------------------------
SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.0e38, -3.0e38, math.inf, -math.inf, math.nan]
EXACTLY_IDEMPOTENT = [
    {"bits": 8, "scale": 0.1, "zero_point": 3},
    {"bits": 8, "signed": False, "scale": 0.1, "zero_point": 3},
    {"bits": 4, "symmetric": True},
    {"bits": 8, "symmetric": True, "narrow_range": True},
    {"bits": 3, "power_of_two": True},
    {"bits": 5, "symmetric": True, "scale_dtype": "bf16"},
]


def check_common_properties(spec: Affine, x: torch.Tensor) -> torch.Tensor:
    out = spec(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out.isnan(), x.isnan())
    scale, zero_point = spec.scale_and_zero_point(x)
    q_min, q_max = spec.clamp_range
    finite = ~out.isnan()
    limit = torch.finfo(x.dtype).max  # grid values past the float range saturate at its top
    bottom = ((q_min - zero_point) * scale).clamp(-limit, limit)
    top = ((q_max - zero_point) * scale).clamp(-limit, limit)
    assert torch.all(out[finite] >= bottom[finite]) and torch.all(out[finite] <= top[finite])  # the block's grid
    assert torch.all(out[x == math.inf] == top[x == math.inf])  # +-inf saturate
    assert torch.all(out[x == -math.inf] == bottom[x == -math.inf])
    ordered = torch.sort(x[~x.isnan()]).values
    assert torch.all(torch.diff(spec(ordered)) >= 0)  # monotonic (per tensor: one grid)
    return out


@pytest.mark.parametrize("params", EXACTLY_IDEMPOTENT)
@given(values=st.lists(FLOATS32, max_size=30), special=st.lists(st.sampled_from(SPECIAL), max_size=4))
def test_properties_exactly_idempotent(params, values, special):
    spec = Affine(**params)
    x = torch.tensor(values + special, dtype=torch.float32)
    out = check_common_properties(spec, x)
    assert equal_with_nan(spec(out), out)
    if spec.symmetric:  # derived symmetric scales saturate -inf at -q_max: sign symmetric everywhere
        assert equal_with_nan(spec(-x), -out)


@pytest.mark.parametrize("params", [{"bits": 8}, {"bits": 3, "signed": False}])
@given(values=st.lists(FLOATS32, max_size=30), special=st.lists(st.sampled_from(SPECIAL), max_size=4))
def test_properties_asymmetric_min_max(params, values, special):
    """A re-derived asymmetric scale can move by one float32 ulp, so idempotence holds to float rounding
    (for ranges max - min that fit in float32; wider ones saturate their grid at the float range's top)."""
    spec = Affine(**params)
    x = torch.tensor(values + special, dtype=torch.float32)
    out = check_common_properties(spec, x)
    scale = spec.scale_and_zero_point(x).scale
    again = spec(out)
    assert torch.equal(again.isnan(), out.isnan())
    finite = x[torch.isfinite(x)].double().tolist() + [0.0]
    if max(finite) - min(finite) <= torch.finfo(torch.float32).max:
        assert torch.all((again - out).abs()[~out.isnan()] <= 1e-4 * scale[~out.isnan()])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("params", EXACTLY_IDEMPOTENT + [{"bits": 4, "symmetric": True, "block_size": [2, 8]}])
def test_other_dtypes(dtype, params):
    x = (torch.randn(4, 24, generator=torch.Generator().manual_seed(8)) * 5).to(dtype)
    x[0, :3] = torch.tensor([math.inf, -math.inf, math.nan], dtype=dtype)
    spec = Affine(**params)
    out = spec(x)
    assert out.dtype == dtype and out.shape == x.shape
    if dtype == torch.float64 or "scale_dtype" not in params:
        # A bf16-rounded scale times q_max needs more significand bits than float16 / bfloat16 have, so
        # there the output's maximum is rounded and a re-derived scale moves: idempotent only in float32/64.
        assert equal_with_nan(spec(out), out)
    if dtype != torch.float64:  # computed in float32, then rounded to dtype
        assert equal_with_nan(out, spec(x.float()).to(dtype))


def test_grid_values_beyond_the_float_range_saturate():
    """A power-of-two scale rounded up near float32's top would put grid values at inf: they saturate."""
    for params in ({"bits": 3, "power_of_two": True}, {"bits": 3, "symmetric": True, "power_of_two": True}):
        spec = Affine(**params)
        x = torch.tensor([3.0e38, -1.0, math.inf, 1.0])
        out = spec(x)
        assert torch.isfinite(out).all() and out[0] == out[2] == torch.finfo(torch.float32).max
        assert torch.equal(spec(out), out)


def test_asymmetric_range_wider_than_the_float_range():
    x = torch.tensor([-3.0e38, 2.5e38, 0.0, 1.0e38])
    spec = Affine(bits=8)
    scale = spec.scale_and_zero_point(x).scale
    assert torch.allclose(scale, torch.tensor(3.0e38 / 255 + 2.5e38 / 255), rtol=2e-5)  # not the tiny fallback
    assert torch.all((spec(x) - x).abs() <= scale * 0.5001)


def test_empty_zero_dim_and_high_rank():
    for params in ({"bits": 8, "scale": 0.1, "zero_point": 3}, {"bits": 4}, {"bits": 4, "symmetric": True, "axis": 0}):
        spec = Affine(**params)
        assert spec(torch.empty(0, 5)).shape == (0, 5)
        assert spec(torch.tensor(0.3)).shape == ()
    assert Affine(scale=0.1, zero_point=3)(torch.tensor(0.34)).item() == pytest.approx(0.3)
    assert Affine(bits=4, symmetric=True)(torch.tensor(-0.7)).item() == pytest.approx(-0.7)
    x = torch.randn(2, 1, 3, 1, 4, 5, generator=torch.Generator().manual_seed(0))
    out = Affine(bits=4, symmetric=True, block_size=[2, 5])(x)
    assert out.shape == x.shape and torch.all((out - x).abs() <= x.abs().max() / 7 / 2 + 1e-6)


def test_stochastic_is_unbiased_at_the_ends_of_the_issue_block():
    # [-0.6, 0.5, 14.4], 4 bits: a nearest-rounded zero point left 14.4 0.4 step past the last code, and the
    # clamped draws averaged 14.0
    draws = 100000
    block = torch.tensor([-0.6, 0.5, 14.4], dtype=torch.float64)
    spec = Affine(bits=4, axis=0, rounding="stochastic")
    data = block.expand(draws, -1).contiguous()  # one block per row
    scale = spec.scale_and_zero_point(data).scale[0]
    mean = spec(data, seed=3).mean(0)
    assert torch.all((mean - block).abs() <= 5 * scale * 0.5 / math.sqrt(draws)), mean
    assert abs(mean[2].item() - 14.4) < 0.01


@pytest.mark.parametrize("bits, power_of_two, scale_dtype", [(4, False, "f32"), (3, False, "f16"), (8, False, "bf16"),
                                                             (4, True, "f32"), (2, False, "f32")])  # fmt: skip
def test_stochastic_grid_covers_every_block_range(bits, power_of_two, scale_dtype):
    """Every element of a block lies between two codes (no clamped draw), so E[y] = x at both ends too."""
    generator = torch.Generator().manual_seed(0)
    blocks = torch.randn(200, 32, generator=generator) * torch.rand(200, 1, generator=generator) * 5
    blocks = blocks + torch.randn(200, 1, generator=generator)
    spec = Affine(bits=bits, axis=0, rounding="stochastic", power_of_two=power_of_two, scale_dtype=scale_dtype)
    scale, zero_point = spec.scale_and_zero_point(blocks)
    q_min, q_max = code_limits(bits, True)
    codes = blocks * (1.0 / scale) + zero_point
    assert torch.all((codes >= q_min) & (codes <= q_max))
    assert torch.all(zero_point == torch.round(zero_point))
    # the ends of every block, drawn 1000 times: mean within 5 sigma of x
    ends = torch.stack([blocks.amin(1), blocks.amax(1)], 1)
    data = torch.cat([blocks, ends], 1).repeat(1000, 1)
    mean = spec(data, seed=11).view(1000, 200, 34).mean(0)[:, 32:]
    step = scale[:, :2]
    assert torch.all((mean - ends).abs() <= 5 * step * 0.5 / math.sqrt(1000) + 1e-6)
