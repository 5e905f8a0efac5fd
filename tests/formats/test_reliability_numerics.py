"""Issue 47, numerics: non-finite input and whole-tensor statistics; directed rounding in half / float8 dtypes.

Rule 1 (docs/formats.md, "Non-finite input"): a statistic of the data is taken over its finite elements only.
For the sign formats' means (binary's alpha, ternary's TWN threshold and alpha) a NaN or +-inf element is
neither summed nor counted, so the finite outputs are exactly those of the tensor with those elements removed
(per group: per tensor, or per index of ``axis``). For the max-based statistics (affine min-max, block and
MX scales) leaving an element out is the same as setting it to 0, and the finite outputs are those of the
zeroed tensor. NaN stays NaN; +-inf saturate to the extreme values.

Rule 2 (casting.narrow_toward): directed rounding (up / down / toward_zero / away_from_zero) of a float16,
bfloat16 or float8 tensor keeps its direction (compared exactly in float64) and is idempotent.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit import backend
from lowbit.casting import narrow_directed, narrow_toward
from lowbit.formats import resolve
from lowbit.native import build

BACKENDS = ["eager", "native"]
MEAN_FORMATS = [  # (name, parameters): formats whose parameter is a mean of the data
    ("binary", {"scaling_factor": True}),
    ("binary", {"scaling_factor": True, "bipolar": False}),
    ("ternary", {}),
    ("ternary", {"scaling_factor": True}),
    ("ternary", {"scaling_factor": True, "alpha": 0.5}),
]
MAX_FORMATS = [  # formats whose parameters come from a min / max of the data (per tensor, channel or block)
    ("affine", {"bits": 8}),
    ("affine", {"bits": 4, "symmetric": True, "axis": 0}),
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": [1, 8]}),
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": [1, 8]}),
    ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": [1, 8]}),
    ("mxint8", {"block_size": 8}),
    ("e2m1", {"block_size": [1, 8]}),
]
SPECIALS = (math.nan, math.inf, -math.inf)
finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@contextlib.contextmanager
def _backend(name: str):
    """Run on ``name`` (the native library must load for "native": skip otherwise), then put back the one before."""
    if name == "native" and build.ensure() is None:
        pytest.skip(f"no native library: {build.error()}")
    before = backend.get_backend()
    backend.set_backend(name)
    try:
        yield
    finally:
        backend.set_backend(before)


def _with_specials(values: list[float], draws: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` with non-finite elements inserted (position, which special); and where the finite ones are."""
    row = list(values)
    for position, kind in draws:
        row.insert(position % (len(row) + 1), SPECIALS[kind])
    x = torch.tensor(row, dtype=torch.float32)
    return x, torch.isfinite(x)


insertions = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 2)), min_size=1, max_size=6)


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("name,params", MEAN_FORMATS)
@settings(max_examples=15)
@given(values=st.lists(finite, min_size=1, max_size=40), draws=insertions)
def test_mean_statistics_leave_non_finite_elements_out(backend_name, name, params, values, draws):
    spec = resolve(name, **params)
    x, kept = _with_specials(values, draws)
    with _backend(backend_name):
        out, removed = spec(x), spec(torch.tensor(values, dtype=torch.float32))
    assert torch.equal(out[kept], removed)  # as if removed
    assert torch.isnan(out[torch.isnan(x)]).all()
    top, bottom = out[kept].max() if kept.any() else None, out[kept].min() if kept.any() else None
    for sign in (1.0, -1.0):  # +-inf: the extreme value of its sign (+-alpha; 0 below a unipolar alpha)
        infinite = out[x == sign * math.inf]
        assert not torch.isnan(infinite).any()
        if top is not None and infinite.numel():
            assert (infinite >= top).all() if sign > 0 else (infinite <= bottom).all()


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("name,params", [(n, p) for n, p in MEAN_FORMATS if "alpha" not in p])
@settings(max_examples=15)
@given(rows=st.lists(st.lists(finite, min_size=8, max_size=8), min_size=1, max_size=5),
       draws=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 2)), min_size=1, max_size=8))
def test_per_axis_statistics_leave_non_finite_elements_out(backend_name, name, params, rows, draws):
    spec = resolve(name, axis=0, **params)
    x = torch.tensor(rows, dtype=torch.float32)
    for position, kind in draws:
        x.view(-1)[position % x.numel()] = SPECIALS[kind]
    per_tensor = resolve(name, **params)
    with _backend(backend_name):
        out = spec(x)
        for row, got in zip(x, out, strict=True):
            kept = torch.isfinite(row)
            if kept.any():  # each row's statistic: that of its finite elements alone
                assert torch.equal(got[kept], per_tensor(row[kept].contiguous()))


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("name,params", MAX_FORMATS)
@settings(max_examples=12)
@given(rows=st.lists(st.lists(finite, min_size=16, max_size=16), min_size=1, max_size=3),
       draws=st.lists(st.tuples(st.integers(0, 47), st.integers(0, 2)), min_size=1, max_size=5))
def test_max_statistics_ignore_non_finite_elements(backend_name, name, params, rows, draws):
    spec = resolve(name, **params)
    x = torch.tensor(rows, dtype=torch.float32)
    for position, kind in draws:
        x.view(-1)[position % x.numel()] = SPECIALS[kind]
    kept = torch.isfinite(x)
    zeroed = torch.where(kept, x, torch.zeros_like(x))
    with _backend(backend_name):
        out, expected = spec(x), spec(zeroed)
    assert torch.equal(out[kept], expected[kept])
    assert torch.isnan(out[torch.isnan(x)]).all()


# ---- directed rounding in every input dtype -------------------------------------------------------------
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
DIRECTED = ["up", "down", "toward_zero", "away_from_zero"]
DIRECTED_FORMATS = [
    ("affine", {"bits": 8}),
    ("affine", {"bits": 8, "symmetric": True}),
    ("affine", {"bits": 8, "axis": 0}),
    ("affine", {"bits": 8, "scale": 0.1, "zero_point": 3}),
    ("integer", {"width": 8, "frac_width": 4}),
    ("minifloat_ieee", {"width": 8, "exponent_width": 4, "exponent_bias": 7}),
    ("e4m3", {}),
    ("log", {"width": 8, "exponent_bias": 63}),
    ("block_fp", {"width": 12, "exponent_width": 8, "exponent_bias": 127}),
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": [1, 16]}),
    ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": [1, 16]}),
    ("mxint8", {}),
    ("mxfp4_e2m1", {}),
]


def _holds(mode: str, result: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Where ``result`` lies on the mode's side of ``x`` (both float64)."""
    rules = {"up": result >= x, "down": result <= x, "toward_zero": (result.abs() <= x.abs()) & (result * x >= 0),
             "away_from_zero": (result.abs() >= x.abs()) & (result * x >= 0)}  # fmt: skip
    return rules[mode]


@pytest.mark.parametrize("name,params", DIRECTED_FORMATS)
@settings(max_examples=20)
@given(dtype=st.sampled_from(DTYPES), mode=st.sampled_from(DIRECTED), seed=st.integers(0, 2**16),
       exponent=st.integers(-6, 10))
def test_directed_rounding_keeps_direction_and_is_idempotent(name, params, dtype, mode, seed, exponent):
    spec = resolve(name, rounding=mode, **params)
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(4, 32, generator=gen) * 2.0**exponent).to(dtype)
    once = spec(x)
    assert once.dtype == dtype
    twice = spec(once)
    assert torch.equal(once.view(torch.uint8) if dtype.itemsize == 1 else once, twice.view(torch.uint8)
                       if dtype.itemsize == 1 else twice), f"{name} {mode} {dtype}: q(q(x)) != q(x)"  # fmt: skip
    # where the float32 result of the widened input keeps the direction (not saturated), so does this one
    wide = spec(x.float()).double()
    unsaturated = _holds(mode, wide, x.double())
    assert _holds(mode, once.double(), x.double())[unsaturated].all()


def test_issue_examples():
    half = torch.tensor([-0.43798828125, 2.482421875, 1.0], dtype=torch.float16)
    bf16 = torch.tensor([0.0, 2.48, 3184.0], dtype=torch.bfloat16)
    for x in (half, bf16, half.to(torch.float8_e4m3fn)):
        spec = resolve("affine", rounding="up", bits=8)
        once = spec(x)
        assert torch.equal(spec(once).float(), once.float()) and (once.double() >= x.double()).all()
    block = resolve("block_fp", width=12, exponent_width=8, exponent_bias=127, rounding="up")
    x = torch.tensor([512.0, 3.0, -7.5, 1e-3], dtype=torch.bfloat16)
    assert torch.equal(block(block(x)), block(x)) and block(x)[0] == 512.0


# ---- the narrowing helpers against every value of each dtype ----------------------------------------------
def _all_values(dtype: torch.dtype) -> torch.Tensor:
    if dtype.itemsize == 1:
        values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    else:
        values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).float()
    return values[torch.isfinite(values)].double().unique()


def _sample(values: torch.Tensor) -> torch.Tensor:
    """Every value of an 8-bit dtype; of a 16-bit one, every 5th (and both ends)."""
    return values if values.numel() < 512 else torch.cat([values[::5], values[-1:]])


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_narrowing_matches_the_enumerated_values(dtype):
    values = _all_values(dtype)
    gen = torch.Generator().manual_seed(0)
    probe = torch.cat([_sample(values).float(), (torch.randn(5000, generator=gen) * values.max().sqrt()).float(),
                       torch.tensor([0.0, -0.0, 1e-30, -1e-30])])  # fmt: skip
    probe = probe[probe.abs() <= values.max()]
    infinity = torch.tensor([math.inf], dtype=torch.float64)
    ends = torch.cat([-infinity, values, infinity])
    floor = ends[torch.searchsorted(ends, probe.double(), side="right") - 1]
    ceil = ends[torch.searchsorted(ends, probe.double(), side="left")]
    up_target, down_target = torch.full_like(probe, math.inf), torch.full_like(probe, -math.inf)
    assert torch.equal(narrow_toward(probe, up_target, dtype).double(), ceil)
    assert torch.equal(narrow_toward(probe, down_target, dtype).double(), floor)
    assert torch.equal(narrow_directed(probe, dtype, "up").double(), floor)  # "up" narrows down
    assert torch.equal(narrow_directed(probe, dtype, "down").double(), ceil)
