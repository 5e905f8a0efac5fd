"""block_minifloat: minifloat elements (implicit one, subnormals, all codes finite) sharing one bias per block.

The oracle is a slow per-block reference in exact rational arithmetic: a scalar minifloat rounding (binade
by frexp, step 2^(e - M), the mode's rule on the exact quotient) and, per block, a binary search for the
smallest shared exponent t at which no element rounds above (2 - 2^-M) * 2^t.
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
from lowbit.formats import BlockMinifloat
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
def round_element(value: float, mantissa_bits: int, min_exponent: int, mode: str) -> Fraction:
    """A minifloat with unbounded top: the value's own binade (at least min_exponent), step 2^(e - M)."""
    if value == 0:
        return Fraction(0)
    exponent = max(math.frexp(abs(value))[1] - 1, min_exponent)
    step = Fraction(2) ** (exponent - mantissa_bits)
    return reference_round(Fraction(value) / step, mode) * step


def reference_block(values: list[float], spec: BlockMinifloat, cap: int = 127) -> list[float]:
    mantissa_bits, mode = spec.mantissa_bits, spec.rounding
    span = 2**spec.exponent_width - 2  # normal binades below the top one
    finite = [v for v in values if math.isfinite(v)]

    def top(t: int) -> Fraction:
        return (2 - Fraction(1, 2**mantissa_bits)) * Fraction(2) ** t

    def fits(t: int) -> bool:
        return all(abs(round_element(v, mantissa_bits, t - span, mode)) <= top(t) for v in finite)

    shared = smallest_fitting_exponent(values, spec.min_shared_exponent, min(spec.max_shared_exponent, cap), fits)
    return saturated_block(values, top(shared), lambda v: round_element(v, mantissa_bits, shared - span, mode))


def reference(x: torch.Tensor, spec: BlockMinifloat) -> torch.Tensor:
    block = block_shape(x.shape, spec.block_size, None, spec.skip_first_dim)
    return per_block_reference(x, block, lambda values: reference_block(values, spec))


# ---- MASE's small-weight failure, as we define it ------------------------------------------------------------
@pytest.mark.parametrize("bias_width", [4, 8])
def test_small_weights_keep_relative_precision(bias_width):
    """MASE (W=8, E=4): the bias is floor(log2 max) clamped at 0, so |w| < 1 sits on multiples of 0.25:
    -0.1 -> 0 and 0.2 -> 0.25. Ours puts the block max in the top binade: every element keeps M bits."""
    w = torch.tensor([-0.1, 0.2, 0.05, -0.7, 0.3, -0.01, 0.9, 0.001])
    params = dict(width=8, exponent_width=4, exponent_bias_width=bias_width, block_size=[8])
    out = lowbit.quantize(w, "block_minifloat", **params)
    assert out[0].item() == -13 / 128 and out[1].item() == 13 / 64
    relative_error = ((out - w).abs() / w.abs()).max().item()
    assert relative_error <= 2.0**-4  # 2^-(M+1), M = 3


def test_docs_worked_example():
    """docs/formats/block.md: W=8, E=4, Bw=8 (MASE: [0, 0.25, 0, -0.75])."""
    out = lowbit.quantize(torch.tensor([-0.1, 0.2, 0.05, -0.7]), "block_minifloat", block_size=[4])
    assert out.tolist() == [-13 / 128, 13 / 64, 13 / 256, -11 / 16]


def test_larger_block_max_moves_the_window_up():
    """The shared exponent tracks the block max: 1.5 * 2^k is exact for every k the bias covers."""
    spec = BlockMinifloat(width=6, exponent_width=2, exponent_bias_width=4, block_size=(1,))  # t in [-8, 7]
    for k in range(-8, 8):
        x = torch.tensor([1.5 * 2.0**k, 1.25 * 2.0 ** (k - 2)])  # the second one is two binades down
        block = lowbit.quantize(x, spec.replace(block_size=(2,)))
        assert block.tolist() == x.tolist()


# ---- the shared exponent ---------------------------------------------------------------------------------------
def test_block_max_that_rounds_up_takes_the_next_binade():
    spec = BlockMinifloat(width=8, exponent_width=4, exponent_bias_width=8, block_size=(2,))  # M = 3
    assert spec(torch.tensor([1.97, 0.3])).tolist() == [2.0, 0.3125]  # 1.97 -> 2.0, t = 1
    assert spec(torch.tensor([1.9375, 0.3])).tolist() == [2.0, 0.3125]  # exact tie: even mantissa is 2.0
    toward_zero = spec.replace(rounding="nearest_toward_zero")
    assert toward_zero(torch.tensor([1.9375, 0.3])).tolist() == [1.875, 0.3125]


def test_bias_range_limits():
    spec = BlockMinifloat(width=8, exponent_width=4, exponent_bias_width=4, block_size=(3,))  # t in [-8, 7]
    assert spec.max_value == 1.875 * 2**7
    big = spec(torch.tensor([1000.0, 3.0, -0.01]))  # above 2^8: t = 7, saturates to 240
    assert big.tolist() == [240.0, 3.0, -10 / 1024]  # smallest normal 2^-7, step 2^-10
    small = spec(torch.tensor([1e-4, 2.0**-30, -3e-5]))  # below 2^-8: t = -8, elements down to 2^-22
    expected = round_to_float_grid(torch.tensor([1e-4, 2.0**-30, -3e-5]).double(), 3, -22, 1.875 * 2**-8)
    assert small.tolist() == expected.float().tolist() and small[1].item() == 0.0
    assert spec.element_min_exponent(-8) == -22 and spec.element_max_value(0) == 1.875


def test_all_zero_block_and_one_huge_value():
    spec = BlockMinifloat(width=8, exponent_width=4, exponent_bias_width=8, block_size=(1, 4))
    x = torch.tensor([[0.0, -0.0, 0.0, 0.0], [1e4, 1e-3, -0.5, 3.0]])
    out = spec(x)
    # t = 13, smallest normal 2^-1, subnormal step 2^-4: 1e-3 flushes, -0.5 and 3.0 stay exact.
    assert out.tolist() == [[0.0, 0.0, 0.0, 0.0], [10240.0, 0.0, -0.5, 3.0]]


def test_float32_top_stays_finite():
    spec = BlockMinifloat(width=8, exponent_width=4, exponent_bias_width=9, block_size=(2,))  # t up to 255
    out = spec(torch.tensor([3.4e38, 1.0]))
    assert torch.isfinite(out).all() and out[0].item() == 1.875 * 2.0**127


def test_defaults():
    spec = BlockMinifloat()
    assert (spec.width, spec.exponent_width, spec.exponent_bias_width) == (8, 4, 8)
    assert spec.block_size == (16,) and spec.skip_first_dim is False and spec.mantissa_bits == 3


# ---- block size 1: a minifloat element with the best bias -----------------------------------------------------
@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("width, exponent_width, bias_width", [(8, 4, 4), (8, 5, 8), (4, 2, 3), (6, 3, 5), (5, 4, 6)])
def test_block_size_one_is_a_minifloat_with_the_best_bias(mode, width, exponent_width, bias_width):
    """One element per block: its own binade is the top one, so it is an M-bit float whose exponent
    range is [t_min - 2^E + 2, t_max] (round_to_float_grid with those limits)."""
    spec = BlockMinifloat(width=width, exponent_width=exponent_width, exponent_bias_width=bias_width,
                          block_size=(1,), rounding=mode)  # fmt: skip
    x = interesting_data((400,), spec.mantissa_bits + 1, seed=width + bias_width, spread=2 ** (bias_width - 1) + 4)
    x[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    lowest_top, highest_top = -(2 ** (bias_width - 1)), min(2 ** (bias_width - 1) - 1, 127)
    min_exponent = lowest_top - 2**exponent_width + 2
    max_value = (2 - 2.0**-spec.mantissa_bits) * 2.0**highest_top
    expected = round_to_float_grid(x.double(), spec.mantissa_bits, min_exponent, max_value, mode).float()
    assert_same(spec(x), expected)


# ---- the slow per-block reference ----------------------------------------------------------------------------
REFERENCE_CASES = [
    ((64,), dict(width=8, exponent_width=4, exponent_bias_width=4, block_size=(8,))),
    ((50,), dict(width=6, exponent_width=3, exponent_bias_width=8, block_size=(16,))),  # short last block
    ((9, 13), dict(width=5, exponent_width=2, exponent_bias_width=5, block_size=(1, 4))),
    ((9, 13), dict(width=8, exponent_width=5, exponent_bias_width=6, block_size=(3, 5))),
    ((4, 6, 7), dict(width=4, exponent_width=2, exponent_bias_width=4, block_size=(2, 3, 4))),
    ((4, 6, 7), dict(width=7, exponent_width=3, exponent_bias_width=8, block_size=(16,), skip_first_dim=True)),
    ((2, 3, 5, 6), dict(width=5, exponent_width=1, exponent_bias_width=3, block_size=(2, 2, 4))),
    ((2, 3, 5, 6), dict(width=4, exponent_width=3, exponent_bias_width=8, block_size=(-1, 1, 5, 2))),
]


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("shape, params", REFERENCE_CASES)
def test_matches_slow_reference(shape, params, mode):
    spec = BlockMinifloat(**params, rounding=mode)
    x = interesting_data(shape, spec.mantissa_bits + 1, seed=len(shape) + spec.width)
    x.view(-1)[::11] = torch.tensor(float("nan"))
    x.view(-1)[5::23] = torch.tensor(float("inf"))
    assert_same(spec(x), reference(x, spec))


# ---- exhaustive element grid at a fixed shared exponent --------------------------------------------------------
@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("width, exponent_width", [(4, 2), (5, 2), (6, 3), (6, 2), (8, 4), (8, 5), (3, 1)])
def test_exhaustive_grid_at_a_fixed_shared_exponent(width, exponent_width, mode):
    spec = BlockMinifloat(width=width, exponent_width=exponent_width, exponent_bias_width=6, block_size=(1, 2),
                          rounding=mode)  # fmt: skip
    shared = 2
    values = spec.block_values(shared)
    anchor = values[-1].item()  # the block maximum pins t
    assert anchor == spec.element_max_value(shared)
    assert values.numel() == 2 * (2 ** (width - 1) - 1) + 1  # every code is finite; +-0 are one value

    check_block_grid(spec, values, mode)


def test_block_values_e4m3_at_t8_is_the_ieee_grid():
    """t = 8 with E = 4 is the bias 7 of an IEEE-style E4M3 whose codes are all finite (max 480)."""
    values = BlockMinifloat(width=8, exponent_width=4).block_values(8)
    assert values.max().item() == 480.0 and values[values > 0].min().item() == 2.0**-9
    with pytest.raises(FormatError, match="exponent"):
        BlockMinifloat(exponent_bias_width=4).block_values(8)


# ---- stochastic rounding ----------------------------------------------------------------------------------------
def test_stochastic_is_unbiased_reproducible_and_never_overflows():
    spec = BlockMinifloat(width=6, exponent_width=2, exponent_bias_width=6, block_size=(1, 3), rounding="stochastic")
    row = torch.tensor([1.95, 0.3, -0.55])  # M = 3; 1.95 could round up to 2.0, so t = 1
    x = row.repeat(20000, 1)
    out = spec(x, seed=5)
    assert torch.equal(out, spec(x, seed=5))
    # t = 1: normals from 2^-1, subnormal step 2^-4 (0.3 rounds between subnormals).
    assert spec.element_min_exponent(1) == -1
    allowed = [{1.875, 2.0}, {0.25, 0.3125}, {-0.5, -0.5625}]
    for column, values in enumerate(allowed):
        assert set(out[:, column].tolist()) == values
    assert torch.allclose(out.double().mean(0), row.double(), atol=0.01)


# ---- properties ---------------------------------------------------------------------------------------------------
SPEC = BlockMinifloat(width=8, exponent_width=4, exponent_bias_width=8, block_size=(4,))
FLOAT32_MAX = 1.875 * 2.0**127


@given(st.lists(BLOCK_FLOAT32S, min_size=1, max_size=24))
def test_properties(values):
    x = torch.tensor(values, dtype=torch.float32)
    check_block_properties(SPEC, x, reference, FLOAT32_MAX)


@given(FOUR_FLOAT32S, NON_FINITE)
def test_nan_and_inf_do_not_set_the_block(values, special):
    x = torch.tensor(values, dtype=torch.float32)
    check_special_does_not_set_block(SPEC, x, 2, special, FLOAT32_MAX)


def test_empty_and_zero_d():
    assert SPEC(torch.empty(3, 0)).shape == (3, 0)
    assert SPEC(torch.tensor(0.3)).item() == 0.3125 and SPEC(torch.tensor(0.3)).shape == ()
    assert SPEC(torch.tensor(float("-inf"))).item() == -FLOAT32_MAX
    assert SPEC(torch.tensor([float("inf"), 0.0, 1.0])).tolist() == [1.875, 0.0, 1.0]


# ---- dtypes and gradients -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_dtype_is_kept(dtype):
    x = torch.tensor([0.3, -1.7, 2.5, 0.01], dtype=dtype)
    out = lowbit.quantize(x, "block_minifloat", block_size=[4])
    assert out.dtype == dtype
    assert out.float().tolist() == [0.3125, -1.75, 2.5, 10 / 1024]  # t = 1: 0.01 is in binade -7, step 2^-10


def test_gradient_is_straight_through():
    """MASE's block_minifloat backward raises TypeError (issue #262); ours passes gradients through."""
    weight = torch.randn(4, 32, requires_grad=True)
    inputs = torch.randn(5, 32)
    spec = BlockMinifloat(width=8, exponent_width=4, block_size=(1, 16))
    loss = (inputs @ spec(weight).t()).square().sum()
    loss.backward()
    with torch.no_grad():
        quantized = spec(weight)
        expected = 2 * (inputs @ quantized.t()).t() @ inputs  # d loss / d q(W), passed through unchanged
    torch.testing.assert_close(weight.grad, expected)


# ---- parameters --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, name",
    [
        (dict(width=1), "width"),
        (dict(width=4, exponent_width=4), "width"),  # no room for a sign bit
        (dict(width=30, exponent_width=4), "width"),  # 25 mantissa bits: beyond float32
        (dict(exponent_width=0), "exponent_width"),
        (dict(exponent_width=9, width=12), "exponent_width"),
        (dict(exponent_bias_width=0), "exponent_bias_width"),
        (dict(exponent_bias_width=11), "exponent_bias_width"),
        (dict(exponent_bias_width="8"), "exponent_bias_width"),
        (dict(block_size="16"), "block_size"),
        (dict(block_size=[0, 16]), "block_size"),
        (dict(skip_first_dim="yes"), "skip_first_dim"),
        (dict(rounding="sideways"), "rounding"),
        (dict(exponent_bias=3), "exponent_bias"),
    ],
)
def test_bad_parameters_name_themselves(params, name):
    with pytest.raises(FormatError, match=name):
        BlockMinifloat.create(**params)


def test_bits_per_element():
    spec = BlockMinifloat(width=8, exponent_width=4, exponent_bias_width=8, block_size=(1, 16))
    assert spec.bits == 8
    assert spec.bits_per_element((4, 32)) == 8 + 8 / 16
    assert spec.bits_per_element((3, 20)) == 8 + 8 * 6 / 60
    assert spec.bits_per_element() == 8.0
