"""One QAT step with every role quantized, as a multiple of the same step in fp32, with peers' QAT quantizers.

The step: Linear 384 -> 1536, GELU, Linear 1536 -> 384 on 2112 rows (a MiniLM feed-forward block at batch
32), MSE loss, backward, SGD. lowbit quantizes data_in, weight, bias and data_out of both Linear layers and
data_in / data_out of the GELU with one format. Columns: lowbit eager (``set_backend("eager")``) and
lowbit auto, the default backend in steady state (the native library loaded: every quantizer with a native
kernel runs it, the rest eagerly). Peers, where installed: torchao's QAT fake
quantizers (``FakeQuantizedLinear`` with ``IntxFakeQuantizeConfig`` int8 per-token activations and
int8 / int4 per-channel or per-group weights, or ``Float8FakeQuantizeConfig``: activations and weights only,
as torchao's QAT does) and qtorch's ``quantizer`` (activations, weights and outputs of both Linear layers
in its float format). Timing: ``timing.interleaved`` (round-robin, ratio to fp32 within each round, median
and min-max over rounds).

Usage: python benchmarks/qat_step.py [--rounds 5] [--only NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit import backend
from lowbit._io import atomic_write_text
from lowbit.nn.modules import QuantGELU, QuantLinear
from lowbit.nn.roles import RoleFormats

sys.path.insert(0, os.path.dirname(__file__))
from machine import header_line  # noqa: E402
from timing import cell, interleaved  # noqa: E402

ROWS, WIDTH, HIDDEN = 2112, 384, 1536
FORMATS: list[tuple[str, dict]] = [
    ("integer", {"width": 8, "frac_width": 4}),
    ("affine", {"bits": 8}),
    ("e4m3", {}),
    ("mxfp4_e2m1", {}),
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": [1, 16]}),
    ("log", {"width": 8, "exponent_bias": 63}),
    ("ternary", {"scaling_factor": True}),
]


def float_block() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH))


def lowbit_block(spec: lowbit.FormatSpec) -> nn.Sequential:
    block = float_block()
    every = RoleFormats(data_in=spec, weight=spec, bias=spec, data_out=spec)
    return nn.Sequential(QuantLinear.from_float(block[0], every),
                         QuantGELU.from_float(block[1], RoleFormats(data_in=spec, data_out=spec)),
                         QuantLinear.from_float(block[2], every))  # fmt: skip


def step_function(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x), target).backward()
        optimizer.step()

    return step


def on_backend(name: str, step: Callable[[], None]) -> Callable[[], None]:
    def call() -> None:
        backend.set_backend(name)
        step()

    return call


def torchao_block(name: str) -> nn.Module | None:
    """torchao's QAT linear layers for the lowbit format's nearest torchao counterpart (None if none)."""
    try:
        from torchao.quantization.granularity import PerGroup, PerToken
        from torchao.quantization.qat import Float8FakeQuantizeConfig, FakeQuantizedLinear, IntxFakeQuantizeConfig
    except Exception:
        return None
    if name in ("integer", "affine"):
        activation = IntxFakeQuantizeConfig(torch.int8, PerToken(), is_symmetric=False)
        weight = IntxFakeQuantizeConfig(torch.int8, "per_channel", is_symmetric=True)
    elif name == "mxfp4_e2m1":
        activation = IntxFakeQuantizeConfig(torch.int8, PerToken(), is_symmetric=False)
        weight = IntxFakeQuantizeConfig(torch.int4, PerGroup(32), is_symmetric=True)
    elif name == "e4m3":
        activation = weight = Float8FakeQuantizeConfig(torch.float8_e4m3fn)
    else:
        return None
    block = float_block()

    def fake(linear: nn.Linear) -> nn.Module:
        new = FakeQuantizedLinear(linear.in_features, linear.out_features, True, activation, weight)
        new.load_state_dict(linear.state_dict())
        return new

    return nn.Sequential(fake(block[0]), nn.GELU(), fake(block[2]))


def qtorch_block(name: str) -> nn.Module | None:
    """qtorch float quantizers around both Linear layers (inputs, weights, outputs), or None."""
    formats = {"e4m3": (4, 3), "minifloat_ieee": (4, 3)}
    if name not in formats:
        return None
    try:
        from qtorch import FloatingPoint
        from qtorch.quant import quantizer
    except Exception:
        return None
    exponent, mantissa = formats[name]
    quantize = quantizer(forward_number=FloatingPoint(exp=exponent, man=mantissa), forward_rounding="nearest")

    class Quantized(nn.Module):
        def __init__(self, linear: nn.Linear) -> None:
            super().__init__()
            self.linear = linear

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return quantize(F.linear(quantize(x), quantize(self.linear.weight), self.linear.bias))

    block = float_block()
    return nn.Sequential(Quantized(block[0]), nn.GELU(), Quantized(block[2]))


def row(name: str, params: dict, x: torch.Tensor, target: torch.Tensor, rounds: int) -> str:
    spec = lowbit.get_format(name)(**params)
    methods = {"fp32": step_function(float_block(), x, target)}
    eager = on_backend("eager", step_function(lowbit_block(spec), x, target))
    auto = on_backend("auto", step_function(lowbit_block(spec), x, target))
    lowbit.native.ensure()  # the default backend's steady state: the native library is loaded
    methods.update({"eager": eager, "auto": auto})
    for label, block in (("torchao QAT", torchao_block(name)), ("qtorch", qtorch_block(name))):
        if block is not None:
            methods[label] = step_function(block, x, target)
    timing = interleaved(methods, "fp32", rounds=rounds, target=0.3, warmup=2)
    peers = "; ".join(f"{m}: {cell(timing[m])}" for m in methods if m not in ("fp32", "eager", "auto")) or "-"
    return (f"| {spec.describe()} | {cell(timing['eager'])} | {cell(timing['auto'])} | {timing['fp32'].milliseconds:.1f} "
            f"| {peers} |")  # fmt: skip


HEADER = ("| format (every role) | lowbit eager x fp32 step | lowbit auto x fp32 step | fp32 step ms | peers x fp32 step |\n"
          "|---|---:|---:|---:|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    machine = header_line()
    print(machine, flush=True)
    generator = torch.Generator().manual_seed(0)
    x, target = torch.randn(ROWS, WIDTH, generator=generator), torch.randn(ROWS, WIDTH, generator=generator)
    lines = [f"`python {' '.join(sys.argv)}`", "", machine, "",
             f"QAT step (Linear {WIDTH}->{HIDDEN}, GELU, Linear {HIDDEN}->{WIDTH}, {ROWS} rows, forward + backward "
             f"+ SGD); {args.rounds} rounds, median ratio (min-max over rounds)", "", HEADER]  # fmt: skip
    print("\n".join(lines[-2:]), flush=True)
    for name, params in FORMATS:
        if args.only and name not in args.only:
            continue
        lines.append(row(name, params, x, target, args.rounds))
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
