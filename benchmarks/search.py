"""lowbit search on the digits MLP / CNN and MiniLM: the Pareto front (task metric vs bits per weight)
against the uniform presets, and its hypervolume against random search and the sensitivity-guided start,
each with the same trial budget.

The MLP (64 -> 128 -> 64 -> 10) and the CNN (two 3x3 convs, one Linear) are trained here (Adam, 60 epochs,
seed 0). The space: per Linear / Conv2d layer (by name), the weight in affine 2 / 3 / 4 / 6 / 8 bits per channel, ternary, block_fp 4 / 6 bits
(default blocks), e4m3, mxfp4, mxfp8, and the input in affine 8 bits, e4m3, mxfp8 or mxfp4. Objectives:
accuracy (maximize) and weight_bits (minimize); evaluation on the 270 validation samples. MiniLM (run with
HF_HUB_OFFLINE=1): its 37 Linear layers, mean cosine to fp32 of the first 64 test sentences of
benchmarks/minilm.py's pydoc corpus. Hypervolume: area dominated up to (metric 0, 32 bits).

Usage: python benchmarks/search.py [--trials 100] [--seeds 3] [--models digits_mlp digits_cnn] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from lowbit.models import DigitsCNN, DigitsMLP  # noqa: E402
from lowbit.models.sentences import help_text_sentences  # noqa: E402
from lowbit.pipeline.catalog import get_split  # noqa: E402
from lowbit.search import run_search  # noqa: E402
from lowbit.search.compare import beats  # noqa: E402
from lowbit.search.front import hypervolume_2d  # noqa: E402
from machine import header_line  # noqa: E402

CONFIG = """
model = "MODEL"
dataset = "DATASET"
[search.search_space]
name = "graph/quantize/mixed_precision_ptq"
[search.search_space.setup]
by = "BY"
share = SHARE
ops = ["linear", "conv2d"]
[search.search_space.seed.KEY.roles.weight]
name = ["affine", "ternary", "block_fp", "e4m3", "mxfp4_e2m1", "mxfp8_e4m3"]
affine = {bits = [2, 3, 4, 6, 8], axis = 0}
block_fp = {width = [4, 6]}
[search.search_space.seed.KEY.roles.data_in]
name = ["affine", "e4m3", "mxfp8_e4m3", "mxfp4_e2m1"]
affine = {bits = [8]}
[search.strategy]
name = "optuna"
[search.strategy.sw_runner.basic_evaluation]
num_samples = SAMPLES
[search.strategy.setup]
n_trials = 100
sampler = "SAMPLER"
seed = SEED
sensitivity_start = SENSITIVITY
[search.strategy.metrics]
METRIC.direction = "maximize"
weight_bits.direction = "minimize"
"""


def trained(name: str) -> torch.nn.Module:
    if name == "minilm":
        from lowbit.models.minilm import load_minilm

        return load_minilm()[1]
    torch.manual_seed(0)
    model, data = (DigitsMLP() if name == "digits_mlp" else DigitsCNN()), get_split("digits", "train")
    x, y = data.tensors
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        for index in torch.randperm(len(y)).split(64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[index]), y[index]).backward()
            optimizer.step()
    return model.eval()


def run(name: str, model: torch.nn.Module, sampler: str, sensitivity: bool, trials: int, seed: int,
        folder: str) -> dict:  # fmt: skip
    text = CONFIG.replace("SAMPLER", sampler).replace("SENSITIVITY", "true" if sensitivity else "false")
    minilm = name == "minilm"
    text = text.replace("MODEL", name).replace("SEED", str(seed)).replace("DATASET", "sentences" if minilm else "digits")
    text = text.replace("METRIC", metric_of(name)).replace("SAMPLES", str(MINILM_SENTENCES if minilm else 1000))
    text = grouped(text) if GROUPED else text.replace("BY", "name").replace("SHARE", "false").replace("KEY", "default")
    tag = f"{name}_{sampler}_{sensitivity}_{seed}"
    path = os.path.join(folder, f"{tag}.toml")
    with open(path, "w") as handle:
        handle.write(text)
    started = time.perf_counter()
    result = run_search(path, os.path.join(folder, tag), n_trials=trials, model=model,
                        sentences=help_text_sentences()[:MINILM_SENTENCES] if minilm else None)  # fmt: skip
    result["seconds"] = time.perf_counter() - started
    return result


# MiniLM's Linear layers by kind: one shared decision per kind (--grouped)
KINDS = (r".*attention\\.self\\.(query|key|value)", r".*attention\\.output\\.dense", r".*intermediate\\.dense",
         r".*layer\\.[0-9]+\\.output\\.dense", "default")  # fmt: skip
GROUPED = False


def grouped(text: str) -> str:
    """The same choices, one seed table per layer kind, each shared by the layers of that kind."""
    head, _, tables = text.partition("[search.search_space.seed.KEY")
    tables = "[search.search_space.seed.KEY" + tables.split("[search.strategy]")[0]
    tail = "[search.strategy]" + text.split("[search.strategy]")[1]
    head = head.replace("BY", "regex").replace("SHARE", "true")
    return head + "".join(tables.replace("KEY", f'"{kind}"' if kind != "default" else kind) for kind in KINDS) + tail


def metric_of(name: str) -> str:
    return "mean_cosine" if name == "minilm" else "accuracy"


def points(result: dict, metric: str) -> list[tuple[float, float]]:
    return [(r["metrics"][metric], r["metrics"]["weight_bits"]) for r in result["records"]]


MINILM_SENTENCES = 64  # default: the first 64 test sentences of benchmarks/minilm.py's pydoc corpus
STRATEGIES = (("TPE", "tpe", False), ("random", "random", False), ("TPE + sensitivity start", "tpe", True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3, help="sampler seeds per strategy")
    parser.add_argument("--models", nargs="+", default=["digits_mlp", "digits_cnn"])
    parser.add_argument("--sentences", type=int, default=MINILM_SENTENCES, help="MiniLM: test sentences evaluated")
    parser.add_argument("--grouped", action="store_true", help="one shared decision per layer kind (regex)")
    parser.add_argument("--out")
    args = parser.parse_args()
    globals()["GROUPED"] = args.grouped
    globals()["MINILM_SENTENCES"] = args.sentences
    torch.set_num_threads(1)
    lines = [header_line()]
    for name in args.models:
        lines += model_section(name, args.trials, args.seeds)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


def beater(members: list[tuple[str, dict]], metrics: dict, metric: str) -> str:
    """The best member with a higher metric at fewer bits per weight (both strictly), or "none"."""
    axes = {metric: "maximize", "weight_bits": "minimize"}
    better = [(run, r) for run, r in members if beats(r["metrics"], metrics, axes)]
    if not better:
        return "none"
    run, top = max(better, key=lambda item: (item[1]["metrics"][metric], -item[1]["metrics"]["weight_bits"]))
    return f"{top['metrics'][metric]:.4f} at {top['metrics']['weight_bits']:.3f} bits ({run}, trial {top['number']})"


def winner(result: dict) -> str:
    """The front member that beats every uniform preset on both axes at once (run_search's comparison)."""
    member = result["comparison"]["beats_every_preset"]
    return "none" if member is None else f"trial {member['trial']}"


def model_section(name: str, trials: int, seeds: int) -> list[str]:
    model, metric = trained(name), metric_of(name)
    where = f"mean cosine to fp32 on the first {MINILM_SENTENCES} pydoc test sentences" if name == "minilm" else "accuracy on the validation split"
    space = "one shared decision per layer kind" if GROUPED else "one decision per layer"
    lines = ["", f"### {name}: {trials} trials per run, sampler seeds 0..{seeds - 1}, {where}; {space}"]
    with tempfile.TemporaryDirectory() as folder:
        runs = {label: [run(name, model, sampler, sensitivity, trials, seed, folder) for seed in range(seeds)]
                for label, sampler, sensitivity in STRATEGIES}  # fmt: skip
    lines += ["", "| strategy | hypervolume per seed (metric x bits, ref 0 / 32) | mean | front sizes | "
              "trial beating every preset at once, per seed | seconds per run |", "|---|---|---|---|---|---|"]  # fmt: skip
    for label, results in runs.items():
        volumes = [hypervolume_2d(points(result, metric), (0.0, 32.0)) for result in results]
        lines.append(f"| {label} | {' / '.join(f'{v:.3f}' for v in volumes)} | {sum(volumes) / len(volumes):.3f} | "
                     f"{' / '.join(str(len(r['front'])) for r in results)} | {' / '.join(map(winner, results))} | "
                     f"{sum(r['seconds'] for r in results) / len(results):.1f} |")  # fmt: skip
    best = runs["TPE"][0]
    uniform = best["uniform"]
    lines += ["", f"| uniform preset | {metric} | bits / weight | TPE (seed 0) front member beating it on both axes "
              "| any run's front member beating it (run) |", "|---|---|---|---|---|"]  # fmt: skip
    members = [(f"{label} seed {seed}", r) for label, results in runs.items() for seed, result in enumerate(results)
               for r in result["front"]]  # fmt: skip
    for preset, metrics in uniform.items():
        cells = [beater([("TPE seed 0", r) for r in best["front"]], metrics, metric), beater(members, metrics, metric)]
        lines.append(f"| {preset} | {metrics[metric]:.4f} | {metrics['weight_bits']:.3f} | {cells[0]} | {cells[1]} |")
    lines += [""] + [f"- {label} seed {seed}: {result['comparison']['sentence']}" for label, results in runs.items()
                     for seed, result in enumerate(results)]  # fmt: skip
    ordered = sorted(best["front"], key=lambda r: r["metrics"]["weight_bits"])
    lines += ["", "TPE (seed 0) front: " + "; ".join(f"{r['metrics'][metric]:.4f} @ {r['metrics']['weight_bits']:.3f} b"
                                                    for r in ordered)]  # fmt: skip
    return lines


if __name__ == "__main__":
    main()
