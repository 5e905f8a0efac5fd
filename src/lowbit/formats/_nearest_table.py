"""The nearest entry of a sorted table of values, decided exactly (binary_residual, codebook, nf4).

The table holds exact values (Python floats, i.e. float64). For each pair of neighbours a < b the exact
midpoint (a + b) / 2 (a Fraction) is turned once into a *threshold*: the smallest value of the compute
dtype that goes to b, in the order where -0 sorts just below +0. An input's index is then the number of
thresholds it reaches, so comparisons with rounded midpoints never decide a near-tie the wrong way.

Tie rules (what an input exactly on a midpoint gets): ``away`` (the neighbour farther from zero),
``toward_zero`` (the nearer one), ``up`` (b), ``down`` (a). A midpoint of exactly 0 (a = -b) under
``away`` / ``toward_zero`` is decided by the sign bit: +0 goes to b, -0 to a; the rules are then mirror
images for -x, so a sign-symmetric table gives a sign-symmetric result.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
import torch

TIE_RULES = ("away", "toward_zero", "up", "down")
_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _smallest_above(midpoint: Fraction, dtype: torch.dtype, inclusive: bool) -> float:
    """The smallest ``dtype`` value >= ``midpoint`` (``inclusive``) or > it (inf past the range)."""
    kind = _NUMPY_DTYPES[dtype]
    up, down = kind(math.inf), kind(-math.inf)
    with np.errstate(over="ignore"):
        candidate = kind(float(midpoint))  # within an ulp or two of the answer (float64 first, then dtype)

    def passes(value) -> bool:
        if not math.isfinite(value):
            return value > 0
        return Fraction(float(value)) >= midpoint if inclusive else Fraction(float(value)) > midpoint

    while not passes(candidate):
        candidate = np.nextafter(candidate, up)
    while math.isfinite(below := np.nextafter(candidate, down)) and passes(below):
        candidate = below
    return float(candidate)


def _goes_up_on_tie(midpoint: Fraction, tie: str) -> bool:
    if tie in ("up", "down"):
        return tie == "up"
    return (midpoint > 0) == (tie == "away")


@functools.lru_cache(maxsize=256)
def thresholds(values: tuple[float, ...], dtype: torch.dtype, tie: str) -> tuple[float, ...]:
    """Per pair of neighbouring ``values`` (ascending, distinct), the smallest ``dtype`` input that goes to
    the upper one. A threshold of +0.0 is not reached by -0.0 (see ``nearest_index``)."""
    points = []
    for low, high in zip(values[:-1], values[1:], strict=True):
        midpoint = (Fraction(low) + Fraction(high)) / 2
        if midpoint == 0 and tie in ("away", "toward_zero"):
            points.append(0.0)  # +0 goes up, -0 stays
        elif midpoint == 0:
            points.append(-0.0 if tie == "up" else float(np.nextafter(_NUMPY_DTYPES[dtype](0), 1)))
        else:
            points.append(_smallest_above(midpoint, dtype, _goes_up_on_tie(midpoint, tie)))
    return tuple(points)


def nearest_index(x: torch.Tensor, points: tuple[float, ...], counted: bool = False) -> torch.Tensor:
    """The index (int64) of each x's nearest value, given ``thresholds(...)`` for x's dtype. NaN gets an
    arbitrary index (callers put NaN back). ``counted``: compare with each threshold instead of a binary
    search (what compiled kernels fuse best for short tables)."""
    limits = torch.tensor(points, dtype=x.dtype, device=x.device)
    if counted:
        index = sum((x >= t).to(torch.int64) for t in limits.unbind())
    else:
        index = torch.bucketize(x, limits, right=True)  # the number of thresholds <= x
    positive_zeros = sum(1 for t in points if t == 0 and math.copysign(1.0, t) > 0)
    if positive_zeros:  # -0 compares equal to a +0 threshold but lies below it
        index = index - positive_zeros * ((x == 0) & torch.signbit(x)).to(torch.int64)
    return index
