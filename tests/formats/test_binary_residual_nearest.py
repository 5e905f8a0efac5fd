"""binary_residual is the nearest value of its exact grid and sign-symmetric at every near-tie (issue 45),
against an exact Fraction oracle, for MASE's magnitudes (levels 1-8) and other magnitude sets."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from lowbit.formats import BinaryResidual
from helpers import assert_same


def exact_nearest(value: Fraction, negative_zero: bool, exact: list[Fraction]) -> Fraction:
    """The nearest exact grid value; ties away from zero, a tie at 0 by the sign bit (the independent oracle)."""
    best = min(abs(v - value) for v in exact)
    candidates = [v for v in exact if abs(v - value) == best]
    if len(candidates) == 1:
        return candidates[0]
    if value == 0:
        return min(candidates) if negative_zero else max(candidates)
    return max(candidates, key=abs)


def near_ties(exact: list[Fraction], dtype: torch.dtype, steps: int) -> torch.Tensor:
    """Every ``dtype`` value within ``steps`` ulps of each exact midpoint of neighbours, both signs, +-0."""
    found = [torch.tensor([0.0, -0.0], dtype=dtype)]
    for low, high in zip(exact[:-1], exact[1:]):
        center = torch.tensor([float((low + high) / 2)], dtype=dtype)
        around = [center]
        for direction in (math.inf, -math.inf):
            y = center
            for _ in range(steps):
                y = torch.nextafter(y, torch.tensor([direction], dtype=dtype))
                around.append(y)
        found += around + [-v for v in around]
    return torch.cat(found)


RESIDUAL_GRIDS = [{"levels": n} for n in range(1, 9)] + [
    {"levels": 3, "means": (1.0, 0.8, 0.6)}, {"levels": 4, "means": (0.7, 0.3, 0.2, 0.1)},
    {"levels": 2, "means": (0.3, 0.1)}, {"levels": 5, "means": (1 / 3, 1 / 5, 1 / 7, 1 / 11, 1 / 13)}]  # fmt: skip


@pytest.mark.parametrize("params", RESIDUAL_GRIDS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_residual_is_nearest_and_sign_symmetric_at_every_near_tie(params, dtype):
    """0 not-nearest and 0 asymmetric results within 8 ulps of every exact midpoint (issue 45: 29 and 23
    such inputs over levels 1-8 before), against exact Fractions of the float64 grid values."""
    spec = BinaryResidual(**params)
    exact = [Fraction(v) for v in spec.value_set().tolist()]
    x = near_ties(exact, dtype, steps=8)
    got = spec(x)
    expected = [exact_nearest(Fraction(v), math.copysign(1.0, v) < 0, exact) for v in x.tolist()]
    assert_same(got, torch.tensor([float(v) for v in expected], dtype=torch.float64).to(dtype))
    assert_same(spec(-x).abs(), got.abs())
    assert bool((spec(-x) == -got).all())
