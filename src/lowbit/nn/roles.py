"""Role -> format maps: which number format a quantized op applies to each of its operands.

Every quantized module and function takes one :class:`RoleFormats`. The roles are MASE's operand names:
``data_in`` (the input activations; both operands of add / sub / mul), ``weight`` (parameters, and the
second operand of matmul / bmm), ``bias`` and ``data_out`` (the op's result). A role without a format is
left in float. ``bypass`` keeps the formats for reporting but runs the op in float (MASE's ``bypass``).

A RoleFormats also has a plain-dict form (:meth:`to_dict` / :meth:`from_dict`) of strings, numbers, bools
and lists only: it is what a quantized ``call_function`` node carries as its ``config`` keyword (so fx can
print it into the generated code and a saved graph can store it as JSON).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import torch

from lowbit.errors import ConfigError
from lowbit.formats import FormatSpec, resolve

ROLES: tuple[str, ...] = ("data_in", "weight", "bias", "data_out")

# MASE's "precision" entries per scheme (metadata); other formats report their parameters that shape the
# value set.
_MASE_PRECISION = {
    "integer": ("width", "frac_width"),
    "fixed": ("width", "frac_width"),
    "binary": ("width", "stochastic", "bipolar"),
    "binary_residual": ("width", "levels"),
    "ternary": ("width", "scaling_factor", "mean", "median", "max"),
    "minifloat_ieee": ("width", "exponent_width", "exponent_bias"),
    "minifloat_denorm": ("width", "exponent_width", "exponent_bias"),
    "log": ("width", "exponent_bias"),
    "block_fp": ("width", "exponent_width", "exponent_bias", "block_size"),
    "block_minifloat": ("width", "exponent_width", "exponent_bias_width", "block_size"),
    "block_log": ("width", "exponent_bias_width", "block_size"),
}


@dataclasses.dataclass(frozen=True)
class RoleFormats:
    """The format of each operand role of one quantized op (None: that role stays float)."""

    data_in: FormatSpec | None = None
    weight: FormatSpec | None = None
    bias: FormatSpec | None = None
    data_out: FormatSpec | None = None
    bypass: bool = False

    def __post_init__(self) -> None:
        for role in ROLES:
            value = getattr(self, role)
            if value is not None and not isinstance(value, FormatSpec):
                raise ConfigError(f"role {role!r} needs a format spec or None, got {type(value).__name__}")

    # ---- applying ------------------------------------------------------------------------------------
    def apply(self, role: str, value: Any) -> Any:
        """Fake-quantize ``value`` with the role's format (straight-through gradient); anything that is not
        a floating-point tensor, a role without a format, and bypassed ops pass through unchanged."""
        spec = getattr(self, role)
        if spec is None or self.bypass or not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        return spec(value)

    # ---- description ---------------------------------------------------------------------------------
    def active(self) -> dict[str, FormatSpec]:
        """The roles that have a format."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role) is not None}

    def describe(self) -> str:
        text = ", ".join(f"{role}={spec.describe()}" for role, spec in self.active().items()) or "float"
        return f"bypass({text})" if self.bypass else text

    def precision(self, role: str) -> list[Any]:
        """MASE-style precision list of a role (e.g. integer -> [width, frac_width]); [32] when float."""
        spec = getattr(self, role)
        if spec is None:
            return [32]
        fields = _MASE_PRECISION.get(spec.format_name)
        if fields is None:
            return [spec.bits]
        return [_plain(getattr(spec, name)) for name in fields]

    # ---- plain-dict form -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """``{role: {"name": ..., param: value}, "bypass": bool}`` with JSON-able values only."""
        out: dict[str, Any] = {}
        for role, spec in self.active().items():
            out[role] = {"name": spec.format_name, **{k: _plain(v) for k, v in spec.params().items()}}
        if self.bypass:
            out["bypass"] = True
        return out

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> RoleFormats:
        """The inverse of :meth:`to_dict` (cached: quantized functions call it on every forward)."""
        if isinstance(config, RoleFormats):
            return config
        if not isinstance(config, dict):
            raise ConfigError(f"a quantized op's config must be a dict, got {type(config).__name__}")
        return _from_json(json.dumps(config, sort_keys=True))


@functools.lru_cache(maxsize=1024)
def _from_json(text: str) -> RoleFormats:
    config = json.loads(text)
    unknown = set(config) - set(ROLES) - {"bypass"}
    if unknown:
        raise ConfigError(f"unknown role(s) {sorted(unknown)} in a quantized op's config; roles: {', '.join(ROLES)}")
    specs = {}
    for role in ROLES:
        if role in config:
            params = dict(config[role])
            specs[role] = resolve(params.pop("name"), **params)
    return RoleFormats(**specs, bypass=bool(config.get("bypass", False)))


def _plain(value: Any) -> Any:
    """Tuples become lists (JSON / TOML have no tuples); everything else is already plain."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value
