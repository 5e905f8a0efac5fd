"""The search space: one decision per searched layer (or per op type), each a few categorical parameters.

Seed tables (``[search.search_space.seed.<key>]``; ``<key>`` is ``default``, a layer name (``by = "name"``),
an op type (``by = "type"``: all layers of that type share one decision) or a regular expression matched
against whole layer names (``by = "regex"``, first match wins, one decision per layer)). With ``setup.share =
true`` the layers one seed key reaches share one decision (per op type) instead of one each. Each seed table
has exactly one of:

- ``config`` (MASE): a flat quantize config whose values are lists of choices (a scalar is fixed); each key
  is one categorical parameter, as MASE samples it.
- ``roles`` (lowbit): per operand role, ``name = [format names]`` ("NA" = leave the role float) and, per
  format, a table of parameter lists: ``[...roles.weight.integer] width = [4, 8]``. Every combination of a
  format and its parameters is one choice for that role.
- ``choices`` (lowbit): whole role -> format configurations by name: the built-in presets of
  :data:`PRESETS` or ``[search.search_space.presets.<name>]`` tables (role -> format tables).

Layers matching ``skip`` (regexes over whole names) and ops outside ``setup.ops`` stay float.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from lowbit.config.toml_config import na_to_none
from lowbit.errors import ConfigError, LowbitError
from lowbit.graph.select import select_layers
from lowbit.nn.config import OP_ROLES, is_none, parse_node_config
from lowbit.nn.roles import RoleFormats
from lowbit.search.config import SearchConfig

_INT8_ACT = {"name": "affine", "bits": 8}
# The uniform reference points (and ``choices`` names): weights and inputs of every searched layer. int8
# (symmetric per-channel weights, dynamic per-tensor inputs) and int4_g32 (weight-only, groups of 32) are
# the formats lowbit's real int8-dynamic and int4 kernels compute.
PRESETS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "int8": {"weight": {"name": "affine", "bits": 8, "axis": 0, "symmetric": True}, "data_in": _INT8_ACT},
    "int4_g32": {"weight": {"name": "affine", "bits": 4, "block_size": [1, 32], "symmetric": True}},
    "mxfp8": {"weight": {"name": "mxfp8_e4m3"}, "data_in": {"name": "mxfp8_e4m3"}},
    "mxfp4": {"weight": {"name": "mxfp4_e2m1"}, "data_in": {"name": "mxfp4_e2m1"}},
    "fp8": {"weight": {"name": "e4m3"}, "data_in": {"name": "e4m3"}},
    "ternary": {"weight": {"name": "ternary"}, "data_in": _INT8_ACT},
}
REFERENCE_PRESETS = ("int8", "int4_g32", "mxfp8", "mxfp4", "fp8", "ternary")


@dataclass
class Decision:
    """One sampled unit: ``params`` (name suffix -> choices) turn into the formats of ``layers``."""

    key: str
    op: str
    layers: tuple[str, ...]
    params: dict[str, list[Any]]
    build: Callable[[dict[str, Any]], RoleFormats | None]

    def param_name(self, suffix: str) -> str:
        return f"{self.key}/{suffix}"


class SearchSpace:
    """Decisions over the layers of ``root`` from a :class:`SearchConfig` (checked when built)."""

    def __init__(self, root: nn.Module, config: SearchConfig) -> None:
        self.config = config
        self.layers = {name: op for name, (_, op) in select_layers(root, config.ops, config.skip).items()}
        self.decisions = self._decisions()
        if not self.decisions:
            raise ConfigError(f"the search space is empty: no layer of the ops {list(config.ops)} has a seed "
                              f"entry (layers: {list(self.layers)[:5]})")  # fmt: skip
        self._check_every_choice()

    # ---- building --------------------------------------------------------------------------------------
    def _decisions(self) -> list[Decision]:
        by, seeds = self.config.by, self.config.seeds
        unknown = [key for key in seeds if key != "default" and by == "name" and key not in self.layers]
        if unknown:
            raise ConfigError(f"search seed {unknown[0]!r} names no searched layer; layers: {', '.join(self.layers)}")
        if by == "type":
            groups: dict[str, list[str]] = {}
            for name, op in self.layers.items():
                if op in seeds or "default" in seeds:
                    groups.setdefault(op, []).append(name)
            return [self._decision(op, op, tuple(names), seeds.get(op, seeds.get("default")), op not in seeds)
                    for op, names in groups.items()]  # fmt: skip
        if self.config.share:  # one decision per seed key (and op) for every layer it reaches
            shared: dict[tuple[str, str], list[str]] = {}
            for name, op in self.layers.items():
                key, seed = self._seed_for(name)
                if seed is not None:
                    shared.setdefault((key, op), []).append(name)
            ops_per_key = {key: sum(1 for k, _ in shared if k == key) for key, _ in shared}
            return [self._decision(key if ops_per_key[key] == 1 else f"{key}:{op}", op, tuple(names),
                                   self._seed_for(names[0])[1], True) for (key, op), names in shared.items()]  # fmt: skip
        decisions = []
        for name, op in self.layers.items():
            key, seed = self._seed_for(name)
            if seed is not None:
                decisions.append(self._decision(name, op, (name,), seed, key != name))
        return decisions

    def _seed_for(self, name: str) -> tuple[str | None, dict[str, Any] | None]:
        seeds = self.config.seeds
        if self.config.by == "regex":
            for key, seed in seeds.items():
                if key != "default" and re.fullmatch(key, name):
                    return key, seed
        elif name in seeds:
            return name, seeds[name]
        return ("default", seeds["default"]) if "default" in seeds else (None, None)

    def _decision(self, key: str, op: str, layers: tuple[str, ...], seed: dict[str, Any], shared: bool) -> Decision:
        kinds = [kind for kind in ("config", "roles", "choices") if kind in seed]
        where = f"search seed {key!r}"
        if len(kinds) != 1 or set(seed) - {"config", "roles", "choices"}:
            raise ConfigError(f"{where}: a seed table has exactly one of config, roles, choices; got {sorted(seed)}")
        if kinds[0] == "config":
            return _mase_decision(key, op, layers, seed["config"], shared, where)
        if kinds[0] == "roles":
            return _role_decision(key, op, layers, seed["roles"], where)
        return named_decision(key, op, layers, seed["choices"], self.config.presets, where)

    def _check_every_choice(self) -> None:
        """Build every choice of every parameter once (first choice elsewhere): bad formats fail now."""
        for decision in self.decisions:
            first = {suffix: choices[0] for suffix, choices in decision.params.items()}
            for suffix, choices in decision.params.items():
                for choice in choices:
                    decision.build({**first, suffix: choice})

    # ---- sampling --------------------------------------------------------------------------------------
    def sample(self, trial: Any) -> dict[str, RoleFormats | None]:
        """Layer -> formats (None: float) for one Optuna trial."""
        plan: dict[str, RoleFormats | None] = {}
        for decision in self.decisions:
            chosen = {suffix: trial.suggest_categorical(decision.param_name(suffix), choices)
                      for suffix, choices in decision.params.items()}  # fmt: skip
            formats = decision.build(chosen)
            plan.update({layer: formats for layer in decision.layers})
        return plan

    def grid(self) -> dict[str, list[Any]]:
        return {d.param_name(s): list(c) for d in self.decisions for s, c in d.params.items()}

    def size(self) -> int:
        total = 1
        for choices in self.grid().values():
            total *= len(choices)
        return total

    def preset_params(self, preset: str) -> dict[str, Any] | None:
        """The trial parameters that give every decision ``preset``, if the space has that choice."""
        params = {}
        for decision in self.decisions:
            if list(decision.params) != ["choice"] or preset not in decision.params["choice"]:
                return None
            params[decision.param_name("choice")] = preset
        return params


def _mase_decision(key: str, op: str, layers: tuple[str, ...], table: Any, shared: bool, where: str) -> Decision:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: config must be a table of choice lists")
    params = {name: [na_to_none(v) for v in (value if isinstance(value, list) else [value])]
              for name, value in table.items()}  # fmt: skip
    for name, choices in params.items():
        if not choices:
            raise ConfigError(f"{where}: config.{name} has no choices")

    def build(chosen: dict[str, Any]) -> RoleFormats | None:
        return parse_node_config(op, chosen, f"{where} ({op})", shared=shared)

    return Decision(key, op, layers, params, build)


def role_candidates(role: str, table: Any, where: str) -> dict[str, dict[str, Any] | None]:
    """Label -> format dict (None: float) of every format and parameter combination of one role's table."""
    if not isinstance(table, dict) or "name" not in table:
        raise ConfigError(f"{where}: roles.{role} needs name = [format names]")
    names = table["name"] if isinstance(table["name"], list) else [table["name"]]
    candidates: dict[str, dict[str, Any] | None] = {}
    for name in names:
        if is_none(name):
            candidates["float"] = None
            continue
        params = table.get(name, {})
        if not isinstance(params, dict):
            raise ConfigError(f"{where}: roles.{role}.{name} must be a table of parameter lists")
        lists = {k: (v if isinstance(v, list) and k != "block_size" or _nested(v) else [v]) for k, v in params.items()}
        for combination in itertools.product(*lists.values()):
            fmt = {"name": name, **dict(zip(lists, combination, strict=True))}
            candidates[_label(fmt)] = fmt
    return candidates


def _nested(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, list) for item in value)


def _label(fmt: dict[str, Any]) -> str:
    params = ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in fmt.items() if k != "name")
    return f"{fmt['name']}({params})" if params else fmt["name"]


def _role_decision(key: str, op: str, layers: tuple[str, ...], table: Any, where: str) -> Decision:
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{where}: roles must be a table of [roles.<role>] tables")
    required, optional = OP_ROLES[op]
    roles = {role: role_candidates(role, value, where) for role, value in table.items()
             if role in required + optional}  # fmt: skip
    unknown = [role for role in table if role not in OP_ROLES["linear"][0] + OP_ROLES["linear"][1]]
    if unknown:
        raise ConfigError(f"{where}: unknown role {unknown[0]!r}; roles: {', '.join(required + optional)}")

    def build(chosen: dict[str, Any]) -> RoleFormats | None:
        plain = {role: roles[role][label] for role, label in chosen.items() if roles[role][label] is not None}
        return _formats(op, plain, where)

    return Decision(key, op, layers, {role: list(c) for role, c in roles.items()}, build)


def named_decision(key: str, op: str, layers: tuple[str, ...], names: Any, presets: dict[str, Any],
                    where: str) -> Decision:  # fmt: skip
    table = {**PRESETS, **presets}
    names = names if isinstance(names, list) else [names]
    for name in names:
        if name not in table:
            raise ConfigError(f"{where}: unknown choice {name!r}; presets: {', '.join(table)}")

    def build(chosen: dict[str, Any]) -> RoleFormats | None:
        required, optional = OP_ROLES[op]
        plain = {role: fmt for role, fmt in table[chosen["choice"]].items() if role in required + optional}
        if op not in ("linear", "conv1d", "conv2d"):  # activations-only ops take the preset's input format
            plain = {"data_in": plain["data_in"]} if "data_in" in plain else {}
        return _formats(op, plain, where)

    return Decision(key, op, layers, {"choice": list(names)}, build)


def _formats(op: str, plain: dict[str, Any], where: str) -> RoleFormats | None:
    if not plain:
        return None
    try:
        return RoleFormats.from_dict(na_to_none(plain))
    except LowbitError as error:
        raise ConfigError(f"{where} ({op}): {error}") from None


__all__ = ["PRESETS", "REFERENCE_PRESETS", "Decision", "SearchSpace", "named_decision", "role_candidates"]
