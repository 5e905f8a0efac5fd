"""The argument parser: one sub-command per action; run options as flags with MASE's names."""

from __future__ import annotations

import argparse
from typing import NoReturn

from lowbit.cli.arguments import add_verbosity, parse_bool
from lowbit.config.options import OPTIONS
from lowbit.errors import UsageError  # re-exported: it lives in lowbit.errors (the CLI catches it unimported)

RUN_COMMANDS = {
    "train": "train a built-in model (or a transformed one: quantization-aware training) with Lightning",
    "test": "evaluate a checkpoint on the test split",
    "transform": "run the [passes.*] of a config (profile, quantize, calibrate, report ...) and save the result",
    "report": "quantization report of a config's transform: per-layer error, bits, sensitivity, HTML",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (through main), instead of usage + message
        raise UsageError(f"{self.prog}: {message}")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_positional", nargs="?", metavar="MODEL", default=argparse.SUPPRESS)
    parser.add_argument("dataset_positional", nargs="?", metavar="DATASET", default=argparse.SUPPRESS)
    parser.add_argument("--config", help="TOML config (run options at the top level, [passes.*] tables)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--print-config", dest="print_config", type=parse_bool, default=True,
                        help="print the effective configuration table (default true)")  # fmt: skip
    for option in OPTIONS:
        kind = parse_bool if option.kind is bool else option.kind
        alone = {"nargs": "?", "const": True} if option.kind is bool else {}  # "--warmup" = "--warmup true"
        parser.add_argument(option.flag, dest=option.name, type=kind, choices=option.choices, **alone,
                            default=argparse.SUPPRESS, help=f"{option.help} (default: {option.default})")  # fmt: skip
    parser.add_argument("--load-name", dest="load", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--num-devices", dest="devices", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=argparse.SUPPRESS,
                        help="no progress bars")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    from lowbit.cli import commands, search, tools

    parser = _Parser(prog="lowbit", description="Quantize PyTorch models to any arithmetic and measure what it costs.")
    parser.add_argument("-V", "--version", action="version", version=f"lowbit {_version()}")
    add_verbosity(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, required=True)
    for name, text in RUN_COMMANDS.items():
        command = sub.add_parser(name, help=text, description=text)
        add_verbosity(command)
        _add_run_options(command)
        if name == "report":
            tools.add_report_arguments(command)
        command.set_defaults(command_function=getattr(commands, f"run_{name}"))
    tools.add_tool_commands(sub)
    search.add_search_command(sub)
    return parser


def _version() -> str:
    from lowbit import __version__

    return __version__


__all__ = ["UsageError", "add_verbosity", "build_parser", "parse_bool"]
