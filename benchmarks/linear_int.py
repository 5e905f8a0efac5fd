"""Integer Linear kernels side by side: fp32, bf16, torch.ao, torchao, optimum-quanto and lowbit.

For each size D (D x D Linear with bias) and batch B, every variant of ``int_peers`` runs in one process,
interleaved with the fp32 nn.Linear (see ``timing.py``); the table gives the median time ratio to fp32 over
the rounds (min-max in brackets; < 1 is faster) and the relative L2 error of the output against fp32 at
B = 16. All calls run under ``torch.no_grad()`` (quanto's int4 path fails under inference_mode). The
"bf16 model" row (the same nn.Linear cast to bfloat16, input in bfloat16) is in every table, whatever
``--only`` keeps; the table starts with the machine line of ``machine.py``.

Usage: python benchmarks/linear_int.py [--sizes 1024 4096] [--batches 1 16 256] [--rounds 7] [--threads N]
                                       [--only WORD ...] [--out FILE]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from emulate import apply  # noqa: E402

apply()  # --emulate avx2: re-executed with the AVX2 kernels before torch is imported

import argparse  # noqa: E402

import torch  # noqa: E402

from int_peers import variants  # noqa: E402
from machine import header_line  # noqa: E402
from timing import cell, interleaved  # noqa: E402

from lowbit import native  # noqa: E402
from lowbit._io import atomic_write_text  # noqa: E402


def _row_error(model, dtype, reference_model, x) -> float:
    with torch.no_grad():
        expected = reference_model(x)
        got = model(x.to(dtype)).float()
    return float((got - expected).norm() / expected.norm())


def measure(sizes, batches, rounds, only) -> tuple[list[str], dict[str, dict[str, str]], dict[str, float]]:
    columns, table, errors = [], {}, {}
    for size in sizes:
        torch.manual_seed(0)
        linear = torch.nn.Sequential(torch.nn.Linear(size, size)).eval()  # quantizers swap children, not the root
        built = variants(linear, only)
        for label, value in built.items():
            if isinstance(value, str):
                table.setdefault(label, {})[f"{size}"] = f"failed: {value}"
        runnable = {label: value for label, value in built.items() if not isinstance(value, str)}
        for batch in batches:
            column = f"{size}² B{batch}"
            columns.append(column)
            x = torch.randn(batch, size, generator=torch.Generator().manual_seed(batch))
            inputs = {dtype: x.to(dtype) for dtype in (torch.float32, torch.bfloat16)}
            methods = {"fp32 nn.Linear": lambda: linear(inputs[torch.float32])}
            for label, (model, dtype) in runnable.items():
                methods[label] = lambda model=model, dtype=dtype: model(inputs[dtype])
                if batch == 16:
                    errors[f"{label} {size}"] = _row_error(model, dtype, linear, x)
            with torch.no_grad():
                timings = interleaved(methods, "fp32 nn.Linear", rounds=rounds, target=0.08)
            for label, timing in timings.items():
                table.setdefault(label, {})[column] = cell(timing)
            table.setdefault("fp32 ms per call", {})[column] = f"{timings['fp32 nn.Linear'].milliseconds:.3f}"
            print(column, {k: round(v.ratio, 2) for k, v in timings.items()}, flush=True)
    return columns, table, errors


def markdown(columns, table, errors, sizes) -> str:
    lines = ["| method | " + " | ".join(columns) + " | " + " | ".join(f"rel. err {s}² B16" for s in sizes) + " |",
             "|---|" + "---|" * (len(columns) + len(sizes))]  # fmt: skip
    for label, cells in table.items():
        error_cells = [f"{errors[f'{label} {s}']:.4f}" if f"{label} {s}" in errors else "-" for s in sizes]
        failure = next((v for v in cells.values() if v.startswith("failed")), None)
        row = [failure] + [""] * (len(columns) - 1) if failure else [cells.get(c, "-") for c in columns]
        lines.append(f"| {label} | " + " | ".join(row) + " | " + " | ".join(error_cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--only", nargs="*", default=None, help="keep variants whose label contains a word")
    parser.add_argument("--out", default=None)
    parser.add_argument("--emulate", default=None, help="avx2: the kernels of an AVX2 CPU without VNNI (emulate.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native.ensure()  # the default backend's steady state: native kernels loaded
    machine = header_line()
    print(machine, flush=True)
    columns, table, errors = measure(args.sizes, args.batches, args.rounds, args.only)
    header = f"quantized engine {torch.backends.quantized.engine}, {args.rounds} rounds"
    text = machine + "\n\n" + header + "\n\n" + markdown(columns, table, errors, args.sizes) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
