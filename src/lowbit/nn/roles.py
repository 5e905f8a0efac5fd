"""Role -> format maps: which number format a quantized op applies to each of its operands.

Every quantized module and function takes one :class:`RoleFormats`. The roles are MASE's operand names:
``data_in`` (the input activations; both operands of add / sub / mul), ``weight`` (parameters, and the
second operand of matmul / bmm), ``bias`` and ``data_out`` (the op's result). A role without a format is
left in float. ``bypass`` keeps the formats for reporting but runs the op in float (MASE's ``bypass``).

Training arithmetic (docs/training-arithmetic.md): the gradient roles ``grad_data_in``, ``grad_weight``,
``grad_bias`` and ``grad_data_out`` round the backward pass (:mod:`lowbit.nn.gradients`; ``seed`` seeds their
stochastic rounding), and ``accumulator`` (an :class:`~lowbit.nn.accumulate.Accumulator`) rounds the partial
sums of a Linear / Conv / matmul. :meth:`RoleFormats.apply` places the gradient rounding of a role next to its
forward quantizer, so every quantized op rounds its backward pass without code of its own.

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
from lowbit.nn.accumulate import Accumulator, build_accumulator
from lowbit.nn.gradients import GradientStream, round_gradient

ROLES: tuple[str, ...] = ("data_in", "weight", "bias", "data_out")
# the backward-pass role of each operand role
GRADIENT_OF: dict[str, str] = {role: f"grad_{role}" for role in ROLES}
GRADIENT_ROLES: tuple[str, ...] = tuple(GRADIENT_OF.values())
ACCUMULATOR_ROLE = "accumulator"

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
    grad_data_in: FormatSpec | None = None
    grad_weight: FormatSpec | None = None
    grad_bias: FormatSpec | None = None
    grad_data_out: FormatSpec | None = None
    accumulator: Accumulator | None = None
    seed: int | None = None
    # the generators of stochastic gradient rounding (not part of the value: equal configs compare equal)
    stream: GradientStream = dataclasses.field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for role in (*ROLES, *GRADIENT_ROLES):
            value = getattr(self, role)
            if value is not None and not isinstance(value, FormatSpec):
                raise ConfigError(f"role {role!r} needs a format spec or None, got {type(value).__name__}")
        if self.accumulator is not None and not isinstance(self.accumulator, Accumulator):
            raise ConfigError(f"role 'accumulator' needs an Accumulator or None, got {type(self.accumulator).__name__}")
        if self.stream is None:
            object.__setattr__(self, "stream", GradientStream(self.seed))

    # ---- applying ------------------------------------------------------------------------------------
    def apply(self, role: str, value: Any) -> Any:
        """Fake-quantize ``value`` with the role's format (straight-through gradient); anything that is not
        a floating-point tensor, a role without a format, and bypassed ops pass through unchanged."""
        spec = getattr(self, role)
        if self.bypass or not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        gradient = getattr(self, GRADIENT_OF[role]) if role in GRADIENT_OF else None
        if role == "data_out":  # the arriving gradient is rounded before the quantizer passes it back
            return round_gradient(value if spec is None else spec(value), gradient, self.stream)
        value = round_gradient(value, gradient, self.stream)  # rounds what the quantizer passes back
        return value if spec is None else spec(value)

    # ---- description ---------------------------------------------------------------------------------
    def active(self) -> dict[str, FormatSpec]:
        """The roles that have a format."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role) is not None}

    def active_gradients(self) -> dict[str, FormatSpec]:
        """The gradient roles that have a format."""
        return {role: getattr(self, role) for role in GRADIENT_ROLES if getattr(self, role) is not None}

    def describe(self) -> str:
        parts = [f"{role}={spec.describe()}" for role, spec in {**self.active(), **self.active_gradients()}.items()]
        if self.accumulator is not None:
            parts.append(f"accumulator={self.accumulator.describe()}")
        text = ", ".join(parts) or "float"
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
        for role, spec in {**self.active(), **self.active_gradients()}.items():
            out[role] = {"name": spec.format_name, **{k: _plain(v) for k, v in spec.params().items()}}
        if self.accumulator is not None:
            out[ACCUMULATOR_ROLE] = self.accumulator.to_dict()
        if self.seed is not None:
            out["seed"] = self.seed
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
    roles = (*ROLES, *GRADIENT_ROLES)
    unknown = set(config) - {*roles, ACCUMULATOR_ROLE, "bypass", "seed"}
    if unknown:
        raise ConfigError(f"unknown role(s) {sorted(unknown)} in a quantized op's config; roles: "
                          f"{', '.join((*roles, ACCUMULATOR_ROLE))}")  # fmt: skip
    specs: dict[str, Any] = {}
    for role in roles:
        if role in config:
            params = dict(config[role])
            specs[role] = resolve(params.pop("name"), **params)
    if ACCUMULATOR_ROLE in config:
        specs[ACCUMULATOR_ROLE] = build_accumulator(config[ACCUMULATOR_ROLE])
    return RoleFormats(**specs, bypass=bool(config.get("bypass", False)), seed=config.get("seed"))


def _plain(value: Any) -> Any:
    """Tuples become lists (JSON / TOML have no tuples); everything else is already plain."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value
