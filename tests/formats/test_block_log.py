"""The ``block_log`` format: per-block bias rule, geometry, specials, properties, MASE's examples."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit.errors import FormatError
from lowbit.formats import ROUNDING_MODES, BlockLog, Log
from lowbit.formats.blocking import block_shape

DETERMINISTIC_MODES = [mode for mode in ROUNDING_MODES if mode != "stochastic"]


def bias_rule(block_max: float, width: int, bias_width: int) -> int:
    """beta = clamp(2^(W-1) - 1 - ceil(log2 m), 0, 2^Bw - 1), m = 0 taking the largest beta."""
    if block_max == 0:
        return 2**bias_width - 1
    mantissa, exponent = math.frexp(block_max)
    ceil_log2 = exponent - 1 if mantissa == 0.5 else exponent
    return min(max(2 ** (width - 1) - 1 - ceil_log2, 0), 2**bias_width - 1)


def per_element_bias(x: torch.Tensor, spec: BlockLog) -> torch.Tensor:
    """The bias of each element's block, by a loop over the blocks (ragged edge blocks sliced, never padded)."""
    if x.dim() == 0:
        return per_element_bias(x.reshape(1), spec.replace(axis=None, block_size=[1])).reshape(())
    block = block_shape(x.shape, spec.block_size, spec.axis, spec.skip_first_dim)
    biases = torch.empty(x.shape, dtype=torch.int64)
    counts = [math.ceil(dim / size) for dim, size in zip(x.shape, block)]
    for index in itertools.product(*(range(count) for count in counts)):
        region = tuple(slice(i * size, (i + 1) * size) for i, size in zip(index, block))
        magnitudes = [abs(v) for v in x[region].flatten().tolist() if math.isfinite(v)]
        biases[region] = bias_rule(max(magnitudes, default=0.0), spec.width, spec.exponent_bias_width)
    return biases


def per_block_reference(x: torch.Tensor, spec: BlockLog) -> torch.Tensor:
    """Each element through a scalar ``log`` with its block's bias."""
    biases = per_element_bias(x, spec)
    out = torch.empty_like(x)
    for beta in biases.unique().tolist():
        element = Log(width=spec.width, exponent_bias=beta, rounding=spec.rounding, log_domain=spec.log_domain)
        out[biases == beta] = element(x[biases == beta])
    return out


def sample_tensor(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Values spread over many binades, with zeros, NaN and +-inf sprinkled in."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * 10.0 ** torch.randint(-6, 7, shape, generator=generator)
    flat = x.view(-1)
    if flat.numel() >= 6:
        flat[1], flat[3], flat[4], flat[-1] = 0.0, math.nan, math.inf, -math.inf
    return x


def test_mase_verified_example_with_mase_tiles():
    # MASE's block [2] on a 2-D weight means [rows, 2] tiles; [2, 2] reproduces that geometry here.
    w = torch.tensor([[0.5, 0.25, -0.1, 0.01], [1.0, -3.0, 0.2, 0.0]])
    spec = BlockLog(width=4, exponent_bias_width=4, block_size=[2, 2])
    # Tile 1: max 3 -> beta = 7 - 2 = 5, e in [-4, 2]; -3 is a tie between 2 (code 6, even) and 4: -2
    # (MASE: -4). Tile 2: max 0.2 -> beta = 9, e in [-8, -2]; 0.01 -> 2^-7 as MASE; 0 -> 0 (MASE 2^-9).
    assert spec(w).tolist() == [[0.5, 0.25, -0.125, 2.0**-7], [1.0, -2.0, 0.25, 0.0]]
    assert spec.replace(log_domain=True)(w).tolist() == [[0.5, 0.25, -0.125, 2.0**-7], [1.0, -4.0, 0.25, 0.0]]
    # Our [2] is one row by 2 columns: the (-0.1, 0.01) pair has max 0.1 -> beta = 10, e in [-9, -3].
    rows = BlockLog(width=4, exponent_bias_width=4, block_size=[2])(w)
    assert rows.tolist() == [[0.5, 0.25, -0.125, 2.0**-7], [1.0, -2.0, 0.25, 0.0]]


def test_all_zero_blocks_stay_zero():
    spec = BlockLog(width=5, exponent_bias_width=3, block_size=[1, 4])
    x = torch.zeros(3, 8)
    x[1, 4:] = torch.tensor([-0.0, 0.0, -0.0, 0.0])
    x[2, :4] = torch.tensor([0.3, -0.0, 6.0, 0.0])
    result = spec(x)
    assert not torch.isnan(result).any()
    assert result.tolist() == [[0.0] * 8, [0.0] * 8, [0.25, 0.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    assert torch.equal(torch.signbit(result[1]), torch.signbit(x[1]))
    assert torch.equal(BlockLog()(torch.zeros(2, 3, 40)), torch.zeros(2, 3, 40))


def test_one_huge_value_sets_the_block_range():
    spec = BlockLog(width=8, exponent_bias_width=8, block_size=[8])
    x = torch.tensor([1e30, 1.0, -1e-3, 3e-8, 1e-8, 5e-9, 0.0, -1e30])
    # max 1e30 (2^99.66): beta = 127 - 100 = 27, e in [-26, 100]; 1e-8 is past 2^-27, the zero tie point.
    expected = [2.0**100, 1.0, -(2.0**-10), 2.0**-25, 2.0**-26, 0.0, 0.0, -(2.0**100)]
    assert spec(x).tolist() == expected
    narrow = BlockLog(width=4, exponent_bias_width=4, block_size=[4])
    # max 1e6 wants beta = 7 - 20 < 0: clamped to 0, e in [1, 7], so 1e6 saturates at 2^7 and 1 (the tie
    # between 0 and 2^1) goes to zero.
    assert narrow(torch.tensor([1e6, 1.0, 1.5, -3.0])).tolist() == [128.0, 0.0, 2.0, -4.0]
    # max 1e-10 wants beta = 40: clamped to 15, e in [-14, -8]; the whole block flushes to zero.
    assert narrow(torch.tensor([1e-10, -5e-11, 0.0, 1e-12])).tolist() == [0.0, -0.0, 0.0, 0.0]
    # max 2^-8 gives beta = 15 exactly: the top of the range.
    assert narrow(torch.tensor([2.0**-8, 2.0**-14, 2.0**-16, 0.0])).tolist() == [2.0**-8, 2.0**-14, 0.0, 0.0]


def test_bias_rule_never_lets_the_block_max_saturate():
    widths = [(2, 3), (3, 4), (4, 4), (8, 8)]
    for (width, bias_width), mode in itertools.product(widths, DETERMINISTIC_MODES):
        spec = BlockLog(width=width, exponent_bias_width=bias_width, block_size=[-1], rounding=mode)
        for block_max in [0.3, 0.5, 0.75, 1.0, 1.4, 1.5, 1.99, 3.0, 17.0]:
            x = torch.tensor([block_max, block_max / 3, -block_max], dtype=torch.float64)
            beta = bias_rule(block_max, width, bias_width)
            element = Log(width=width, exponent_bias=beta, rounding=mode)
            # A far wider range whose codes have the same parity (nearest_even ties go to the even code).
            unbounded = Log(width=11, exponent_bias=510 + beta % 2, rounding=mode)
            assert torch.equal(spec(x), element(x))
            lower_in_range = math.floor(math.log2(block_max)) >= 1 - beta
            if 0 < beta < 2**bias_width - 1 and lower_in_range:  # the max rounds exactly as with no top
                assert spec(x)[0] == unbounded(x)[0], (width, mode, block_max)


@pytest.mark.parametrize(
    "shape, params",
    [
        ((7,), {"block_size": [3]}),
        ((37,), {"block_size": [16]}),
        ((5, 9), {"block_size": [2, 4]}),
        ((5, 9), {"block_size": [16]}),
        ((5, 9), {"block_size": [-1, 3]}),
        ((6, 10), {"block_size": [4], "skip_first_dim": True}),
        ((3, 5, 7), {"block_size": [2, 3]}),
        ((3, 5, 7), {"block_size": [4, 16], "skip_first_dim": True}),
        ((3, 5, 7), {"block_size": [2], "axis": 1}),
        ((2, 3, 5, 6), {"block_size": [1, 2, 4]}),
        ((2, 3, 5, 6), {"block_size": [2, 2, 2, 2]}),
        ((2, 3, 5, 6), {"block_size": None}),
        ((4, 6), {"block_size": None, "axis": 0}),
    ],
)
@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "up", "toward_zero"])
def test_agrees_with_a_per_block_loop(shape, params, mode):
    for width, bias_width, log_domain in [(4, 4, False), (6, 3, True), (8, 8, False)]:
        spec = BlockLog(width=width, exponent_bias_width=bias_width, rounding=mode, log_domain=log_domain, **params)
        x = sample_tensor(shape, seed=width + len(shape))
        expected = per_block_reference(x, spec)
        assert torch.equal(spec(x).isnan(), expected.isnan())
        assert torch.equal(spec(x).nan_to_num(), expected.nan_to_num()), (width, bias_width)


def test_padding_never_changes_a_result():
    spec = BlockLog(width=5, exponent_bias_width=4, block_size=[2, 4])
    x = sample_tensor((5, 9), seed=3)
    padded = torch.zeros(6, 12)
    padded[:5, :9] = x
    assert torch.equal(spec(x).nan_to_num(), spec(padded)[:5, :9].nan_to_num())


def test_geometry_of_a_2d_block_size():
    x = torch.tensor([[1.0, 100.0], [0.75, 0.75]])
    # Rows as blocks: row 0 has max 100 -> beta = 3 - 7 < 0 -> 0, e in [1, 3] (values 0, 2, 4, 8): 1 is the
    # tie between 0 and 2 -> 0, 100 saturates at 8. Row 1 has max 0.75 -> beta = 3, e in [-2, 0]: 0.75 ties
    # between 0.5 (code 2, even) and 1 (code 3) -> 0.5.
    rows = BlockLog(width=3, exponent_bias_width=3, block_size=[1, 2])(x)
    assert rows.tolist() == [[0.0, 8.0], [0.5, 0.5]]
    # Columns as blocks: column 0 has max 1 -> beta = 3, column 1 max 100 -> beta = 0: 0.75 there -> 0.
    columns = BlockLog(width=3, exponent_bias_width=3, block_size=[2, 1])(x)
    assert columns.tolist() == [[1.0, 8.0], [0.5, 0.0]]


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
def test_block_size_one_is_a_scalar_log_with_the_per_element_bias(mode):
    width, bias_width = 5, 5
    spec = BlockLog(width=width, exponent_bias_width=bias_width, block_size=[1], rounding=mode)
    x = sample_tensor((40,), seed=11)
    expected = [
        Log(width=width, exponent_bias=bias_rule(abs(v) if math.isfinite(v) else 0.0, width, bias_width),
            rounding=mode)(torch.tensor([v])).item()
        for v in x.tolist()
    ]  # fmt: skip
    assert torch.equal(spec(x).nan_to_num(), torch.tensor(expected).nan_to_num())
    # Without bias bits every block has beta = 0: the plain log format with exponent_bias=0.
    no_bias = BlockLog(width=width, exponent_bias_width=0, block_size=[4], rounding=mode)
    assert torch.equal(no_bias(x).nan_to_num(), Log(width=width, exponent_bias=0, rounding=mode)(x).nan_to_num())


def test_special_values_and_shapes():
    spec = BlockLog(width=4, exponent_bias_width=4, block_size=[4])
    x = torch.tensor([math.nan, math.inf, 0.3, -0.05, -math.inf, 0.0, 0.0, 0.0])
    result = spec(x)
    # Block 1 max 0.3 -> beta = 8, e in [-7, -1]: inf -> 2^-1. Block 2 has no finite nonzero: beta = 15.
    assert torch.isnan(result[0])
    assert result[1:].tolist() == [0.5, 0.25, -0.0625, -(2.0**-8), 0.0, 0.0, 0.0]
    assert spec(torch.empty(0, 5)).shape == (0, 5)
    scalar = spec(torch.tensor(-3.0))
    assert scalar.shape == () and scalar.item() == -2.0  # alone in its block: beta = 5, tie -> even code
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        out = spec(torch.tensor([0.3, -3.0, 1.0, 0.0], dtype=dtype))
        assert out.dtype == dtype and out.tolist() == [0.25, -2.0, 1.0, 0.0]


def test_gradient_is_straight_through():
    leaf = torch.randn(3, 4, 5, requires_grad=True)
    upstream = torch.linspace(-1, 1, 60).reshape(3, 4, 5)
    BlockLog(block_size=[2, 2])(leaf).backward(upstream)
    assert torch.equal(leaf.grad, upstream)


def test_stochastic_rounding_is_unbiased_and_reproducible():
    spec = BlockLog(width=4, exponent_bias_width=4, block_size=[1, 4], rounding="stochastic")
    row = torch.tensor([3.0, -0.7, 0.2, 0.05])  # max 3: beta = 5, e in [-4, 2]
    x = row.repeat(40000, 1)
    samples = spec(x, seed=7)
    assert torch.equal(samples, spec(x, seed=7))
    assert torch.allclose(samples.mean(dim=0), row, rtol=0.01, atol=5e-4)
    assert set(samples[:, 0].tolist()) == {2.0, 4.0} and set(samples[:, 3].tolist()) == {0.0, 0.0625}


def test_bits_per_element():
    spec = BlockLog(width=8, exponent_bias_width=8, block_size=[1, 16])
    assert spec.bits == 8
    assert spec.bits_per_element((4, 32)) == 8 + 8 * 8 / 128
    assert spec.bits_per_element((4, 20)) == 8 + 8 * 8 / 80  # ragged: 2 blocks per row
    assert spec.bits_per_element() == 8.5
    assert spec.bits_per_element((0, 16)) == 8
    assert BlockLog(width=4, exponent_bias_width=4, block_size=None).bits_per_element((10, 10)) == 4.04


def test_bad_parameters_name_the_parameter():
    bad = [("width", 1), ("width", 12), ("width", "4"), ("exponent_bias_width", -1), ("exponent_bias_width", 11),
           ("exponent_bias_width", 2.5), ("block_size", 0), ("block_size", [2, 0]), ("block_size", "x"),
           ("skip_first_dim", 3), ("axis", "a"), ("log_domain", 0.5)]  # fmt: skip
    for name, value in bad:
        with pytest.raises(FormatError, match=name):
            BlockLog(**{name: value})
    with pytest.raises(FormatError, match="exponent_width"):
        BlockLog.create(exponent_width=3)
    assert BlockLog(block_size=[1, 32], skip_first_dim=1).block_size == (1, 32)
    assert lowbit.get_format("block_log") is BlockLog
    x = torch.randn(2, 40)
    by_name = lowbit.quantize(x, "block_log", width=5, exponent_bias_width=4)
    assert torch.equal(by_name, BlockLog(width=5, exponent_bias_width=4)(x))


any_float32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
shapes_and_blocks = st.sampled_from(
    [((), [4]), ((0,), [4]), ((9,), [4]), ((3, 5), [2, 2]), ((2, 3, 4), [3]), ((2, 2, 3, 3), [1, 2, 2])]
)
widths = st.sampled_from([(3, 2), (4, 4), (6, 5), (8, 8)])


@st.composite
def blocked_inputs(draw):
    shape, block_size = draw(shapes_and_blocks)
    numel = math.prod(shape)
    values = draw(st.lists(any_float32, min_size=numel, max_size=numel))
    width, bias_width = draw(widths)
    spec = BlockLog(width=width, exponent_bias_width=bias_width, block_size=block_size, log_domain=draw(st.booleans()))
    return torch.tensor(values, dtype=torch.float32).reshape(shape), spec


@given(blocked_inputs())
def test_property_idempotent_sign_symmetric_and_within_the_block_range(case):
    x, spec = case
    once = spec(x)
    assert once.shape == x.shape and once.dtype == x.dtype
    assert torch.equal(once.isnan(), x.isnan())
    assert torch.equal(spec(once).nan_to_num(), once.nan_to_num())
    assert torch.equal(spec(-x).nan_to_num(), (-once).nan_to_num())
    assert torch.equal(once.nan_to_num(), per_block_reference(x, spec).nan_to_num())
    # Every result lies in its block's range: 0 or 2^e with e in [1 - beta, 2^(W-1) - 1 - beta].
    biases = per_element_bias(x, spec).double()
    results = once.double().abs()
    top, bottom = 2.0 ** (2 ** (spec.width - 1) - 1 - biases), 2.0 ** (1 - biases)
    assert torch.all(results.isnan() | (results <= top))
    assert torch.all(results.isnan() | (results == 0) | (results >= bottom))
    assert torch.all(results.isnan() | (results == 0) | (torch.frexp(results).mantissa == 0.5))  # powers of two
