"""Format emulation speed: every format's quantize as a multiple of x.clone(): eager / native / auto / compiled
vs peers.

Method: for each format and tensor, the methods (clone, lowbit eager, lowbit native, lowbit auto, lowbit
compiled, each peer that has the format) run in one process, round-robin for ROUNDS rounds with a rotating
start; each round times enough calls of every method to last about TARGET seconds; the ratio to clone is
taken within the round; the table reports the median ratio and the min-max over rounds. "native" is the C
kernel (``lowbit.native``; "-" where the format has none for these parameters), "auto" the default backend in
steady state (the native library loaded; no torch.compile kernel warmed up, so formats without a native
kernel run eagerly), "compiled" torch.compile's kernel. Native and compiled outputs are checked bit for bit
against eager before timing (``--no-compile``: no compiled column).

First calls (``--first-call``): each format in a fresh process (subprocess) on the first shape, default
backend, with empty lowbit and Inductor cache directories ("cold") and then a second fresh process on the same
directories ("warm"): the first ``lowbit.quantize`` call (it starts the native build on a background thread
and answers eagerly), the time until the native library is loaded, and the median and max of the next five
calls after it. lowbit's modules are compiled to bytecode first, as ``pip install`` does for an installed
package: an editable install under ``PYTHONDONTWRITEBYTECODE=1`` (this set-up) would otherwise compile about
thirty modules from source in every fresh process, 45-60 ms of each first call. The report starts with the
command, the machine line of ``machine.py`` and how large allocations were served (``--memory``,
``timing.pin_allocator``: it decides the 4096 x 4096 ratios).

Usage: python benchmarks/formats.py [--shapes 384x384 2112x384] [--dtypes float32 bfloat16] [--rounds 5]
                                    [--only NAME ...] [--first-call] [--no-compile] [--memory warm|as-is]
                                    [--out FILE]
"""

from __future__ import annotations

import os
import sys
import tempfile

# An empty compile cache, so "first call" is what a new user sees (set before torch reads it).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="lowbit-bench-inductor-"))

import argparse  # noqa: E402
import compileall  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

import lowbit  # noqa: E402
from lowbit import backend  # noqa: E402
from lowbit._io import atomic_write_text  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from machine import header_line  # noqa: E402
from peers import peers_for  # noqa: E402
from timing import MEMORY_MODES, pin_allocator  # noqa: E402

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
TARGET = 0.05
SHAPES = ["384x384", "1536x384", "2112x384", "4096x4096"]


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


def same_bits(want: torch.Tensor, got: torch.Tensor) -> bool:
    return torch.equal(want.isnan(), got.isnan()) and torch.equal(want.nan_to_num(), got.nan_to_num())


def bench_row(name: str, params: dict, x: torch.Tensor, rounds: int, no_compile: bool = False) -> dict:
    spec = lowbit.get_format(name)(**params)
    methods = {"clone": x.clone, "eager": on_backend("eager", spec, x)}
    want, checked = methods["eager"](), []
    if lowbit.native.ensure() is not None and spec._native(x.float().contiguous(), x.dtype) is not None:
        methods["native"] = on_backend("native", spec, x)
        checked.append(methods["native"]())
    methods["auto"] = on_backend("auto", spec, x)  # native where it applies, else eager (nothing warmed up)
    if not no_compile:
        methods["compiled"] = on_backend("compiled", spec, x)
        checked.append(methods["compiled"]())
    identical = all(same_bits(want, got) for got in checked) if checked else None
    methods.update(peers_for(name, params, x))
    timing = time_round_robin(methods, rounds)
    peer_names = [m for m in methods if m not in ("clone", "eager", "native", "auto", "compiled")]
    best_peer = min(peer_names, key=lambda m: timing[m][0]) if peer_names else None
    return {"format": spec.describe(), "timing": timing, "best_peer": best_peer, "identical": identical}


def format_row(row: dict, kind: str) -> str:
    timing = row["timing"]

    def cell(method: str) -> str:
        if method not in timing:
            return "-"
        median, low, high, _ = timing[method]
        return f"{median:.2f} ({low:.2f}-{high:.2f})"

    peer = row["best_peer"]
    peer_cell = f"{peer}: {cell(peer)}" if peer else "-"
    return (f"| {row['format']} | {kind} | {cell('eager')} | {cell('native')} | {cell('auto')} | {cell('compiled')} "
            f"| {timing['clone'][3] * 1e3:.3f} | {peer_cell} | {_IDENTICAL[row['identical']]} |")


_IDENTICAL = {True: "yes", False: "NO", None: "-"}


HEADER = ("| format | kind | eager x clone | native x clone | auto x clone | compiled x clone | clone ms "
          "| fastest peer x clone | bit-identical |\n|---|---|---:|---:|---:|---:|---:|---|---|")

_FIRST_CALL_CODE = """
import json, statistics, sys, time, torch
start = time.perf_counter()
import lowbit
imported = time.perf_counter() - start
name, params, rows, cols = json.loads(sys.argv[1])
x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))
start = time.perf_counter(); lowbit.quantize(x, name, **params); first = time.perf_counter() - start
thread = lowbit.native.build._state["thread"]
if thread is not None:
    thread.join()
loaded = time.perf_counter() - start
steady = []
for _ in range(5):
    start = time.perf_counter(); lowbit.quantize(x, name, **params); steady.append(time.perf_counter() - start)
print(json.dumps([imported, first, statistics.median(steady), max(steady), loaded]))
"""


def first_call_row(name: str, params: dict, shape: tuple[int, int], cache_dir: str) -> list[list[float]]:
    """Per fresh process (cold caches, then warm): [import s, first call s, median of the 5 calls after the
    native library loaded s, their max s, first call until loaded s]."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir, "LOWBIT_CACHE_DIR": os.path.join(cache_dir, "lowbit")}
    env.pop("LOWBIT_BACKEND", None)  # the default backend
    out = []
    for _ in ("cold", "warm"):
        result = subprocess.run([sys.executable, "-c", _FIRST_CALL_CODE, json.dumps([name, params, *shape])],
                                env=env, capture_output=True, text=True, check=True)  # fmt: skip
        out.append(json.loads(result.stdout.strip().splitlines()[-1]))
    return out


FIRST_HEADER = ("| format | import lowbit ms | cold: first call ms | cold: native loaded after ms "
                "| cold: next 5 median / max ms | cold: first - median ms | warm: first call ms "
                "| warm: native loaded after ms | warm: next 5 median / max ms | warm: first - median ms |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def first_call_lines(formats, shape: tuple[int, int]) -> list[str]:
    compileall.compile_dir(os.path.dirname(lowbit.__file__), quiet=1)  # bytecode as an installed package has it
    lines = ["", f"### First call, fresh process, default backend, {shape[0]}x{shape[1]} float32", "", FIRST_HEADER]
    for name, params, _ in formats:
        cache_dir = tempfile.mkdtemp(prefix="lowbit-bench-first-")
        cold, warm = first_call_row(name, params, shape, cache_dir)
        cells = [f"{run[1] * 1e3:.1f} | {run[4] * 1e3:.0f} | {run[2] * 1e3:.2f} / {run[3] * 1e3:.1f} "
                 f"| {(run[1] - run[2]) * 1e3:.1f}" for run in (cold, warm)]  # fmt: skip
        described = lowbit.get_format(name)(**params).describe()
        lines.append(f"| {described} | {cold[0] * 1e3:.1f} | {cells[0]} | {cells[1]} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="ROWSxCOLS (default: the real-layer shapes)")
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None, help="format names to run (default: all)")
    parser.add_argument("--first-call", action="store_true", help="also time first calls in fresh processes")
    parser.add_argument("--no-steady", action="store_true", help="only the first-call table")
    parser.add_argument("--no-compile", "--eager-only", dest="no_compile", action="store_true",
                        help="no torch.compile (the compiled column shows '-')")
    parser.add_argument("--out", default=None, help="also write the markdown report to this file")
    parser.add_argument("--memory", default="warm", choices=MEMORY_MODES,
                        help="large allocations always reused (warm, default) or as glibc leaves them (timing.pin_allocator)")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in shape.lower().split("x")) for shape in args.shapes]
    formats = [f for f in FORMATS if not args.only or f[0] in args.only]
    machine = header_line() + "; " + pin_allocator(args.memory)
    print(machine, flush=True)
    lines = [f"`python {' '.join(sys.argv)}`", "", machine, "",
             f"{args.rounds} rounds, median ratio (min-max over rounds)"]
    if args.first_call:
        lines += first_call_lines(formats, shapes[min(2, len(shapes) - 1)] if len(shapes) > 2 else shapes[0])
    if not args.no_steady and not args.no_compile:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(8))  # the process's first compile, not charged to a format
    for dtype_name in [] if args.no_steady else args.dtypes:
        for rows, cols in shapes:
            x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype_name))
            lines += ["", f"### {rows}x{cols} {dtype_name}", "", HEADER]
            for name, params, kind in formats:
                lines.append(format_row(bench_row(name, params, x, args.rounds, args.no_compile), kind))
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
