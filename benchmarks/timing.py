"""Side-by-side timing shared by the kernel benchmarks: every method of a table runs in one process,
round-robin with a rotating start; each round times enough calls of every method to last about ``target``
seconds; the ratio to the reference method is taken within each round, and the median over rounds is
reported with the min-max. Other processes on a shared machine move absolute times, much less the ratios."""

from __future__ import annotations

import ctypes
import ctypes.util
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


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)
MEMORY_MODES = ("warm", "as-is")


def pin_allocator(mode: str = "warm") -> str:
    """Serve large allocations one way for the whole run (``warm``) or leave glibc alone (``as-is``), and say
    which, for the table's header.

    Left alone, glibc serves a block of 32 MiB or more from a free chunk of the heap when one is large enough
    (memory already touched) and otherwise maps fresh pages (a page fault per 4 KiB on first touch), so what
    ran before decides: x.clone() of 4096 x 4096 float32 read 19-26 ms on fresh pages (16385 faults a call)
    and 2.5-4 ms once a peer or any burst of small allocations had grown the heap, in one process, and the
    ratios to it swung from 0.2 to 7 in mid-table. ``warm`` maps nothing and trims nothing: every method runs
    at memory speed, the stricter comparison (fresh pages add the same 15-20 ms to clone and to a quantizer,
    pulling every ratio towards 1)."""
    if mode == "as-is":
        return "allocator: as the C library leaves it (large blocks fresh or reused, by history)"
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is not None and mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1):
        return "allocator: glibc, warm (mallopt: no mmap, no trim)"
    return "allocator: the C library's own (no glibc mallopt: large blocks fresh or reused, by history)"


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
