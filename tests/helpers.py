"""Helpers shared by the format tests: exact scalar models, tensor comparisons and slow per-block oracles.

Everything here is independent of lowbit's implementation (plain Python fractions, numpy and torch), so the
tests that use it compare lowbit against a second computation rather than against itself.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from fractions import Fraction

import numpy as np
import torch
from hypothesis import strategies as st

from lowbit.formats.rounding import ROUNDING_MODES

DETERMINISTIC = [mode for mode in ROUNDING_MODES if mode != "stochastic"]
FLOATS32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
BLOCK_SPECIALS = [0.0, -0.0, 1e-45, -1e-40, 3e38, -3.4e38, 2.0**-130, float("nan"), float("inf"), -float("inf")]
BLOCK_FLOAT32S = st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True), st.sampled_from(BLOCK_SPECIALS))
FOUR_FLOAT32S = st.lists(st.floats(-1e6, 1e6, width=32), min_size=4, max_size=4)  # one block of four
NON_FINITE = st.sampled_from([float("nan"), float("inf"), -float("inf")])


# ---- exact scalar models -------------------------------------------------------------------------------------
def reference_round(value: Fraction, mode: str) -> int:
    """A slow, exact scalar model of every deterministic rounding mode (independent of the implementation)."""
    low = math.floor(value)
    if value == low:
        return low
    high = low + 1
    toward_zero, away = (low, high) if value > 0 else (high, low)
    directed = {"toward_zero": toward_zero, "away_from_zero": away, "up": high, "down": low}
    if mode in directed:
        return directed[mode]
    half = value - low - Fraction(1, 2)
    if half != 0:
        return low if half < 0 else high
    even = low if low % 2 == 0 else high
    ties = {"nearest_even": even, "nearest_away": away, "nearest_toward_zero": toward_zero,
            "nearest_up": high, "nearest_down": low}  # fmt: skip
    return ties[mode]


def expected_between(low: float, high: float, position: Fraction, mode: str) -> float:
    """What ``mode`` gives for low + position * (high - low), with low and high neighbouring grid values (on
    a float grid the step at that point is high - low, and the tie parity is that of low / step)."""
    step = Fraction(high) - Fraction(low)
    return float(reference_round(Fraction(low) / step + position, mode) * step)


def code_limits(bits: int, signed: bool, narrow_range: bool = False) -> tuple[int, int]:
    return (-(2 ** (bits - 1)) + narrow_range, 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


def short_scale(scale: np.float32, code_bits: int) -> float:
    """A positive scale rounded down to 24 - code_bits significant bits, computed with Python fractions."""
    if code_bits > 11:  # wider codes keep their scale (see scaling.shorten_scale)
        return float(scale)
    keep = 24 - code_bits
    mantissa, exponent = math.frexp(float(scale))
    return math.ldexp(math.floor(Fraction(mantissa) * 2**keep), exponent - keep)


# ---- tensor comparisons --------------------------------------------------------------------------------------
def t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def equal_with_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and torch.equal(
        a.nan_to_num(), b.nan_to_num()
    )


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-for-bit equal values (NaN == NaN; 0.0 == -0.0), same dtype and shape."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def assert_near(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """For results holding a computed mean: equal up to float32 rounding of that mean (NaN == NaN)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=0, equal_nan=True)


# ---- slow per-block oracles ----------------------------------------------------------------------------------
def block_slices(shape, block) -> Iterator[tuple[slice, ...]]:
    """Every block of a tensor of ``shape`` as a tuple of slices (the last block of a dim may be short)."""
    starts = [range(0, dim, b) for dim, b in zip(shape, block)]
    for corner in itertools.product(*starts):
        yield tuple(slice(s, s + b) for s, b in zip(corner, block))


def per_block_reference(x: torch.Tensor, block, reference_block: Callable[[list], list]) -> torch.Tensor:
    """``reference_block`` (a block's values as a flat list -> its results) applied to every block, in float64."""
    array = x.double().numpy().copy()
    for slices in block_slices(x.shape, block):
        part = array[slices]
        array[slices] = np.array(reference_block(part.ravel().tolist())).reshape(part.shape)
    return torch.from_numpy(array).to(x.dtype)


def smallest_fitting_exponent(values: list[float], low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The smallest shared exponent in [low, high] that ``fits`` (a monotone test), by binary search; the
    largest if none does, and also for a block of only zeros and infinities (the infs saturate to the max)."""
    finite = [v for v in values if math.isfinite(v)]
    if not any(finite) and any(math.isinf(v) for v in values):
        return high
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    return low


def saturated_block(values: list[float], limit: Fraction, round_finite: Callable[[float], Fraction]) -> list[float]:
    """Each value rounded by ``round_finite`` and clamped to [-limit, limit]; NaN stays, +-inf saturate."""
    out = []
    for v in values:
        if math.isnan(v):
            out.append(math.nan)
        elif math.isinf(v):
            out.append(math.copysign(float(limit), v))
        else:
            out.append(float(max(-limit, min(limit, round_finite(v)))))
    return out


def interesting_data(shape, tie_bits: int, seed: int, spread: int = 8) -> torch.Tensor:
    """Random values over many binades plus powers of two, exact ties (2 - 2^-tie_bits) * 2^k and values just
    above them, which round up to 2^(k+1)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * 2.0 ** torch.randint(-spread, spread, shape, generator=generator)
    flat = x.view(-1)
    count = flat.numel()
    picks = torch.randperm(count, generator=generator)
    exponents = torch.randint(-6, 6, (count,), generator=generator).double()
    gap = 2.0**-tie_bits
    near_top = (2.0 - gap * torch.rand(count, generator=generator, dtype=torch.float64)) * 2**exponents
    exact_tie = (2.0 - gap) * 2**exponents
    sources = [2.0**exponents, near_top, exact_tie, -near_top, torch.zeros(count, dtype=torch.float64)]
    for index, source in enumerate(sources):
        chosen = picks[index::8]
        flat[chosen] = source[chosen].float()
    return x


# ---- checks shared by the block formats' tests ----------------------------------------------------------------
def check_block_grid(spec, values: torch.Tensor, mode: str) -> None:
    """``values``: a block's whole grid at one shared exponent. Paired with the grid's top value (which pins the
    exponent), every grid value maps to itself and the points 1/4, 1/2, 3/4 between neighbours round by ``mode``."""
    anchor = values[-1].item()

    def run(column: list[float]) -> list[float]:
        pairs = torch.tensor([[anchor, v] for v in column], dtype=torch.float32)
        out = spec(pairs)
        assert torch.all(out[:, 0] == anchor)
        return out[:, 1].tolist()

    assert run(values.tolist()) == values.tolist()  # every value maps to itself
    lows, highs = values[:-1].tolist(), values[1:].tolist()
    for position in (Fraction(1, 2), Fraction(1, 4), Fraction(3, 4)):
        points = [float(Fraction(a) + position * (Fraction(b) - Fraction(a))) for a, b in zip(lows, highs)]
        assert run(points) == [expected_between(a, b, position, mode) for a, b in zip(lows, highs)]


def check_block_properties(spec, x: torch.Tensor, reference, float32_max: float) -> None:
    """Shape, dtype, idempotence, sign symmetry, NaN in = NaN out, the float32 bound and the slow reference."""
    q = spec(x)
    assert q.dtype == x.dtype and q.shape == x.shape
    assert_same(spec(q), q)  # idempotent
    assert_same(spec(-x), -q)  # sign symmetric (nearest_even)
    assert torch.equal(torch.isnan(q), torch.isnan(x))  # NaN stays NaN, nothing else becomes NaN
    assert torch.all(q[~torch.isnan(q)].abs() <= float32_max)
    assert_same(q, reference(x, spec))


def check_special_does_not_set_block(spec, x: torch.Tensor, index: int, special: float, float32_max: float) -> None:
    """x: one block. A NaN or inf at ``index`` leaves the others as a zero there would; NaN stays NaN and
    +-inf saturate to the block's largest magnitude (the format's max if the rest is zero)."""
    poisoned, plain = x.clone(), x.clone()
    poisoned[index], plain[index] = special, 0.0
    q, clean = spec(poisoned), spec(plain)
    keep = torch.arange(x.numel()) != index
    assert torch.equal(q[keep], clean[keep])
    if math.isnan(special):
        assert math.isnan(q[index].item())
    else:
        assert math.copysign(1, q[index].item()) == math.copysign(1, special)
        assert abs(q[index].item()) >= clean.abs().max().item()
        if torch.all(clean == 0):
            assert abs(q[index].item()) == float32_max


def float32_patterns(shape, seed: int) -> torch.Tensor:
    """Random float32 bit patterns: NaN, +-inf, subnormals and every magnitude, uniformly over the codes."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, tuple(shape), dtype=torch.int64, generator=generator)
    return bits.to(torch.int32).view(torch.float32)


def eager_and_native(spec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``spec.quantize(x)`` on the eager backend, then on the native one (the eager backend in force after)."""
    from lowbit import backend

    try:
        backend.set_backend("eager")
        want = spec.quantize(x)
        backend.set_backend("native")
        return want, spec.quantize(x)
    finally:
        backend.set_backend("eager")
