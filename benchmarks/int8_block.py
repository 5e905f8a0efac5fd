"""The int8 routes on the shapes issue 41 names, each path forced and automatic, against fp32 and torch.ao.

- block: MiniLM's feed-forward block (Linear 384 -> 1536, GELU, Linear 1536 -> 384) on 2112 rows (a batch of
  32 sentences of 66 tokens), x float32;
- cnn: Conv2d 64 -> 128 -> 128, 3 x 3, padding 1, ReLU between, on 8 x 64 x 56 x 56.

Every variant is a deep copy quantized by ``lowbit.quantize_model`` (``int8_dynamic``; the CNN also
``w8a8_static`` calibrated on its input), timed interleaved with fp32 in one process (``timing.py``: median
ratio over rounds, min-max in brackets, < 1 is faster); the relative L2 error of the output against fp32 and
the path each layer took are listed. ``--emulate avx2`` runs the AVX2-without-VNNI kernels on any x86 CPU
(``emulate.py``); the header line names the machine and the emulation.

Usage: python benchmarks/int8_block.py [--rounds 7] [--threads N] [--only block|cnn] [--emulate avx2] [--out FILE]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from emulate import apply  # noqa: E402

apply()  # before torch is imported

import argparse  # noqa: E402
import copy  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import lowbit  # noqa: E402
from lowbit import native  # noqa: E402
from lowbit._io import atomic_write_text  # noqa: E402
from machine import header_line  # noqa: E402
from timing import cell, interleaved  # noqa: E402

BLOCK_PATHS = ("native", "fbgemm_pairs", "float_codes", "fbgemm", "int_mm")


def block_variants(model: nn.Module) -> dict[str, nn.Module]:
    variants = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        ao = quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
        variants["torch.ao quantize_dynamic (7-bit inputs per tensor)"] = ao
    variants["lowbit int8_dynamic auto"] = lowbit.quantize_model(copy.deepcopy(model), "int8_dynamic")[0]
    seven = lowbit.quantize_model(copy.deepcopy(model), "int8_dynamic", act_bits=7)[0]
    variants["lowbit int8_dynamic act_bits=7 auto"] = seven
    for path in BLOCK_PATHS:
        quantized = lowbit.quantize_model(copy.deepcopy(model), "int8_dynamic")[0]
        try:
            for module in quantized.modules():
                if path in getattr(module, "paths", ()):
                    module.path = path
            quantized(torch.zeros(2, model[0].in_features))
        except lowbit.LowbitError as error:  # inexact here: the table says so
            variants[f"lowbit int8_dynamic path={path}"] = f"not exact here: {str(error)[:80]}"
            continue
        variants[f"lowbit int8_dynamic path={path}"] = quantized
    return variants


def cnn_variants(model: nn.Module, x: torch.Tensor) -> dict[str, nn.Module]:
    """The recipes' automatic choice (``include_conv="auto"``), and with ``include_conv=True`` where that takes
    a fast route (on a CPU without one the forced Int8Conv2d runs the int64 reference, tens of times fp32:
    left out of the timing, and said so)."""
    from lowbit.ops import routes

    static = lowbit.quantize_model(copy.deepcopy(model), "w8a8_static", calibration_data=[x[:2]])
    dynamic = lowbit.quantize_model(copy.deepcopy(model), "int8_dynamic")
    out = {"lowbit int8_dynamic auto": dynamic[0], "lowbit w8a8_static auto": static[0],
           "_info": (dynamic[1], static[1])}  # fmt: skip
    path = routes.int8_conv(x.device)
    if path == "onednn":
        out["lowbit int8_dynamic include_conv=True"] = lowbit.quantize_model(copy.deepcopy(model), "int8_dynamic",
                                                                           include_conv=True)[0]  # fmt: skip
    else:
        out["lowbit int8_dynamic include_conv=True"] = f"Int8Conv2d would take the {path!r} path here: not timed"
    return out


def _path(module: nn.Module, x: torch.Tensor) -> str:
    """The path a real module takes on this input's row count ("auto -> ..." when chosen automatically)."""
    if module.path != "auto":
        return module.path
    if hasattr(module, "in_features"):
        return "auto -> " + module.choose_path(torch.empty(x.numel() // x.shape[-1], module.in_features))
    return "auto -> " + lowbit.ops.routes.int8_conv(x.device)  # Int8Conv2d


def table(title: str, model: nn.Module, x: torch.Tensor, variants: dict, rounds: int) -> list[str]:
    with torch.inference_mode():
        want = model(x)
        lines = [f"### {title}", "", "| variant | x fp32 | relative error | paths |", "|---|---|---|---|"]
        methods, errors = {"fp32": lambda: model(x)}, {}
        for label, variant in variants.items():
            if isinstance(variant, str):
                lines.append(f"| {label} | - | - | {variant} |")
                continue
            got = variant(x)
            errors[label] = float((got - want).norm() / want.norm())
            methods[label] = lambda variant=variant: variant(x)
        timings = interleaved(methods, "fp32", rounds=rounds)
    for label in methods:
        if label == "fp32":
            lines.insert(4, f"| fp32 | 1.00 ({timings['fp32'].milliseconds:.2f} ms) | 0 | float |")
            continue
        paths = sorted({_path(m, x) for m in variants[label].modules() if hasattr(m, "paths")}) or ["float"]
        lines.append(f"| {label} | {cell(timings[label])} | {errors[label]:.4f} | {', '.join(paths)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--only", choices=("block", "cnn"), default=None)
    parser.add_argument("--emulate", default=None, help="avx2: the kernels of an AVX2 CPU without VNNI")
    parser.add_argument("--out", default=None)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    torch.manual_seed(0)
    print("native kernels:", "loaded" if native.ensure() else native.error(), file=sys.stderr)
    lines = [header_line(), ""]
    if arguments.only in (None, "block"):
        block = nn.Sequential(nn.Linear(384, 1536), nn.GELU(), nn.Linear(1536, 384)).eval()
        x = torch.randn(2112, 384)
        title = "MiniLM block, 2112 x 384 -> 1536 -> 384"
        lines += table(title, block, x, block_variants(block), arguments.rounds) + [""]
    if arguments.only in (None, "cnn"):
        cnn = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 128, 3, padding=1)).eval()
        x = torch.randn(8, 64, 56, 56)
        variants = cnn_variants(cnn, x)
        infos = variants.pop("_info")
        lines += table("CNN, 8 x 64 x 56 x 56, Conv2d 64 -> 128 -> 128 3 x 3", cnn, x, variants, arguments.rounds)
        kept = {reason for info in infos for reason in (info.get("kept") or {}).values()}
        lines += [f"- recipe info: {reason}" for reason in sorted(kept)] + [""]
    text = "\n".join(lines)
    print(text)
    if arguments.out:
        atomic_write_text(arguments.out, text + "\n")


if __name__ == "__main__":
    main()
