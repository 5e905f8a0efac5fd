"""Reading a run config from TOML: MASE's layout, checked before any work starts.

Layout (seed 002 / MASE)::

    model = "toy"                # any run option (see lowbit.config.options) at the top level
    dataset = "toy_tiny"
    [transform]
    style = "graph"              # or "module" (module swap, for models fx cannot trace)
    [passes.profile_statistics]  # passes run in file order
    ...
    [passes.quantize]
    by = "type"
    [passes.quantize.default.config]
    name = "integer"

The string "NA" stands for None anywhere (MASE's convention); :func:`na_to_none` / :func:`none_to_na`
convert. Every problem raises ConfigError naming the file, the key and, for unknown keys, the nearest
valid one.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowbit._io import read_regular_text
from lowbit.config.options import ALIAS_TO_NAME, OPTION_BY_NAME, check_option_value
from lowbit.errors import ConfigError, did_you_mean
from lowbit.nn.config import ConfigWarning

SECTIONS = ("passes", "transform", "low_precision_optimizer")
# [low_precision_optimizer]: the optimizer state formats of `lowbit train` (lowbit.optim.LowPrecisionOptimizer);
# a format is a name or an inline table {name = ..., parameter = value}; the formats are checked by lowbit.train
OPTIMIZER_FORMAT_KEYS = ("weight", "grad", "momentum", "second_moment")
OPTIMIZER_KEYS = (*OPTIMIZER_FORMAT_KEYS, "stochastic", "seed")
# MASE's command-line keys (its CLI_DEFAULTS) that lowbit has no option for, and why; MASE's other keys
# are options here (num_devices = devices, log_every_n_steps, accumulate_grad_batches, trainer_precision,
# t_max, eta_min, ...).
MASE_UNSUPPORTED = {
    "max_token_len": "lowbit's one text dataset (sentences) is tokenized to at most 128 tokens; there is no "
                     "language-model dataset to set a length for",
    "is_pretrained": "built-in models are built by name; load weights with load / --load",
    "quant_config": "lowbit quantizes with [passes.quantize] (or a recipe), not a model-construction config",
    "disable_dataset_cache": "lowbit's built-in datasets are generated in memory; there is no cache",
    "is_to_auto_requeue": "cluster auto-requeue is not supported",
    "github_ci": "MASE's CI switch has no meaning here",
    "report_to": "training logs go to a CSV logger in the project folder (no wandb / tensorboard)",
    "log_level": "use -q / -v on the command line",
    "to_debug": "use --debug on the command line",
    "no_warnings": "use Python's -W ignore",
}
# MASE sections for actions lowbit does not have: skipped with a warning (MASE's transform skips them too).
IGNORED_SECTIONS = {"search": "the [search.*] tables (MASE's ch search) belong to `lowbit search --config`; transform skips them"}
TRANSFORM_KEYS = {"style": ("graph", "module")}


@dataclass
class RunConfig:
    """A checked config file: run options, the transform style and the passes in file order."""

    path: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    style: str = "graph"
    passes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    low_precision_optimizer: dict[str, Any] | None = None  # the [low_precision_optimizer] table, keys checked


def na_to_none(value: Any) -> Any:
    """A copy of ``value`` with every "NA" string turned into None."""
    if isinstance(value, Mapping):
        return {key: na_to_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [na_to_none(item) for item in value]
    return None if value == "NA" else value


def none_to_na(value: Any) -> Any:
    """A copy of ``value`` with every None turned into "NA" (TOML has no null)."""
    if isinstance(value, Mapping):
        return {key: none_to_na(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [none_to_na(item) for item in value]
    return "NA" if value is None else value


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a TOML file; ConfigError for a missing file or a syntax error (with its line)."""
    path = Path(path)
    try:
        text = read_regular_text(path)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from None
    try:
        return tomllib().loads(text)
    except ValueError as error:  # tomllib.TOMLDecodeError
        raise ConfigError(f"{path}: TOML syntax error: {error}") from None


def load_run_config(path: str | os.PathLike, known_passes: Iterable[str]) -> RunConfig:
    """Read and check a run config; ``known_passes`` are the pass names the caller can run."""
    path = Path(path)
    return parse_run_config(read_toml(path), known_passes, str(path))


def parse_run_config(table: Mapping[str, Any], known_passes: Iterable[str], where: str = "config") -> RunConfig:
    """Check a run config given as a (TOML-loaded) table."""
    known_passes = list(known_passes)
    config = RunConfig(path=Path(where) if where != "config" else None)
    for key, value in table.items():
        if key == "passes":
            config.passes = _passes(value, known_passes, where)
        elif key == "transform":
            config.style = _transform(value, where)
        elif key == "low_precision_optimizer":
            config.low_precision_optimizer = _low_precision_optimizer(value, where)
        elif key in OPTION_BY_NAME or key in ALIAS_TO_NAME:
            name = ALIAS_TO_NAME.get(key, key)
            config.options[name] = check_option_value(name, na_to_none(value), f"{where}: top-level key")
        elif key in IGNORED_SECTIONS:
            warnings.warn(f"{where}: [{key}] ignored: {IGNORED_SECTIONS[key]}", ConfigWarning, stacklevel=3)
        elif key in MASE_UNSUPPORTED:
            raise ConfigError(f"{where}: MASE's key {key!r} is not supported: {MASE_UNSUPPORTED[key]}")
        else:
            valid = [*OPTION_BY_NAME, *ALIAS_TO_NAME, *SECTIONS]
            raise ConfigError(f"{where}: unknown top-level key {key!r}{did_you_mean(key, valid)}")
    return config


def _passes(value: Any, known: list[str], where: str) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: 'passes' must be a table of [passes.<name>] tables")
    passes = []
    for name, arguments in value.items():
        if name not in known:
            raise ConfigError(f"{where}: unknown pass [passes.{name}]{did_you_mean(name, known)}; "
                              f"passes: {', '.join(known)}")  # fmt: skip
        if not isinstance(arguments, Mapping):
            raise ConfigError(f"{where}: [passes.{name}] must be a table, got {arguments!r}")
        passes.append((name, na_to_none(arguments)))
    return passes


def _low_precision_optimizer(value: Any, where: str) -> dict[str, Any]:
    """The [low_precision_optimizer] table with its keys and value kinds checked (formats: by lowbit.train)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: 'low_precision_optimizer' must be a table, got {value!r}")
    for key, item in value.items():
        if key not in OPTIMIZER_KEYS:
            raise ConfigError(f"{where}: unknown key low_precision_optimizer.{key}{did_you_mean(key, OPTIMIZER_KEYS)}")
        if key in OPTIMIZER_FORMAT_KEYS and not isinstance(item, (str, Mapping)):
            raise ConfigError(f"{where}: low_precision_optimizer.{key} must be a format name or a table "
                              f"{{name = ..., ...}}, got {item!r}")  # fmt: skip
        if key == "stochastic" and not isinstance(item, bool):
            raise ConfigError(f"{where}: low_precision_optimizer.stochastic must be true or false, got {item!r}")
        if key == "seed" and (isinstance(item, bool) or not isinstance(item, int)):
            raise ConfigError(f"{where}: low_precision_optimizer.seed must be an integer, got {item!r}")
    if not any(key in value for key in OPTIMIZER_FORMAT_KEYS):
        raise ConfigError(f"{where}: [low_precision_optimizer] names no format; give one or more of "
                          f"{', '.join(OPTIMIZER_FORMAT_KEYS)}")  # fmt: skip
    return {key: dict(item) if isinstance(item, Mapping) else item for key, item in value.items()}


def _transform(value: Any, where: str) -> str:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: 'transform' must be a table")
    for key in value:
        if key not in TRANSFORM_KEYS:
            raise ConfigError(f"{where}: unknown key transform.{key}{did_you_mean(key, TRANSFORM_KEYS)}")
    style = value.get("style", "graph")
    if style not in TRANSFORM_KEYS["style"]:
        raise ConfigError(f"{where}: transform.style = {style!r} is not one of graph, module")
    return style


def tomllib():
    if sys.version_info >= (3, 11):
        import tomllib as module
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as module
        except ImportError:
            raise ConfigError("reading TOML on Python 3.10 needs the 'tomli' package") from None
    return module


__all__ = ["RunConfig", "load_run_config", "na_to_none", "none_to_na", "parse_run_config", "read_toml", "tomllib"]
