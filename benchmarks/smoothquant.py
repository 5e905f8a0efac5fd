"""SmoothQuant and AWQ on SmolLM2-135M-Instruct: perplexity of each variant against fp32 and plain rounding.

Protocol: ``lowbit.models.smollm2.load_smollm2()`` (float32); perplexity ``lowbit.perplexity(model, test_ids,
seqlen=--seqlen, windows=--windows)`` on the wikipedia test split; calibration: the first ``--calibration``
windows of ``--seqlen`` tokens of the train split, one [1, seqlen] batch each. Each variant starts from a fresh
copy of the fp32 model. "closes": the share of the baseline's perplexity gap to fp32 that the variant removes
(``(base - variant) / (base - fp32)``; the base of ``int8_dynamic+sq*`` is int8_dynamic, of ``w8a8_static+sq*``
w8a8_static, of the int4 rows int4 g64 ``method="round", search=False``). Wall: the quantize_ call.

Variants: fp32, int8_dynamic, int8_dynamic+sq0.5, int8_dynamic+sq0.8, w8a8_static, w8a8_static+sq0.5,
w8a8_static+sq0.8, int4:round-nosearch, int4:round, int4:awq, int4:gptq, int4:awq+gptq.

Usage: HF_HUB_OFFLINE=1 python benchmarks/smoothquant.py [--variants ...] [--windows 8] [--calibration 16]
       [--seqlen 512] [--group-size 64] [--threads 1]
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
from lowbit.datasets.wikipedia import wikipedia_token_ids  # noqa: E402
from lowbit.models.causal_lm import token_windows  # noqa: E402
from lowbit.models.smollm2 import load_smollm2  # noqa: E402
from machine import header_line  # noqa: E402

INT8 = ["int8_dynamic", "int8_dynamic+sq0.5", "int8_dynamic+sq0.8", "w8a8_static", "w8a8_static+sq0.5",
        "w8a8_static+sq0.8"]  # fmt: skip
INT4 = ["int4:round-nosearch", "int4:round", "int4:awq", "int4:gptq", "int4:awq+gptq"]


def quantize(model, variant: str, batches: list, group_size: int) -> dict:
    """Quantize ``model`` in place by ``variant``; returns quantize_model's info."""
    if variant.startswith("int4:"):
        method = variant.split(":")[1]
        if method == "round-nosearch":
            return lowbit.quantize_model(model, "int4_weight_only", group_size=group_size, search=False)[1]
        data = {} if method == "round" else {"calibration_data": batches}
        return lowbit.quantize_model(model, "int4_weight_only", group_size=group_size, method=method, **data)[1]
    recipe, _, smooth = variant.partition("+sq")
    options = {"smoothquant": float(smooth), "calibration_data": batches} if smooth else {}
    if recipe == "w8a8_static":
        options["calibration_data"] = batches
    return lowbit.quantize_model(model, recipe, **options)[1]


def base_of(variant: str) -> str | None:
    if variant.startswith("int4:"):
        return None if variant == "int4:round-nosearch" else "int4:round-nosearch"
    return variant.split("+")[0] if "+" in variant else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["fp32", *INT8, *INT4])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer, fp32 = load_smollm2()
    test_ids = wikipedia_token_ids(tokenizer, "test")
    batches = list(token_windows(wikipedia_token_ids(tokenizer, "train"), args.seqlen, args.calibration).unsqueeze(1))
    print(header_line())
    print(f"SmolLM2-135M, perplexity seqlen={args.seqlen} windows={args.windows}; calibration {args.calibration} "
          f"train windows of {args.seqlen}; threads {args.threads}\n", flush=True)  # fmt: skip
    print("| variant | perplexity | vs fp32 | closes | smoothed / scaled groups | quantize_ s |")
    print("|---|---|---|---|---|---|", flush=True)
    results: dict[str, float] = {}
    reference = lowbit.perplexity(fp32, test_ids, seqlen=args.seqlen, windows=args.windows)
    results["fp32"] = reference
    for variant in args.variants:
        if variant == "fp32":
            print(f"| fp32 | {reference:.4f} | | | | |", flush=True)
            continue
        model = copy.deepcopy(fp32)
        start = time.perf_counter()
        info = quantize(model, variant, batches, args.group_size)
        wall = time.perf_counter() - start
        value = results[variant] = lowbit.perplexity(model, test_ids, seqlen=args.seqlen, windows=args.windows)
        base = base_of(variant)
        closes = ""
        if base in results and results[base] != reference:
            closes = f"{100 * (results[base] - value) / (results[base] - reference):.0f} %"
        groups = len(info.get("smoothed", info.get("awq", {})))
        print(f"| {variant} | {value:.4f} | {100 * (value / reference - 1):+.2f} % | {closes} | {groups or ''} | "
              f"{wall:.0f} |", flush=True)  # fmt: skip
        del model


if __name__ == "__main__":
    main()
