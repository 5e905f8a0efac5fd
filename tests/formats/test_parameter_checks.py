"""Issue 19's API items: bad parameters and unusual tensors give a FormatError naming the problem, never a
raw torch error or a silent wrong answer; given scales are range-checked; sparse / meta tensors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import lowbit
from format_cases import CASES
from helpers import t
from lowbit.errors import FormatError
from lowbit.formats._registry import get_format

CASE_PARAMS = [pytest.param(name, params, id=case_id) for case_id, name, params, _ in CASES]
FLOAT32_TINY = torch.finfo(torch.float32).tiny
FLOAT32_MAX = torch.finfo(torch.float32).max


# ---- given affine scales ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-45, FLOAT32_TINY / 2, 0.0, -1.0, 1e300, math.inf, math.nan, [0.5, 1e-40]])
def test_given_affine_scale_out_of_float32_range_is_a_format_error(scale):
    with pytest.raises(FormatError, match=r"affine: scale=.* is invalid; every value must be a finite number in"):
        lowbit.quantize(torch.zeros(4), "affine", scale=scale, axis=0 if isinstance(scale, list) else None)


def test_given_affine_scale_at_the_float32_limits_gives_finite_values():
    for scale in (FLOAT32_TINY, FLOAT32_MAX):
        y = lowbit.quantize(t([0.0, 1.0, -1e38, 3e38]), "affine", scale=scale)
        assert torch.isfinite(y).all()
    assert torch.equal(lowbit.quantize(torch.zeros(4), "affine", scale=FLOAT32_TINY), torch.zeros(4))


def test_given_affine_scale_rounded_up_to_a_power_of_two_must_stay_in_range():
    with pytest.raises(FormatError, match="scale=3e"):
        lowbit.get_format("affine")(scale=3e38, power_of_two=True)
    y = lowbit.quantize(t([1e38, -3e38, 5.0]), "affine", scale=2.0**127, power_of_two=True)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("zero_point", [math.inf, -math.inf, math.nan, "3", True, b"3", 2.5])
def test_given_zero_point_must_be_an_integer(zero_point):
    with pytest.raises(FormatError, match="zero_point"):
        lowbit.get_format("affine")(scale=0.5, zero_point=zero_point)


# ---- junk types for every format's parameters --------------------------------------------------------------
@pytest.mark.parametrize(
    "params",
    [{"scale": "8"}, {"scale": True}, {"scale": b"8"}, {"scale": [True]}, {"scale": ["8"]}, {"block_size": b"8"},
     {"block_size": "8"}, {"block_size": bytearray(b"8")}, {"block_size": {8}}, {"block_size": True},
     {"scale_dtype": ["f16"]}, {"bits": "8"}, {"bits": True}],
    ids=repr,
)  # fmt: skip
def test_affine_junk_is_a_format_error_naming_the_parameter(params):
    (name,) = params
    with pytest.raises(FormatError, match=f"affine: {name}="):
        lowbit.quantize(torch.zeros(4, 8), "affine", **params)


JUNK = ["8", b"8", bytearray(b"8"), {8}, {"a": 1}, [[8]], object(), 1 + 2j, ["8"], [b"8"]]


def _parameter_cases():
    for name in lowbit.list_formats():
        cls = get_format(name)
        for field in dataclasses.fields(cls):
            if field.init:
                yield pytest.param(name, field.name, "bool" in str(field.type), id=f"{name}-{field.name}")


@pytest.mark.parametrize("name,parameter,is_flag", list(_parameter_cases()))
def test_junk_values_are_a_format_error_for_every_parameter(name, parameter, is_flag):
    """Strings, bytes, sets, dicts, nested lists and objects are never a number, a block size, a flag or a
    choice; True / False are a flag, never a number (``width=True`` is not width 1)."""
    cls = get_format(name)
    for value in JUNK + ([] if is_flag else [True, False]):
        with pytest.raises(FormatError, match=parameter):
            cls.create(**{parameter: value})(torch.ones(2, 8))


@pytest.mark.parametrize("name", ["binary_residual"])
@pytest.mark.parametrize("means", ["12", b"\x01\x02", [True, True], ("1", "2")], ids=repr)
def test_residual_means_must_be_numbers(name, means):
    with pytest.raises(FormatError, match="means="):
        get_format(name)(levels=2, means=means)


@pytest.mark.parametrize("value", [torch.tensor([True]), "True", 1.0 + 0j, [True]], ids=repr)
def test_preset_fixed_parameters_take_only_their_own_value(value):
    with pytest.raises(FormatError, match="q8s: signed=.* the preset fixes signed=True"):
        get_format("q8s")(signed=value)
    assert get_format("q8s")(signed=True, bits=8.0).bits == 8


# ---- block_fp at width 32 ----------------------------------------------------------------------------------
def test_block_fp_width_32_saturates_an_inf_block_at_the_float32_max():
    x = torch.full((32,), math.inf)
    x[1::2] = -math.inf
    y = lowbit.quantize(x, "block_fp", width=32)
    assert torch.equal(y, torch.where(x > 0, FLOAT32_MAX, -FLOAT32_MAX))  # the documented rule: +-max, never inf
    lone = lowbit.quantize(t([0.0] * 15 + [math.inf]), "block_fp", width=32)
    assert lone[-1] == FLOAT32_MAX and (lone[:-1] == 0).all()
    near_top = lowbit.quantize(t([3.4e38, -3.4e38, 1.0, 0.0]), "block_fp", width=32, block_size=4)
    assert torch.isfinite(near_top).all() and near_top[0] == 3.4e38 and near_top[1] == -3.4e38


def test_block_fp_width_32_top_value_is_on_the_block_grid_and_idempotent():
    x = torch.full((16,), math.inf)
    y = lowbit.quantize(x, "block_fp", width=32)
    step = 2.0 ** (127 - 31 + 1)  # the step of the largest exponent
    assert float(y[0]) / step == int(float(y[0]) / step)
    assert torch.equal(lowbit.quantize(y, "block_fp", width=32), y)


# ---- sparse and meta tensors -------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params", CASE_PARAMS)
def test_sparse_tensors_are_a_format_error(name, params):
    dense = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    for sparse in (dense.to_sparse(), dense.to_sparse_csr()):
        with pytest.raises(FormatError, match=r"dense \(strided\) tensor.*to_dense"):
            lowbit.quantize(sparse, name, **params)


@pytest.mark.parametrize("name,params", CASE_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_meta_tensors_give_a_meta_tensor_of_the_same_shape_and_dtype(name, params, dtype):
    x = torch.empty(4, 32, device="meta", dtype=dtype)
    y = lowbit.quantize(x, name, **params)
    assert y.device.type == "meta" and y.shape == x.shape and y.dtype == dtype


# ---- affine derived scales: directed modes are idempotent ---------------------------------------------------
DIRECTED = ["up", "down", "toward_zero", "away_from_zero"]


@pytest.mark.parametrize("rounding", DIRECTED + ["nearest_even", "nearest_away"])
@pytest.mark.parametrize(
    "params",
    [{}, {"bits": 4}, {"bits": 4, "block_size": [8]}, {"bits": 3, "power_of_two": True}, {"bits": 11},
     {"bits": 2, "signed": False}, {"bits": 1}, {"symmetric": True}, {"bits": 5, "axis": 0}],
    ids=repr,
)  # fmt: skip
def test_affine_derived_parameters_are_idempotent_under_every_deterministic_mode(rounding, params):
    spec = lowbit.get_format("affine")(rounding=rounding, **params)
    for seed in range(8):
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 64, generator=generator) * 10 ** torch.randn((), generator=generator)
        x = x + torch.randn((), generator=generator)
        once = spec(x)
        assert torch.equal(spec(once), once), seed


def test_affine_up_keeps_values_on_the_grid():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    once = lowbit.quantize(x, "affine", rounding="up")
    assert torch.equal(lowbit.quantize(once, "affine", rounding="up"), once)
    assert (once >= x).sum() >= 999  # up, except the block maximum where the code range ends


def test_affine_toward_zero_stays_inside_the_data_and_pins_both_ends():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) + 0.3
    spec = lowbit.get_format("affine")(rounding="toward_zero", bits=4)
    y = spec(x)
    assert (y.abs() <= x.abs()).all()
    parameters = spec.scale_and_zero_point(x)
    codes = torch.round(y / parameters.scale) + parameters.zero_point
    assert codes.min() == -8 and codes.max() == 7  # both end codes in use: the grid re-derives unchanged


@pytest.mark.parametrize("rounding", DIRECTED)
@pytest.mark.parametrize(
    "params", [{"scale_dtype": "bf16"}, {"scale_dtype": "f16", "bits": 5}, {"scale_dtype": "bf16", "symmetric": True},
               {"bits": 2, "signed": False, "scale_dtype": "f16"}], ids=repr,
)  # fmt: skip
def test_affine_directed_modes_with_half_precision_scales_are_idempotent(rounding, params):
    spec = lowbit.get_format("affine")(rounding=rounding, **params)
    for seed in range(8):
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 64, generator=generator) * 10 ** torch.randn((), generator=generator) + 0.2
        once = spec(x)
        assert torch.equal(spec(once), once), seed


# ---- scaled OCP elements: directed modes are idempotent ------------------------------------------------------
@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m1"])
@pytest.mark.parametrize("rounding", DIRECTED)
@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_scaled_elements_are_idempotent_under_directed_modes(name, rounding, saturate, dtype):
    cases = ({"block_size": [1, 32]}, {"axis": 0}, {"block_size": [1, 8], "scale_dtype": "bf16"}, {"scale": 0.37})
    for params in cases:
        spec = lowbit.get_format(name)(rounding=rounding, saturate=saturate, **params)
        for seed in range(4):
            generator = torch.Generator().manual_seed(seed)
            x = (torch.randn(4, 32, generator=generator, dtype=torch.float64) * 3).to(dtype)
            once = spec(x)
            assert torch.isfinite(once).all() or "scale" in params
            assert torch.equal(spec(once), once), (params, seed)


def test_scaled_element_down_keeps_grid_values_and_the_block_maximum():
    x = torch.tensor([[0.3, -0.07015062, 2.2339, 1.1209]])
    spec = lowbit.get_format("e4m3")(rounding="down", axis=0)
    once = spec(x)
    assert (once <= x).all()
    assert once.max() == 448 * spec.scales(x).max()  # the positive extreme lands on max_element * s


def test_scaled_element_near_the_float_max_stays_finite():
    y = lowbit.quantize(t([[3.4e38]]), "e3m2", axis=0, scale_dtype="bf16", saturate=False)
    assert torch.isfinite(y).all()
