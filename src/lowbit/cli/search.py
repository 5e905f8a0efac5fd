"""``lowbit search --config FILE``: run (or continue) a config's ``[search]`` study and write its front.

Exit 2 for configuration errors (bad ``[search]`` tables, unknown formats or metrics), 1 for runtime
failures, as every lowbit command. ``--workers N`` starts N-1 more processes on the same study storage.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from lowbit.cli.arguments import check_input_file
from lowbit.errors import ConfigError, LowbitError


def add_search_command(sub: Any) -> None:
    from lowbit.cli.arguments import add_verbosity

    text = "mixed-precision search (Optuna) over a config's [search] tables; writes front.json and front/*.toml"
    command = sub.add_parser("search", help=text, description=text)
    command.add_argument("--config", required=True, help="TOML config with [search.search_space] / [search.strategy]")
    command.add_argument("--save-dir", help="output folder (default: <project_dir>/<project>/search)")
    command.add_argument("--n-trials", type=int, help="trials this run adds (default: setup.n_trials)")
    command.add_argument("--storage", help="Optuna storage: a .journal / .db file or a database URL")
    command.add_argument("--sampler", choices=("tpe", "nsga2", "random", "grid"), help="override setup.sampler")
    command.add_argument("--workers", type=int, default=1, help="processes working on the study together")
    command.add_argument("--load", help="checkpoint of the model to search (overrides load_name)")
    command.add_argument("--load-type", dest="load_type", choices=("pt", "pl", "lowbit"), help="checkpoint kind")
    command.add_argument("--project-dir", dest="project_dir", help="where outputs go (default: lowbit_output)")
    command.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    command.add_argument("--debug", action="store_true", help="show the traceback of an error")
    add_verbosity(command)
    command.set_defaults(command_function=run_search_command)


def run_search_command(args: argparse.Namespace) -> int:
    from lowbit.search.run import run_search

    if args.n_trials is not None and args.n_trials < 1:
        raise ConfigError(f"--n-trials must be a positive integer, got {args.n_trials}")
    if args.workers < 1:
        raise ConfigError(f"--workers must be a positive integer, got {args.workers}")
    check_input_file(args.config, "config")  # before any worker starts: a FIFO would block them all
    others = [_start_worker(args, index) for index in range(1, args.workers)]
    from lowbit.config import check_option_value

    overrides = {name: check_option_value(name, getattr(args, name), "command line")
                 for name in ("load", "load_type", "project_dir") if getattr(args, name) is not None}  # fmt: skip
    result = run_search(args.config, args.save_dir, n_trials=args.n_trials, storage=args.storage,
                        sampler=args.sampler, worker=args.worker, overrides=overrides,
                        progress=not getattr(args, "quiet", False))  # fmt: skip
    failed = [process.args for process in others if process.wait() != 0]
    if failed:
        raise LowbitError(f"{len(failed)} search worker process(es) failed")
    if others:  # the front again, now with every worker's trials
        first = result["run"]
        result = run_search(args.config, args.save_dir, n_trials=None, storage=args.storage, sampler=args.sampler,
                            worker=args.worker, overrides=overrides, only_outputs=True)  # fmt: skip
        result["run"] = {**first, "added": args.workers * first["added"]}
    if args.worker == 0:
        _show(result)
    return 0


def _start_worker(args: argparse.Namespace, index: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "lowbit", "-q", "search", "--config", args.config, "--worker", str(index)]
    for flag, value in (("--save-dir", args.save_dir), ("--n-trials", args.n_trials), ("--storage", args.storage),
                        ("--sampler", args.sampler), ("--load", args.load), ("--load-type", args.load_type),
                        ("--project-dir", args.project_dir)):  # fmt: skip
        if value is not None:
            command += [flag, str(value)]
    return subprocess.Popen(command)


def _show(result: dict[str, Any]) -> None:
    front, run = result["front"], result["run"]
    print(f"trials in study: {len(result['records'])} (this run added {run['added']} in {run['seconds']:.1f} s; "
          f"modules built {run['cache_misses']}, reused {run['cache_hits']})")  # fmt: skip
    for record in front:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in record["metrics"].items())
        print(f"  front trial {record['number']}: {metrics}")
    if result.get("comparison"):
        print(f"against the uniform presets: {result['comparison']['sentence']}")
    print(f"outputs: {', '.join(str(path) for path in result['files'])}")


__all__ = ["add_search_command", "run_search_command"]
