"""Streamed against plain output stores in the native kernels (csrc/stream.h), side by side in one process.

For each format and thread count: the native kernel with its output written through the cache (plain) and
with non-temporal stores (streamed), both forced with ``kernels.stream_from``, and ``x.clone()``.
``timing.interleaved`` runs the three round-robin; the table gives each as a multiple of clone (median and
min-max over rounds) and streamed / plain taken within each round, the figure that decides whether a call
should stream (``kernels.streams``: from 32 MiB of output, on two threads or more).

Usage: python benchmarks/streamed.py [--shape 4096x4096] [--threads 1 2] [--rounds 15] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
import timing  # noqa: E402

import lowbit  # noqa: E402
from lowbit.native import build, kernels  # noqa: E402

FORMATS = {
    "integer": ("integer", {"width": 8, "frac_width": 4}),
    "affine": ("affine", {"bits": 8}),
    "affine_blocks": ("affine", {"bits": 4, "power_of_two": True, "block_size": (1, 32)}),
    "binary": ("binary", {"width": 1, "scaling_factor": True}),
    "ternary": ("ternary", {"width": 2, "scaling_factor": True}),
    "e4m3": ("e4m3", {}),
    "log": ("log", {"width": 8, "exponent_bias": 63}),
    "e2m1": ("e2m1", {"block_size": (1, 32)}),
    "block_minifloat": ("block_minifloat",
                        {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": (1, 16)}),
    "mxint8": ("mxint8", {}),
    "mxfp4_e2m1": ("mxfp4_e2m1", {}),
}


def measure(spec, x: torch.Tensor, rounds: int) -> dict[str, timing.Timing]:
    def plain():
        with kernels.stream_from(1 << 62):
            return spec._native(x, torch.float32)

    def streamed():
        with kernels.stream_from(1):
            return spec._native(x, torch.float32)

    if not torch.equal(plain().view(torch.int32), streamed().view(torch.int32)):
        raise SystemExit(f"streamed and plain outputs differ for {spec}")
    return timing.interleaved({"plain": plain, "streamed": streamed, "clone": x.clone}, "plain", rounds=rounds,
                              target=0.05)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096x4096")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", nargs="*", choices=sorted(FORMATS))
    arguments = parser.parse_args()
    if build.ensure() is None:
        raise SystemExit(f"no native library: {build.error()}")
    memory = timing.pin_allocator("warm")
    rows, columns = (int(part) for part in arguments.shape.split("x"))
    x = torch.randn(rows, columns, generator=torch.Generator().manual_seed(0)) * 3
    print(machine.header_line() + f"; {memory}")
    print(f"\n{arguments.rounds} rounds, {arguments.shape} float32, threshold {kernels.stream_threshold()} bytes\n")
    print("| format | threads | plain x clone | streamed x clone | streamed / plain | plain ms | streamed ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for threads in arguments.threads:
        torch.set_num_threads(threads)
        for key in arguments.only or FORMATS:
            name, params = FORMATS[key]
            result = measure(lowbit.get_format(name)(**params), x, arguments.rounds)
            plain, streamed, to_clone = result["plain"], result["streamed"], 1.0 / result["clone"].ratio
            print(f"| {key} | {threads} | {to_clone:.2f} | {streamed.ratio * to_clone:.2f} | {timing.cell(streamed)} | "
                  f"{plain.milliseconds:.2f} | {streamed.milliseconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
