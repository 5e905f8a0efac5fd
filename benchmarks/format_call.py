"""Median time of one ``spec(x)`` call under the default backend, for a few formats and two sizes.

    python benchmarks/format_call.py                      # this interpreter's lowbit, one table
    python benchmarks/format_call.py --compare A B [-r 4]  # two source trees (PYTHONPATH), alternated

``--compare`` runs each tree in its own process, alternating A, B, A, B, ... so that both see the same machine
load, and reports the median and the best over rounds of each tree's per-round medians (microseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

FORMATS = {
    "integer": ("integer", {"width": 8, "frac_width": 4}),
    "minifloat e4m3": ("e4m3", {}),
    "mxfp4_e2m1": ("mxfp4_e2m1", {}),
    "affine": ("affine", {"bits": 8}),
}
SIZES = {"64": (64,), "1M": (1024, 1024)}


def _median_us(call, repeats: int) -> float:
    for _ in range(max(3, repeats // 10)):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure() -> dict[str, float]:
    import torch

    import lowbit
    import lowbit.native

    if lowbit.native.ensure() is None:
        raise SystemExit(f"no native library: {lowbit.native.error()}")
    torch.manual_seed(0)
    results = {}
    for size_name, shape in SIZES.items():
        x = torch.randn(shape)
        repeats = 2000 if x.numel() < 4096 else 60
        for label, (name, params) in FORMATS.items():
            spec = lowbit.get_format(name)(**params)
            results[f"{label} @ {size_name}"] = _median_us(lambda spec=spec: spec(x), repeats)
    return results


def _run_tree(source: str) -> dict[str, float]:
    environment = dict(os.environ, PYTHONPATH=source)
    done = subprocess.run([sys.executable, __file__, "--json"], env=environment, check=True, capture_output=True,
                          text=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(first: str, second: str, rounds: int) -> None:
    runs: dict[str, list[dict[str, float]]] = {first: [], second: []}
    for _ in range(rounds):
        for tree in (first, second):
            runs[tree].append(_run_tree(tree))
    print(f"{'case':28} {'A (us)':>12} {'B (us)':>12} {'B/A':>7} {'best A':>10} {'best B':>10} {'B/A':>7}")
    for case in runs[first][0]:
        a = statistics.median(run[case] for run in runs[first])
        b = statistics.median(run[case] for run in runs[second])
        best_a, best_b = min(run[case] for run in runs[first]), min(run[case] for run in runs[second])
        print(f"{case:28} {a:12.2f} {b:12.2f} {b / a:7.3f} {best_a:10.2f} {best_b:10.2f} {best_b / best_a:7.3f}")
    print(f"A = {first}\nB = {second}\nrounds = {rounds}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON line (used by --compare)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two source trees to alternate")
    parser.add_argument("-r", "--rounds", type=int, default=4)
    arguments = parser.parse_args()
    if arguments.compare:
        compare(*arguments.compare, arguments.rounds)
        return
    results = measure()
    if arguments.json:
        print(json.dumps(results))
        return
    for case, value in results.items():
        print(f"{case:28} {value:12.2f} us")


if __name__ == "__main__":
    main()
