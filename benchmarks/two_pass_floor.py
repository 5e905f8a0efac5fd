"""The floor of the formats whose parameters come from the whole tensor, side by side in one process.

TWN, binary with a scale and affine per tensor must see every element before they can write one: a pass that
reads x for the statistic, then a pass that reads x again and writes out (past the cache, x is read from
memory twice). This script times, as multiples of ``x.clone()`` in the same round (``timing.interleaved``):
a read-only pass (``x.amax()``), each format's element pass alone (the same kernel with its parameter given:
ternary with a fixed threshold, binary unscaled, affine with a given scale and zero point) and the whole
format; "floor" is the read pass plus the element pass, what two passes cost on this machine at this moment.
The native kernels run (``backend native``); the allocator is pinned (``timing.pin_allocator``).
``--threads 1 2`` repeats the table at each thread count (clone and kernels alike): a pass whose time falls
with more threads while the read pass's barely does is bound by its arithmetic, not by memory.

    .venv/bin/python benchmarks/two_pass_floor.py --rounds 9 --shape 4096x4096 [--threads 1 2]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from machine import header_line
from past_cache import native_input
from timing import cell, interleaved

import lowbit

# (name, the whole format, its element pass alone with the parameter given)
PAIRS = [
    ("ternary (TWN)", ("ternary", {"scaling_factor": True}), ("ternary", {"threshold": 0.5})),
    ("binary, scaled", ("binary", {"scaling_factor": True}), ("binary", {})),
    ("affine 8-bit per tensor", ("affine", {"bits": 8}), ("affine", {"bits": 8, "scale": 0.05, "zero_point": 3})),
]


def on(spec: lowbit.FormatSpec, x: torch.Tensor):
    return lambda: spec.quantize(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--shape", default="4096x4096", help="ROWSxCOLS")
    parser.add_argument("--threads", type=int, nargs="*", default=[], help="thread counts (default: torch's)")
    args = parser.parse_args()
    if any(count < 1 for count in args.threads):
        parser.error("--threads takes counts of 1 or more")
    x, allocator = native_input(args.shape, torch.float32)
    calls = {"clone": x.clone, "read (x.amax())": x.amax}
    for name, whole, element in PAIRS:
        calls[name] = on(lowbit.get_format(whole[0])(**whole[1]), x)
        calls[f"{name}: element pass"] = on(lowbit.get_format(element[0])(**element[1]), x)
    print(header_line() + "; " + allocator)
    for threads in args.threads or [torch.get_num_threads()]:
        torch.set_num_threads(threads)
        table(interleaved(calls, "clone", rounds=args.rounds), args, threads)


def table(timings: dict, args: argparse.Namespace, threads: int) -> None:
    clone_ms = timings["clone"].milliseconds
    print(f"\n{args.shape} float32, native backend, {threads} thread(s), x clone (clone {clone_ms:.2f} ms), "
          f"median (min-max) of {args.rounds} rounds\n")
    read = timings["read (x.amax())"]
    print(f"read pass: {cell(read)} ({read.milliseconds:.2f} ms)\n")
    print("| format | element pass alone | floor (read + element pass) | the format | the format less its element "
          "pass, ms |\n|---|---:|---:|---:|---:|")
    for name, _, _ in PAIRS:
        element, whole = timings[f"{name}: element pass"], timings[name]
        print(f"| {name} | {cell(element)} | {read.ratio + element.ratio:.2f} | {cell(whole)} | "
              f"{whole.milliseconds - element.milliseconds:.2f} |")


if __name__ == "__main__":
    main()
