"""``lowbit formats``, ``lowbit machine``, ``lowbit stats-to-config`` and ``lowbit export``, plus the report
command's flags."""

from __future__ import annotations

import argparse
import math
from typing import Any

from lowbit.errors import LowbitError


def add_tool_commands(sub: Any) -> None:
    from lowbit.cli.arguments import add_verbosity

    formats = sub.add_parser("formats", help="list every number format with its parameters and value range")
    formats.add_argument("name", nargs="?", help="show one format (default: all)")
    formats.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    add_verbosity(formats)
    formats.set_defaults(command_function=run_formats)

    stats = sub.add_parser("stats-to-config", help="statistics TOML -> per-node scaled-ternary quantize config")
    stats.add_argument("stats", metavar="STATS", help="statistics TOML written by the profile_statistics pass")
    stats.add_argument("dest", metavar="DEST", help="config TOML to write")
    stats.add_argument("-b", "--base", help="config whose passes.quantize.default.config is the template")
    stats.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    add_verbosity(stats)
    stats.set_defaults(command_function=run_stats_to_config)

    machine = sub.add_parser("machine", help="this machine's CPU class, kernel probes and the real modules' paths")
    machine.add_argument("--device", default="cpu", help="the device to report on (default cpu; cuda, cuda:1, ...)")
    machine.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    add_verbosity(machine)
    machine.set_defaults(command_function=run_machine)

    export = sub.add_parser("export", help="export a transformed model (ONNX QDQ, lowbit safetensors, GGUF, "
                                           "compressed-tensors)")
    export.add_argument("--load", required=True, help="a lowbit checkpoint folder (transform / train output)")
    export.add_argument("--onnx", help="write a QDQ ONNX model here")
    export.add_argument("--safetensors", help="write lowbit's safetensors file here")
    export.add_argument("--gguf", help="write a GGUF file (llama.cpp) here: a Llama-architecture model whose quantized "
                                       "layers ggml types hold exactly")
    export.add_argument("--compressed-tensors", dest="compressed_tensors",
                        help="write a compressed-tensors checkpoint folder (vLLM) here")
    export.add_argument("--batch-size", type=int, default=1, help="batch size of the example input (default 1)")
    export.add_argument("--dataset", help="dataset giving the example input (default: the checkpoint's)")
    export.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    add_verbosity(export)
    export.set_defaults(command_function=run_export)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--save-dir",
                        help="folder for report.json / report.html (default: <project>/software/transform/report)")
    from lowbit.cli.arguments import parse_bool

    parser.add_argument("--sensitivity", type=parse_bool, default=True,
                        help="rank layers by the metric when only that layer is quantized (default true)")  # fmt: skip


# ---- machine ------------------------------------------------------------------------------------------------
def run_machine(args: argparse.Namespace) -> int:
    import torch

    from lowbit.cli.output import show_table
    from lowbit.errors import ConfigError
    from lowbit.ops.machine_report import report

    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        raise ConfigError(f"--device {args.device!r} is not a device: {error}") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ConfigError(f"--device {args.device}: no such CUDA device here")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device}: lowbit's real modules run on cpu or cuda")
    show_table(f"Real-module paths on {device}", report(device))
    return 0


# ---- formats ------------------------------------------------------------------------------------------------
def run_formats(args: argparse.Namespace) -> int:
    from lowbit.cli.output import show_table
    from lowbit.formats import get_format, list_formats

    names = [args.name] if args.name is not None else list_formats()  # '' is a name, and no format's
    rows = [_format_row(name, get_format(name)) for name in names]
    show_table("Number formats (defaults shown; ranges of the default parameters)", rows)
    return 0


def _format_row(name: str, cls: Any) -> dict[str, Any]:
    from lowbit.formats._registry import parameter_names

    try:
        spec = cls()
    except LowbitError:
        return {"format": name, "parameters": ", ".join(parameter_names(cls)), "bits": "", "range": "needs parameters"}
    params = spec.params()
    shown = ", ".join(f"{key}={value}" for key, value in params.items() if key != "rounding" and value is not None)
    return {"format": name, "parameters": shown or "-", "bits": _bits(spec), "range": _range(spec)}


def _bits(spec: Any) -> str:
    try:
        return f"{spec.bits_per_element():g}"
    except (NotImplementedError, LowbitError, TypeError):
        return "?"


def _range(spec: Any) -> str:
    values = spec.value_set()
    if values is not None:
        finite = values[values.isfinite()]
        positive = finite[finite > 0]
        smallest = f", min |x| > 0: {float(positive.min()):.4g}" if positive.numel() else ""
        return f"[{float(finite.min()):.6g}, {float(finite.max()):.6g}]{smallest}, {finite.numel()} values"
    largest = getattr(spec, "max_value", None)
    if isinstance(largest, (int, float)) and math.isfinite(largest):
        return f"largest {largest:.6g}; exponent shared per block"
    return "scaled to the data"


# ---- stats-to-config ----------------------------------------------------------------------------------------
def run_stats_to_config(args: argparse.Namespace) -> int:
    from lowbit.cli.arguments import check_input_file
    from lowbit.graph import stats_to_config_file

    check_input_file(args.stats, "statistics")
    if args.base is not None:
        check_input_file(args.base, "base config")
    config = stats_to_config_file(args.stats, args.dest, args.base)
    nodes = [key for key in config.get("passes", {}).get("quantize", {}) if key not in ("by", "default", "report")]
    print(f"wrote {args.dest}: quantize configs for {len(nodes)} nodes ({', '.join(nodes)})")
    return 0


# ---- export -------------------------------------------------------------------------------------------------
def run_export(args: argparse.Namespace) -> int:
    from lowbit.errors import ConfigError

    if not (args.onnx or args.safetensors or args.gguf or args.compressed_tensors):
        raise ConfigError("lowbit export: say what to write: --onnx PATH, --safetensors PATH, --gguf PATH and / or "
                          "--compressed-tensors DIR")  # fmt: skip
    from lowbit.pipeline.exporting import export

    for path in export(args.load, onnx_path=args.onnx, safetensors_path=args.safetensors, gguf_path=args.gguf,
                       compressed_tensors_path=args.compressed_tensors, batch_size=args.batch_size,
                       dataset=args.dataset):  # fmt: skip
        print(f"wrote {path}")
    return 0


__all__ = ["add_report_arguments", "add_tool_commands"]
