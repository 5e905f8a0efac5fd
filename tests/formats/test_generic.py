"""The numerics contract, checked for every case of tests/format_cases.py whose format is registered.

Formats are added in parallel; a case whose format is not registered yet is simply not collected here
(tests/formats/test_registry_cases.py fails until CASES and the registry agree).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit.errors import FormatError
from format_cases import CASES
from helpers import assert_same

REGISTERED = set(lowbit.list_formats())
ACTIVE = [pytest.param(name, params, traits, id=case_id) for case_id, name, params, traits in CASES
          if name in REGISTERED]  # fmt: skip
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 40), (2, 3, 2, 33)]
EMPTY_SHAPES = [(0,), (0, 5), (3, 0), (2, 0, 4)]


def make_spec(name: str, params: dict) -> lowbit.FormatSpec:
    return lowbit.get_format(name)(**params)


def sample(shape, dtype=torch.float32, seed: int = 0, spread: float = 3.0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * spread).to(dtype)


# ---- shape, dtype, any rank ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,traits", ACTIVE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shape_and_dtype(name, params, traits, dtype):
    spec = make_spec(name, params)
    for shape in SHAPES:
        x = sample(shape, dtype, seed=len(shape))
        y = spec(x)
        assert y.shape == x.shape and y.dtype == dtype, shape
        assert not torch.isnan(y).any(), shape
    for shape in EMPTY_SHAPES:
        y = spec(torch.empty(shape, dtype=dtype))
        assert y.shape == shape and y.dtype == dtype


@pytest.mark.parametrize("name,params,traits", ACTIVE)
def test_outputs_lie_in_the_value_set(name, params, traits):
    spec = make_spec(name, params)
    values = spec.value_set()
    if values is None:  # the values depend on the data (a scale from the tensor)
        return
    y = spec(sample((4, 64), torch.float64, seed=1, spread=10.0))
    distance = (y.reshape(-1, 1) - values.reshape(1, -1)).abs().min(dim=1).values
    assert (distance <= 1e-12 * values.abs().max()).all()


# ---- idempotence -----------------------------------------------------------------------------------------
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
finite_float32 = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1e-38, FLOAT32_MAX, -FLOAT32_MAX, 0.5, -1.5, 3.0]),
    st.floats(-8.0, 8.0, width=32),
)


@st.composite
def finite_tensors(draw) -> torch.Tensor:
    """1-D or 2-D float32 tensors of up to 24 finite values (small: drawing floats is what costs time)."""
    values = draw(st.lists(finite_float32, min_size=1, max_size=24))
    x = torch.tensor(values, dtype=torch.float32)
    return x.reshape(2, -1) if len(values) % 2 == 0 and draw(st.booleans()) else x


@pytest.mark.parametrize("name,params,traits", ACTIVE)
@given(x=finite_tensors())
def test_idempotent(name, params, traits, x):
    spec = make_spec(name, params)
    once = spec(x)
    assert_requantized(spec, once, traits)


def assert_requantized(spec: lowbit.FormatSpec, once: torch.Tensor, traits) -> None:
    """q(q(x)) == q(x) bit for bit; asymmetric min-max formats may move a value by one step at most."""
    if "searched" in traits:  # a least-squares search re-fits its own output: no fixed point is claimed
        assert torch.equal(torch.isfinite(spec(once)), torch.isfinite(once))  # (search=False cases carry it)
        return
    if "scale_recomputed" in traits:  # a few ulps: the owner's rule re-derives the scale from the maximum
        again = spec(once)
        assert torch.all((again - once).abs() <= once.abs() * 2.0**-20), (once, again)
        return
    if "asymmetric_minmax" not in traits:
        assert_same(spec(once), once)
        return
    step = spec.scale_and_zero_point(once).scale.to(once.dtype)
    assert torch.all((spec(once) - once).abs() <= step * 1.0001)


@pytest.mark.parametrize("name,params,traits", ACTIVE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_idempotent_every_dtype(name, params, traits, dtype):
    spec = make_spec(name, params)
    once = spec(sample((3, 64), dtype, seed=2))
    assert_requantized(spec, once, traits)


# ---- NaN and infinities ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,traits", ACTIVE)
def test_nan_stays_nan_and_changes_nothing_else(name, params, traits):
    spec = make_spec(name, params)
    x = sample((3, 40), seed=3)
    x[1, 5] = 0.0
    with_nan = x.clone()
    with_nan[1, 5] = math.nan
    y_nan, y_zero = spec(with_nan), spec(x)
    assert torch.isnan(y_nan[1, 5])
    others = torch.ones_like(x, dtype=torch.bool)
    others[1, 5] = False
    if "nan_left_out" in traits:  # per-tensor statistics: as if the element were not there at all
        y_zero = torch.zeros_like(x)
        y_zero[others] = spec(x[others])
    assert_same(y_nan[others], y_zero[others])


@pytest.mark.parametrize("name,params,traits", ACTIVE)
def test_infinities_never_give_nan(name, params, traits):
    spec = make_spec(name, params)
    x = sample((2, 40), seed=4)
    x[0, 3], x[1, 7] = math.inf, -math.inf
    y = spec(x)
    assert not torch.isnan(y).any()
    assert y[0, 3] >= y[1, 7]
    if "scalar" in traits:  # one element's value cannot depend on the others: +-inf sit at the ends
        assert (y[0, 3] >= y).all() and (y[1, 7] <= y).all()


# ---- symmetry, monotonicity ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,traits", [p for p in ACTIVE if "sign_symmetric" in p.values[2]])
def test_sign_symmetric(name, params, traits):
    spec = make_spec(name, params)
    x = sample((4, 64), torch.float64, seed=5)
    x[0, :8] = 0.0
    assert_same(spec(-x), -spec(x))


def sorted_probe() -> torch.Tensor:
    """Both signs, zero, tiny to huge magnitudes, sorted ascending (float32)."""
    magnitudes = torch.logspace(-40, 38, 400, dtype=torch.float64)
    magnitudes = torch.cat([magnitudes, torch.linspace(0, 20, 401, dtype=torch.float64)])
    values = torch.cat([magnitudes, -magnitudes]).float()
    return values.unique()


@pytest.mark.parametrize("name,params,traits", [p for p in ACTIVE if "scalar" in p.values[2]])
def test_monotonic(name, params, traits):
    y = make_spec(name, params)(sorted_probe())
    assert (y[1:] >= y[:-1]).all()


# ---- gradient ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,traits", ACTIVE)
def test_gradient_is_straight_through(name, params, traits):
    spec = make_spec(name, params)
    x = sample((3, 40), seed=6, spread=100.0).requires_grad_()  # out-of-range values included
    upstream = sample((3, 40), seed=7)
    spec(x).backward(upstream)
    assert_same(x.grad, upstream)
    x.grad = None
    lowbit.quantize(x, name, **params).backward(upstream)
    assert_same(x.grad, upstream)


# ---- zero and constant inputs ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,traits", ACTIVE)
@pytest.mark.parametrize("shape", [(), (5,), (3, 40)], ids=str)
def test_all_zero_input(name, params, traits, shape):
    spec = make_spec(name, params)
    y = spec(torch.zeros(shape))
    assert torch.isfinite(y).all()
    values = spec.value_set()
    if values is None or (values == 0).any():
        assert (y == 0).all()
    else:  # zero is not representable (e.g. bipolar binary): every element gets the same value nearest 0
        nearest_zero = values.to(y.dtype).abs().min()
        assert (y == y.reshape(-1)[0]).all() and y.abs().reshape(-1)[0] == nearest_zero


@pytest.mark.parametrize("name,params,traits", ACTIVE)
@pytest.mark.parametrize("constant", [0.37, -5.0, 1e-3, 1e4])
def test_constant_input_gives_finite_constant_output(name, params, traits, constant):
    y = make_spec(name, params)(torch.full((3, 40), constant))
    assert torch.isfinite(y).all()
    assert (y == y[0, 0]).all()


# ---- value set, determinism, API equivalence ------------------------------------------------------------
@pytest.mark.parametrize("name,params,traits", ACTIVE)
def test_value_set_is_sorted_and_maps_to_itself(name, params, traits):
    spec = make_spec(name, params)
    values = spec.value_set()
    if values is None:
        return
    assert values.dtype == torch.float64 and values.dim() == 1 and values.numel() >= 2
    assert (values.diff() > 0).all()
    assert_same(spec(values), values)
    if torch.equal(values.float().double(), values):  # exactly representable in float32 too
        assert_same(spec(values.float()), values.float())


@pytest.mark.parametrize("name,params,traits", ACTIVE)
def test_deterministic(name, params, traits):
    spec = make_spec(name, params)
    x = sample((3, 40), seed=8)
    x[0, 0], x[1, 1], x[2, 2] = math.nan, math.inf, 0.0
    assert_same(spec(x), spec(x))
    assert_same(make_spec(name, params)(x), spec(x))


@pytest.mark.parametrize("name,params,traits", ACTIVE)
def test_api_entry_points_agree(name, params, traits):
    x = sample((2, 3, 40), seed=9)
    spec = make_spec(name, params)
    by_name = lowbit.quantize(x, name, **params)
    assert_same(lowbit.get_format(name)(**params)(x), by_name)
    assert_same(spec.quantize(x), by_name)
    assert_same(lowbit.get_format(name).create(**params)(x), by_name)
    assert_same(lowbit.quantize(x, spec), by_name)
    assert spec == lowbit.formats.resolve(name, **params)


def test_resolve_reuses_a_validated_spec_only_for_parameters_the_checks_cannot_tell_apart():
    spec = lowbit.formats.resolve("integer", width=4, frac_width=2)
    assert lowbit.formats.resolve("integer", frac_width=2, width=4) is spec  # keyword order does not matter
    lowbit.formats.resolve("integer", width=1, frac_width=0)
    with pytest.raises(FormatError, match="width=True"):  # True == 1 and hash(True) == hash(1): still refused
        lowbit.formats.resolve("integer", width=True, frac_width=0)
    blocks = lowbit.formats.resolve("block_fp", width=8, block_size=[1, 16])
    assert lowbit.formats.resolve("block_fp", width=8, block_size=[1, 16]) is blocks
    assert lowbit.formats.resolve("block_fp", width=8, block_size=(1, 16)) == blocks
