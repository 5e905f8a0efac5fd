"""lowbit search on the digits MLP: the Pareto front (validation accuracy vs bits per weight) against the
uniform presets, and its hypervolume against random search and the sensitivity-guided start, each with the
same trial budget.

The MLP (64 -> 128 -> 64 -> 10) is trained here (Adam, 60 epochs, seed 0; about a second). The space: per
Linear layer (by name), the weight in affine 2 / 3 / 4 / 6 / 8 bits per channel, ternary, block_fp 4 / 6 bits
(blocks of 16), e4m3, mxfp4, mxfp8, and the input in affine 8 bits, e4m3, mxfp8 or mxfp4. Objectives:
accuracy (maximize) and weight_bits (minimize); evaluation on the 270 validation samples. Hypervolume:
area dominated up to (accuracy 0, 32 bits).

Usage: python benchmarks/search.py [--trials 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from lowbit.models import DigitsMLP  # noqa: E402
from lowbit.pipeline.catalog import get_split  # noqa: E402
from lowbit.search import run_search  # noqa: E402
from lowbit.search.front import hypervolume_2d  # noqa: E402
from machine import header_line  # noqa: E402

CONFIG = """
model = "digits_mlp"
dataset = "digits"
[search.search_space]
name = "graph/quantize/mixed_precision_ptq"
[search.search_space.setup]
by = "name"
ops = ["linear"]
[search.search_space.seed.default.roles.weight]
name = ["affine", "ternary", "block_fp", "e4m3", "mxfp4_e2m1", "mxfp8_e4m3"]
affine = {bits = [2, 3, 4, 6, 8], axis = 0}
block_fp = {width = [4, 6], block_size = [[1, 16]]}
[search.search_space.seed.default.roles.data_in]
name = ["affine", "e4m3", "mxfp8_e4m3", "mxfp4_e2m1"]
affine = {bits = [8]}
[search.strategy]
name = "optuna"
[search.strategy.sw_runner.basic_evaluation]
num_samples = 1000
[search.strategy.setup]
n_trials = 100
sampler = "SAMPLER"
sensitivity_start = SENSITIVITY
[search.strategy.metrics]
accuracy.direction = "maximize"
weight_bits.direction = "minimize"
"""


def trained_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    model, data = DigitsMLP(), get_split("digits", "train")
    x, y = data.tensors
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        for index in torch.randperm(len(y)).split(64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
            optimizer.step()
    return model.eval()


def run(model: torch.nn.Module, sampler: str, sensitivity: bool, trials: int, folder: str) -> dict:
    text = CONFIG.replace("SAMPLER", sampler).replace("SENSITIVITY", "true" if sensitivity else "false")
    path = os.path.join(folder, f"{sampler}_{sensitivity}.toml")
    with open(path, "w") as handle:
        handle.write(text)
    started = time.perf_counter()
    result = run_search(path, os.path.join(folder, f"{sampler}_{sensitivity}"), n_trials=trials, model=model)
    result["seconds"] = time.perf_counter() - started
    return result


def points(result: dict) -> list[tuple[float, float]]:
    return [(r["metrics"]["accuracy"], r["metrics"]["weight_bits"]) for r in result["records"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = trained_mlp()
    lines = [header_line(), "", f"digits MLP, {args.trials} trials per strategy, accuracy on the validation split"]
    with tempfile.TemporaryDirectory() as folder:
        runs = {name: run(model, sampler, sensitivity, args.trials, folder)
                for name, sampler, sensitivity in (("TPE", "tpe", False), ("random", "random", False),
                                                   ("TPE + sensitivity start", "tpe", True))}  # fmt: skip
    uniform = runs["TPE"]["uniform"]
    lines += ["", "| strategy | trials | front size | hypervolume (acc x bits, ref 0 / 32) | seconds |", "|---|---|---|---|---|"]
    for name, result in runs.items():
        volume = hypervolume_2d(points(result), (0.0, 32.0))
        lines.append(f"| {name} | {len(result['records'])} | {len(result['front'])} | {volume:.3f} | {result['seconds']:.1f} |")
    lines += ["", "| uniform preset | accuracy | bits / weight | TPE front member beating it on both axes |", "|---|---|---|---|"]
    front = runs["TPE"]["front"]
    for preset, metrics in uniform.items():
        better = [r for r in front if r["metrics"]["accuracy"] >= metrics["accuracy"]
                  and r["metrics"]["weight_bits"] < metrics["weight_bits"]]  # fmt: skip
        best = max(better, key=lambda r: (r["metrics"]["accuracy"], -r["metrics"]["weight_bits"]), default=None)
        cell = (f"trial {best['number']}: {best['metrics']['accuracy']:.4f} at {best['metrics']['weight_bits']:.3f} bits"
                if best else "none")  # fmt: skip
        lines.append(f"| {preset} | {metrics['accuracy']:.4f} | {metrics['weight_bits']:.3f} | {cell} |")
    lines += ["", "TPE front: " + "; ".join(f"{r['metrics']['accuracy']:.4f} @ {r['metrics']['weight_bits']:.3f} b"
                                             for r in sorted(front, key=lambda r: r["metrics"]["weight_bits"]))]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
