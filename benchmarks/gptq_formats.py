"""GPTQ for any weight format on SmolLM2-135M-Instruct: perplexity of plain rounding against GPTQ, per format.

Protocol: ``lowbit.models.smollm2.load_smollm2()`` (float32); text from ``lowbit.datasets.wikipedia``:
``lowbit.perplexity(model, test_ids, seqlen=512, windows=8)`` on the test split; calibration on the first
``--calibration`` windows of ``--seqlen`` tokens of the train split, one window per batch ([1, seqlen]).
Weights only (``roles=["weight"]``; activations stay float), every Linear including the tied lm_head.

For each format: fp32, ``method="round"`` (the format's own rounding at run time: MX's floor shared
exponent, affine min-max) and ``method="gptq"`` (each with the options given), the share of round's gap to
fp32 that GPTQ closes (``(round - gptq) / (round - fp32)``) and the wall time of quantize_.

Usage: python benchmarks/gptq_formats.py [--formats mxfp4 int3_g64 e4m3 nvfp4] [--method gptq | awq | awq+gptq]
       [--gptq damping=0.1 ...]
       [--calibration 16] [--seqlen 512] [--calibration-seqlen 512] [--windows 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import lowbit  # noqa: E402

FORMATS = {
    "mxfp4": ("mxfp4_e2m1", {}),
    "mxint8": ("mxint8", {}),
    "int3_g64": ("affine", {"bits": 3, "block_size": [1, 64]}),
    "int4_g64": ("affine", {"bits": 4, "block_size": [1, 64]}),
    "e4m3": ("e4m3", {}),
    "e2m1_g32": ("e2m1", {"block_size": [1, 32]}),
    "nvfp4": ("nvfp4", {}),
}


def parse_options(items: list[str]) -> dict:
    options = {}
    for item in items:
        key, _, value = item.partition("=")
        lowered = value.lower()
        if lowered in ("true", "false"):
            options[key] = lowered == "true"
        else:
            options[key] = int(value) if value.isdigit() else float(value)
    return options


def quantized(model, label: str, method: str, options: dict, calibration: list):
    name, params = FORMATS[label]
    candidate = copy.deepcopy(model)
    extra = {"calibration_data": calibration, **(options if "gptq" in method else {})} if method != "round" else {}
    start = time.perf_counter()
    _, info = lowbit.quantize_model(candidate, name, params=params, roles=["weight"], method=method, **extra)
    return candidate, time.perf_counter() - start, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["mxfp4", "int3_g64", "e4m3"], choices=sorted(FORMATS))
    parser.add_argument("--gptq", nargs="*", default=[], help="FormatRecipe options, key=value")
    parser.add_argument("--method", default="gptq", choices=("gptq", "awq", "awq+gptq"),
                        help="the data-driven method compared with round")
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=512, help="tokens per scored window")
    parser.add_argument("--calibration-seqlen", type=int, default=None, help="tokens per calibration window "
                        "(default: --seqlen)")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    from machine import header_line

    from lowbit.datasets.wikipedia import wikipedia_token_ids
    from lowbit.models.smollm2 import load_smollm2

    tokenizer, model = load_smollm2()
    test_ids, train_ids = wikipedia_token_ids(tokenizer, "test"), wikipedia_token_ids(tokenizer, "train")
    length = args.calibration_seqlen or args.seqlen
    windows = train_ids[:args.calibration * length].reshape(args.calibration, length)
    calibration = [window.unsqueeze(0) for window in windows]
    options = parse_options(args.gptq)

    def score(candidate):
        return lowbit.perplexity(candidate, test_ids, seqlen=args.seqlen, windows=args.windows)

    fp32 = score(model)
    print(f"SmolLM2-135M-Instruct, wikipedia test: {args.windows} windows x {args.seqlen}; calibration "
          f"{args.calibration} train windows x {length}; {args.threads} threads; GPTQ options {options or 'defaults'}")
    print(header_line())
    print(f"\nfp32 perplexity {fp32:.3f}\n")
    method = args.method
    print(f"| weights | round | {method} | gap closed | round s | {method} s | moved on re-rounding |")
    print("|---|---|---|---|---|---|---|")
    for label in args.formats:
        rounded, round_seconds, _ = quantized(model, label, "round", {}, calibration)
        plain = score(rounded)
        del rounded
        gptq_model, gptq_seconds, info = quantized(model, label, method, options, calibration)
        value = score(gptq_model)
        del gptq_model
        closed = 100 * (plain - value) / (plain - fp32)
        print(f"| {label} | {plain:.3f} | {value:.3f} | {closed:.1f} % | {round_seconds:.1f} | {gptq_seconds:.1f} | "
              f"{info['gptq']['moved'] if 'gptq' in info else ''} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
