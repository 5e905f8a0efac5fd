"""Given (calibrated, frozen) scales: OCP elements with ``scale``, binary / ternary with ``alpha``.

Oracles are independent of lowbit: x / s cast through torch.float8_* / ml_dtypes and multiplied back,
plain sign rules, and the unscaled ternary's signs times alpha.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import lowbit
from lowbit import FormatError
from lowbit.formats import Binary, Ternary
from lowbit.formats.ocp_float import ELEMENT_FORMATS

NAMES = ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
ML_DTYPES = {"e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn, "e2m1": ml_dtypes.float4_e2m1fn}
TORCH_DTYPES = {"e5m2": torch.float8_e5m2, "e4m3": torch.float8_e4m3fn}
SCALE_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def cast(x: torch.Tensor, name: str) -> torch.Tensor:
    """Round-half-even cast to the element type and back to float32 (torch for FP8, ml_dtypes for FP6 / FP4)."""
    if name in TORCH_DTYPES:
        return x.to(TORCH_DTYPES[name]).float()
    return torch.from_numpy(x.numpy().astype(ML_DTYPES[name]).astype(np.float32))


def stored(scale: float, scale_dtype: str = "f32") -> torch.Tensor:
    """The scale as the format stores it: rounded to nearest in scale_dtype, as float32."""
    return torch.tensor(scale).to(SCALE_TORCH[scale_dtype]).float()


def oracle(x: torch.Tensor, name: str, scale: torch.Tensor) -> torch.Tensor:
    return cast(x / scale, name) * scale


def grid_probe(name: str, scale: torch.Tensor) -> torch.Tensor:
    """Every element value, every midpoint and +-1 float32 ulp around each, all times the scale (float32)."""
    values = ELEMENT_FORMATS[name].grid.values()
    points = torch.cat([values, (values[1:] + values[:-1]) / 2]).float() * scale
    up, down = (torch.nextafter(points, torch.full_like(points, v)) for v in (math.inf, -math.inf))
    return torch.cat([points, up, down])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


# ---- OCP element formats ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.37, 2.0**-7, 1234.5])
def test_given_scale_equals_the_cast_oracle_over_the_whole_grid(name, scale):
    spec = lowbit.get_format(name)(scale=scale)
    s = stored(scale)
    x = grid_probe(name, s)
    assert same_bits(spec(x), oracle(x, name, s))
    values = (ELEMENT_FORMATS[name].grid.values() * s.double()).float()  # every value maps to itself
    assert same_bits(spec(values), values)
    assert torch.equal(spec.value_set(), ELEMENT_FORMATS[name].grid.values() * s.double())


@pytest.mark.parametrize("name", NAMES)
def test_given_scales_per_channel_and_scale_dtype(name):
    scales = [0.37, 3.0, 2.0**-12, 7e3]
    for scale_dtype in ("f32", "f16", "bf16"):
        spec = lowbit.get_format(name)(scale=scales, axis=0, scale_dtype=scale_dtype)
        rows = [grid_probe(name, stored(s, scale_dtype)) for s in scales]
        x = torch.stack(rows)  # [4, n]: row c on the grid of scale c
        want = torch.stack([oracle(row, name, stored(s, scale_dtype)) for row, s in zip(rows, scales)])
        assert same_bits(spec(x), want), scale_dtype
        transposed = lowbit.get_format(name)(scale=scales, axis=-1, scale_dtype=scale_dtype)
        assert same_bits(transposed(x.T.contiguous()), want.T.contiguous())


@pytest.mark.parametrize("name", NAMES)
def test_the_scale_is_frozen_whatever_the_data(name):
    spec = lowbit.get_format(name)(scale=0.05)
    s, top = stored(0.05), ELEMENT_FORMATS[name].max_value
    small, large = torch.randn(8, 16) * 0.01, torch.randn(8, 16) * 1000
    for batch in (small, large):
        assert same_bits(spec(batch), oracle(batch.clamp(-top * s, top * s), name, s))
        assert torch.equal(spec.scales(batch), torch.full((1, 1), float(s)))
    beyond = torch.tensor([1.001, 2.0, 1e6, math.inf]) * top * s
    assert torch.equal(spec(beyond), torch.full((4,), top) * s)  # saturate=True: the calibrated max
    assert torch.equal(spec(-beyond), -torch.full((4,), top) * s)
    derived = lowbit.get_format(name)(block_size=[-1, -1])  # per tensor, scale from each call's data
    assert not torch.equal(spec(large), derived(large))


def test_overflow_without_saturation_follows_the_type():
    beyond = torch.tensor([2.0, 1e6, math.inf]) * 448 * 0.25
    assert torch.isnan(lowbit.quantize(beyond, "e4m3", scale=0.25, saturate=False)).all()
    assert torch.isinf(lowbit.quantize(beyond * 200, "e5m2", scale=0.25, saturate=False)).all()
    assert torch.isnan(lowbit.quantize(torch.tensor([math.nan]), "e2m1", scale=0.25)).all()


def test_bits_per_element_and_describe():
    spec = lowbit.get_format("e4m3")(scale=[0.5, 0.25], axis=1)
    assert spec.bits_per_element((3, 2)) == 8.0 and spec.is_scaled  # given: a parameter, as affine's
    assert spec.value_set() is None  # one grid per channel
    assert spec.describe() == "e4m3(axis=1, scale=(0.5, 0.25))"
    assert lowbit.get_format("e4m3")(scale="NA").scale is None and lowbit.get_format("e4m3")(scale=2).scale == (2.0,)


@pytest.mark.parametrize("params, message", [
    ({"scale": 0}, r"scale=0 is invalid; every value must be a finite number in \[1.17549e-38, 3.40282e\+38\]"),
    ({"scale": -0.5}, r"scale=-0.5 is invalid"),
    ({"scale": math.nan}, r"scale=nan is invalid"),
    ({"scale": math.inf}, r"scale=inf is invalid"),
    ({"scale": 1e39}, r"scale=1e\+39 is invalid"),
    ({"scale": 1e5, "scale_dtype": "f16"}, r"in \[6.10352e-05, 65504\] \(the range of f16 scales\)"),
    ({"scale": [0.1, -0.1], "axis": 0}, r"scale=\[0.1, -0.1\] is invalid"),
    ({"scale": "big"}, r"scale='big' is invalid"),
    ({"scale": True}, r"scale=True is invalid"),
    ({"scale": [0.1, 0.2]}, r"2 values need axis="),
    ({"scale": 0.1, "block_size": [1, 32]}, r"give scale= .* or block_size= .*not both"),
])  # fmt: skip
def test_invalid_given_scales(params, message):
    with pytest.raises(FormatError, match=message):
        lowbit.get_format("e4m3")(**params)


def test_scale_count_must_match_the_axis():
    spec = lowbit.get_format("e2m1")(scale=[0.1, 0.2, 0.3], axis=0)
    with pytest.raises(FormatError, match=r"e2m1: scale: 3 values do not match dimension 0 of size 4 \(axis=0"):
        spec(torch.randn(4, 5))
    assert spec(torch.randn(3, 5)).shape == (3, 5)
    assert lowbit.get_format("e2m1")(scale=[0.5], axis=1)(torch.randn(2, 7)).shape == (2, 7)  # one value broadcasts


# ---- binary / ternary with a given alpha --------------------------------------------------------------------
def test_binary_given_alpha():
    x = torch.randn(4, 50)
    x[0, :4] = torch.tensor([0.0, -0.0, math.inf, -math.inf])
    x[1, 0] = math.nan
    alpha = torch.tensor([0.5, 1.5, 2.0, 0.25]).reshape(4, 1)
    bipolar = Binary(scaling_factor=True, alpha=alpha.flatten().tolist(), axis=0)
    unipolar = Binary(scaling_factor=True, bipolar=False, alpha=1.25)
    want = torch.where(x >= 0, alpha, -alpha)
    want[1, 0] = math.nan
    assert torch.equal(bipolar(x).nan_to_num(7.0), want.nan_to_num(7.0))
    assert torch.equal(unipolar(x * 1000).nan_to_num(7.0), torch.where(x > 0, 1.25, 0.0).masked_fill(x.isnan(), 7.0))
    assert Binary(scaling_factor=True, alpha=0.5).value_set().tolist() == [-0.5, 0.5]
    assert bipolar.bits_per_element((4, 50)) == 1.0


def test_binary_given_alpha_stochastic_is_unbiased():
    spec = Binary(scaling_factor=True, alpha=2.0, stochastic=True)
    x = torch.tensor([-1.5, -0.4, 0.0, 0.9, 1.99]).repeat(20000, 1)
    y = spec(x, seed=0)
    assert set(y.unique().tolist()) == {-2.0, 2.0}
    assert torch.allclose(y.mean(0), x[0], atol=0.03)  # 20000 draws of +-2: standard error <= 0.014


@pytest.mark.parametrize("params", [{}, {"threshold": 0.4}, {"median": -0.5}, {"axis": 1}])
def test_ternary_given_alpha_keeps_the_threshold_rule(params):
    x = torch.randn(6, 20)
    x[2, 3], x[4, 4] = math.nan, -math.inf
    axis = params.get("axis")
    alpha = [0.1 * (i + 1) for i in range(20)] if axis is not None else 0.8
    spec = Ternary(scaling_factor=True, alpha=alpha, **params)
    signs = Ternary(**params)(x)  # the same delta rule, unscaled
    want = signs * torch.tensor(alpha).reshape(1, -1) if axis is not None else signs * 0.8
    assert torch.equal(spec(x).nan_to_num(9.0), want.nan_to_num(9.0))
    for batch in (x * 50, x * 0.01):  # alpha stays; delta follows the rule
        magnitudes = set(spec(batch).abs().nan_to_num(0).unique().tolist())
        assert magnitudes <= {0.0, *torch.tensor(alpha).reshape(-1).tolist()}


def test_ternary_given_alpha_idempotence_and_errors():
    x = torch.randn(50)
    calibrated = Ternary(scaling_factor=True, alpha=1.2, threshold=0.6)  # alpha > delta: idempotent
    assert torch.equal(calibrated(calibrated(x)), calibrated(x))
    below = Ternary(scaling_factor=True, alpha=0.3, threshold=0.6)  # alpha <= delta: a second pass gives 0
    assert torch.equal(below(below(x)), torch.zeros(50))
    assert Ternary(scaling_factor=True, alpha=0.5).value_set().tolist() == [-0.5, 0.0, 0.5]
    with pytest.raises(FormatError, match=r"ternary: alpha=\(0.5,\) needs scaling_factor=True"):
        Ternary(alpha=0.5)
    with pytest.raises(FormatError, match=r"binary: alpha=0 is invalid"):
        Binary(scaling_factor=True, alpha=0)
    with pytest.raises(FormatError, match=r"alpha=nan is invalid"):
        Ternary(scaling_factor=True, alpha=math.nan)
    with pytest.raises(FormatError, match=r"ternary: alpha: 2 values do not match dimension 0 of size 3"):
        Ternary(scaling_factor=True, alpha=[1.0, 2.0], axis=0)(torch.randn(3, 4))
