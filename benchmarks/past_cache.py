"""How a native pass runs past the cache, side by side in one process, each format three ways interleaved
with ``x.clone()``: as before the fourteenth session (one static share a thread, no software prefetch:
``kernels.chunks(1)``, ``kernels.prefetch(-1)``), with chunks to whichever thread is free but no prefetch,
and as the library does it (chunks, and the block kernels' prefetch; csrc/parallel.c, csrc/stream.h).

Each round times 10 calls of every method in turn; the table gives the median over rounds of the time as a
multiple of the same round's clone. The three give the same bits (checked before timing).

    .venv/bin/python benchmarks/past_cache.py --rounds 9 --shape 4096x4096 --dtype float32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from machine import header_line
from timing import pin_allocator

import lowbit
from lowbit import backend
from lowbit.native import kernels

FORMATS = {
    "ternary": ("ternary", {"scaling_factor": True}),
    "binary": ("binary", {"scaling_factor": True}),
    "integer": ("integer", {"width": 8, "frac_width": 4}),
    "affine8": ("affine", {"bits": 8}),
    "affine4_blocks": ("affine", {"bits": 4, "power_of_two": True, "block_size": (1, 32)}),
    "q4s": ("q4s", {"bits": 4, "block_size": (1, 32), "scale_dtype": "bf16"}),
    "e4m3": ("e4m3", {}),
    "e2m1_blocks": ("e2m1", {"block_size": (1, 32)}),
    "block_fp": ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": (1, 16)}),
    "block_minifloat": ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4,
                                            "block_size": (1, 16)}),
    "block_log": ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": (1, 16)}),
    "mxint8": ("mxint8", {}),
    "mxfp4_e2m1": ("mxfp4_e2m1", {}),
}


WAYS = {"before": (1, -1), "chunks": (0, -1), "library": (0, 0)}  # (chunks a thread, prefetch); 0: the rule


def way_call(spec: lowbit.FormatSpec, x: torch.Tensor, chunks: int, prefetch: int) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        with kernels.chunks(chunks), kernels.prefetch(prefetch):
            return spec.quantize(x)

    return call


def measure(x: torch.Tensor, names: list[str], rounds: int) -> dict[str, float]:
    methods: dict[str, Callable[[], object]] = {"clone": x.clone}
    for name in names:
        spec = lowbit.get_format(FORMATS[name][0])(**FORMATS[name][1])
        bits = torch.int16 if x.dtype != torch.float32 else torch.int32
        results = []
        for way, (chunks, prefetch) in WAYS.items():
            methods[f"{name} {way}"] = way_call(spec, x, chunks, prefetch)
            results.append(methods[f"{name} {way}"]().view(bits))
        if not all(torch.equal(results[0], other) for other in results[1:]):
            raise SystemExit(f"{name}: the ways gave different bits")
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, method in methods.items():
            method()
            start = time.perf_counter()
            for _ in range(10):
                method()
            seconds[name].append((time.perf_counter() - start) / 10)
    ratios = {name: statistics.median(t / c for t, c in zip(times, seconds["clone"], strict=True))
              for name, times in seconds.items()}
    ratios["clone ms"] = statistics.median(seconds["clone"]) * 1e3
    return ratios


def native_input(shape: str, dtype: torch.dtype) -> tuple[torch.Tensor, str]:
    """For a table of native kernels: the allocator pinned (its line returned), the library loaded, the backend
    "native", and x = randn of ``shape`` ("ROWSxCOLS", seed 0) in ``dtype``."""
    allocator = pin_allocator("warm")
    if lowbit.native.ensure() is None:
        raise SystemExit(f"no native library: {lowbit.native.build.error()}")
    backend.set_backend("native")
    rows, columns = (int(part) for part in shape.split("x"))
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(0)).to(dtype), allocator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--shape", default="4096x4096", help="ROWSxCOLS")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--only", nargs="*", choices=sorted(FORMATS), default=list(FORMATS))
    args = parser.parse_args()
    x, allocator = native_input(args.shape, getattr(torch, args.dtype))
    ratios = measure(x, args.only, args.rounds)
    print(header_line() + "; " + allocator)
    print(f"\n{args.shape} {args.dtype}, native backend, median of {args.rounds} rounds, x clone "
          f"(clone {ratios['clone ms']:.2f} ms)\n")
    print("| format | before: static shares | chunks | chunks + block prefetch (the library) |\n|---|---:|---:|---:|")
    for name in args.only:
        print(f"| {name} | " + " | ".join(f"{ratios[f'{name} {way}']:.2f}" for way in WAYS) + " |")


if __name__ == "__main__":
    main()
