"""MASE-style per-node quantize configs -> :class:`RoleFormats`, validated before anything changes.

A config is a flat dict: ``name`` (the format; None / "NA" leaves the node in float), then one key per
operand parameter, ``<role>_<parameter>`` (``data_in_width``, ``weight_frac_width``, ``bias_block_size``).
Which roles an op must and may have is :data:`OP_ROLES`. lowbit additions: ``<role>_name`` gives one role
a format of its own ("NA": leave that role in float), any format parameter works per role (e.g.
``weight_rounding``), ``bypass`` runs the op in float. MASE keys without a lowbit parameter are mapped:
``floor = true`` -> rounding "down" for every role; ``binary_training`` (MASE's spelling; also
``weight_binary_training``) and ``data_in_residual_sign`` (binary_residual) and ``<role>_frac_width`` of
ternary / binary are accepted for compatibility and change nothing; ``<role>_width = 32`` for binary /
ternary / binary_residual leaves that role in float (MASE's idiom). A format parameter without an operand
prefix (``stochastic = true``) applies to every role of that format (see docs/mase-compatibility.md).

Shared configs (``shared=True``: the ``default`` config, and regex entries, which reach many ops) follow
MASE's parser: each op takes the operands MASE gives it (:data:`MASE_OP_ROLES`) and ignores the other
operand keys, which :func:`read_node_config` reports in ``unused``. A config that names one op type or one
node is strict: an operand key the op does not have is an error. A key that no op knows (a typo) is an
error everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lowbit.errors import ConfigError, LowbitError, did_you_mean
from lowbit.formats import get_format
from lowbit.nn.accumulate import build_accumulator
from lowbit.nn.roles import ACCUMULATOR_ROLE, GRADIENT_OF, GRADIENT_ROLES, ROLES, RoleFormats

# mase_op -> (required roles, optional roles); the training roles (gradients, accumulator) are added below
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
# training arithmetic (docs/training-arithmetic.md): a gradient role per operand, an accumulator per GEMM
_GEMM_OPS = ("linear", "conv1d", "conv2d", "matmul", "bmm")
for _op, (_required, _optional) in list(OP_ROLES.items()):
    _operands = (*_required, *_optional, "data_out")
    _gradients = tuple(GRADIENT_OF[r] for r in ROLES if r in _operands)
    OP_ROLES[_op] = (_required, (*_optional, *_gradients, *((ACCUMULATOR_ROLE,) if _op in _GEMM_OPS else ())))
_TRAINING_ROLES = (*GRADIENT_ROLES, ACCUMULATOR_ROLE)  # lowbit's own: a shared config reaches them too
QUANTIZABLE_OPS: tuple[str, ...] = tuple(OP_ROLES)
# The operands MASE's parser reads for each op (its required + optional entries); a shared config reaches
# only these. lowbit's extra operands (a ReLU's data_out, a LayerNorm's weight) need a config that names
# the op or the node. Ops MASE cannot quantize take all of their lowbit operands.
MASE_OP_ROLES: dict[str, tuple[str, ...]] = {
    "linear": ("data_in", "weight", "bias", "data_out"),
    "conv1d": ("data_in", "weight", "bias"),
    "conv2d": ("data_in", "weight", "bias", "data_out"),
    "matmul": ("data_in", "weight"),
    "bmm": ("data_in", "weight"),
    "add": ("data_in",), "sub": ("data_in",), "mul": ("data_in",),
    "relu": ("data_in",), "gelu": ("data_in",), "layer_norm": ("data_in",),
    "batch_norm2d": ("data_in", "weight", "bias"),
}  # fmt: skip

_NONE_STRINGS = {"na", "none", ""}
# Keys taken at the top level of a config (not per role).
_TOP_KEYS = ("name", "bypass", "floor", "seed")
# MASE keys without an operand prefix that lowbit accepts and ignores (binary_residual / BinaryScaling's
# training switch: lowbit keeps the latent float weight and binarises it in every forward).
_IGNORED_TOP_KEYS = ("binary_training",)
# MASE keys that lowbit accepts and ignores, per role: {role: {parameter: why}}.
_COMPAT_KEYS = {"weight": {"binary_training"}, "data_in": {"residual_sign"}}
# Formats whose width is fixed (1 or 2 bits): MASE's configs write ``<role>_width = 32`` for "this role
# stays in float" (its binary / ternary layers keep data_in and bias in float whatever the config says).
_FLOAT_WIDTH = 32
_FIXED_WIDTH_FORMATS = {"binary", "binary_residual", "ternary"}
# Keys MASE configs carry for formats that have no such parameter; MASE's parser drops them, so do we (seed
# 002's ternary ReLU config has ``data_in_frac_width = 0``).
_IGNORED_FORMAT_KEYS = {"ternary": {"frac_width"}, "binary": {"frac_width"}}
# Formats with a ``signed`` parameter that MASE quantizes unsigned at a ReLU's input.
_UNSIGNED_AT_RELU = {"integer", "fixed"}


class ConfigWarning(UserWarning):
    """A config entry that is legal but never used (e.g. a node name in a by-type config)."""


@dataclass(frozen=True)
class NodeConfig:
    """One node's parsed config: its formats (None: float) and the keys it did not use, with the reason."""

    formats: RoleFormats | None
    unused: dict[str, str] = field(default_factory=dict)


def is_none(value: Any) -> bool:
    """MASE's "leave in float" markers: None and the TOML string "NA"."""
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE_STRINGS)


def parse_node_config(op: str, config: Mapping[str, Any], where: str = "node", *,
                      shared: bool = False) -> RoleFormats | None:  # fmt: skip
    """Validate one node's config and build its formats; None when the config leaves the node in float.

    ``where`` names the node in error messages; ``shared`` says the config reaches many ops (MASE's
    ``default``), so operand keys of other ops are ignored instead of refused. Raises ConfigError naming
    the node, the key and the nearest valid key for an unknown op, an unknown key, a missing required
    role or a bad value.
    """
    return read_node_config(op, config, where, shared=shared).formats


def read_node_config(op: str, config: Mapping[str, Any], where: str = "node", *, shared: bool = False) -> NodeConfig:
    """:func:`parse_node_config` plus the keys this op did not use (only a shared config has any)."""
    if op not in OP_ROLES:
        raise ConfigError(f"{where}: op {op!r} cannot be quantized{did_you_mean(op, OP_ROLES)}; "
                          f"quantizable ops: {', '.join(QUANTIZABLE_OPS)}")  # fmt: skip
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: a quantize config must be a table/dict, got {type(config).__name__}")
    if "name" not in config:
        raise ConfigError(f"{where}: config has no 'name' key (the format name, or \"NA\" to leave it in float)")
    if is_none(config["name"]):
        return NodeConfig(None)
    default_name = _format_name(config["name"], where, "name")
    required, optional = OP_ROLES[op]
    roles = required + optional
    if shared and op in MASE_OP_ROLES:
        roles = tuple(role for role in roles if role in MASE_OP_ROLES[op] or role in _TRAINING_ROLES)
    grouped, common, unused = _group_by_role(op, config, roles, default_name, shared, where)
    if not grouped and "width" not in get_format(default_name).parameter_names():
        # {"name": "mxfp4_e2m1"} alone: that format with its defaults for every required operand (formats
        # with a width, as in MASE, still need each operand's width)
        grouped = {role: {} for role in required}
    for role in required:
        if role not in grouped:
            example = f"{role}_width" if "width" in get_format(default_name).parameter_names() else f"{role}_name"
            raise ConfigError(f"{where}: {op} config is missing the {role!r} operand (e.g. key {example!r}); "
                              f"required operands: {', '.join(required)}")  # fmt: skip
    floor = _flag(config, "floor", where)
    specs = {role: _build_role(op, role, {**_common_for(role, common, params, default_name), **params},
                               default_name, floor, where) for role, params in grouped.items()}  # fmt: skip
    formats = RoleFormats(**specs, bypass=_flag(config, "bypass", where), seed=_seed(config, where))
    return NodeConfig(formats, unused)


def _seed(config: Mapping[str, Any], where: str) -> int | None:
    """``seed``: the seed of stochastic rounding in the backward pass (None: torch's global generator)."""
    value = config.get("seed")
    if is_none(value):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: 'seed' must be an integer, got {value!r}")
    return value


def _common_for(role: str, common: dict[str, Any], params: dict[str, Any], default_name: str) -> dict[str, Any]:
    """Unprefixed parameters reach a role that uses the config's own format (not one with ``<role>_name``)."""
    name = params.get("name")
    if name is not None and (is_none(name) or _format_name(name, role, f"{role}_name") != default_name):
        return {}
    return common


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


def _group_by_role(op: str, config: Mapping[str, Any], roles: tuple[str, ...], default_name: str, shared: bool,
                   where: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, str]]:  # fmt: skip
    """``({role: {parameter: value}}, {unprefixed parameter: value}, {unused key: why})`` from the flat keys.

    A key of an operand this op does not take is unused in a shared config and an error otherwise; a key
    of no operand and no parameter of the format raises with the nearest valid key.
    """
    grouped: dict[str, dict[str, Any]] = {}
    common: dict[str, Any] = {}
    unused: dict[str, str] = {}
    parameters = get_format(default_name).parameter_names()
    for key, value in config.items():
        if key in _TOP_KEYS or key in _IGNORED_TOP_KEYS:
            continue
        role = _role_of(key, _known_roles())
        if role in roles:
            grouped.setdefault(role, {})[key[len(role) + 1 :]] = value
        elif role is not None and shared:
            unused[key] = _unused_reason(op, role)
        elif role is None and key in parameters:
            common[key] = value
        else:
            _unknown_key(op, key, roles, default_name, where)
    return grouped, common, unused


def _known_roles() -> tuple[str, ...]:
    """Every operand role some op has (longest first, so that prefixes cannot shadow longer roles)."""
    roles = {*ROLES, *(role for required, optional in OP_ROLES.values() for role in (*required, *optional))}
    return tuple(sorted(roles, key=len, reverse=True))


def _role_of(key: str, roles: tuple[str, ...]) -> str | None:
    return next((role for role in roles if key.startswith(f"{role}_")), None)


def _unused_reason(op: str, role: str) -> str:
    required, optional = OP_ROLES[op]
    if role in required + optional:
        return f"a shared config gives a {op} no {role} operand (as MASE); name the op or node to quantize it"
    return f"a {op} has no {role} operand"


def _valid_keys(roles: tuple[str, ...], default_name: str) -> list[str]:
    parameters = ["name", *get_format(default_name).parameter_names()]
    return [*_TOP_KEYS, *_IGNORED_TOP_KEYS, *(f"{role}_{p}" for role in roles for p in parameters)]


def _unknown_key(op: str, key: str, roles: tuple[str, ...], default_name: str, where: str) -> None:
    hint = did_you_mean(key, _valid_keys(roles, default_name))
    other = [r for r in ROLES if r not in roles and key.startswith(f"{r}_")]
    reason = f"a {op} has no {other[0]!r} operand" if other else "not a key of this config"
    raise ConfigError(f"{where}: unknown key {key!r} ({reason}){hint}; operands of {op}: {', '.join(roles)}")


def _build_role(op: str, role: str, params: dict[str, Any], default_name: str, floor: bool, where: str):
    """The format of one role, or None when ``<role>_name`` is "NA"."""
    params = dict(params)
    if role == ACCUMULATOR_ROLE:
        if is_none(params.get("name", default_name)):
            return None
        try:
            return build_accumulator({"name": default_name, **params})
        except LowbitError as error:
            raise ConfigError(f"{where}: {error}") from None
    floor = floor and role not in GRADIENT_ROLES  # MASE's floor is a forward-pass setting
    name = default_name
    if "name" in params:
        raw = params.pop("name")
        if is_none(raw):
            return None
        name = _format_name(raw, where, f"{role}_name")
    if name in _FIXED_WIDTH_FORMATS and params.get("width") == _FLOAT_WIDTH:
        return None
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
