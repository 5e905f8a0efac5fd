"""Format emulation speed: every format's quantize as a multiple of x.clone(), eager vs compiled vs peers.

Method: for each format and tensor, the methods (clone, lowbit eager, lowbit compiled, each peer that has
the format) run in one process, round-robin for ROUNDS rounds with a rotating start; each round times
enough calls of every method to last about TARGET seconds; the ratio to clone is taken within the round;
the table reports the median ratio and the min-max over rounds. "first call" is the latency of the first
compiled call of a format (compile included) with an empty Inductor cache, after one warm-up compile in the
process. Compiled and eager outputs are checked to be bit-identical before timing. The report starts with
the command and the machine line of ``machine.py``.

Usage: python benchmarks/formats.py [--sizes 1024 4096] [--dtypes float32 bfloat16] [--rounds 7]
                                    [--only NAME ...] [--out FILE]
"""

from __future__ import annotations

import os
import sys
import tempfile

# An empty compile cache, so "first call" is what a new user sees (set before torch reads it).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="lowbit-bench-inductor-"))

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

import lowbit  # noqa: E402
from lowbit import backend  # noqa: E402
from lowbit._io import atomic_write_text  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from machine import header_line  # noqa: E402
from peers import peers_for  # noqa: E402

FORMATS: list[tuple[str, dict, str]] = [
    ("integer", {"width": 8, "frac_width": 4}, "scalar"),
    ("affine", {"bits": 8, "scale": 0.05, "zero_point": 3}, "scalar"),
    ("affine", {"bits": 8}, "per-tensor"),
    ("affine", {"bits": 4, "symmetric": True, "axis": 0}, "per-channel"),
    ("affine", {"bits": 4, "block_size": [1, 32], "power_of_two": True}, "block"),
    ("q4s", {"block_size": [1, 32], "scale_dtype": "bf16"}, "block"),
    ("binary", {"scaling_factor": True}, "per-tensor"),
    ("binary_residual", {}, "scalar"),
    ("ternary", {"scaling_factor": True}, "per-tensor"),
    ("minifloat_ieee", {"width": 8, "exponent_width": 4, "exponent_bias": 7}, "scalar"),
    ("minifloat_denorm", {"width": 8, "exponent_width": 4, "exponent_bias": 7}, "scalar"),
    ("e4m3", {}, "scalar"),
    ("e5m2", {}, "scalar"),
    ("e2m1", {"block_size": [1, 32]}, "block"),
    ("log", {"width": 8, "exponent_bias": 63}, "scalar"),
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": [1, 16]}, "block"),
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": [1, 16]}, "block"),
    ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": [1, 16]}, "block"),
    ("mxint8", {}, "block"),
    ("mxfp8_e4m3", {}, "block"),
    ("mxfp8_e5m2", {}, "block"),
    ("mxfp6_e3m2", {}, "block"),
    ("mxfp6_e2m3", {}, "block"),
    ("mxfp4_e2m1", {}, "block"),
]
TARGET = 0.1


def on_backend(name: str, spec: lowbit.FormatSpec, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        backend.set_backend(name)
        return spec.quantize(x)

    return call


def time_round_robin(methods: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float, float, float]]:
    """{name: (median ratio to clone, min ratio, max ratio, median seconds per call)}."""
    repeats = {}
    for name, fn in methods.items():
        fn()
        start = time.perf_counter()
        fn()
        repeats[name] = max(1, int(TARGET / max(time.perf_counter() - start, 1e-6)))
    names = list(methods)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            for _ in range(repeats[name]):
                methods[name]()
            seconds[name].append((time.perf_counter() - start) / repeats[name])
    result = {}
    for name in names:
        ratios = [t / c for t, c in zip(seconds[name], seconds["clone"])]
        result[name] = (statistics.median(ratios), min(ratios), max(ratios), statistics.median(seconds[name]))
    return result


def first_call_seconds(spec: lowbit.FormatSpec, x: torch.Tensor) -> float:
    backend.set_backend("compiled")
    start = time.perf_counter()
    spec.quantize(x)
    return time.perf_counter() - start


def bench_row(name: str, params: dict, x: torch.Tensor, rounds: int, first: dict) -> dict:
    spec = lowbit.get_format(name)(**params)
    key = spec.describe()
    if key not in first:
        first[key] = first_call_seconds(spec, x)
    eager, compiled = on_backend("eager", spec, x), on_backend("compiled", spec, x)
    want, got = eager(), compiled()
    identical = torch.equal(want.isnan(), got.isnan()) and torch.equal(want.nan_to_num(), got.nan_to_num())
    methods = {"clone": x.clone, "eager": eager, "compiled": compiled, **peers_for(name, params, x)}
    timing = time_round_robin(methods, rounds)
    peer_names = [m for m in methods if m not in ("clone", "eager", "compiled")]
    best_peer = min(peer_names, key=lambda m: timing[m][0]) if peer_names else None
    return {"format": key, "timing": timing, "best_peer": best_peer, "identical": identical,
            "first_call": first[key]}  # fmt: skip


def format_row(row: dict, kind: str) -> str:
    timing = row["timing"]

    def cell(method: str) -> str:
        median, low, high, _ = timing[method]
        return f"{median:.2f} ({low:.2f}-{high:.2f})"

    peer = row["best_peer"]
    peer_cell = f"{peer}: {cell(peer)}" if peer else "-"
    speedup = f"{timing[peer][0] / timing['compiled'][0]:.1f}x" if peer else "-"
    return (f"| {row['format']} | {kind} | {cell('eager')} | {cell('compiled')} | {timing['clone'][3] * 1e3:.2f} "
            f"| {peer_cell} | {speedup} | {row['first_call']:.1f} | {'yes' if row['identical'] else 'NO'} |")


HEADER = ("| format | kind | eager x clone | compiled x clone | clone ms | fastest peer x clone | compiled vs peer "
          "| first call s | bit-identical |\n|---|---|---:|---:|---:|---|---:|---:|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", nargs="*", default=None, help="format names to run (default: all)")
    parser.add_argument("--out", default=None, help="also write the markdown report to this file")
    args = parser.parse_args()
    torch.compile(lambda t: t * 2 + 1)(torch.ones(8))  # the process's first compile, not charged to a format
    machine = header_line()
    print(machine, flush=True)
    lines = [f"`python {' '.join(sys.argv)}`", "", machine, "",
             f"{args.rounds} rounds, median ratio (min-max over rounds)"]
    first: dict[str, float] = {}
    for dtype_name in args.dtypes:
        for size in args.sizes:
            x = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype_name))
            lines += ["", f"### {size}x{size} {dtype_name}", "", HEADER]
            for name, params, kind in FORMATS:
                if args.only and name not in args.only:
                    continue
                lines.append(format_row(bench_row(name, params, x, args.rounds, first), kind))
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
