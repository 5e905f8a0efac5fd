"""HQQ on SmolLM2-135M-Instruct (or Gemma-3-270M: ``--model gemma3``, its BOS token before each window): int4
weight-only perplexity of ``method="hqq"`` against min-max rounding.

Rows: fp32; int4 ``method="round", search=False`` (plain min-max rounding: the baseline of "closes"); int4
``method="round"`` (the default 5 %-step range search); ``method="hqq"`` (integer and float zero points); with
``--gptq`` also
``method="gptq"``, with ``--awq`` ``method="awq"`` and ``"awq+gptq"`` (``--calibration`` train windows of
``--seqlen`` tokens, one per batch). Every Linear is
quantized (lm_head included, as in benchmarks/llm.py). Perplexity: ``lowbit.perplexity(model, test_ids,
seqlen, windows)`` on the wikipedia test split. "closes": ``(plain - row) / (plain - fp32)``. Quantize time:
the wall time of ``lowbit.quantize_`` (the model copy not included). ``--group-sizes 64 192``: 192 is the
largest group that divides every in_features of the model (576 and 1536), the nearest to per channel.
``--speed`` times :func:`lowbit.ops.hqq.hqq_quantize` on a random 4096 x 4096 weight.

Usage: HF_HUB_OFFLINE=1 python benchmarks/hqq_llm.py [--model smollm2|gemma3] [--windows 8] [--seqlen 512]
       [--threads 2] [--gptq] [--awq]
       [--group-sizes 64] [--iterations 20] [--speed] [--only hqq --plain 168.7536]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
import lowbit  # noqa: E402
from lowbit.datasets.wikipedia import wikipedia_token_ids  # noqa: E402
from lowbit.models.causal_lm import token_windows  # noqa: E402
from lowbit.models.smollm2 import load_smollm2  # noqa: E402
from machine import header_line  # noqa: E402


def variants(group_size: int, args, calibration) -> dict[str, dict]:
    """label -> int4_weight_only options."""
    rows = {
        f"g{group_size} round, search=False (plain min-max)": {"search": False},
        f"g{group_size} round (range search)": {},
        f"g{group_size} hqq": {"method": "hqq", "hqq_iterations": args.iterations},
        f"g{group_size} hqq, float zero point": {"method": "hqq", "hqq_iterations": args.iterations,
                                                 "zero_point_domain": "float"},
    }
    if args.gptq:
        rows[f"g{group_size} gptq"] = {"method": "gptq", "calibration_data": calibration}
    if args.awq:
        rows[f"g{group_size} awq"] = {"method": "awq", "calibration_data": calibration}
        rows[f"g{group_size} awq+gptq"] = {"method": "awq+gptq", "calibration_data": calibration}
    return {label: {"group_size": group_size, **options} for label, options in rows.items()}


def speed(threads: int) -> str:
    """The native kernel (csrc/hqq.c) and the torch steps side by side on one weight, best of three each."""
    from lowbit import backend, native
    from lowbit.ops.hqq import hqq_quantize

    if native.ensure() is None:
        raise SystemExit(f"no native library: {native.error()}")
    weight = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 0.02
    lines = []
    for name in ("native", "eager"):
        backend.set_backend(name)
        hqq_quantize(weight[:64], 64)  # warm-up
        times, gauge = [], []
        for _ in range(3):
            start = time.perf_counter()
            hqq_quantize(weight, 64)
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
            torch.mul(weight, weight)  # a contention gauge: one memory-bound pass (about 15 ms on an idle Zen 3)
            gauge.append(time.perf_counter() - start)
        lines.append(f"hqq_quantize 4096 x 4096, g64, {threads} threads, {name}: best {min(times):.3f} s of "
                     f"{[round(t, 3) for t in times]}; one torch.mul over the weight: best {min(gauge) * 1e3:.1f} ms")
    return "\n".join(lines)


def measure(args) -> list[str]:
    if args.model == "gemma3":
        from lowbit.models.gemma3 import load_gemma3

        tokenizer, fp32 = load_gemma3()
        bos = tokenizer.bos_token_id
    else:
        (tokenizer, fp32), bos = load_smollm2(), None
    test_ids = wikipedia_token_ids(tokenizer, "test")
    calibration = None
    if args.gptq or args.awq:
        train = token_windows(wikipedia_token_ids(tokenizer, "train"), args.seqlen, args.calibration)
        calibration = [window[None] if bos is None else torch.cat([torch.tensor([bos]), window])[None] for window in train]

    def perplexity(model) -> float:
        return lowbit.perplexity(model, test_ids, args.seqlen, args.windows, bos_token_id=bos)

    fp32_ppl = perplexity(fp32)
    lines = ["| int4_weight_only | perplexity | vs fp32 | closes | quantize_ s |", "|---|---|---|---|---|",
             f"| fp32 | {fp32_ppl:.4f} | | | |"]  # fmt: skip
    for group_size in args.group_sizes:
        plain = None
        for label, options in variants(group_size, args, calibration).items():
            if args.only and not any(word in label for word in args.only):
                continue
            model = copy.deepcopy(fp32)
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lowbit.quantize_(model, "int4_weight_only", **options)
            built = time.perf_counter() - start
            ppl = perplexity(model)
            plain = ppl if plain is None and "search=False" in label else (plain or args.plain)
            closes = "" if plain is None or ppl == plain else f"{(plain - ppl) / (plain - fp32_ppl):.1%}"
            lines.append(f"| {label} | {ppl:.4f} | {ppl / fp32_ppl - 1:+.2%} | {closes} | {built:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
            del model
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--calibration", type=int, default=16, help="train windows for --gptq")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--iterations", type=int, default=20, help="hqq_iterations")
    parser.add_argument("--gptq", action="store_true")
    parser.add_argument("--awq", action="store_true", help="awq and awq+gptq rows")
    parser.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2")
    parser.add_argument("--only", nargs="+", help="run only the rows whose label has one of these words")
    parser.add_argument("--plain", type=float, help="plain min-max's perplexity from an earlier run, for --only")
    parser.add_argument("--speed", action="store_true", help="only time hqq_quantize on 4096 x 4096")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(header_line())
    if args.speed:
        print(speed(args.threads))
        return
    name = "Gemma-3-270M (BOS first)" if args.model == "gemma3" else "SmolLM2-135M"
    print(f"{name}, wikipedia test, perplexity over {args.windows} windows of {args.seqlen} tokens; "
          f"every Linear quantized (lm_head included); closes = share of plain min-max's gap to fp32 removed\n")
    print("\n".join(measure(args)))


if __name__ == "__main__":
    main()
