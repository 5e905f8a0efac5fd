"""Training arithmetic on digits (issue 22): low-precision GEMM operands forward and backward, integer
accumulators, stochastic vs nearest weight rounding. Prints a markdown table under the machine line.

    .venv/bin/python benchmarks/training_arithmetic.py [--epochs 30] [--seeds 0 1] [--only mxfp8 accumulator]

Every run trains from scratch (Adam, lr 3e-3, batch 64, fixed seeds) on the fixed 70 % train split and
reports test accuracy (%). Rows:

- fp32: the float baseline (MLP 64-128-64-10, CNN of lowbit.models.digits).
- mxfp8: every Linear / Conv quantizes data_in and weight to mxfp8_e4m3 and the arriving gradient
  (grad_data_out, the operand of both backward GEMMs) to mxfp8_e4m3 or mxfp8_e5m2; the backward GEMMs also
  see the forward-quantized activations and weights (the tensors autograd saved). MX blocks run along the
  last dimension of each tensor.
- block_fp8: QPyTorch's 8-bit block floating point setting: activations, weights, gradients (errors) in
  8-bit block_fp with one shared exponent per row (per example / per output channel), nearest in the
  forward pass, stochastic in the backward pass, SGD with momentum whose weights, gradients and momentum
  are kept in the same format with stochastic rounding (LowPrecisionOptimizer).
- accumulator: an MLP 64-1536-768-10 trained with 8-bit fixed-point operands (QAT, float sums), then
  evaluated with the K = 1536 layer's sums in a 16-bit integer register on the products' step (saturating /
  wrapping, chunk 1 / 64 / 1536), an int16 register flushed into float32 every 16 / 64 / 256 products (accumulator_flush),
  20 / 24 / 32-bit registers, float. One trained model per seed; every row evaluates that model.
- weights_Nb: QAT with only the weights in N-bit per-channel affine (2, 3, 4 bits), rounded to nearest or
  stochastically in every training forward pass (evaluated with nearest rounding).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from machine import header_line  # noqa: E402

from lowbit.datasets.digits import digits  # noqa: E402
from lowbit.formats import resolve  # noqa: E402
from lowbit.models.digits import DigitsCNN, DigitsMLP  # noqa: E402
from lowbit.nn import QuantConv2d, QuantLinear, RoleFormats  # noqa: E402
from lowbit.nn.accumulate import Accumulator  # noqa: E402
from lowbit.optim import LowPrecisionOptimizer  # noqa: E402


def swap(model: nn.Module, formats_for) -> nn.Module:
    """Replace every Linear / Conv2d child by its quantized module with ``formats_for(name, module)``."""
    for name, child in list(model.named_modules()):
        for attribute, module in list(child.named_children()):
            full = f"{name}.{attribute}".strip(".")
            cls = {nn.Linear: QuantLinear, nn.Conv2d: QuantConv2d}.get(type(module))
            if cls is not None:
                setattr(child, attribute, cls.from_float(module, formats_for(full, module)))
    return model


def data():
    train, test = digits("train"), digits("test")
    return train.tensors, test.tensors


def train(model, tensors, epochs, seed, optimizer_factory=None):
    (x, y), _ = tensors
    gen = torch.Generator().manual_seed(seed)
    optimizer = (optimizer_factory or (lambda p: torch.optim.Adam(p, lr=3e-3)))(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), 64):
            index = order[start : start + 64]
            optimizer.zero_grad()
            loss_fn(model(x[index]), y[index]).backward()
            optimizer.step()
    return model


@torch.no_grad()
def accuracy(model, tensors) -> float:
    _, (x, y) = tensors
    model.eval()
    return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def model_of(kind: str, seed: int, hidden: int = 128) -> nn.Module:
    torch.manual_seed(seed)
    return DigitsMLP(hidden) if kind == "mlp" else DigitsCNN()


# ---- settings -----------------------------------------------------------------------------------------
def mx_formats(backward: str):
    return lambda name, module: RoleFormats(data_in=resolve("mxfp8_e4m3"), weight=resolve("mxfp8_e4m3"),
                                            grad_data_out=resolve(backward), seed=0)  # fmt: skip


def _row_blocks(rank: int) -> list[int]:
    return [1] + [-1] * (rank - 1)


def bfp8_formats(name, module):
    rank = 2 if isinstance(module, nn.Linear) else 4
    fmt = lambda r, rounding: resolve("block_fp", width=8, exponent_width=8, block_size=_row_blocks(r),  # noqa: E731
                                      rounding=rounding)  # fmt: skip
    return RoleFormats(data_in=fmt(rank, "nearest_even"), weight=fmt(rank, "nearest_even"),
                       grad_data_out=fmt(rank, "stochastic"), grad_data_in=fmt(rank, "stochastic"), seed=0)  # fmt: skip


def bfp8_optimizer(parameters):
    inner = torch.optim.SGD(parameters, lr=0.05, momentum=0.9)
    spec = resolve("block_fp", width=8, exponent_width=8, block_size=None, rounding="stochastic")
    return LowPrecisionOptimizer(inner, weight=spec, grad=spec, momentum=spec, seed=0)


def weight_formats(bits: int, rounding: str):
    spec = resolve("affine", bits=bits, symmetric=True, axis=0, rounding=rounding)
    return lambda name, module: RoleFormats(weight=spec)


# The K = 1536 layer as an 8-bit MAC array with a 16-bit accumulator holds it: each operand's 8-bit grid is
# fitted to its trained range (activations 2^-6, range [-2, 2): the ReLU outputs reach about 1.2; weights
# 2^-10, range [-1/8, 1/8): the trained weights reach about 0.125), so every code is used, and the
# register's step is the products' step 2^-16 (it holds every product of two codes exactly, as an
# integer MAC's code-by-code register does). Its range is then +-0.5, while the trained layer's dot
# products reach about 7.5: the register must overflow. The remedies: a wider register on the same step,
# or an int16 register flushed every F products into a float32 one (`accumulator_flush`: the int16 sums of
# F products are added in float32, which holds these sums exactly: at most 2^20 steps of 2^-16).
INT8_OPERANDS = dict(data_in=resolve("integer", width=8, frac_width=6), weight=resolve("integer", width=8, frac_width=10))
STEP = 16  # frac width of the products: 6 + 10
ACCUMULATORS = {
    "float (fp64 sums)": None,
    "int16 saturate, every product": Accumulator("integer", width=16, frac_width=STEP, overflow="saturate"),
    "int16 wrap, every product": Accumulator("integer", width=16, frac_width=STEP, overflow="wrap"),
    "int16 saturate, chunk 64 (exact 64-sums rounded in)": Accumulator("integer", width=16, frac_width=STEP, chunk=64),
    "int16 saturate, one rounding of the exact sum (chunk 1536)": Accumulator("integer", width=16, frac_width=STEP,
                                                                             chunk=1536),  # fmt: skip
    "int16 saturate, flushed into float32 every 16 products": Accumulator("integer", width=16, frac_width=STEP,
                                                                        flush=16),  # fmt: skip
    "int16 saturate, flushed into float32 every 64 products": Accumulator("integer", width=16, frac_width=STEP,
                                                                        flush=64),  # fmt: skip
    "int16 saturate, flushed into float32 every 256 products": Accumulator("integer", width=16, frac_width=STEP,
                                                                        flush=256),  # fmt: skip
    "int20 saturate, every product": Accumulator("integer", width=20, frac_width=STEP),
    "int24 saturate, every product": Accumulator("integer", width=24, frac_width=STEP),
    "int32 saturate, every product": Accumulator("integer", width=32, frac_width=STEP),
}


# ---- runs ---------------------------------------------------------------------------------------------
def standard_rows(tensors, epochs, seeds):
    settings = {
        "fp32": (None, None),
        "mxfp8 e4m3 fwd + e4m3 grads": (mx_formats("mxfp8_e4m3"), None),
        "mxfp8 e4m3 fwd + e5m2 grads": (mx_formats("mxfp8_e5m2"), None),
        "block_fp8 (QPyTorch setting, SGD state in bfp8)": (bfp8_formats, bfp8_optimizer),
    }
    for label, (formats_for, optimizer_factory) in settings.items():
        for kind in ("mlp", "cnn"):
            results, started = [], time.perf_counter()
            for seed in seeds:
                model = model_of(kind, seed)
                model = swap(model, formats_for) if formats_for else model
                results.append(accuracy(train(model, tensors, epochs, seed, optimizer_factory), tensors))
            yield label, kind, results, time.perf_counter() - started


def accumulator_rows(tensors, epochs, seeds):
    models = []  # one QAT model per seed (float sums in training); every row evaluates all of them
    for seed in seeds:
        model = swap(model_of("mlp", seed, hidden=1536), lambda n, m: RoleFormats(**INT8_OPERANDS))
        models.append(train(model, tensors, max(epochs // 3, 1), seed))
    for label, accumulator in ACCUMULATORS.items():
        results, started = [], time.perf_counter()
        for model in models:
            model.fc2.formats = RoleFormats(**INT8_OPERANDS, accumulator=accumulator)
            results.append(accuracy(model, tensors))
        # seconds: the evaluation of the 270 test images under this accumulator, all seeds
        yield f"int8 operands, K=1536 layer: {label}", "mlp-1536", results, time.perf_counter() - started


def weight_rows(tensors, epochs, seeds):
    for bits in (2, 3, 4):
        for rounding in ("nearest_even", "stochastic"):
            results, started = [], time.perf_counter()
            for seed in seeds:
                torch.manual_seed(seed)
                model = swap(model_of("mlp", seed), weight_formats(bits, rounding))
                train(model, tensors, epochs, seed)
                swap_rounding(model, "nearest_even")  # stochastic in training only: inference rounds to nearest
                results.append(accuracy(model, tensors))
            yield f"weights {bits}-bit affine, {rounding} in training", "mlp", results, time.perf_counter() - started


def swap_rounding(model: nn.Module, rounding: str) -> None:
    for module in model.modules():
        if isinstance(module, QuantLinear) and module.formats.weight is not None:
            module.formats = RoleFormats(weight=module.formats.weight.replace(rounding=rounding))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--only", nargs="+", default=["standard", "accumulator", "weights"],
                        choices=["standard", "accumulator", "weights"])  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(header_line())
    print(f"\ndigits test split (270 images); {args.epochs} epochs; seeds {args.seeds}\n")
    print("| setting | model | test accuracy % (mean; per seed) | seconds |")
    print("|---|---|---|---|")
    tensors = data()
    groups = {"standard": standard_rows, "accumulator": accumulator_rows, "weights": weight_rows}
    for group in args.only:
        for label, kind, results, seconds in groups[group](tensors, args.epochs, args.seeds):
            per_seed = ", ".join(f"{r:.2f}" for r in results)
            print(f"| {label} | {kind} | {statistics.mean(results):.2f} ({per_seed}) | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
