"""OCP / Burn float elements (e5m2 e4m3 e3m2 e2m3 e2m1) against torch and ml_dtypes casts, overflow rules,
and the per-channel / per-block scaled variants against a plain per-block loop.

Exhaustive value-set and midpoint checks of these formats are in test_minifloat.py.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit import FormatError
from lowbit.formats import MinifloatIEEE
from lowbit.formats.ocp_float import ELEMENT_FORMATS, covering_scale

NAMES = ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
MAX = {"e5m2": 57344.0, "e4m3": 448.0, "e3m2": 28.0, "e2m3": 7.5, "e2m1": 6.0}
ML_DTYPES = {"e5m2": ml_dtypes.float8_e5m2, "e4m3": ml_dtypes.float8_e4m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
             "e2m3": ml_dtypes.float6_e2m3fn, "e2m1": ml_dtypes.float4_e2m1fn}  # fmt: skip
TORCH_DTYPES = {"e5m2": torch.float8_e5m2, "e4m3": torch.float8_e4m3fn}
SCALE_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
INF, NAN = math.inf, math.nan


def spec_of(name, **params):
    return lowbit.get_format(name)(**params)


def ml_cast(x: torch.Tensor, name: str) -> torch.Tensor:
    """ml_dtypes' round-half-even cast to the element type and back to float32."""
    return torch.from_numpy(x.numpy().astype(ML_DTYPES[name]).astype(np.float32))


def torch_cast(x: torch.Tensor, name: str) -> torch.Tensor:
    return x.to(TORCH_DTYPES[name]).float()


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def dense_sample(values: torch.Tensor, top: float, seed: int = 0) -> torch.Tensor:
    """float32 inputs: every value, every midpoint, both +-1 ulp, log-uniform randoms over many binades,
    random float32 bit patterns (every binade, subnormals included), and +-0."""
    values = values.double()
    on_grid = torch.cat([values, (values[1:] + values[:-1]) / 2]).float()
    up = torch.nextafter(on_grid, torch.full_like(on_grid, INF))
    down = torch.nextafter(on_grid, torch.full_like(on_grid, -INF))
    generator = torch.Generator().manual_seed(seed)
    smallest = values[values > 0].min().item()
    exponents = torch.rand(100_000, generator=generator, dtype=torch.float64)
    span = math.log2(4 * top) - math.log2(smallest / 64)
    magnitudes = 2.0 ** (math.log2(smallest / 64) + span * exponents)
    randoms = (magnitudes * torch.randn(100_000, generator=generator, dtype=torch.float64).sign()).float()
    patterns = torch.randint(-(2**31), 2**31 - 1, (50_000,), generator=generator, dtype=torch.int32).view(torch.float32)
    subnormals = torch.randint(1, 2**23, (2_000,), generator=generator, dtype=torch.int32).view(torch.float32)
    zeros = torch.tensor([0.0, -0.0])
    sample = torch.cat([on_grid, up, down, randoms, patterns, subnormals, -subnormals, zeros])
    return sample[torch.isfinite(sample)]


def element_values(name) -> torch.Tensor:
    return spec_of(name).value_set()


# ---- unscaled: a plain cast ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_saturating_cast_is_bit_exact_with_the_dtype_cast_in_range(name):
    x = dense_sample(element_values(name), MAX[name])
    got = spec_of(name)(x)
    oracle = ml_cast(x, name) if name not in TORCH_DTYPES else torch_cast(x, name)
    # In range: where the non-saturating cast is finite (ml_dtypes' FP8 casts overflow to Inf / NaN; torch
    # 2.13's e4m3fn cast saturates; FP6 / FP4 casts saturate, so for them every finite input is compared).
    in_range = torch.isfinite(ml_cast(x, name)) & torch.isfinite(oracle)
    if name in TORCH_DTYPES:  # ml_dtypes must agree with torch where both are finite: two oracles
        assert torch.equal(bits(ml_cast(x, name)[in_range]), bits(oracle[in_range]))
    assert torch.equal(bits(got[in_range]), bits(oracle[in_range]))
    outside = ~in_range
    assert torch.equal(got[outside], MAX[name] * torch.sign(x[outside]))
    assert in_range.sum() > 100_000 and (outside.sum() > 1000 or name not in TORCH_DTYPES)


@pytest.mark.parametrize("name", NAMES)
def test_non_saturating_cast_follows_the_dtype_overflow_rule(name):
    specials = torch.tensor([INF, -INF, NAN, 1e38, -1e38, 3 * MAX[name], -3 * MAX[name]])
    x = torch.cat([dense_sample(element_values(name), MAX[name], seed=1), specials])
    got = spec_of(name, saturate=False)(x)
    if name == "e5m2":  # IEEE: overflow -> +-Inf, Inf stays Inf (torch and ml_dtypes agree)
        oracle = torch_cast(x, name)
        assert torch.equal(bits(ml_cast(x, name)[~torch.isnan(x)]), bits(oracle[~torch.isnan(x)]))
    else:  # e4m3fn: overflow and Inf -> NaN; fp6 / fp4: ml_dtypes saturates
        oracle = ml_cast(x, name)
    nan = torch.isnan(x)
    assert torch.isnan(got[nan]).all()  # NaN stays NaN (ml_dtypes turns NaN into -0 for fp6 / fp4)
    assert torch.equal(torch.isnan(got[~nan]), torch.isnan(oracle[~nan]))
    comparable = ~nan & ~torch.isnan(oracle)
    assert torch.equal(bits(got[comparable]), bits(oracle[comparable]))
    if name in ("e3m2", "e2m3", "e2m1"):
        assert torch.equal(got[~nan], spec_of(name)(x)[~nan])  # no Inf / NaN codes: same as saturating


def test_documented_overflow_examples():
    x = torch.tensor([448.0, 464.0, 464.01, 480.0, 61439.0, 61440.0, INF, -INF, NAN])
    e4m3 = spec_of("e4m3", saturate=False)(x)
    assert e4m3[:2].tolist() == [448.0, 448.0] and torch.isnan(e4m3[2:]).all()
    e5m2 = spec_of("e5m2", saturate=False)(x)
    assert e5m2[:8].tolist() == [448.0, 448.0, 448.0, 512.0, 57344.0, INF, INF, -INF] and torch.isnan(e5m2[8])
    saturated = spec_of("e5m2")(x)
    assert saturated[:8].tolist() == [448.0, 448.0, 448.0, 512.0, 57344.0, 57344.0, 57344.0, -57344.0]


@pytest.mark.parametrize(
    ("mode", "positive", "negative"),
    [("toward_zero", "max", "max"), ("up", "past", "max"), ("down", "max", "past"), ("away_from_zero", "past", "past"),
     ("nearest_even", "past", "past"), ("nearest_toward_zero", "past", "past")],
)  # fmt: skip
@pytest.mark.parametrize("name", ["e5m2", "e4m3"])
def test_non_saturating_overflow_under_directed_rounding(name, mode, positive, negative):
    """IEEE 754: an overflow stops at +-max where the mode rounds toward zero, else goes past (Inf / NaN)."""
    past = INF if name == "e5m2" else NAN
    x = torch.tensor([1e6, -1e6])
    got = spec_of(name, saturate=False, rounding=mode)(x)
    for value, sign, rule in ((got[0].item(), 1.0, positive), (got[1].item(), -1.0, negative)):
        want = sign * MAX[name] if rule == "max" else sign * past
        assert value == want or (math.isnan(want) and math.isnan(value)), (mode, value)
    infinities = spec_of(name, saturate=False, rounding=mode)(torch.tensor([INF, -INF]))
    assert infinities.tolist() == [INF, -INF] if name == "e5m2" else torch.isnan(infinities).all()


def test_ieee_minifloat_equals_e5m2_and_differs_from_e4m3_only_by_its_max():
    x = dense_sample(element_values("e4m3"), 480.0, seed=2)
    e5 = MinifloatIEEE(width=8, exponent_width=5, exponent_bias=15)(x)
    in_range = torch.isfinite(torch_cast(x, "e5m2"))
    assert torch.equal(bits(e5[in_range]), bits(spec_of("e5m2")(x)[in_range]))
    ieee_e4m3, ocp_e4m3 = MinifloatIEEE(width=8, exponent_width=4, exponent_bias=7)(x), spec_of("e4m3")(x)
    below = x.abs() <= 464.0  # 464 is the tie between 448 and 480: even mantissa -> 448 in both
    assert torch.equal(bits(ieee_e4m3[below]), bits(ocp_e4m3[below]))
    assert torch.equal(ieee_e4m3[~below], 480.0 * torch.sign(x[~below]))
    assert torch.equal(ocp_e4m3[~below], 448.0 * torch.sign(x[~below]))


@pytest.mark.parametrize(("width", "exponent_width", "exponent_bias", "dtype", "top"),
                         [(16, 5, 15, torch.float16, 65520.0), (16, 8, 127, torch.bfloat16, 2.0**127 * (2 - 2.0**-8))])
def test_16_bit_ieee_minifloats_equal_float16_and_bfloat16_casts(width, exponent_width, exponent_bias, dtype, top):
    spec = MinifloatIEEE(width=width, exponent_width=exponent_width, exponent_bias=exponent_bias)
    all_values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).float()
    all_values = all_values[torch.isfinite(all_values)].unique().double()
    x = dense_sample(all_values, float(torch.finfo(dtype).max), seed=3)
    in_range = x.abs() < top  # the cast's overflow threshold: max + half an ulp
    assert torch.equal(bits(spec(x[in_range])), bits(x[in_range].to(dtype).float()))


# ---- properties ---------------------------------------------------------------------------------------
float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("name", NAMES)
@given(values=st.lists(float32s, min_size=1, max_size=40))
def test_properties_idempotent_symmetric_monotone_bounded(name, saturate, values):
    spec = spec_of(name, saturate=saturate)
    x = torch.tensor(values, dtype=torch.float32)
    q = spec(x)
    torch.testing.assert_close(spec(q), q, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(spec(-x), -q, rtol=0, atol=0, equal_nan=True)
    finite = q[torch.isfinite(q)]
    assert bool((finite.abs() <= MAX[name]).all())
    ordered = torch.sort(x[~torch.isnan(x)]).values
    q_ordered = spec(ordered)
    q_ordered = q_ordered[~torch.isnan(q_ordered)]  # e4m3 non-saturating: overflow is NaN
    assert bool((q_ordered[1:] >= q_ordered[:-1]).all())
    assert torch.isnan(q[torch.isnan(x)]).all()
    infinite = torch.isinf(x)
    if saturate or name in ("e3m2", "e2m3", "e2m1"):
        assert not torch.isnan(q[~torch.isnan(x)]).any() and not torch.isinf(q).any()
        assert torch.equal(q[infinite], MAX[name] * torch.sign(x[infinite]))
    elif name == "e5m2":
        assert torch.equal(q[infinite], x[infinite])  # IEEE: Inf stays Inf
    else:
        assert torch.isnan(q[infinite]).all()  # E4M3FN has no Inf


# ---- scaled variants ----------------------------------------------------------------------------------
def next_in(value, scale_dtype, direction):
    dtype = SCALE_TORCH[scale_dtype]
    stored = torch.tensor(value, dtype=dtype)
    return torch.nextafter(stored, torch.tensor(direction, dtype=dtype)).item()


def reference_scale(amax: float, element_max: float, scale_dtype: str) -> float:
    """The smallest value s of scale_dtype with float32(element_max * s) >= amax, found by walking."""
    dtype = SCALE_TORCH[scale_dtype]
    tiny, largest = torch.finfo(dtype).tiny, torch.finfo(dtype).max
    scale = min(max(torch.tensor(amax / element_max, dtype=torch.float64).to(dtype).item(), tiny), largest)
    covers = lambda s: np.float32(np.float32(element_max) * np.float32(s)) >= np.float32(amax)  # noqa: E731
    while not covers(scale) and scale < largest:
        scale = next_in(scale, scale_dtype, INF)
    while next_in(scale, scale_dtype, 0.0) >= tiny and covers(next_in(scale, scale_dtype, 0.0)):
        scale = next_in(scale, scale_dtype, 0.0)
    return scale


def reference_scaled(x: torch.Tensor, name: str, block: tuple[int, int], scale_dtype: str) -> torch.Tensor:
    """Per 2-D block: amax, scale, cast x / scale with the dtype, multiply back (all float32)."""
    out = torch.empty_like(x)
    element_max = ELEMENT_FORMATS[name].max_value
    for row in range(0, x.shape[0], block[0]):
        for col in range(0, x.shape[1], block[1]):
            part = x[row : row + block[0], col : col + block[1]]
            finite = part[torch.isfinite(part)]
            amax = finite.abs().max().item() if finite.numel() else 0.0
            scale = torch.tensor(reference_scale(amax, element_max, scale_dtype), dtype=torch.float32)
            cast = torch_cast(part / scale, name) if name in TORCH_DTYPES else ml_cast(part / scale, name)
            out[row : row + block[0], col : col + block[1]] = cast * scale
    return out


GRANULARITIES = [({"block_size": [1, 32]}, lambda shape: (1, 32)), ({"axis": 0}, lambda shape: (1, shape[1])),
                 ({"axis": 1}, lambda shape: (shape[0], 1)), ({"block_size": [4, 8]}, lambda shape: (4, 8)),
                 ({"axis": 1, "block_size": [16]}, lambda shape: (1, 16)), ({"block_size": [-1, 1]}, lambda shape: (shape[0], 1))]  # fmt: skip


@pytest.mark.parametrize("scale_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("granularity", range(len(GRANULARITIES)))
@pytest.mark.parametrize("name", ["e4m3", "e2m1", "e5m2"])
def test_scaled_equals_a_plain_per_block_loop(name, granularity, scale_dtype):
    params, block_of = GRANULARITIES[granularity]
    generator = torch.Generator().manual_seed(granularity)
    for shape in [(8, 64), (7, 45)]:  # 45 columns: the last block of 32 / 8 / 16 is partial
        x = torch.randn(shape, generator=generator) * 2.0 ** torch.randint(-20, 20, (shape[0], 1), generator=generator)
        x[2] = 0.0  # an all-zero row: its blocks must stay zero
        spec = spec_of(name, scale_dtype=scale_dtype, **params)
        got, want = spec(x), reference_scaled(x, name, block_of(shape), scale_dtype)
        assert torch.equal(bits(got), bits(want)), (shape, (got != want).sum())
        assert torch.equal(got[2], torch.zeros(shape[1]))


@pytest.mark.parametrize("scale_dtype", ["f32", "bf16", "f16"])
def test_scales_are_stored_precision_and_the_smallest_that_cover_the_block(scale_dtype):
    x = torch.randn(16, 96, generator=torch.Generator().manual_seed(5)) * torch.logspace(-3, 3, 16).unsqueeze(1)
    spec = spec_of("e4m3", block_size=[1, 32], scale_dtype=scale_dtype)
    scales = spec.scales(x)
    assert scales.shape == (16, 3)
    assert torch.equal(scales.to(SCALE_TORCH[scale_dtype]).float(), scales)
    amax = x.abs().reshape(16, 3, 32).amax(-1)
    assert bool((448.0 * scales >= amax).all())
    smaller = torch.nextafter(scales.to(SCALE_TORCH[scale_dtype]), torch.zeros((), dtype=SCALE_TORCH[scale_dtype]))
    unclamped = scales > torch.finfo(SCALE_TORCH[scale_dtype]).tiny  # f16: tiny blocks get its smallest normal
    assert unclamped.sum() >= 10
    assert bool((448.0 * smaller.float() < amax)[unclamped].all())
    block_max = spec(x).abs().reshape(16, 3, 32).amax(-1)
    assert torch.equal(block_max[unclamped], 448.0 * scales[unclamped])  # each block's max -> 448 * scale


@pytest.mark.parametrize("scale_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("element_max", [448.0, 57344.0, 28.0, 7.5, 6.0])
def test_covering_scale_is_minimal_for_many_block_maxima(element_max, scale_dtype):
    generator = torch.Generator().manual_seed(int(element_max))
    dtype = SCALE_TORCH[scale_dtype]
    low = math.log2(torch.finfo(dtype).tiny) + 1
    high = min(math.log2(torch.finfo(dtype).max) - 1, 126 - math.log2(element_max))  # amax stays a float32
    exponents = low + (high - low) * torch.rand(50_000, generator=generator, dtype=torch.float64)
    amax = (element_max * 2.0**exponents * (1 + torch.rand(50_000, generator=generator, dtype=torch.float64))).float()
    amax = torch.cat([amax, torch.tensor([0.0, 1e-45, 3e38])])  # zero, float32 subnormal, huge
    scale = covering_scale(amax, element_max, scale_dtype)
    inside = amax / element_max < torch.finfo(dtype).max / 2
    inside &= amax / element_max > torch.finfo(dtype).tiny * 2
    assert torch.equal(scale.to(dtype).float(), scale)
    assert bool((scale * element_max >= amax)[inside].all())
    smaller = torch.nextafter(scale.to(dtype), torch.zeros((), dtype=dtype)).float()
    assert bool((smaller[inside] * element_max < amax[inside]).all())
    assert inside.float().mean() > 0.9
    assert torch.isfinite(scale).all() and bool((scale >= torch.finfo(dtype).tiny).all())


def test_all_zero_tiny_and_huge_blocks_stay_finite():
    x = torch.zeros(4, 64)
    x[1, :32] = 1e-44  # a float32 subnormal block
    x[2, 32:] = 3e38
    x[3, :] = torch.linspace(-1, 1, 64)
    for name in NAMES:
        for scale_dtype in ("f32", "bf16", "f16"):
            q = spec_of(name, block_size=[1, 32], scale_dtype=scale_dtype)(x)
            assert torch.isfinite(q).all(), (name, scale_dtype)
            assert torch.equal(q[0], torch.zeros(64)) and torch.equal(q[1, 32:], torch.zeros(32))
    assert spec_of("e4m3", block_size=[1, 32])(x)[2, 32:].eq(3e38).all()  # 448 * scale covers amax exactly


def test_nan_and_inf_elements_in_a_block():
    x = torch.linspace(-3, 5, 32).reshape(1, 32)
    clean = spec_of("e4m3", block_size=[1, 32])(x)
    for special in (NAN, INF):
        y = x.clone()
        y[0, 7] = special
        for saturate in (True, False):
            q = spec_of("e4m3", block_size=[1, 32], saturate=saturate)(y)
            others = torch.arange(32) != 7
            assert torch.equal(q[0, others], clean[0, others])  # NaN / Inf never set the scale
            if special == INF and saturate:
                assert q[0, 7].item() == clean.abs().max().item()  # 448 * scale
            else:
                assert torch.isnan(q[0, 7])  # NaN stays NaN; e4m3fn non-saturating: Inf -> NaN


@pytest.mark.parametrize("scale_dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", ["e4m3", "e2m1", "e5m2"])
@given(values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=70))
def test_scaled_idempotent_and_symmetric(name, scale_dtype, values):
    spec = spec_of(name, block_size=[1, 16], scale_dtype=scale_dtype)
    x = torch.tensor(values, dtype=torch.float32).reshape(1, -1)
    q = spec(x)
    assert torch.equal(spec(q), q)
    assert torch.equal(spec(-x), -q)
    assert torch.isfinite(q).all()


@pytest.mark.parametrize(
    ("shape", "params", "block"),
    [((2, 3, 40), {"block_size": [1, 32]}, (1, 1, 32)), ((5, 2, 3, 4), {"block_size": [2, 2]}, (1, 1, 2, 2)),
     ((6, 40), {"axis": -1, "block_size": [32], "skip_first_dim": True}, (1, 32)),
     ((6, 40), {"block_size": [4, 32], "skip_first_dim": True}, (1, 32))],
)  # fmt: skip
def test_any_rank_right_aligned_blocks(shape, params, block):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 5
    spec = spec_of("e2m1", **params)
    q = spec(x)
    assert q.shape == x.shape and torch.isfinite(q).all()
    flat_x, flat_q = x.reshape(-1, shape[-1]), q.reshape(-1, shape[-1])
    if len(block) == 2 and block == (1, 32):  # compare with the 2-D loop on rows
        assert torch.equal(flat_q, reference_scaled(flat_x, "e2m1", block, "f32"))
    else:
        assert spec.scales(x).numel() == math.prod(-(-s // b) for s, b in zip(shape, block))


def test_zero_dimensional_and_empty():
    assert spec_of("e4m3")(torch.tensor(1.95)).item() == 2.0
    for params in ({"block_size": [1, 32]}, {"axis": 0}, {"block_size": [32]}):
        spec = spec_of("e2m1", **params)
        q = spec(torch.tensor(-3.3))
        assert q.dim() == 0 and q.item() == pytest.approx(-3.3, rel=1e-6)  # a block of one: its max is exact
        assert torch.equal(spec(q), q)
        assert spec(torch.empty(0, 32)).shape == (0, 32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("params", [{}, {"block_size": [1, 32]}], ids=["cast", "block32"])
def test_dtypes_and_straight_through_gradient(params, dtype):
    x = (torch.randn(4, 40, generator=torch.Generator().manual_seed(0)) * 3).to(dtype).requires_grad_()
    y = spec_of("e4m3", **params)(x)
    assert y.dtype == dtype and y.shape == x.shape
    (y * torch.arange(40.0, dtype=dtype)).sum().backward()
    assert torch.equal(x.grad, torch.arange(40.0, dtype=dtype).expand(4, 40))


def test_stochastic_rounding_with_scales_is_seeded_and_unbiased():
    spec = spec_of("e2m1", block_size=[1, 64], rounding="stochastic")
    x = torch.full((1000, 64), 2.5)
    x[:, 0] = 6.0  # scale 1: 2.5 lies between 2 and 3
    first = spec(x, seed=11)
    assert torch.equal(first, spec(x, seed=11))
    assert set(first[:, 1:].unique().tolist()) == {2.0, 3.0}
    assert abs(first[:, 1:].mean().item() - 2.5) < 0.01


def test_bits_value_sets_and_registry():
    assert [spec_of(n).bits for n in NAMES] == [8, 8, 6, 6, 4]
    assert spec_of("e4m3", block_size=[1, 32]).bits_per_element((64, 64)) == 8 + 32 / 32
    assert spec_of("e2m1", block_size=[1, 32], scale_dtype="bf16").bits_per_element((64, 64)) == 4 + 16 / 32
    assert spec_of("e2m1", axis=0).bits_per_element((10, 50)) == 4 + 32 * 10 / 500
    assert spec_of("e4m3").bits_per_element((64, 64)) == 8
    assert spec_of("e4m3", axis=0).value_set() is None
    assert spec_of("e2m1").value_set().tolist() == [-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]
    for name, alias in [("e5m2", "float8_e5m2"), ("e4m3", "float8_e4m3fn"), ("e2m1", "float4_e2m1fn")]:
        assert lowbit.get_format(alias) is lowbit.get_format(name)
    for name in NAMES:
        spec = spec_of(name)
        assert spec.max_value == MAX[name] == float(ml_dtypes.finfo(ML_DTYPES[name]).max)
        assert spec.min_normal == float(ml_dtypes.finfo(ML_DTYPES[name]).smallest_normal)
        assert spec.min_subnormal == float(ml_dtypes.finfo(ML_DTYPES[name]).smallest_subnormal)


@pytest.mark.parametrize(
    ("params", "name"),
    [({"saturate": "maybe"}, "saturate"), ({"scale_dtype": "f8"}, "scale_dtype"), ({"block_size": [0, 4]}, "block_size"),
     ({"axis": "rows"}, "axis"), ({"skip_first_dim": 2}, "skip_first_dim"), ({"rounding": "nearest_odd"}, "rounding"),
     ({"width": 8}, "width"), ({"axis": 0, "block_size": [1, 32]}, "axis")],
)  # fmt: skip
def test_bad_parameters_name_the_parameter(params, name):
    with pytest.raises(FormatError, match=name):
        lowbit.quantize(torch.ones(2, 2), "e4m3", **params)
