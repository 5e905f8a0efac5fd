"""MASE-style per-node quantize configs -> :class:`RoleFormats`, validated before anything changes.

A config is a flat dict: ``name`` (the format; None / "NA" leaves the node in float), then one key per
operand parameter, ``<role>_<parameter>`` (``data_in_width``, ``weight_frac_width``, ``bias_block_size``).
Which roles an op must and may have is :data:`OP_ROLES`. lowbit additions: ``<role>_name`` gives one role
a format of its own ("NA": leave that role in float), any format parameter works per role (e.g.
``weight_rounding``), ``bypass`` runs the op in float. MASE keys without a lowbit parameter are mapped:
``floor = true`` -> rounding "down" for every role; ``weight_binary_training`` and ``data_in_residual_sign``
(binary_residual) and ``<role>_frac_width`` of ternary / binary are accepted for compatibility and change
nothing (see docs/mase-compatibility.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowbit.errors import ConfigError, LowbitError, did_you_mean
from lowbit.formats import get_format
from lowbit.nn.roles import ROLES, RoleFormats

# mase_op -> (required roles, optional roles)
OP_ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("data_in", "weight"), ("bias", "data_out")),
    "conv1d": (("data_in", "weight"), ("bias", "data_out")),
    "conv2d": (("data_in", "weight"), ("bias", "data_out")),
    "matmul": (("data_in", "weight"), ("data_out",)),
    "bmm": (("data_in", "weight"), ("data_out",)),
    "add": (("data_in",), ("data_out",)),
    "sub": (("data_in",), ("data_out",)),
    "mul": (("data_in",), ("data_out",)),
    "relu": (("data_in",), ("data_out",)),
    "gelu": (("data_in",), ("data_out",)),
    "softmax": (("data_in",), ("data_out",)),
    "layer_norm": (("data_in",), ("weight", "bias", "data_out")),
    "batch_norm2d": (("data_in",), ("weight", "bias", "data_out")),
    "embedding": (("weight",), ("data_out",)),
}
QUANTIZABLE_OPS: tuple[str, ...] = tuple(OP_ROLES)

_NONE_STRINGS = {"na", "none", ""}
# Keys taken at the top level of a config (not per role).
_TOP_KEYS = ("name", "bypass", "floor")
# MASE keys that lowbit accepts and ignores, per role: {role: {parameter: why}}.
_COMPAT_KEYS = {"weight": {"binary_training"}, "data_in": {"residual_sign"}}
# Keys MASE configs carry for formats that have no such parameter; MASE's parser drops them, so do we (seed
# 002's ternary ReLU config has ``data_in_frac_width = 0``).
_IGNORED_FORMAT_KEYS = {"ternary": {"frac_width"}, "binary": {"frac_width"}}
# Formats with a ``signed`` parameter that MASE quantizes unsigned at a ReLU's input.
_UNSIGNED_AT_RELU = {"integer", "fixed"}


def is_none(value: Any) -> bool:
    """MASE's "leave in float" markers: None and the TOML string "NA"."""
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE_STRINGS)


def parse_node_config(op: str, config: Mapping[str, Any], where: str = "node") -> RoleFormats | None:
    """Validate one node's config and build its formats; None when the config leaves the node in float.

    ``where`` names the node in error messages. Raises ConfigError naming the node, the key and the
    nearest valid key for an unknown op, an unknown key, a missing required role or a bad value.
    """
    if op not in OP_ROLES:
        raise ConfigError(f"{where}: op {op!r} cannot be quantized{did_you_mean(op, OP_ROLES)}; "
                          f"quantizable ops: {', '.join(QUANTIZABLE_OPS)}")  # fmt: skip
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: a quantize config must be a table/dict, got {type(config).__name__}")
    if "name" not in config:
        raise ConfigError(f"{where}: config has no 'name' key (the format name, or \"NA\" to leave it in float)")
    if is_none(config["name"]):
        return None
    default_name = _format_name(config["name"], where, "name")
    required, optional = OP_ROLES[op]
    grouped = _group_by_role(op, config, required + optional, default_name, where)
    for role in required:
        if role not in grouped:
            example = f"{role}_width" if "width" in get_format(default_name).parameter_names() else f"{role}_name"
            raise ConfigError(f"{where}: {op} config is missing the {role!r} operand (e.g. key {example!r}); "
                              f"required operands: {', '.join(required)}")  # fmt: skip
    floor = _flag(config, "floor", where)
    specs = {role: _build_role(op, role, params, default_name, floor, where) for role, params in grouped.items()}
    return RoleFormats(**specs, bypass=_flag(config, "bypass", where))


def _format_name(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key!r} must be a format name string, got {value!r}")
    try:
        return get_format(value).format_name
    except LowbitError as error:
        raise ConfigError(f"{where}: {key}={value!r}: {error}") from None


def _flag(config: Mapping[str, Any], key: str, where: str) -> bool:
    value = config.get(key, False)
    if is_none(value):
        return False
    if value not in (True, False, 0, 1):
        raise ConfigError(f"{where}: {key!r} must be true or false, got {value!r}")
    return bool(value)


def _group_by_role(op: str, config: Mapping[str, Any], roles: tuple[str, ...], default_name: str,
                   where: str) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``{role: {parameter: value}}`` from the flat keys; unknown keys raise with the nearest valid key."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in config.items():
        if key in _TOP_KEYS:
            continue
        role = next((r for r in sorted(roles, key=len, reverse=True) if key.startswith(f"{r}_")), None)
        if role is None:
            _unknown_key(op, key, roles, default_name, where)
        grouped.setdefault(role, {})[key[len(role) + 1 :]] = value
    return grouped


def _valid_keys(roles: tuple[str, ...], default_name: str) -> list[str]:
    parameters = ["name", *get_format(default_name).parameter_names()]
    return [*_TOP_KEYS, *(f"{role}_{p}" for role in roles for p in parameters)]


def _unknown_key(op: str, key: str, roles: tuple[str, ...], default_name: str, where: str) -> None:
    hint = did_you_mean(key, _valid_keys(roles, default_name))
    other = [r for r in ROLES if r not in roles and key.startswith(f"{r}_")]
    reason = f"a {op} has no {other[0]!r} operand" if other else "not a key of this config"
    raise ConfigError(f"{where}: unknown key {key!r} ({reason}){hint}; operands of {op}: {', '.join(roles)}")


def _build_role(op: str, role: str, params: dict[str, Any], default_name: str, floor: bool, where: str):
    """The format of one role, or None when ``<role>_name`` is "NA"."""
    params = dict(params)
    name = default_name
    if "name" in params:
        raw = params.pop("name")
        if is_none(raw):
            return None
        name = _format_name(raw, where, f"{role}_name")
    for ignored in (*_COMPAT_KEYS.get(role, ()), *_IGNORED_FORMAT_KEYS.get(name, ())):
        params.pop(ignored, None)
    cls = get_format(name)
    known = cls.parameter_names()
    for parameter in params:
        if parameter not in known:
            hint = did_you_mean(f"{role}_{parameter}", [f"{role}_{p}" for p in known])
            raise ConfigError(f"{where}: unknown key {role + '_' + parameter!r} for format {name!r}{hint}; "
                              f"parameters of {name}: {', '.join(known)}")  # fmt: skip
    if floor and "rounding" in known:
        params.setdefault("rounding", "down")
    if op == "relu" and role == "data_in" and name in _UNSIGNED_AT_RELU:
        params.setdefault("signed", False)
    try:
        return cls.create(**params)
    except LowbitError as error:
        raise ConfigError(f"{where}: {role} operand: {error}") from None
