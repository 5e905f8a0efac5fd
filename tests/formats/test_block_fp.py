"""block_fp: sign-magnitude mantissas sharing one exponent per block.

The oracle is a slow per-block reference in exact rational arithmetic: for each block it searches the
smallest exponent at which no element's rounded mantissa overflows (a binary search over the whole E-bit
range, not the floor-log2-plus-carry rule the format uses), then rounds every element by the mode.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit.errors import FormatError
from lowbit.formats import BlockFP
from lowbit.formats._float_grid import round_to_float_grid
from lowbit.formats.blocking import block_shape

from helpers import (
    BLOCK_FLOAT32S,
    DETERMINISTIC,
    FOUR_FLOAT32S,
    NON_FINITE,
    assert_same,
    check_block_grid,
    check_block_properties,
    check_special_does_not_set_block,
    interesting_data,
    per_block_reference,
    reference_round,
    saturated_block,
    smallest_fitting_exponent,
)


# ---- the slow reference -------------------------------------------------------------------------------------
def reference_block(values: list[float], spec: BlockFP, max_exponent_cap: int = 127) -> list[float]:
    mantissa_bits = spec.width - 1
    top = 2**mantissa_bits - 1
    finite = [Fraction(v) for v in values if math.isfinite(v)]

    def fits(exponent: int) -> bool:
        scale = Fraction(2) ** (mantissa_bits - 1 - exponent)
        return all(abs(reference_round(v * scale, spec.rounding)) <= top for v in finite)

    high_e = min(2**spec.exponent_width - 1 - spec.exponent_bias, max_exponent_cap)
    exponent = smallest_fitting_exponent(values, -spec.exponent_bias, high_e, fits)
    step = Fraction(2) ** (exponent - mantissa_bits + 1)
    return saturated_block(values, top * step, lambda v: reference_round(Fraction(v) / step, spec.rounding) * step)


def reference(x: torch.Tensor, spec: BlockFP) -> torch.Tensor:
    block = block_shape(x.shape, spec.block_size, spec.axis, spec.skip_first_dim)
    return per_block_reference(x, block, lambda values: reference_block(values, spec))


# ---- MASE's examples, as we define them -----------------------------------------------------------------------
def test_power_of_two_block_max_keeps_its_ulp():
    """MASE: [0.5, 0.25] with W=4 -> [0.4375, 0.25] (ceil(log2 max) loses an ulp). Ours: exact."""
    out = lowbit.quantize(torch.tensor([0.5, 0.25]), "block_fp", width=4, block_size=[2])
    assert out.tolist() == [0.5, 0.25]


def test_mase_tile_example():
    w = torch.tensor([[0.5, 0.25, -0.1, 0.01], [1.0, -3.0, 0.2, 0.0]])
    # MASE infers block [2] on a 2-D weight as a 2x2 tile; asking for that tile gives MASE's numbers.
    tiles = lowbit.quantize(w, "block_fp", width=4, block_size=[2, 2])
    assert tiles.tolist() == [[0.5, 0.0, -0.09375, 0.0], [1.0, -3.0, 0.1875, 0.0]]
    # Our [2] means [1, 2]: pairs within a row.
    pairs = lowbit.quantize(w, "block_fp", width=4, block_size=[2])
    assert pairs.tolist() == [[0.5, 0.25, -0.09375, 0.015625], [1.0, -3.0, 0.1875, 0.0]]


# ---- the shared exponent --------------------------------------------------------------------------------------
def test_block_max_that_rounds_up_takes_the_next_exponent():
    # M = 3: at e = -1 the step is 1/8 and the largest code 7/8; 0.97 would round to 8/8 -> e = 0.
    out = lowbit.quantize(torch.tensor([0.97, 0.3]), "block_fp", width=4, block_size=[2])
    assert out.tolist() == [1.0, 0.25]
    # 0.9375 is exactly halfway between 7/8 and 8/8: nearest_even picks 8 (overflow), toward zero picks 7.
    tie = torch.tensor([0.9375, 0.3])
    assert lowbit.quantize(tie, "block_fp", width=4, block_size=[2]).tolist() == [1.0, 0.25]
    kept = lowbit.quantize(tie, "block_fp", width=4, block_size=[2], rounding="nearest_toward_zero")
    assert kept.tolist() == [0.875, 0.25]
    # Directed modes: 'up' keeps result >= x, so the max needs the next exponent; 'down' does not.
    spec = BlockFP(width=4, block_size=(2,))
    assert spec.replace(rounding="up")(torch.tensor([0.9, 0.3])).tolist() == [1.0, 0.5]
    assert spec.replace(rounding="down")(torch.tensor([0.9, 0.3])).tolist() == [0.875, 0.25]
    # A negative maximum with 'down' rounds away from zero, so it also needs the next exponent.
    assert spec.replace(rounding="down")(torch.tensor([-0.9, 0.3])).tolist() == [-1.0, 0.25]


def test_docs_worked_example():
    """docs/formats/block.md: W = 4, [0.97, 0.3, -0.55, 0.02] (MASE: [0.875, 0.25, -0.5, 0.0])."""
    out = lowbit.quantize(torch.tensor([0.97, 0.3, -0.55, 0.02]), "block_fp", width=4, block_size=[4])
    assert out.tolist() == [1.0, 0.25, -0.5, 0.0]


def test_all_zero_block():
    x = torch.tensor([[0.0, -0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 0.0]])
    out = lowbit.quantize(x, "block_fp", width=6, block_size=[1, 4])
    assert out.tolist() == [[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 0.0]]
    assert torch.isfinite(out).all()


def test_one_huge_value_and_tiny_others():
    x = torch.tensor([1000.0, 1e-3, -1e-3, 0.3, 12.0, -7.9, 0.0, 5.0])
    out = lowbit.quantize(x, "block_fp", width=8, block_size=[8])
    # e = 9, step = 2^(9 - 6) = 8: everything below 4 flushes to zero.
    assert out.tolist() == [1000.0, 0.0, -0.0, 0.0, 16.0, -8.0, 0.0, 8.0]


def test_shared_exponent_clamps_to_its_range():
    spec = BlockFP(width=4, exponent_width=4, exponent_bias=7, block_size=(2,))  # e in [-7, 8]
    big = spec(torch.tensor([1e6, 1.0]))
    assert big.tolist() == [spec.max_value, 0.0] and spec.max_value == 1.75 * 256
    tiny = spec(torch.tensor([2.0**-12, 2.0**-9]))  # e = -7, step 2^-9
    assert tiny.tolist() == [0.0, 2.0**-9]


def test_float32_top_stays_finite():
    """A block max near float32's max would round up to 2^128: the exponent is capped so it saturates."""
    x = torch.tensor([3.4e38, -1.0])
    out = lowbit.quantize(x, "block_fp", width=8, block_size=[2])
    assert torch.isfinite(out).all() and out[0].item() == 127 * 2.0**121


def test_default_bias_and_na():
    assert BlockFP(exponent_width=5).exponent_bias == 15
    assert BlockFP(exponent_width=8, exponent_bias="NA").exponent_bias == 127
    spec = BlockFP()
    assert (spec.width, spec.exponent_width, spec.block_size, spec.skip_first_dim) == (12, 8, (16,), False)


# ---- block size 1 is a scalar float ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("width, exponent_width, bias", [(4, 4, 7), (8, 5, 15), (3, 3, 2), (12, 8, 127)])
def test_block_size_one_is_a_sign_magnitude_float(mode, width, exponent_width, bias):
    """Block 1 = a float with W - 2 fraction bits (explicit leading bit), exponent in [-B, 2^E - 1 - B]."""
    spec = BlockFP(width=width, exponent_width=exponent_width, exponent_bias=bias, block_size=(1,), rounding=mode)
    x = interesting_data((400,), width - 1, seed=width) * 2.0 ** (bias // 4)
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 2.0 ** (-bias - 3)])
    top_exponent = min(spec.max_exponent, 127)  # E = 8, B = 127 reaches 2^128: capped for float32
    max_value = (2 - 2.0 ** (2 - width)) * 2.0**top_exponent
    expected = round_to_float_grid(x.double(), width - 2, -bias, max_value, mode).float()
    assert_same(spec(x), expected)


# ---- the slow per-block reference ----------------------------------------------------------------------------
REFERENCE_CASES = [
    ((64,), dict(width=4, exponent_width=4, exponent_bias=7, block_size=(8,))),
    ((50,), dict(width=6, exponent_width=8, block_size=(16,))),  # the last block is short
    ((9, 13), dict(width=5, exponent_width=5, block_size=(1, 4))),
    ((9, 13), dict(width=8, exponent_width=6, block_size=(3, 5))),
    ((4, 6, 7), dict(width=3, exponent_width=5, block_size=(2, 3, 4))),
    ((4, 6, 7), dict(width=7, exponent_width=8, block_size=(16,), skip_first_dim=True)),
    ((2, 3, 5, 6), dict(width=4, exponent_width=3, exponent_bias=1, block_size=(2, 2, 4))),
    ((10, 6), dict(width=5, exponent_width=8, block_size=(4,), axis=0)),
]


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("shape, params", REFERENCE_CASES)
def test_matches_slow_reference(shape, params, mode):
    spec = BlockFP(**params, rounding=mode)
    x = interesting_data(shape, spec.width - 1, seed=len(shape) + spec.width)
    x.view(-1)[::11] = torch.tensor(float("nan"))
    x.view(-1)[5::23] = torch.tensor(float("inf"))
    assert_same(spec(x), reference(x, spec))


# ---- exhaustive element grid at a fixed block exponent ---------------------------------------------------------
@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("width", [2, 3, 4, 5, 8])
def test_exhaustive_grid_at_a_fixed_exponent(width, mode):
    spec = BlockFP(width=width, exponent_width=5, block_size=(1, 2), rounding=mode)
    exponent = 1
    values = spec.block_values(exponent)
    anchor = values[-1].item()  # the top code pins the block exponent to `exponent`
    assert anchor == (2 - 2.0 ** (2 - width)) * 2**exponent
    check_block_grid(spec, values, mode)


def test_block_values():
    spec = BlockFP(width=4, exponent_width=4)
    assert spec.block_values(0).tolist() == [k / 4 for k in range(-7, 8)]
    with pytest.raises(FormatError, match="exponent"):
        spec.block_values(99)


# ---- stochastic rounding ----------------------------------------------------------------------------------------
def test_stochastic_is_unbiased_reproducible_and_never_overflows():
    spec = BlockFP(width=4, exponent_width=5, block_size=(1, 4), rounding="stochastic")
    row = torch.tensor([0.95, 0.3, -0.55, 0.0])  # 0.95 *could* round up to 1.0: the exponent is 0
    x = row.repeat(20000, 1)
    out = spec(x, seed=3)
    assert torch.equal(out, spec(x, seed=3))
    allowed = [{0.75, 1.0}, {0.25, 0.5}, {-0.5, -0.75}, {0.0}]
    for column, values in enumerate(allowed):
        assert set(out[:, column].tolist()) == values
    assert torch.allclose(out.double().mean(0), row.double(), atol=0.01)


# ---- properties ---------------------------------------------------------------------------------------------------
SPEC = BlockFP(width=5, exponent_width=8, block_size=(4,))
FLOAT32_MAX = (2 - 2.0**-3) * 2.0**127  # SPEC's own max, (2 - 2^-3) * 2^128, is beyond float32: capped


@given(st.lists(BLOCK_FLOAT32S, min_size=1, max_size=24))
def test_properties(values):
    x = torch.tensor(values, dtype=torch.float32)
    check_block_properties(SPEC, x, reference, FLOAT32_MAX)


@given(FOUR_FLOAT32S, NON_FINITE)
def test_nan_and_inf_do_not_set_the_block(values, special):
    x = torch.tensor(values, dtype=torch.float32)
    check_special_does_not_set_block(SPEC, x, 1, special, FLOAT32_MAX)


def test_empty_and_zero_d():
    assert SPEC(torch.empty(0, 3)).shape == (0, 3)
    assert SPEC(torch.tensor(0.3)).item() == 0.3125 and SPEC(torch.tensor(0.3)).shape == ()
    assert SPEC(torch.tensor(float("-inf"))).item() == -FLOAT32_MAX
    assert SPEC(torch.tensor(float("-inf"), dtype=torch.float64)).item() == -SPEC.max_value
    assert SPEC(torch.tensor([float("inf"), 0.0, 1.0])).tolist() == [1.875, 0.0, 1.0]  # the block's top


# ---- dtypes and gradients -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_dtype_is_kept(dtype):
    x = torch.tensor([0.3, -1.7, 2.5, 0.01], dtype=dtype)
    out = lowbit.quantize(x, "block_fp", width=5, block_size=[4])
    assert out.dtype == dtype
    assert out.float().tolist() == [0.25, -1.75, 2.5, 0.0]


def test_gradient_is_straight_through():
    x = torch.randn(3, 20, requires_grad=True)
    upstream = torch.randn(3, 20)
    lowbit.quantize(x, "block_fp", width=4).backward(upstream)
    assert torch.equal(x.grad, upstream)


# ---- parameters --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, name",
    [
        (dict(width=1), "width"),
        (dict(width=33), "width"),
        (dict(width=8.5), "width"),
        (dict(exponent_width=0), "exponent_width"),
        (dict(exponent_width=11), "exponent_width"),
        (dict(exponent_bias=-500), "exponent_bias"),
        (dict(exponent_bias="x"), "exponent_bias"),
        (dict(block_size=[0]), "block_size"),
        (dict(block_size=[4, -2]), "block_size"),
        (dict(skip_first_dim=2), "skip_first_dim"),
        (dict(axis="rows"), "axis"),
        (dict(axis=0, block_size=[1, 16]), "axis"),  # an ND block and an axis: ambiguous
        (dict(rounding="sideways"), "rounding"),
        (dict(mantissa_width=3), "mantissa_width"),
    ],
)
def test_bad_parameters_name_themselves(params, name):
    with pytest.raises(FormatError, match=name):
        BlockFP.create(**params)


def test_bits_per_element():
    spec = BlockFP(width=8, exponent_width=8, block_size=(1, 16))
    assert spec.bits == 8
    assert spec.bits_per_element((4, 32)) == 8 + 8 / 16
    assert spec.bits_per_element((3, 20)) == 8 + 8 * 6 / 60  # partial blocks still store an exponent
    assert spec.bits_per_element() == 8.0
    assert spec.bits_per_element((0, 5)) == 8.0
