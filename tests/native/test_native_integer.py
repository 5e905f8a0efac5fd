"""Native integer-family kernels (lowbit.native.integer) on parameters the case table does not cover: fixed
point with negative / large fractional widths, given scales per channel and rounded to f16 / bf16, derived
scales per channel on every axis, blocks with short tails, wide codes, huge scales; each bit for bit the
eager result in every deterministic rounding mode, and the kernel really runs (or declines, where it should)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lowbit
from helpers import DETERMINISTIC, float32_patterns
from lowbit import backend
from lowbit.errors import FormatError
from lowbit.native import build
from lowbit.native import integer as native_integer

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def inputs(shape, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    spread = torch.randn(shape, generator=generator) * torch.logspace(-6, 6, shape[-1])
    ties = torch.randint(-4096, 4096, shape, generator=generator) / 256.0
    mixed = torch.randn(shape, generator=generator) * 5
    mixed.view(-1)[::7] = float32_patterns(((mixed.numel() + 6) // 7,), seed)  # a few specials in otherwise plain blocks
    huge = torch.randn(shape, generator=generator) * 3e38
    tiny = torch.randn(shape, generator=generator) * 1e-39
    return [spread, ties, mixed, huge, tiny, float32_patterns(shape, seed + 1), torch.zeros(shape), -torch.zeros(shape)]


def assert_native_equals_eager(spec, x: torch.Tensor) -> None:
    got = spec._native(x.contiguous(), torch.float32)
    assert got is not None, f"{spec.describe()} declined shape {tuple(x.shape)}"
    assert_bits_equal(got, spec._quantize_in_dtype(x, None), x)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    got, want = got.float(), want.float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    mismatch = (got.view(torch.int32) != want.view(torch.int32)) & ~nan
    assert not mismatch.any(), f"{int(mismatch.sum())} differ: {got[mismatch][:4]} vs {want[mismatch][:4]} for x {x[mismatch][:4]}"


def check_everywhere(spec, shape) -> None:
    """Native == eager on every input, and on the eager output itself (values on the grid, where the
    directed modes correct their steps)."""
    for x in inputs(shape):
        assert_native_equals_eager(spec, x)
        assert_native_equals_eager(spec, spec._quantize_in_dtype(x, None))


FIXED = [
    {"width": 6, "frac_width": -3},  # steps of 8: underflow keeps the side of zero under directed modes
    {"width": 4, "frac_width": 12},
    {"width": 1, "frac_width": 0},
    {"width": 1, "frac_width": 0, "signed": False},
    {"width": 32, "frac_width": 64},
    {"width": 24, "frac_width": -64, "signed": False},
]


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("params", FIXED, ids=str)
def test_fixed_point(params, mode):
    check_everywhere(lowbit.get_format("integer")(**params, rounding=mode), (12, 70))


GIVEN = [
    ({"bits": 8, "scale": tuple(0.01 * (k + 1) for k in range(12)), "zero_point": tuple(range(-6, 6)), "axis": 0}, (12, 70)),
    ({"bits": 6, "scale": tuple(0.3 + k for k in range(28)), "axis": -1}, (6, 5, 28)),
    ({"bits": 4, "scale": (0.7, 0.3, 1.5, 2.0, 0.1), "zero_point": 2, "axis": 1, "signed": False}, (6, 5, 28)),
    ({"bits": 5, "scale": 0.37, "power_of_two": True, "scale_dtype": "bf16"}, (12, 70)),
    ({"bits": 7, "scale": (0.37, 1e-30, 3e4, 1.0 / 3), "axis": 1, "scale_dtype": "f16", "zero_point": -5}, (3, 4, 9)),
    ({"bits": 16, "scale": 3e38, "zero_point": 30000}, (12, 70)),  # values past float32's max: saturated
    ({"bits": 8, "scale": 2.0**127, "power_of_two": True, "narrow_range": True}, (12, 70)),
]


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("params,shape", GIVEN, ids=[str(i) for i in range(len(GIVEN))])
def test_affine_given_scales(params, shape, mode):
    check_everywhere(lowbit.get_format("affine")(**params, rounding=mode), shape)


DERIVED = [
    ("affine", {"bits": 8, "axis": -1}, (12, 70)),
    ("affine", {"bits": 8, "axis": 1}, (6, 5, 28)),
    ("affine", {"bits": 3, "axis": 0, "signed": False}, (6, 5, 28)),
    ("affine", {"bits": 8, "axis": 2, "symmetric": True}, (6, 5, 28)),
    ("affine", {"bits": 5, "block_size": (1, 9), "scale_dtype": "f16"}, (12, 70)),  # a short last block
    ("affine", {"bits": 4, "block_size": (1, 1, 16), "skip_first_dim": True, "scale_dtype": "bf16"}, (6, 5, 28)),
    ("affine", {"bits": 4, "block_size": (1, 1)}, (12, 70)),  # one element per block
    ("affine", {"bits": 12, "scale_dtype": "bf16"}, (12, 70)),  # wider than shorten_scale's 11 bits
    ("affine", {"bits": 16, "axis": 0, "power_of_two": True}, (12, 70)),
    ("affine", {"bits": 2, "symmetric": True, "signed": False, "scale_dtype": "f16"}, (12, 70)),
    ("affine", {"bits": 6, "narrow_range": True, "power_of_two": True, "axis": -1, "scale_dtype": "bf16"}, (12, 70)),
    ("q8s", {"axis": -1, "scale_dtype": "f16"}, (12, 70)),
    ("q2s", {"block_size": (1, 5)}, (12, 70)),
    ("q8f", {"axis": 1, "scale_dtype": "bf16"}, (6, 5, 28)),
    ("q4f", {"block_size": (1, 32), "power_of_two": True}, (12, 70)),
    ("q2f", {"axis": 0, "scale_dtype": "f16"}, (12, 70)),
    ("affine", {"bits": 4, "block_size": (1, 32), "scale_dtype": "bf16"}, (12, 64)),  # whole blocks of 32
    ("q4s", {"block_size": (1, 16)}, (6, 5, 32)),  # whole blocks of 16
    ("affine", {"bits": 6, "block_size": (1, 48), "symmetric": True, "power_of_two": True}, (12, 96)),  # of 48
]


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("name,params,shape", DERIVED, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(DERIVED)])
def test_affine_derived_scales(name, params, shape, mode):
    check_everywhere(lowbit.get_format(name)(**params, rounding=mode), shape)


@pytest.mark.parametrize("shape", [(), (1,), (37,), (1, 1, 5)])
def test_small_ranks(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4)) * 3
    for name, params in [("affine", {}), ("affine", {"axis": -1}), ("q4f", {"axis": 0}), ("integer", {}),
                         ("affine", {"scale": 0.25, "zero_point": 1})]:  # fmt: skip
        assert_native_equals_eager(lowbit.get_format(name)(**params), x)


@pytest.mark.parametrize(
    "name,params",
    [("affine", {"axis": -1}), ("affine", {"axis": 1, "symmetric": True}), ("q4s", {"block_size": (1, 48)}),
     ("affine", {"scale": tuple(0.01 + k / 1000 for k in range(1000)), "axis": -1, "rounding": "down"}),
     ("affine", {"bits": 4, "rounding": "up"}), ("integer", {"rounding": "nearest_away"})],
)  # fmt: skip
def test_threads_on_large_tensors(name, params, several_threads):
    x = torch.randn(1100, 1000, generator=torch.Generator().manual_seed(5)) * 8
    x[3, 7], x[900, 11] = float("inf"), float("nan")
    spec = lowbit.get_format(name)(**params)
    shaped = x.reshape(1100, 10, 100) if params.get("axis") == 1 else x
    assert_native_equals_eager(spec, shaped)
    backend.set_backend("native")
    try:
        got = spec.quantize(shaped.to(torch.bfloat16))
    finally:
        backend.set_backend("eager")
    assert got.dtype == torch.bfloat16
    assert_bits_equal(got, spec.quantize(shaped.to(torch.bfloat16)), shaped)


@pytest.mark.parametrize(
    "name,params",
    [("affine", {"bits": 4, "block_size": (1, 32), "power_of_two": True}), ("q4s", {"block_size": (1, 32)}),
     ("affine", {"bits": 8, "block_size": (1, 16), "scale_dtype": "bf16"}),
     ("affine", {"bits": 3, "block_size": (1, 64), "symmetric": True, "rounding": "down"})],
)  # fmt: skip
def test_whole_blocks_in_vectors_of_blocks(name, params, several_threads):
    """Whole blocks along rows have their extremes reduced a vector of blocks at a time (min_max_lanes.h): every
    block gets its own scale here (magnitudes from 2^-20 to 2^20, one sign only in some), one-sided, zero and
    -0.0 blocks, infinities and NaN inside blocks, and a row count that leaves a remainder of single blocks."""
    rows, columns = 67, 1024
    x = torch.randn(rows, columns, generator=torch.Generator().manual_seed(6))
    block = params["block_size"][1]
    blocks = x.view(-1, block)
    blocks *= torch.exp2(torch.arange(blocks.shape[0]) % 41 - 20.0).unsqueeze(1)
    blocks[3::7] = blocks[3::7].abs()
    blocks[5::11] = -blocks[5::11].abs()
    blocks[9::13] = 0.0
    blocks[10::13] = -0.0
    x.view(-1)[123::997] = float("inf")
    x.view(-1)[456::1009] = -float("inf")
    x.view(-1)[789::1013] = float("nan")
    assert_native_equals_eager(lowbit.get_format(name)(**params), x)


def test_the_kernel_declines_what_it_does_not_cover():
    x = torch.randn(64, 64)
    assert lowbit.get_format("affine")(block_size=(8, 8))._native(x, torch.float32) is None  # 2D blocks
    stochastic = lowbit.get_format("affine")(rounding="stochastic")
    assert stochastic._native(x, torch.float32) is None
    mismatched = lowbit.get_format("affine")(scale=(0.1, 0.2, 0.3), axis=0)
    assert mismatched._native(x, torch.float32) is None
    with pytest.raises(FormatError):
        mismatched.quantize(x)
    assert lowbit.get_format("integer")(rounding="stochastic")._native(x, torch.float32) is None


def test_prepared_constants_follow_the_spec_object():
    """A spec's packed constants are remembered per object: a replaced spec (new scale) gets its own."""
    x = torch.randn(16, 16)
    first = lowbit.get_format("affine")(scale=0.5)
    second = dataclasses.replace(first, scale=0.25)
    assert_native_equals_eager(first, x)
    assert_native_equals_eager(second, x)
    assert not torch.equal(first._native(x, torch.float32), second._native(x, torch.float32))
    assert native_integer._prepared[id(second)].spec_ref() is second
