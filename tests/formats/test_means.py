"""formats/means.py: the exact mean behind the binary / ternary scales, rounded once to float32."""

from __future__ import annotations

import fractions

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.formats.means import exact_float32, rounded_mean

UNIT = fractions.Fraction(1, 2**149)


def nearest_float32(value: fractions.Fraction) -> float:
    """The float32 nearest to an exact rational, ties to the even bit pattern (a slow oracle)."""
    guess = np.float32(float(value))
    candidates = [np.nextafter(guess, np.float32(-1)), guess, np.nextafter(guess, np.float32(np.inf))]
    return float(min(candidates, key=lambda c: (abs(fractions.Fraction(float(c)) - value), int(c.view(np.uint32)) & 1)))


@settings(max_examples=400, deadline=None)
@given(units=st.integers(1, 2**270), count=st.integers(1, 2**40))
def test_exact_float32_is_the_nearest_float32(units, count):
    assert exact_float32(units, count) == nearest_float32(fractions.Fraction(units, count) * UNIT)


@pytest.mark.parametrize("shift", [0, 1, 24, 100, 240])
def test_exact_float32_ties_go_to_even(shift):
    for m in range(1, 200):
        units = (2**24 + 2 * m + 1) << shift  # over 2: halfway between two floats
        want = nearest_float32(fractions.Fraction(units, 2) * UNIT)
        assert exact_float32(units, 2) == want
        assert int(np.float32(want).view(np.uint32)) % 2 == 0


def test_a_mean_the_float64_sum_drops_a_term_of_is_exact():
    # 0.625 + 2^-25 is a float32 midpoint; the tiny term puts the exact mean above it, float64 cannot tell
    kept = torch.tensor([[1.0, 1.0, 0.5 + 2.0**-23, 1e-30]])
    assert ((kept.sum(dtype=torch.float64) / 4).float()).item() == 0.625  # what the float64 sum alone gives
    assert rounded_mean(kept, 4, (1,)).item() == 0.625 + 2.0**-24
    assert rounded_mean(kept[:, :2], 2, (1,)).item() == 1.0  # a block the float64 sum decides


def test_equal_values_give_that_value():
    # (float64 tensors keep their float64 sum's mean: masked_mean's equal-values rule covers them)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        value = torch.tensor(0.1, dtype=dtype)
        kept = value.expand(1000, 3).contiguous()
        assert torch.equal(rounded_mean(kept, 1000, (0,)), value.expand(1, 3))


def test_half_types_round_through_float32():
    kept = torch.tensor([[1.0, 1.0, 0.5 + 2.0**-23, 1e-30]])
    assert rounded_mean(kept.bfloat16(), 4, (1,)).dtype == torch.bfloat16
    assert rounded_mean(kept.bfloat16(), 4, (1,)).item() == torch.tensor(0.625 + 2.0**-24).bfloat16().item()
