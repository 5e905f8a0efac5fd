"""The shared ND block geometry (lowbit.formats.blocking): block_shape rules, apply_blockwise against a slow
per-block loop, padding, skip_first_dim, axis, 0-d and empty tensors, the finite statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from lowbit.errors import FormatError
from lowbit.formats.blocking import _apply_interleaved
from lowbit.formats.blocking import (
    apply_blockwise,
    block_shape,
    finite_abs_max,
    finite_min_max,
    normalize_axis,
    num_blocks,
)

from helpers import block_slices


# ---- a slow reference: python loops over block index ranges ---------------------------------------------
def reference_blockwise(x: np.ndarray, block, statistic) -> np.ndarray:
    """Each element replaced by ``statistic`` of the elements of its block (no padding involved)."""
    out = np.empty_like(x)
    for slices in block_slices(x.shape, block):
        out[slices] = statistic(x[slices])
    return out


def broadcast_stat(stat):
    """An apply_blockwise callback that writes a per-block statistic over the whole block."""
    return lambda blocked, dims: stat(blocked, dims).expand_as(blocked)


def abs_max_everywhere(x: torch.Tensor, block) -> torch.Tensor:
    return apply_blockwise(x, block, broadcast_stat(finite_abs_max))


# ---- block_shape: the rules -------------------------------------------------------------------------------
BLOCK_SHAPE_CASES = [
    # (shape, block_size, axis, skip_first_dim, expected block)
    ((16,), (4,), None, False, (4,)),
    ((10,), (4,), None, False, (4,)),  # 10 is not a multiple: the last block is padded
    ((64, 100), (16,), None, False, (1, 16)),  # missing leading entries mean 1 (MASE: the whole dim)
    ((64, 100), (1, 32), None, False, (1, 32)),
    ((64, 100), (-1, 8), None, False, (64, 8)),  # -1: the whole dimension
    ((64, 100), (200, 300), None, False, (64, 100)),  # oversize: the whole dimension
    ((5, 6, 7), (2, 3, 4, 5), None, False, (3, 4, 5)),  # extra leading entries are dropped
    ((5, 6, 7), (16,), None, False, (1, 1, 7)),
    ((8, 10), (4, 4), None, True, (1, 4)),  # skip_first_dim: dim 0 never shared
    ((8, 10), (-1,), None, True, (1, 10)),
    ((8, 10), (-1, -1), None, True, (1, 10)),
    ((2, 3, 4, 5), (2, 2), None, False, (1, 1, 2, 2)),
    ((2, 3, 4, 5), (-1, -1, -1, -1), None, False, (2, 3, 4, 5)),
    ((4, 6), None, None, False, (4, 6)),  # per tensor
    ((4, 6), None, 0, False, (1, 6)),  # per channel along dim 0
    ((4, 6), None, -1, False, (4, 1)),
    ((4, 64), (32,), 1, False, (1, 32)),  # one-entry block_size + axis: blocks along axis
    ((4, 64), (32,), 0, False, (4, 1)),  # oversize along the axis: the whole dim
    ((3, 4, 64), (16,), -1, False, (1, 1, 16)),
    ((), (4,), None, False, ()),
    ((), None, 0, False, ()),
    ((), (4,), -1, False, ()),
    ((0, 5), (4, 4), None, False, (1, 4)),  # an empty dimension still gives a legal block
]


@pytest.mark.parametrize("shape, block_size, axis, skip, expected", BLOCK_SHAPE_CASES)
def test_block_shape_rules(shape, block_size, axis, skip, expected):
    assert block_shape(shape, block_size, axis, skip) == expected


@pytest.mark.parametrize("shape, axis", [((4, 6), 2), ((4, 6), -3), ((), 1), ((5,), 1)])
def test_axis_out_of_range_is_a_format_error(shape, axis):
    with pytest.raises(FormatError, match=f"axis={axis}"):
        block_shape(shape, None, axis)


def test_normalize_axis():
    assert [normalize_axis(a, 3) for a in (-3, -2, -1, 0, 1, 2)] == [0, 1, 2, 0, 1, 2]
    assert normalize_axis(0, 0) == 0 and normalize_axis(-1, 0) == 0


def test_num_blocks_counts_partial_blocks():
    assert num_blocks((10,), (4,)) == 3
    assert num_blocks((64, 100), (1, 16)) == 64 * 7
    assert num_blocks((2, 3, 4, 5), (1, 2, 3, 5)) == 2 * 2 * 2 * 1
    assert num_blocks((), ()) == 1


# ---- apply_blockwise against the slow loop ----------------------------------------------------------------
GEOMETRY_CASES = [
    ((10,), (4,)),
    ((16,), (16,)),
    ((7,), (1,)),
    ((5, 7), (2, 3)),
    ((5, 7), (1, 7)),
    ((6, 9), (6, 1)),
    ((3, 5, 7), (2, 2, 4)),
    ((3, 5, 7), (1, 5, 3)),
    ((2, 3, 5, 7), (1, 2, 3, 4)),
    ((2, 3, 5, 7), (2, 3, 5, 7)),
    ((3, 2, 3, 2, 5), (2, 1, 2, 2, 3)),  # 5-D works too
]


@pytest.mark.parametrize("shape, block", GEOMETRY_CASES)
def test_apply_blockwise_matches_slow_loop(shape, block):
    generator = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    got = abs_max_everywhere(x, block)
    want = reference_blockwise(x.numpy(), block, lambda values: np.abs(values).max())
    np.testing.assert_array_equal(got.numpy(), want)
    low, high = (apply_blockwise(x, block, broadcast_stat(lambda b, d, i=i: finite_min_max(b, d)[i])) for i in (0, 1))
    np.testing.assert_array_equal(low.numpy(), reference_blockwise(x.numpy(), block, lambda v: min(v.min(), 0.0)))
    np.testing.assert_array_equal(high.numpy(), reference_blockwise(x.numpy(), block, lambda v: max(v.max(), 0.0)))


@pytest.mark.parametrize("shape, block", GEOMETRY_CASES)
def test_each_block_is_exactly_its_elements(shape, block):
    """Distinct positive labels: the block max identifies the block, so any mis-grouping shows."""
    labels = torch.arange(1, math.prod(shape) + 1, dtype=torch.float64).reshape(shape)
    got = abs_max_everywhere(labels, block)
    want = reference_blockwise(labels.numpy(), block, np.max)
    np.testing.assert_array_equal(got.numpy(), want)
    assert torch.unique(got).numel() == num_blocks(shape, block)


def test_apply_blockwise_crops_padding_and_keeps_shape():
    x = torch.arange(1.0, 11.0)  # [10], blocks of 4: the last block has 2 elements + 2 zeros
    seen = []

    def record(blocked, dims):
        seen.append((tuple(blocked.shape), dims))
        return blocked * 2

    out = apply_blockwise(x, (4,), record)
    assert seen == [((1, 3, 4), (2,))]  # blocks along the last dimension: [rows, blocks, block]
    assert out.shape == x.shape and torch.equal(out, x * 2)


def test_apply_blockwise_last_dimension_layout_matches_the_general_one():
    x = torch.randn(3, 5, 37, generator=torch.Generator().manual_seed(0))
    seen = []

    def block_max(blocked, dims):
        seen.append((tuple(blocked.shape), dims))
        return blocked.abs().amax(dim=dims, keepdim=True).expand_as(blocked)

    fast = apply_blockwise(x, (1, 1, 8), block_max)
    general = _apply_interleaved(x, (1, 1, 8), block_max)
    assert seen[0] == ((15, 5, 8), (2,)) and seen[1] == ((3, 1, 5, 1, 5, 8), (1, 3, 5))
    assert torch.equal(fast, general)


def test_apply_blockwise_blocked_layout():
    x = torch.arange(24.0).reshape(4, 6)
    blocked_shapes = []
    apply_blockwise(x, (2, 3), lambda b, d: blocked_shapes.append((tuple(b.shape), d)) or b)
    assert blocked_shapes == [((2, 2, 2, 3), (1, 3))]


def test_zero_d_tensor_is_one_block():
    x = torch.tensor(-3.5)
    out = apply_blockwise(x, block_shape(x.shape, (16,)), broadcast_stat(finite_abs_max))
    assert out.shape == () and out.item() == 3.5


def test_empty_dimension():
    x = torch.empty(0, 5)
    out = apply_blockwise(x, block_shape(x.shape, (4, 4)), broadcast_stat(finite_abs_max))
    assert out.shape == (0, 5)


# ---- padding never changes a result; skip_first_dim; axis --------------------------------------------------
@pytest.mark.parametrize("fmt", ["block_fp", "block_minifloat"])
@pytest.mark.parametrize("shape, block", [((10,), (4,)), ((5, 7), (2, 3)), ((3, 5, 7), (2, 2, 4))])
def test_padding_never_changes_a_format_result(fmt, shape, block):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=generator) * 3
    padded_shape = [-(-dim // b) * b for dim, b in zip(shape, block)]
    padded = torch.zeros(padded_shape)
    padded[tuple(slice(0, dim) for dim in shape)] = x
    direct = lowbit.quantize(x, fmt, block_size=list(block), width=5)
    via_padding = lowbit.quantize(padded, fmt, block_size=list(block), width=5)
    assert torch.equal(direct, via_padding[tuple(slice(0, dim) for dim in shape)])


def test_skip_first_dim_keeps_samples_apart():
    x = torch.tensor([[100.0, 1.0, 2.0, 3.0], [0.5, 0.25, 0.125, 0.0625]])
    together = abs_max_everywhere(x, block_shape(x.shape, (2, 4)))
    apart = abs_max_everywhere(x, block_shape(x.shape, (2, 4), skip_first_dim=True))
    assert torch.all(together == 100.0)
    assert torch.equal(apart[0], torch.full((4,), 100.0)) and torch.equal(apart[1], torch.full((4,), 0.5))


def test_axis_blocks_equal_explicit_block_size():
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    along_axis = abs_max_everywhere(x, block_shape(x.shape, (4,), axis=0))
    explicit = abs_max_everywhere(x, block_shape(x.shape, (4, 1)))
    assert torch.equal(along_axis, explicit)
    per_channel = abs_max_everywhere(x, block_shape(x.shape, None, axis=1))
    assert torch.equal(per_channel[0], x.abs().amax(dim=0))


# ---- finite statistics ---------------------------------------------------------------------------------------
def test_finite_statistics_ignore_nan_and_inf():
    blocked = torch.tensor([[1.0, float("nan"), -2.0, float("inf")], [float("-inf"), float("nan"), 0.0, 0.0]])
    assert finite_abs_max(blocked, (1,)).flatten().tolist() == [2.0, 0.0]
    low, high = finite_min_max(blocked, (1,))
    assert low.flatten().tolist() == [-2.0, 0.0] and high.flatten().tolist() == [1.0, 0.0]
    positive = torch.tensor([[3.0, 4.0]])
    low, high = finite_min_max(positive, (1,))
    assert low.item() == 0.0 and high.item() == 4.0  # widened to include zero


# ---- property: any rank, any block --------------------------------------------------------------------------
@st.composite
def shapes_and_blocks(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    entries = draw(st.lists(st.integers(-1, 8).filter(lambda b: b != 0), min_size=1, max_size=rank + 1))
    skip = draw(st.booleans())
    return shape, tuple(entries), skip


@given(shapes_and_blocks())
def test_blockwise_abs_max_property(case):
    shape, block_size, skip = case
    block = block_shape(shape, block_size, skip_first_dim=skip)
    assert len(block) == len(shape) and all(1 <= b <= max(dim, 1) for b, dim in zip(block, shape))
    if skip:
        assert block[0] == 1
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)), dtype=torch.float64)
    want = reference_blockwise(x.numpy(), block, lambda values: np.abs(values).max())
    np.testing.assert_array_equal(abs_max_everywhere(x, block).numpy(), want)
