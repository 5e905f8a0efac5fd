"""Side-by-side timing shared by the kernel benchmarks: every method of a table runs in one process,
round-robin with a rotating start; each round times enough calls of every method to last about ``target``
seconds; the ratio to the reference method is taken within each round, and the median over rounds is
reported with the min-max. Other processes on a shared machine move absolute times, much less the ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Timing:
    ratio: float  # median over rounds of (method time / reference time) in the same round
    low: float
    high: float
    milliseconds: float  # median time per call


def _iterations(function: Callable[[], object], target: float) -> int:
    """How many calls of ``function`` last about ``target`` seconds."""
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < target / 4:
        function()
        calls += 1
    return max(1, int(calls * target / max(time.perf_counter() - start, 1e-9)))


def interleaved(methods: dict[str, Callable[[], object]], reference: str, rounds: int = 7, target: float = 0.1,
                warmup: int = 3) -> dict[str, Timing]:  # fmt: skip
    """Ratio of every method to ``reference`` (see the module docstring)."""
    for function in methods.values():
        for _ in range(warmup):
            function()
    counts = {name: _iterations(function, target) for name, function in methods.items()}
    names = list(methods)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            function, count = methods[name], counts[name]
            start = time.perf_counter()
            for _ in range(count):
                function()
            seconds[name].append((time.perf_counter() - start) / count)
    out = {}
    for name in names:
        ratios = [mine / theirs for mine, theirs in zip(seconds[name], seconds[reference])]
        out[name] = Timing(statistics.median(ratios), min(ratios), max(ratios), 1e3 * statistics.median(seconds[name]))
    return out


def cell(timing: Timing) -> str:
    return f"{timing.ratio:.2f} ({timing.low:.2f}-{timing.high:.2f})"
