"""Run options shared by the ``lowbit`` commands and the TOML configs, and their precedence.

An option has one name, used as the TOML key (``batch_size = 64``) and, with dashes, as the command-line
flag (``--batch-size 64``). The effective value is the command line's if given there, else the config's,
else the default (MASE's rule: default < TOML < command line). :func:`merge_options` also says where each
value came from, so the effective configuration can be printed as a table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lowbit.errors import ConfigError


@dataclass(frozen=True)
class Option:
    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()  # other TOML spellings (MASE's names)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("model", str, None, "built-in model: toy, digits_mlp, digits_cnn, minilm, smollm2"),
    Option("dataset", str, None, "built-in dataset: toy_tiny, digits, sentences, wikipedia"),
    Option("task", str, "classification", "what the model does", ("classification", "cls", "embedding", "language_modeling")),
    Option("load", str, None, "checkpoint to start from", aliases=("load_name",)),
    Option("load_type", str, None, "checkpoint kind (default: from the path)", ("pt", "pl", "lowbit")),
    Option("batch_size", int, 128, "batch size for training, evaluation and calibration (causal LM: 1 window)"),
    Option("windows", int, 16, "causal LM: test windows whose perplexity lowbit test reports"),
    Option("max_epochs", int, 20, "training epochs"),
    Option("max_steps", int, -1, "stop training after this many steps (-1: no limit)"),
    Option("learning_rate", float, 1e-3, "optimizer learning rate"),
    Option("weight_decay", float, 0.0, "optimizer weight decay"),
    Option("training_optimizer", str, "adam", "optimizer", ("adam", "adamw", "sgd")),
    Option("seed", int, 0, "random seed (data order, initial weights)"),
    Option("accelerator", str, "auto", "Lightning accelerator", ("auto", "cpu", "gpu", "cuda", "mps")),
    Option("devices", str, "1", "devices per node (a count, or 'auto')", aliases=("num_devices",)),
    Option("num_nodes", int, 1, "machines taking part in training"),
    Option("strategy", str, "auto", "Lightning strategy: auto, ddp, ddp_spawn, ..."),
    Option("num_workers", int, 0, "data-loader worker processes"),
    Option("project_dir", str, "lowbit_output", "where outputs go"),
    Option("project", str, None, "output folder name (default: <model>_<task>_<dataset>)"),
    Option("progress", bool, True, "show progress bars"),
    Option("resume", bool, False, "train: continue the project's run from its last.ckpt"),
    Option("overwrite", bool, False, "train: start again in a project holding checkpoints (best.ckpt kept)"),
    Option("warmup", bool, False, "compile the simulated layers' quantizer kernels before test / report measure"),
    # MASE's trainer options (its defaults differ where noted in docs/mase-compatibility.md)
    Option("log_every_n_steps", int, 1, "Lightning: log metrics every n training steps"),
    Option("accumulate_grad_batches", int, 1, "Lightning: batches whose gradients add up before a step"),
    Option("trainer_precision", str, "32", "Lightning precision", ("32", "64", "16-mixed", "bf16-mixed", "bf16")),
    Option("t_max", int, None, "cosine learning-rate schedule: epochs of one half period (default: max_epochs)"),
    Option("eta_min", float, 0.0, "cosine learning-rate schedule: the lowest learning rate"),
)
OPTION_BY_NAME = {option.name: option for option in OPTIONS}
ALIAS_TO_NAME = {alias: option.name for option in OPTIONS for alias in option.aliases}


def option_defaults() -> dict[str, Any]:
    return {option.name: option.default for option in OPTIONS}


def check_option_value(name: str, value: Any, where: str) -> Any:
    """``value`` converted to the option's type; ConfigError naming ``where`` if it cannot be."""
    option = OPTION_BY_NAME[name]
    if value is None:
        return None
    converted = _convert(option, value)
    if converted is None:
        raise ConfigError(f"{where}: {name} must be {_kind_name(option.kind)}, got {value!r}")
    if option.choices is not None and converted not in option.choices:
        raise ConfigError(f"{where}: {name} = {value!r} is not one of {', '.join(option.choices)}")
    if option.kind is int and name in ("batch_size", "max_epochs", "num_nodes", "log_every_n_steps",
                                       "accumulate_grad_batches", "t_max", "windows") and converted < 1:
        raise ConfigError(f"{where}: {name} must be at least 1, got {value!r}")
    if name == "devices" and not (converted == "auto" or (converted.isdigit() and int(converted) > 0)):
        raise ConfigError(f"{where}: devices must be a positive count or 'auto', got {value!r}")
    _check_range(name, converted, value, where)
    return converted


_AT_LEAST_ZERO = ("num_workers", "weight_decay", "eta_min")
_POSITIVE = ("learning_rate",)


def _check_range(name: str, converted: Any, value: Any, where: str) -> None:
    """Numbers that must be finite and in range (a NaN learning rate trains nothing, silently)."""
    if isinstance(converted, float) and not math.isfinite(converted):
        raise ConfigError(f"{where}: {name} must be a finite number, got {value!r}")
    if name in _POSITIVE and converted <= 0:
        raise ConfigError(f"{where}: {name} must be greater than 0, got {value!r}")
    if name in _AT_LEAST_ZERO and converted < 0:
        raise ConfigError(f"{where}: {name} must be at least 0, got {value!r}")
    if name == "max_steps" and converted != -1 and converted < 1:
        raise ConfigError(f"{where}: max_steps must be -1 (no limit) or at least 1, got {value!r}")


def _convert(option: Option, value: Any) -> Any:
    if option.kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if option.kind is str:
        return str(value) if isinstance(value, (str, int)) else None
    if option.kind is int:
        return value if isinstance(value, int) else None
    if option.kind is float:
        return float(value) if isinstance(value, (int, float)) else None
    return None


def _kind_name(kind: type) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[kind]


@dataclass
class EffectiveOptions:
    """The merged options plus, per option, the default / config / command-line values seen."""

    values: dict[str, Any]
    from_config: dict[str, Any]
    from_command_line: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def source(self, name: str) -> str:
        if name in self.from_command_line:
            return "command line"
        return "config" if name in self.from_config else "default"

    def rows(self) -> list[dict[str, Any]]:
        return [{"option": o.name, "default": o.default, "config": self.from_config.get(o.name, ""),
                 "command line": self.from_command_line.get(o.name, ""), "effective": self.values[o.name]}
                for o in OPTIONS]  # fmt: skip


def merge_options(from_config: Mapping[str, Any], from_command_line: Mapping[str, Any]) -> EffectiveOptions:
    """default < config < command line; both inputs already checked with :func:`check_option_value`."""
    values = option_defaults()
    values.update(from_config)
    values.update(from_command_line)
    values["task"] = {"cls": "classification"}.get(values["task"], values["task"])
    return EffectiveOptions(values, dict(from_config), dict(from_command_line))


__all__ = ["ALIAS_TO_NAME", "EffectiveOptions", "OPTIONS", "OPTION_BY_NAME", "Option", "check_option_value",
           "merge_options", "option_defaults"]  # fmt: skip
