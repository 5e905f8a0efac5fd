"""The fast eager pieces against the general code they replace, over every float32 bit pattern class.

``grid_step`` builds the float grid's step from the exponent bits in two integer passes where the grid's
smallest step is a normal float; the general path (``floor_log2`` + ``exact_pow2``) is the reference. The
inputs cover every one of the 65536 sign / exponent / top-mantissa patterns of float32 with six low-half
patterns each (zero, one, the half-way and its neighbours, all ones): every binade, every code of every
<= 8-bit grid, the midpoints between codes and the values next to them, subnormals, +-0, +-inf and NaNs.
"""

from __future__ import annotations

import functools

import pytest
import torch

import lowbit
from format_cases import CASES
from helpers import assert_same
from lowbit.formats import _float_grid, log
from lowbit.formats.rounding import ROUNDING_MODES

DETERMINISTIC = [mode for mode in ROUNDING_MODES if mode != "stochastic"]


@functools.cache
def every_pattern_class(dtype=torch.float32) -> torch.Tensor:
    high = torch.arange(1 << 16, dtype=torch.int64) << 16
    low = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)
    bits = (high[:, None] | low[None, :]).flatten()
    values = (bits - (1 << 32) * (bits >= (1 << 31))).to(torch.int32).view(torch.float32)
    return values if dtype == torch.float32 else torch.cat([values.double(), values.double() * 2.0**-900])


def general_step(x, mantissa_bits, min_exponent):
    exponent = _float_grid.floor_log2(x.abs()).clamp(min=min_exponent)
    return _float_grid.exact_pow2(exponent - mantissa_bits, x.dtype)


GRIDS = [(m, e) for m in (1, 2, 3, 5, 7) for e in (-125 + m, -6, 1)] + [(23, -126), (10, -14)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mantissa_bits,min_exponent", GRIDS)
def test_step_from_bits_equals_the_general_step_on_every_finite_pattern(dtype, mantissa_bits, min_exponent):
    x = every_pattern_class(dtype)
    x = x[torch.isfinite(x)]  # (+-inf / NaN: a different, larger step, checked through the results below)
    fast = _float_grid.grid_step(x, mantissa_bits, min_exponent)
    assert torch.equal(fast, general_step(x, mantissa_bits, min_exponent))


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("mantissa_bits,min_exponent,max_value", [(3, -6, 448.0), (2, -14, 57344.0), (1, 0, 6.0),
                                                                   (2, -2, 28.0), (3, 0, 7.5), (4, -7, 1.0)])  # fmt: skip
def test_rounding_with_the_fast_step_equals_the_general_path_everywhere(monkeypatch, mode, mantissa_bits,
                                                                        min_exponent, max_value):  # fmt: skip
    x = every_pattern_class().clone()
    fast = _float_grid.round_to_float_grid(x, mantissa_bits, min_exponent, max_value, mode)
    monkeypatch.setattr(_float_grid, "_step_from_bits", None)  # any use of the fast step would now fail
    monkeypatch.setattr(_float_grid, "grid_step", general_step)
    assert_same(fast, _float_grid.round_to_float_grid(x, mantissa_bits, min_exponent, max_value, mode))
    assert torch.equal(torch.signbit(fast), torch.signbit(_float_grid.round_to_float_grid(
        x, mantissa_bits, min_exponent, max_value, mode)))  # fmt: skip


FLOAT_CASES = [c for c in CASES if c[1].startswith(("minifloat", "e5m2", "e4m3", "e3m2", "e2m3", "e2m1", "mx"))]


@pytest.mark.parametrize("name,params", [pytest.param(n, p, id=i) for i, n, p, _ in FLOAT_CASES])
def test_every_float_grid_format_is_unchanged_by_the_fast_step(monkeypatch, name, params):
    spec = lowbit.get_format(name)(**params)
    x = every_pattern_class().clone().reshape(-1, 64)
    fast = spec(x)
    monkeypatch.setattr(_float_grid, "grid_step", general_step)
    general = spec(x)
    assert_same(fast, general)
    assert torch.equal(torch.signbit(fast), torch.signbit(general))  # -0.0 stays -0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("min_exponent,max_exponent", [(-62, 64), (-63, 64), (-6, 8), (-125, 127), (-1, 200), (0, 0)])
def test_nearest_power_of_two_equals_the_general_routine_everywhere(dtype, min_exponent, max_exponent):
    x = every_pattern_class(dtype)
    fast = log.nearest_power_of_two(x, min_exponent, max_exponent)
    general = log.round_to_power_of_two(x, min_exponent, max_exponent, "nearest_even")
    assert_same(fast, general)
    assert torch.equal(torch.signbit(fast), torch.signbit(general))


def test_log_takes_the_fast_path_only_where_it_applies():
    assert log.fast_nearest_applies(torch.float32, -62) and not log.fast_nearest_applies(torch.float32, -126)
    assert log.fast_nearest_applies(torch.float64, -1000) and not log.fast_nearest_applies(torch.bfloat16, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mantissa_bits", [1, 2, 3, 6])
def test_step_from_bits_with_per_block_exponents(dtype, mantissa_bits):
    x = every_pattern_class(dtype)
    x = x[torch.isfinite(x)]
    x = x[: x.numel() // 64 * 64].reshape(-1, 16, 4)
    generator = torch.Generator().manual_seed(mantissa_bits)
    low = 1 - (127 if dtype == torch.float32 else 1023) + mantissa_bits
    min_exponent = torch.randint(low, low + 200, (x.shape[0], 1, 1), generator=generator, dtype=torch.int32)
    fast = _float_grid.grid_step(x, mantissa_bits, min_exponent)
    exponent = torch.maximum(_float_grid.floor_log2(x.abs()), min_exponent)
    assert torch.equal(fast, _float_grid.exact_pow2(exponent - mantissa_bits, dtype))
    min_exponent[0] = low - 1  # one block's smallest step subnormal: the general path for every block
    exponent = torch.maximum(_float_grid.floor_log2(x.abs()), min_exponent)
    assert torch.equal(_float_grid.grid_step(x, mantissa_bits, min_exponent),
                       _float_grid.exact_pow2(exponent - mantissa_bits, dtype))  # fmt: skip
