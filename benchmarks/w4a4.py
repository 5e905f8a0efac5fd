"""SmolLM2-135M perplexity with 4-bit weights and inputs (W4A4): NVFP4 against MXFP4, plus NF4 weight-only.

Model: ``lowbit.models.smollm2.load_smollm2()`` (float32). Text: ``wikipedia_token_ids(tokenizer, "test")``.
Perplexity: ``lowbit.perplexity(model, ids, seqlen=--seqlen, windows=--windows)``. Every row quantizes every
Linear (lm_head included) with ``lowbit.quantize_(model, FORMAT, roles=[...])`` (simulated: the format's
values in float32 arithmetic), then again with ``skip=["lm_head"]`` (the tied output layer left float).

- ``nvfp4``: E2M1 values, an E4M3 scale per 16 values and a float32 tensor scale (torchao 0.18's recipe).
- ``mxfp4_e2m1``: E2M1 values, a power-of-two scale per 32 values (OCP MX).
- ``nf4``: the NF4 codebook with an absmax scale per block of 64 (weights only, as QLoRA / bitsandbytes use it).

The last rows are the peer: torchao 0.18's own NVFP4 (``nvfp4_quantize``) and NF4 (``to_nf4``, whose absmax
scales are themselves quantized: QLoRA's double quantization) of every Linear weight, dequantized into the
float model (needs ``pip install torchao==0.18.*``, the ``oracles`` extra).

Usage: python benchmarks/w4a4.py [--windows 8] [--seqlen 512] [--threads 2] [--rows NAME ...]
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
    "NVFP4 weights, torchao 0.18 (peer)": "torchao",
    "NF4 weights, torchao 0.18 NF4Tensor (peer; double-quantized scales)": "torchao_nf4",
}


def torchao_nvfp4_weights(model) -> None:
    """Every Linear's weight replaced by torchao 0.18's own NVFP4 of it, dequantized (its per-tensor scale from
    the weight's amax, E4M3 scales per 16 values): the peer's values in the float model."""
    from torchao.prototype.mx_formats import kernels, nvfp4_tensor

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                weight = module.weight.detach().float()
                pts = nvfp4_tensor.per_tensor_amax_to_scale(weight.abs().max())
                scales, packed = nvfp4_tensor.nvfp4_quantize(weight, 16, pts)
                elements = kernels.f4_unpacked_to_f32(kernels.unpack_uint4(packed)).reshape(*weight.shape[:-1], -1, 16)
                values = elements * (pts * scales.to(torch.float32)).reshape(*elements.shape[:-1], 1)
                module.weight = torch.nn.Parameter(values.reshape(weight.shape))  # untied from the embedding


def torchao_nf4_weights(model) -> None:
    """Every Linear's weight through torchao 0.18's NF4Tensor (blocks of 64; its absmax scales themselves
    quantized to int8 in blocks of 256, or 128 / 64 where 256 does not divide their count (SmolLM2's 576 x 576
    and 576 x 192 weights): QLoRA's double quantization), dequantized into the float model."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    with torch.no_grad():
        for module in model.modules():
            scalers = module.weight.numel() // 64 if isinstance(module, torch.nn.Linear) else 0
            block = next((size for size in (256, 128, 64) if scalers and scalers % size == 0), None)
            if block is not None:
                values = to_nf4(module.weight.detach().float(), 64, block).get_original_weight()
                module.weight = torch.nn.Parameter(values.float().reshape(module.weight.shape))


def run_row(model, ids, recipe, args) -> dict:  # noqa: D103
    model = copy.deepcopy(model)
    if recipe == "torchao":
        torchao_nvfp4_weights(model)
    elif recipe == "torchao_nf4":
        torchao_nf4_weights(model)
    elif recipe is not None:
        lowbit.quantize_(model, recipe[0], **recipe[1])
    start = time.perf_counter()
    value = lowbit.perplexity(model, ids, seqlen=args.seqlen, windows=args.windows)
    return {"ppl": value, "eval_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", nargs="*", default=None, help="row names to run (fp32 always runs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from lowbit.datasets.wikipedia import wikipedia_token_ids
    from lowbit.models.smollm2 import load_smollm2

    tokenizer, model = load_smollm2()
    ids = wikipedia_token_ids(tokenizer, "test")
    results = {}
    for name, recipe in ROWS.items():
        if args.rows is not None and name != "fp32" and name not in args.rows:
            continue
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
