"""Tests of the public API: lowbit.quantize, list_formats, get_format, spec objects, seeds and gradients."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import math

import torch

import lowbit
import lowbit.api
from lowbit import FormatError
from lowbit.formats import Affine, Integer
from lowbit.formats.ste import straight_through

MY_FORMATS = ["integer", "fixed", "affine", "q8s", "q4s", "q2s", "q8f", "q4f", "q2f"]


# ---- the documented examples, with their values ----------------------------------------------------------------
def test_integer_examples():
    x = torch.tensor([0.30, -1.7, 0.03125, 100.0])
    assert lowbit.quantize(x, "integer", width=8, frac_width=4).tolist() == [0.3125, -1.6875, 0.0, 7.9375]
    out = lowbit.quantize(x, "integer", width=8, frac_width=4, rounding="stochastic", seed=0)
    assert torch.equal(out, lowbit.quantize(x, "integer", width=8, frac_width=4, rounding="stochastic", seed=0))
    assert out[0].item() in (0.25, 0.3125) and out[1].item() in (-1.75, -1.6875) and out[3].item() == 7.9375


def test_affine_examples():
    x = torch.tensor([0.34, -20.0, 30.0])
    assert torch.equal(lowbit.quantize(x, "affine", bits=8, scale=0.1, zero_point=3),
                       torch.tensor([3.0, -131.0, 124.0]) * torch.tensor(0.1))  # codes [-128, 127] # fmt: skip
    assert torch.equal(lowbit.quantize(x, "affine", bits=8, signed=False, scale=0.1, zero_point=3),
                       torch.tensor([3.0, -3.0, 252.0]) * torch.tensor(0.1))  # codes [0, 255] # fmt: skip
    w = torch.tensor([[0.5, -1.0, 0.2], [7.0, 3.0, -0.4]])
    # max |row| / 7 for 4-bit symmetric codes; 1/7 kept to 20 significant bits (so 7 * scale is exact)
    scales = torch.tensor([math.floor(2.0**22 / 7) * 2.0**-22, 1.0])
    expected = torch.round(w * (1 / scales[:, None])) * scales[:, None]
    assert torch.equal(lowbit.quantize(w, "affine", bits=4, symmetric=True, axis=0), expected)
    v = torch.cat([torch.full((1, 32), 0.25), torch.full((1, 32), -3.0)], dim=1)
    v[0, 0] = 3.0
    out = lowbit.quantize(v, "affine", bits=4, block_size=[1, 32], power_of_two=True)
    assert out[0, 0].item() == 3.0 and out[0, 1].item() == 0.25 and out[0, 40].item() == -3.0  # scales 1/4, 1/4


def test_preset_and_ternary_examples():
    x = torch.linspace(-1, 1, 64).reshape(1, 64)  # both blocks of 32 have max |x| = 1
    out = lowbit.quantize(x, "q4s", block_size=[1, 32], scale_dtype="bf16")
    scale = torch.tensor(146 / 1024)  # 1/7 = 0.142857 stored in bf16: 0.142578 (1 -> 7.01 steps, in range)
    assert torch.equal(out, torch.round(x * (1 / scale)).clamp(-7, 7) * scale)
    y = torch.tensor([[0.1, -2.0, 1.0, 0.05, -0.6, 3.0]])
    # TWN: delta = 0.75 * mean|y| = 0.84375; alpha = mean |y| above delta = (2 + 1 + 3) / 3 = 2
    assert lowbit.quantize(y, "ternary", scaling_factor=True).tolist() == [[0.0, -2.0, 2.0, 0.0, 0.0, 2.0]]


def test_docstring_examples_run():
    assert doctest.testmod(lowbit.api, raise_on_error=False).failed == 0


# ---- the registry -----------------------------------------------------------------------------------------------
def test_list_formats():
    names = lowbit.list_formats()
    assert names == sorted(names) and len(names) == len(set(names))
    assert set(MY_FORMATS) <= set(names)
    assert all(lowbit.get_format(name).format_name == name or name in lowbit.get_format(name).aliases for name in names)


def test_get_format_returns_the_spec_class():
    assert lowbit.get_format("integer") is Integer is lowbit.formats.Integer
    assert lowbit.get_format("affine") is Affine
    assert lowbit.get_format(" Q4S ") is lowbit.formats.Q4S
    assert all(isinstance(lowbit.get_format(name)(), lowbit.FormatSpec) for name in MY_FORMATS)


def test_unknown_format_suggests_the_nearest():
    with pytest.raises(FormatError, match="did you mean 'integer'"):
        lowbit.get_format("integr")
    with pytest.raises(FormatError, match="did you mean 'affine'"):
        lowbit.quantize(torch.ones(2), "afine")
    with pytest.raises(FormatError, match="format name must be a string"):
        lowbit.quantize(torch.ones(2), 8)


# ---- spec objects ----------------------------------------------------------------------------------------------
def test_spec_objects_work_wherever_a_name_does():
    x = torch.randn(50, generator=torch.Generator().manual_seed(0)) * 4
    spec = Integer(width=6, frac_width=2)
    assert torch.equal(lowbit.quantize(x, spec), lowbit.quantize(x, "integer", width=6, frac_width=2))
    assert torch.equal(spec(x), lowbit.quantize(x, spec))
    assert torch.equal(lowbit.quantize(x, spec, width=4), lowbit.quantize(x, "integer", width=4, frac_width=2))
    assert torch.equal(lowbit.quantize(x, Integer, width=4), lowbit.quantize(x, "integer", width=4))
    assert spec.width == 6  # overriding made a new spec; the original is unchanged (frozen)
    with pytest.raises(Exception):
        spec.width = 3  # type: ignore[misc]
    assert spec.replace(signed=False).params() == {"rounding": "nearest_even", "width": 6, "frac_width": 2,
                                                   "signed": False}  # fmt: skip
    assert spec.describe() == "integer(width=6, frac_width=2)"  # the parameters that differ from defaults
    assert Integer(width=6, frac_width=2) == spec and hash(Integer(width=6, frac_width=2)) == hash(spec)


def test_unknown_parameter_suggests_the_nearest():
    with pytest.raises(FormatError, match="unknown parameter 'widht'.*did you mean 'width'"):
        lowbit.quantize(torch.ones(2), "integer", widht=4)
    with pytest.raises(FormatError, match="did you mean 'frac_width'"):
        lowbit.quantize(torch.ones(2), Integer(), frac_widht=4)
    with pytest.raises(FormatError, match="did you mean 'zero_point'"):
        lowbit.quantize(torch.ones(2), "affine", scale=0.1, zeropoint=1)


# ---- inputs ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [[0.5, 1.0], 0.5, np.ones(3, dtype=np.float32), None])
def test_non_tensor_input_is_a_format_error(bad):
    with pytest.raises(FormatError, match="torch.Tensor"):
        lowbit.quantize(bad, "integer")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64])
def test_non_float_tensor_is_a_format_error(dtype):
    with pytest.raises(FormatError, match="floating-point"):
        lowbit.quantize(torch.ones(3, dtype=dtype), "affine")


@pytest.mark.parametrize("name", MY_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_dtype_and_shape_are_preserved_and_input_untouched(name, dtype):
    x = (torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    before = x.clone()
    out = lowbit.quantize(x, name)
    assert out.dtype == dtype and out.shape == x.shape and torch.equal(x, before)
    assert out.data_ptr() != x.data_ptr()


# ---- seeds and generators -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, params", [("integer", {"width": 4, "frac_width": 1}), ("affine", {"bits": 3}),
                                          ("q4f", {"block_size": [1, 8]})])  # fmt: skip
def test_seed_and_generator(name, params):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    run = lambda **kw: lowbit.quantize(x, name, rounding="stochastic", **params, **kw)  # noqa: E731
    assert torch.equal(run(seed=3), run(seed=3))
    assert not torch.equal(run(seed=3), run(seed=4))
    assert torch.equal(run(seed=3), run(generator=torch.Generator().manual_seed(3)))
    with pytest.raises(FormatError, match="not both"):
        run(seed=3, generator=torch.Generator())
    with pytest.raises(FormatError, match="seed"):
        run(seed="3")
    assert torch.equal(lowbit.quantize(x, name, **params, seed=1), lowbit.quantize(x, name, **params))


# ---- gradients --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, params",
    [("integer", {"width": 4, "frac_width": 1}), ("fixed", {}), ("affine", {"bits": 4}),
     ("affine", {"bits": 8, "scale": 0.1, "zero_point": 3}), ("affine", {"bits": 4, "symmetric": True, "axis": 0}),
     ("q4s", {"block_size": [1, 4]}), ("q2f", {}), ("integer", {"rounding": "stochastic"})],
)  # fmt: skip
def test_straight_through_gradient(name, params):
    x = torch.tensor([[0.3, -0.7, 100.0, -100.0], [1.26, 2.0, -5.5, 0.0]], requires_grad=True)
    upstream = torch.tensor([[1.0, -2.0, 3.0, 0.5], [-0.25, 4.0, 7.0, -1.0]])
    out = lowbit.quantize(x, name, seed=0, **params)
    assert out.requires_grad
    out.backward(upstream)
    assert torch.equal(x.grad, upstream)  # unchanged, clamped values (+-100) included


def test_gradient_flows_through_a_non_leaf_and_not_without_requires_grad():
    w = torch.randn(5, requires_grad=True)
    loss = (lowbit.quantize(w * 2, "integer", width=4, frac_width=1) * torch.arange(5.0)).sum()
    loss.backward()
    assert torch.equal(w.grad, 2 * torch.arange(5.0))
    assert not lowbit.quantize(torch.randn(5), "integer").requires_grad
    with torch.no_grad():
        assert not lowbit.quantize(w, "integer").requires_grad


def test_gradcheck_on_the_straight_through_wrapper():
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: straight_through(lambda u: u * 1.0, t), (x,))
    # Whatever the forward does, the Jacobian the wrapper reports is the identity.
    jacobian = torch.autograd.functional.jacobian(lambda t: straight_through(torch.round, t * 3), x.detach())
    assert torch.equal(jacobian, 3 * torch.eye(6, dtype=torch.float64))
    jacobian = torch.autograd.functional.jacobian(Affine(bits=3, block_size=[2]), x.detach())
    assert torch.equal(jacobian, torch.eye(6, dtype=torch.float64))


def test_gradcheck_at_the_grid_scale():
    """Finite differences taken in multiples of the step see slope 1: exactly the straight-through gradient."""
    spec = Integer(width=32, frac_width=24)
    x = (torch.randint(-2**28, 2**28, (8,), generator=torch.Generator().manual_seed(0)).double() * 2.0**-24)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(spec, (x,), eps=2.0**-10, atol=1e-12, rtol=0)
    # A smaller step than the grid sees a flat function: the quantizer is not differentiable, STE is a choice.
    with pytest.raises(Exception):
        torch.autograd.gradcheck(spec, (x,), eps=2.0**-30, atol=1e-3, rtol=0)


def test_floating_point_and_block_examples_as_written():
    """The issue-3 API examples, each checked against a property of its format."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5)) * 4
    ieee = lowbit.quantize(x, "minifloat_ieee", width=8, exponent_width=4, exponent_bias=7)
    denorm = lowbit.quantize(x, "minifloat_denorm", width=8, exponent_width=4, exponent_bias=7)
    for out, name in ((ieee, "minifloat_ieee"), (denorm, "minifloat_denorm")):
        values = lowbit.get_format(name)(width=8, exponent_width=4, exponent_bias=7).value_set()
        assert torch.isin(out.double(), values).all()
    assert torch.equal(lowbit.quantize(x, "e4m3"), x.to(torch.float8_e4m3fn).float())
    blocked = lowbit.quantize(x, "e2m1", block_size=[1, 32])
    for block in blocked.reshape(8, 2, 32).unbind(1):  # each block: at most 15 values (8 magnitudes, signs)
        assert all(len(row.unique()) <= 15 for row in block)
    log = lowbit.quantize(x, "log", width=8, exponent_bias=63)
    nonzero = log[log != 0].abs()
    assert torch.equal(torch.log2(nonzero), torch.round(torch.log2(nonzero)))  # powers of two
    block_fp = lowbit.quantize(x, "block_fp", width=8, exponent_width=8, exponent_bias=127, block_size=[1, 16])
    assert (block_fp - x).abs().max() <= x.abs().max() * 2**-6
    minifloat = lowbit.quantize(x, "block_minifloat", width=8, exponent_width=4, exponent_bias_width=4,
                                block_size=[1, 16])  # fmt: skip
    assert ((minifloat - x).abs() <= x.abs() * 2**-4 + 1e-3).all()
    block_log = lowbit.quantize(x, "block_log", width=8, exponent_bias_width=4, block_size=[1, 16])
    assert torch.equal(block_log, lowbit.formats.BlockLog(width=8, exponent_bias_width=4, block_size=[1, 16])(x))
    mx = lowbit.quantize(x, "mxfp4_e2m1", axis=-1)
    scales = x.reshape(8, 2, 32).abs().amax(-1, keepdim=True)
    assert (mx.reshape(8, 2, 32).abs() <= scales * 1.5).all() and mx.shape == x.shape
