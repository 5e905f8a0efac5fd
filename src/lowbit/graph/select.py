"""Which layers a quantizing door reaches, and which config applies to each: the one selector.

:func:`select_layers` gives the candidates every door starts from (the layers a quantized module exists
for, by op, minus ``skip``: regexes fully matched against qualified names); recipes, ``lowbit.ptq``, the
search and the module-swap pass all take their targets from it. :class:`Selector` then resolves MASE's
pass_args over those candidates: ``by`` = "type" / "name" / "regex_name".

Shared by the graph pass (keys are mase_op names, fx node names or regexes over node names) and the
module-swap pass (keys are mase_op names, qualified module names or regexes over them). pass_args are
read, never changed; every problem is found before anything is rewritten.

The ``default`` config and regex entries are *shared*: they reach ops of different kinds, so (as MASE's
parser does) each op takes its own operand keys and the others are reported as unused, not refused. A
by-type key that is a node name (MASE never uses it: its by-type lookup reads op names only) gives a
:class:`~lowbit.nn.config.ConfigWarning`, not an error; a key that is neither an op nor a name is a typo.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from lowbit._model import skip_patterns
from lowbit.errors import ConfigError, did_you_mean
from lowbit.graph.mase_ops import _classify_module
from lowbit.nn.config import OP_ROLES, QUANTIZABLE_OPS, ConfigWarning, is_none
from lowbit.nn.modules import MODULE_FOR_OP, QuantModule

BY_MODES = ("type", "name", "regex_name")
# Top-level keys that are not selectors. "report" is accepted (MASE's TOML has it) and does nothing: the
# summary is its own pass.
_RESERVED = ("by", "default", "report")


def select_layers(root: nn.Module, ops: Iterable[str] | None = None, skip: Any = None, *,
                  exact: bool = False) -> dict[str, tuple[nn.Module, str]]:  # fmt: skip
    """name -> (module, mase op) of every layer of ``root`` of ``ops`` (every quantizable op when None) that
    no ``skip`` regex fully matches. ``exact`` keeps only layers whose class is the float class itself (the
    real recipes: a subclass may compute something else); otherwise quantized modules and subclasses that do
    not override ``forward`` count too."""
    wanted = None if ops is None else tuple(ops)
    for op in wanted or ():
        if op not in OP_ROLES:
            raise ConfigError(f"unknown op {op!r}{did_you_mean(op, OP_ROLES)}; ops: {', '.join(OP_ROLES)}")
    patterns = skip_patterns(skip)
    return {name: (module, op) for name, module, op in swappable_modules(root)
            if (wanted is None or op in wanted) and not any(pattern.fullmatch(name) for pattern in patterns)
            and (not exact or type(module) is MODULE_FOR_OP[op].float_class)}  # fmt: skip


def swappable_modules(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(qualified name, module, mase_op) of every module a quantized module exists for."""
    found = []
    for name, module in model.named_modules():
        if not name:
            continue
        op = _classify_module(module).mase_op
        if op in MODULE_FOR_OP and isinstance(module, MODULE_FOR_OP[op].float_class):
            if isinstance(module, QuantModule) or type(module) is MODULE_FOR_OP[op].float_class or _plain(module):
                found.append((name, module, op))
    return found


def _plain(module: nn.Module) -> bool:
    """A subclass of a torch module that does not override ``forward`` computes the same op: swappable."""
    for cls in type(module).__mro__:
        if "forward" in vars(cls):
            return cls.__module__.startswith("torch.nn")
    return False


class Selector:
    """Resolved pass_args: ``config_for(op, name)`` gives the config dict for one candidate, or None."""

    def __init__(self, pass_args: Mapping[str, Any], names: Iterable[str], what: str) -> None:
        if not isinstance(pass_args, Mapping):
            raise ConfigError(f"pass_args must be a dict, got {type(pass_args).__name__}")
        self.by = _check_by(pass_args)
        self.what = what
        self.default = _entry_config(pass_args, "default") if "default" in pass_args else None
        self.entries = {key: _entry_config(pass_args, key) for key in pass_args if key not in _RESERVED}
        self.patterns = _compile_patterns(self.entries) if self.by == "regex_name" else {}
        self._check_keys(list(names))

    def _check_keys(self, names: list[str]) -> None:
        if self.by == "type":
            valid, kind = list(QUANTIZABLE_OPS), "quantizable op"
        elif self.by == "name":
            valid, kind = names, self.what
        else:
            return
        for key in self.entries:
            if self.by == "type" and key not in valid and _is_a_name(key, names):
                warnings.warn(f"quantize by type: {key!r} is a {self.what.split(' of ')[0]}, not an op, so this config is "
                              f"never used (MASE ignores it too); write by = \"name\" to configure that node",
                              ConfigWarning, stacklevel=4)  # fmt: skip
            elif key not in valid:
                raise ConfigError(f"quantize by {self.by}: {key!r} is not a {kind}{did_you_mean(key, valid)}"
                                  + ("; quantizable ops: " + ", ".join(QUANTIZABLE_OPS) if self.by == "type" else ""))

    def is_shared(self, key: str) -> bool:
        """Whether the config found under ``key`` can reach ops of different kinds (default, regexes)."""
        return key == "default" or self.by == "regex_name"

    def config_for(self, op: str, name: str) -> tuple[str, dict[str, Any] | None]:
        """(which key matched, its config) for a candidate; config None when nothing applies or "NA"."""
        if self.by == "type":
            key = op if op in self.entries else "default"
        elif self.by == "name":
            key = name if name in self.entries else "default"
        else:
            key = next((k for k, pattern in self.patterns.items() if pattern.fullmatch(name)), "default")
        config = self.entries.get(key) if key != "default" else self.default
        if config is None or is_none(config.get("name")):
            return key, None
        return key, config


def _is_a_name(key: str, names: list[str]) -> bool:
    """``key`` names a node / module (module names also in MASE's node spelling, dots as underscores)."""
    return key in names or key in {name.replace(".", "_") for name in names}


def _check_by(pass_args: Mapping[str, Any]) -> str:
    if "by" not in pass_args:
        raise ConfigError(f"pass_args has no 'by' key; legal: {', '.join(BY_MODES)}")
    by = pass_args["by"]
    if by not in BY_MODES:
        raise ConfigError(f"unknown quantize by={by!r}{did_you_mean(str(by), BY_MODES)}; legal: {', '.join(BY_MODES)}")
    return by


def _entry_config(pass_args: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The ``config`` table of one entry (``{"config": {...}}`` as MASE writes it)."""
    entry = pass_args[key]
    if not isinstance(entry, Mapping) or "config" not in entry:
        raise ConfigError(f"pass_args[{key!r}] must be a table with a 'config' key, e.g. "
                          f"{{'config': {{'name': 'integer', ...}}}}, got {entry!r}")  # fmt: skip
    extra = [k for k in entry if k != "config"]
    if extra:
        raise ConfigError(f"pass_args[{key!r}] has unknown key {extra[0]!r}{did_you_mean(extra[0], ['config'])}")
    config = entry["config"]
    if not isinstance(config, Mapping):
        raise ConfigError(f"pass_args[{key!r}]['config'] must be a table, got {type(config).__name__}")
    if "name" not in config:
        raise ConfigError(f"pass_args[{key!r}]['config'] has no 'name' key (a format name, or \"NA\")")
    return dict(config)


def _compile_patterns(entries: Mapping[str, Any]) -> dict[str, re.Pattern[str]]:
    patterns = {}
    for key in entries:
        try:
            patterns[key] = re.compile(key)
        except re.error as error:
            raise ConfigError(f"quantize by regex_name: {key!r} is not a valid regular expression ({error})") from None
    return patterns
