"""The native narrowing of float32 results to bfloat16 / float16 (csrc/cast.c) against torch's saturating
cast written out (isfinite, clamp, cast): every 16-bit top of a float32 with the low halves around each
rounding point, random patterns, and the float16 subnormal ties; one and several threads."""

from __future__ import annotations

import pytest
import torch

from lowbit.native import build, kernels

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")

LOWS = [0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x6000, 0x7FFF, 0x8000, 0x8001, 0xE000, 0xFFFF]


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def reference(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = torch.finfo(dtype).max
    return torch.where(torch.isfinite(values), values.clamp(-limit, limit), values).to(dtype)


def float32_of_bits(bits: torch.Tensor) -> torch.Tensor:
    bits = bits & 0xFFFFFFFF
    return torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)


def float16_subnormal_ties() -> torch.Tensor:
    """Values at and one bit either side of every rounding midpoint of the float16 subnormals."""
    patterns = []
    for exponent in range(100, 114):
        for shift in range(1, 25):
            for top in range(0, 1 << 9, 7):
                mantissa = ((top << shift) | (1 << (shift - 1))) & 0x7FFFFF
                patterns += [(exponent << 23) | ((mantissa + d) & 0x7FFFFF) for d in (-1, 0, 1)]
    return torch.tensor(patterns)


def patterns() -> torch.Tensor:
    tops = torch.arange(0, 1 << 16, dtype=torch.int64) << 16
    swept = (tops[:, None] | torch.tensor(LOWS)[None, :]).reshape(-1)
    random = torch.randint(0, 1 << 32, (1 << 20,), generator=torch.Generator().manual_seed(0))
    ties = float16_subnormal_ties()
    return float32_of_bits(torch.cat([swept, random, ties, ties | (1 << 31)]))


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    mismatch = got.view(torch.int16) != want.view(torch.int16)
    assert not (mismatch & ~nan).any(), f"{int((mismatch & ~nan).sum())} differ"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrowing_equals_the_saturating_cast_on_every_rounding_point(dtype):
    values = patterns()
    assert_same(kernels.narrow(values, dtype), reference(values, dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("length", [1, 15, 16, 31, 33, 1000, 100_003])
def test_narrowing_any_length_on_several_threads(dtype, length, several_threads):
    generator = torch.Generator().manual_seed(length)
    values = torch.randn(length, generator=generator) * 3e4
    ties = torch.randint(0x3000, 0x4700, (length,), generator=generator) << 16 | 0x8000  # bfloat16 midpoints
    values[::2] = float32_of_bits(ties)[::2]
    values[::5] *= 1e36  # past both ranges
    values[1::7], values[2::11] = float("inf"), float("nan")
    assert_same(kernels.narrow(values, dtype), reference(values, dtype))
    assert_same(kernels.narrow(values.view(1, -1), dtype), reference(values, dtype).view(1, -1))


def test_narrowing_declines_what_it_does_not_take():
    assert kernels.narrow(torch.randn(8, dtype=torch.float64), torch.bfloat16) is None
    assert kernels.narrow(torch.randn(8), torch.float32) is None
    assert kernels.narrow(torch.randn(8, 4).t(), torch.bfloat16) is None
