"""``lowbit train | test | transform | report``: options merged, effective configuration printed, then the
pipeline function called and its result shown."""

from __future__ import annotations

import argparse
import os
from typing import Any

from lowbit.cli.arguments import check_input_file
from lowbit.config import RunConfig, check_option_value, load_run_config, merge_options
from lowbit.config.options import OPTION_BY_NAME, EffectiveOptions
from lowbit.errors import ConfigError


def resolve(args: argparse.Namespace, *, needs_config: bool = False) -> tuple[EffectiveOptions, RunConfig]:
    """The effective options (default < TOML < command line) and the checked config file."""
    from lowbit.cli import is_rank_zero
    from lowbit.cli.output import show_effective_options
    from lowbit.pipeline.actions import prepare
    from lowbit.pipeline.passes import PASSES

    if needs_config and args.config is None:
        raise ConfigError(f"lowbit {args.command} needs --config: a TOML file with [passes.*] tables")
    if args.config is not None:
        check_input_file(args.config, "config")
    config = load_run_config(args.config, PASSES) if args.config is not None else RunConfig()
    given = {name: check_option_value(name, value, "command line") for name, value in vars(args).items()
             if name in OPTION_BY_NAME}  # fmt: skip
    for name in ("model", "dataset"):
        positional = getattr(args, f"{name}_positional", None)
        if positional is not None:
            if name in given and given[name] != positional:
                raise ConfigError(f"{name} given twice on the command line: {positional!r} and --{name} {given[name]!r}")
            given[name] = positional
    options = merge_options(config.options, given)
    prepare(options)
    if args.print_config and is_rank_zero():
        show_effective_options(options)
    return options, config


def run_train(args: argparse.Namespace) -> int:
    from lowbit.cli import is_rank_zero
    from lowbit.cli.output import show_metrics
    from lowbit.pipeline.actions import train

    options, config = resolve(args)
    summary = train(options, config.low_precision_optimizer)  # [low_precision_optimizer]: optimizer state formats
    if is_rank_zero() and summary.get("is_global_zero", True):
        show_metrics("Training result (best checkpoint)", summary.get("metrics", {}))
        print(f"checkpoints: {summary['best']} (best), {summary['last']} (last)")
        if "transformed" in summary:
            print(f"transformed model: {summary['transformed']}")
    return 0


def run_test(args: argparse.Namespace) -> int:
    from lowbit.cli.output import show_metrics
    from lowbit.pipeline.actions import test

    options, _ = resolve(args)
    result = test(options)
    show_metrics(f"Test metrics ({options['dataset']})", result["metrics"])
    print(f"metrics: {result['files'][0]}")
    return 0


def run_transform(args: argparse.Namespace) -> int:
    from lowbit.pipeline.actions import transform

    options, config = resolve(args, needs_config=True)
    result = transform(options, config)
    print(f"passes run: {', '.join(result['passes']) or 'none'}")
    print(f"transformed model: {result['transformed']}")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from lowbit.pipeline.actions import transform

    options, config = resolve(args, needs_config=True)
    extra: dict[str, Any] = {"sensitivity": args.sensitivity}
    if args.save_dir is not None:  # a command-line path is relative to where the command runs
        extra["save_dir"] = os.path.abspath(args.save_dir)
    table = next((a for n, a in config.passes if n == "quantization_report"), {})  # the config's own keys stay
    config.passes = [(n, a) for n, a in config.passes if n != "quantization_report"]
    config.passes.append(("quantization_report", {**table, **extra}))
    result = transform(options, config)
    report_info = result["passes"]["quantization_report"]
    files = report_info.get("files") if isinstance(report_info, dict) else None
    print(f"report: {', '.join(map(str, files)) if files else options['project_dir']}")
    return 0


__all__ = ["resolve", "run_report", "run_test", "run_train", "run_transform"]
