"""lowbit demo: quantize a small MLP with several number formats and print the error of each.

For every format the weights of each Linear layer (and the activations entering it) are fake-quantized
and the network's output is compared with the float32 output on the same inputs. SQNR (dB) is
10 log10(|y|^2 / |y - y_q|^2): higher is better; every 6 dB is about one bit.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import lowbit

FORMATS: list[tuple[str, dict]] = [
    ("integer", {"width": 8, "frac_width": 6}),
    ("affine", {"bits": 8, "symmetric": True, "axis": 0}),
    ("affine", {"bits": 4, "block_size": [1, 32]}),
    ("q4s", {"block_size": [1, 32], "scale_dtype": "bf16"}),
    ("q2s", {"axis": 0}),
    ("ternary", {"scaling_factor": True, "axis": 0}),
    ("binary", {"scaling_factor": True, "axis": 0}),
]
OPTIONAL_FORMATS: list[tuple[str, dict]] = [
    ("minifloat_ieee", {"width": 8, "exponent_width": 4, "exponent_bias": 7}),
    ("e4m3", {}),
    ("e2m1", {"block_size": [1, 32]}),
    ("log", {"width": 8, "exponent_bias": 63}),
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": [1, 16]}),
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": [1, 16]}),
    ("mxfp4_e2m1", {}),
    ("mxint8", {}),
]


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def quantized_forward(model: nn.Sequential, x: torch.Tensor, spec: lowbit.FormatSpec) -> torch.Tensor:
    for layer in model:
        if isinstance(layer, nn.Linear):
            x = nn.functional.linear(spec(x), spec(layer.weight), layer.bias)
        else:
            x = layer(x)
    return x


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (reference - approximation).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(reference.pow(2).sum().item() / noise)


def rows() -> list[tuple[str, str, str, str]]:
    model = make_model()
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(x)
        registered = set(lowbit.list_formats())
        table = []
        for name, params in FORMATS + [f for f in OPTIONAL_FORMATS if f[0] in registered]:
            spec = lowbit.get_format(name)(**params)
            weight = model[2].weight
            table.append((
                spec.describe().replace("rounding='nearest_even', ", ""),
                f"{spec.bits_per_element(tuple(weight.shape)):.2f}",
                f"{sqnr_db(weight, spec(weight)):.1f}",
                f"{sqnr_db(reference, quantized_forward(model, x, spec)):.1f}",
            ))
    return table


def main() -> None:
    headers = ("format", "bits/weight", "weight SQNR dB", "output SQNR dB")
    table = rows()
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(" | ".join(headers))
        for row in table:
            print(" | ".join(row))
        return
    out = Table(title="lowbit demo: 64-128-128-10 MLP, 256 random inputs, weights and activations quantized")
    for header in headers:
        out.add_column(header, justify="left" if header == "format" else "right")
    for row in table:
        out.add_row(*row)
    Console(width=160).print(out)


if __name__ == "__main__":
    main()
