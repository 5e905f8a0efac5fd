"""The ``[search.*]`` tables of a run config, in MASE's layout plus lowbit's extensions, checked up front.

MASE's layout::

    [search.search_space]
    name = "graph/quantize/mixed_precision_ptq"     # or "module/..." (lowbit searches modules either way)
    [search.search_space.setup]
    by = "name"                                      # "name" | "type" | lowbit: "regex"
    [search.search_space.seed.default.config]        # MASE: every key a list of choices
    name = ["integer"]
    weight_width = [2, 4, 8]
    [search.strategy]
    name = "optuna"
    [search.strategy.sw_runner.basic_evaluation]     # or sw_runner = "basic_evaluation" + keys beside it
    data_loader = "val_dataloader"
    num_samples = 512
    [search.strategy.hw_runner.average_bitwidth]
    compare_to = 32
    [search.strategy.setup]
    n_jobs = 1
    n_trials = 20
    timeout = 20000
    sampler = "tpe"                                  # tpe | nsga2 | random | grid (any case)
    sum_scaled_metrics = false
    [search.strategy.metrics]
    accuracy.scale = 1.0
    accuracy.direction = "maximize"

lowbit's additions are described in :mod:`lowbit.search.space` (seed tables) and docs/search.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lowbit._checks import check_choice, check_flag, check_positive_int
from lowbit.errors import ConfigError, did_you_mean

SPACE_NAMES = ("graph/quantize/mixed_precision_ptq", "module/quantize/mixed_precision_ptq",
               "module/manual_hf/quantize/llm_mixed_precision_ptq")  # fmt: skip
SAMPLERS = ("tpe", "nsga2", "random", "grid")
BY = ("name", "type", "regex")
DEFAULT_OPS = ("linear", "conv1d", "conv2d", "relu")
SW_METRICS = ("accuracy", "loss", "mean_cosine", "min_cosine")
HW_METRICS = ("average_bitwidth", "memory_density", "weight_bits", "activation_bits", "model_bytes", "cost",
              "latency_ms")
METRICS = SW_METRICS + HW_METRICS
_SPACE_KEYS = ("name", "setup", "seed", "presets", "skip")
_SPACE_SETUP_KEYS = ("by", "ops", "skip", "share")
_STRATEGY_KEYS = ("name", "eval_mode", "sw_runner", "hw_runner", "setup", "metrics", "data_loader", "num_samples",
                  "cost_table", "sensitivity_start")  # fmt: skip
_SETUP_KEYS = ("n_jobs", "n_trials", "timeout", "sampler", "sum_scaled_metrics", "direction", "seed", "storage",
               "study_name", "sensitivity_start")  # fmt: skip


@dataclass
class SearchConfig:
    """A checked ``[search]`` table."""

    seeds: dict[str, dict[str, Any]]
    by: str = "name"
    share: bool = False
    ops: tuple[str, ...] = DEFAULT_OPS
    skip: tuple[str, ...] = ()
    presets: dict[str, Any] = field(default_factory=dict)
    n_trials: int = 20
    n_jobs: int = 1
    timeout: float | None = None
    sampler: str = "tpe"
    sum_scaled_metrics: bool = False
    seed: int = 0
    storage: str | None = None
    study_name: str = "lowbit_search"
    data_loader: str = "val_dataloader"
    num_samples: int = 512
    compare_to: int = 32
    metrics: dict[str, tuple[float, str]] = field(default_factory=lambda: {"accuracy": (1.0, "maximize"),
                                                                              "average_bitwidth": (0.2, "minimize")})
    cost_table: str | dict[str, Any] | None = None
    sensitivity_start: bool = False


def parse_search(table: Any, where: str = "config") -> SearchConfig:
    """Check the ``[search]`` table of a config (its ``search_space`` and ``strategy``)."""
    table = _table(table, "search", where)
    _known(table, ("search_space", "strategy"), "search", where)
    space = _table(table.get("search_space", {}), "search.search_space", where)
    _known(space, _SPACE_KEYS, "search.search_space", where)
    name = space.get("name", SPACE_NAMES[0])
    if name not in SPACE_NAMES:
        raise ConfigError(f"{where}: search.search_space.name = {name!r} is not a mixed-precision search space; "
                          f"known: {', '.join(SPACE_NAMES)}")  # fmt: skip
    setup = _table(space.get("setup", {}), "search.search_space.setup", where)
    _known(setup, _SPACE_SETUP_KEYS, "search.search_space.setup", where)
    seeds = _table(space.get("seed"), "search.search_space.seed", where)
    if not seeds:
        raise ConfigError(f"{where}: [search.search_space.seed.<key>] tables are needed (e.g. seed.default.config)")
    config = SearchConfig(seeds={key: _table(value, f"search.search_space.seed.{key}", where)
                                 for key, value in seeds.items()})  # fmt: skip
    config.by = _choice(setup.get("by", "name"), BY, "search.search_space.setup.by", where)
    config.share = _bool(setup.get("share", False), "search.search_space.setup.share", where)
    config.ops = tuple(_strings(setup.get("ops", list(DEFAULT_OPS)), "search.search_space.setup.ops", where))
    config.skip = tuple(_strings(space.get("skip", setup.get("skip", [])), "search.search_space.skip", where))
    config.presets = _table(space.get("presets", {}), "search.search_space.presets", where)
    _strategy(config, _table(table.get("strategy", {}), "search.strategy", where), where)
    return config


def _strategy(config: SearchConfig, strategy: dict[str, Any], where: str) -> None:
    if strategy.get("name", "optuna") != "optuna":
        raise ConfigError(f"{where}: search.strategy.name = {strategy['name']!r}: lowbit searches with optuna only "
                          "(MASE's rl / ea strategies are not supported)")  # fmt: skip
    _known(strategy, _STRATEGY_KEYS, "search.strategy", where)
    sw = _runner(strategy, "sw_runner", "basic_evaluation", where)
    config.data_loader = str(sw.get("data_loader", strategy.get("data_loader", config.data_loader)))
    if config.data_loader not in ("val_dataloader", "test_dataloader", "train_dataloader"):
        raise ConfigError(f"{where}: data_loader {config.data_loader!r} is not one of val_dataloader, "
                          "test_dataloader, train_dataloader")  # fmt: skip
    config.num_samples = _positive_int(sw.get("num_samples", strategy.get("num_samples", config.num_samples)),
                                       "num_samples", where)  # fmt: skip
    hw = _runner(strategy, "hw_runner", "average_bitwidth", where)
    config.compare_to = _positive_int(hw.get("compare_to", 32), "hw_runner.average_bitwidth.compare_to", where)
    config.cost_table = strategy.get("cost_table")
    setup = _table(strategy.get("setup", {}), "search.strategy.setup", where)
    _known(setup, _SETUP_KEYS, "search.strategy.setup", where)
    config.n_trials = _positive_int(setup.get("n_trials", config.n_trials), "setup.n_trials", where)
    config.n_jobs = _positive_int(setup.get("n_jobs", 1), "setup.n_jobs", where)
    timeout = setup.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError(f"{where}: setup.timeout must be a positive number of seconds, got {timeout!r}")
    config.timeout = timeout
    config.sampler = _choice(str(setup.get("sampler", "tpe")).lower(), SAMPLERS, "setup.sampler", where)
    config.sum_scaled_metrics = _bool(setup.get("sum_scaled_metrics", False), "setup.sum_scaled_metrics", where)
    config.seed = int(setup.get("seed", 0))
    config.storage = setup.get("storage")
    config.study_name = str(setup.get("study_name", config.study_name))
    config.sensitivity_start = _bool(setup.get("sensitivity_start", strategy.get("sensitivity_start", False)),
                                     "sensitivity_start", where)  # fmt: skip
    if "metrics" in strategy:
        config.metrics = _metrics(_table(strategy["metrics"], "search.strategy.metrics", where), where)


def _runner(strategy: dict[str, Any], key: str, expected: str, where: str) -> dict[str, Any]:
    """MASE writes either ``sw_runner = "basic_evaluation"`` or a ``[sw_runner.basic_evaluation]`` table."""
    value = strategy.get(key, {expected: {}})
    if isinstance(value, str):
        value = {value: {}}
    value = _table(value, f"search.strategy.{key}", where)
    for name in value:
        if name != expected:
            raise ConfigError(f"{where}: search.strategy.{key}.{name} is not supported; lowbit has {key} {expected!r}")
    return _table(value.get(expected, {}), f"search.strategy.{key}.{expected}", where)


def _metrics(table: dict[str, Any], where: str) -> dict[str, tuple[float, str]]:
    metrics = {}
    for name, spec in table.items():
        if name not in METRICS:
            raise ConfigError(f"{where}: unknown search metric {name!r}{did_you_mean(name, METRICS)}; "
                              f"metrics: {', '.join(METRICS)}")  # fmt: skip
        spec = _table(spec, f"search.strategy.metrics.{name}", where)
        _known(spec, ("scale", "direction"), f"search.strategy.metrics.{name}", where)
        scale = spec.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise ConfigError(f"{where}: metrics.{name}.scale must be a number, got {scale!r}")
        direction = _choice(spec.get("direction", "maximize"), ("maximize", "minimize"),
                            f"metrics.{name}.direction", where)  # fmt: skip
        metrics[name] = (float(scale), direction)
    if not metrics:
        raise ConfigError(f"{where}: [search.strategy.metrics] names no metric")
    return metrics


def _table(value: Any, name: str, where: str) -> dict[str, Any]:
    if value is None:
        raise ConfigError(f"{where}: [{name}] is missing")
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {name} must be a table, got {value!r}")
    return dict(value)


def _known(table: Mapping[str, Any], keys: tuple[str, ...], name: str, where: str) -> None:
    for key in table:
        if key not in keys:
            raise ConfigError(f"{where}: unknown key {name}.{key}{did_you_mean(key, keys)}")


def _choice(value: Any, choices: tuple[str, ...], name: str, where: str) -> str:
    return check_choice(where, name, value, choices)


def _strings(value: Any, name: str, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: {name} must be a list of strings, got {value!r}")
    return value


def _positive_int(value: Any, name: str, where: str) -> int:
    return check_positive_int(where, name, value)


def _bool(value: Any, name: str, where: str) -> bool:
    return check_flag(where, name, value)


__all__ = ["METRICS", "SAMPLERS", "SearchConfig", "parse_search"]
