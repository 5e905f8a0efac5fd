"""SmolLM2-135M perplexity with 4-bit weights and inputs (W4A4): NVFP4 against MXFP4, plus NF4 weight-only.

Model: ``lowbit.models.smollm2.load_smollm2()`` (float32). Text: ``wikipedia_token_ids(tokenizer, "test")``.
Perplexity: ``lowbit.perplexity(model, ids, seqlen=--seqlen, windows=--windows)``. Every row quantizes every
Linear (lm_head included) with ``lowbit.quantize_(model, FORMAT, roles=[...])`` (simulated: the format's
values in float32 arithmetic), then again with ``skip=["lm_head"]`` (the tied output layer left float).

- ``nvfp4``: E2M1 values, an E4M3 scale per 16 values and a float32 tensor scale (torchao 0.18's recipe).
- ``mxfp4_e2m1``: E2M1 values, a power-of-two scale per 32 values (OCP MX).
- ``nf4``: the NF4 codebook with an absmax scale per block of 64 (weights only, as QLoRA / bitsandbytes use it).

Usage: python benchmarks/w4a4.py [--windows 8] [--seqlen 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import lowbit  # noqa: E402
from machine import header_line  # noqa: E402

W4A4 = ["data_in", "weight"]
ROWS = {  # name -> (format, options) or None for fp32
    "fp32": None,
    "MXFP4 W4A4": ("mxfp4_e2m1", {"roles": W4A4}),
    "NVFP4 W4A4": ("nvfp4", {"roles": W4A4}),
    "MXFP4 W4A4, lm_head float": ("mxfp4_e2m1", {"roles": W4A4, "skip": ["lm_head"]}),
    "NVFP4 W4A4, lm_head float": ("nvfp4", {"roles": W4A4, "skip": ["lm_head"]}),
    "MXFP4 weights": ("mxfp4_e2m1", {"roles": ["weight"]}),
    "NVFP4 weights": ("nvfp4", {"roles": ["weight"]}),
    "NF4 weights (block 64)": ("nf4", {"roles": ["weight"], "params": {"block_size": 64}}),
}


def run_row(model, ids, recipe, args) -> dict:  # noqa: D103
    model = copy.deepcopy(model)
    if recipe is not None:
        lowbit.quantize_(model, recipe[0], **recipe[1])
    start = time.perf_counter()
    value = lowbit.perplexity(model, ids, seqlen=args.seqlen, windows=args.windows)
    return {"ppl": value, "eval_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from lowbit.datasets.wikipedia import wikipedia_token_ids
    from lowbit.models.smollm2 import load_smollm2

    tokenizer, model = load_smollm2()
    ids = wikipedia_token_ids(tokenizer, "test")
    results = {}
    for name, recipe in ROWS.items():
        results[name] = run_row(model, ids, recipe, args)
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    fp32 = results["fp32"]["ppl"]
    print(header_line(), "", f"SmolLM2-135M, wikipedia test, lowbit.perplexity(seqlen={args.seqlen}, "
          f"windows={args.windows}), {args.threads} thread(s)", "", "| variant | perplexity | vs fp32 | eval s |",
          "|---|---:|---:|---:|", sep="\n")  # fmt: skip
    for name, row in results.items():
        print(f"| {name} | {row['ppl']:.3f} | {100 * (row['ppl'] / fp32 - 1):+.1f} % | {row['eval_s']:.0f} |")


if __name__ == "__main__":
    main()
