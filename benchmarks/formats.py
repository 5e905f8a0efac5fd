"""Format emulation speed: every format's quantize as a multiple of x.clone() on the same tensor.

Method: all methods for one tensor live in one process; each is warmed up, then timed round-robin for
ROUNDS rounds (the start rotates each round); each round times REPEATS calls of every method; the ratio to
clone is taken within the round; we report the median ratio and the min-max over rounds, plus the median
absolute time. Peers (torch's own fake_quantize and float8 casts) are timed in the same rounds.

Usage: python benchmarks/formats.py [--sizes 1024 4096] [--rounds 7] [--dtype float32] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import lowbit
from lowbit._io import atomic_write_text

FORMATS: list[tuple[str, dict]] = [
    ("integer", {"width": 8, "frac_width": 4}),
    ("affine", {"bits": 8, "scale": 0.05, "zero_point": 3}),
    ("affine", {"bits": 8}),
    ("affine", {"bits": 4, "symmetric": True, "axis": 0}),
    ("affine", {"bits": 4, "block_size": [1, 32], "power_of_two": True}),
    ("q4s", {"block_size": [1, 32], "scale_dtype": "bf16"}),
    ("binary", {"scaling_factor": True}),
    ("ternary", {"scaling_factor": True}),
    ("binary_residual", {}),
    ("minifloat_ieee", {"width": 8, "exponent_width": 4, "exponent_bias": 7}),
    ("minifloat_denorm", {"width": 8, "exponent_width": 4, "exponent_bias": 7}),
    ("e4m3", {}),
    ("e5m2", {}),
    ("e2m1", {"block_size": [1, 32]}),
    ("log", {"width": 8, "exponent_bias": 63}),
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": [1, 16]}),
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": [1, 16]}),
    ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": [1, 16]}),
    ("mxint8", {}),
    ("mxfp8_e4m3", {}),
    ("mxfp4_e2m1", {}),
]


def peers(x: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Torch's own implementations of some of the same work (always installed)."""
    out = {
        "torch fake_quantize_per_tensor int8": lambda: torch.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127),
    }
    if x.dtype == torch.float32:
        out["torch .to(float8_e4m3fn).float()"] = lambda: x.to(torch.float8_e4m3fn).to(x.dtype)
    return out


def time_round_robin(methods: dict[str, Callable[[], object]], rounds: int, target_s: float = 0.15):
    """{name: (median ratio to clone, min ratio, max ratio, median seconds per call)}."""
    repeats = {}
    for name, fn in methods.items():
        for _ in range(2):
            fn()
        start = time.perf_counter()
        fn()
        one = max(time.perf_counter() - start, 1e-6)
        repeats[name] = max(1, int(target_s / one))
    names = list(methods)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            fn, count = methods[name], repeats[name]
            start = time.perf_counter()
            for _ in range(count):
                fn()
            per_round[name].append((time.perf_counter() - start) / count)
    clone = per_round["clone"]
    result = {}
    for name in names:
        ratios = [t / c for t, c in zip(per_round[name], clone)]
        result[name] = (statistics.median(ratios), min(ratios), max(ratios), statistics.median(per_round[name]))
    return result


def run(size: int, rounds: int, dtype: torch.dtype) -> list[str]:
    x = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(dtype)
    methods: dict[str, Callable[[], object]] = {"clone": x.clone}
    registered = set(lowbit.list_formats())
    for name, params in FORMATS:
        if name in registered:
            spec = lowbit.get_format(name)(**params)
            methods[f"lowbit {spec.describe()}"] = lambda spec=spec: spec.quantize(x)
    methods.update(peers(x))
    results = time_round_robin(methods, rounds)
    lines = [f"\n### {size}x{size} {str(dtype).replace('torch.', '')}, {rounds} rounds\n",
             "| method | median x clone | min-max | median ms |", "|---|---:|---:|---:|"]
    for name, (median, low, high, seconds) in results.items():
        lines.append(f"| {name} | {median:.2f} | {low:.2f}-{high:.2f} | {seconds * 1e3:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    lines = [f"torch {torch.__version__}, threads {torch.get_num_threads()}, eager path"]
    for size in args.sizes:
        lines += run(size, args.rounds, dtype)
    text = "\n".join(lines)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()
