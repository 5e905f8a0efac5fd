"""Post-training quantization flows: static (calibrated activation scales), dynamic, weight-only.

All three work on any ``nn.Module`` (a ``QGraph``'s ``model`` included) by swapping modules, so they also
serve models torch.fx cannot trace. Targets are selected by op (``ops=("linear", "conv2d")``); each flow
builds the role -> format map of every target (:class:`~lowbit.nn.roles.RoleFormats`) and swaps the modules
for simulated quantized ones (``lowbit.flows.simulated.swap_formats``), returning ``(model, info)`` with the
model changed in place, like the graph passes. These are the simulated flows; the real-execution recipes
(``lowbit.quantize_(model, "int8_dynamic")`` ...) compute the same formats with integer kernels.

- **static**: :func:`calibrate` runs N batches through the float model with an observer on the input of
  every target module and returns a :class:`CalibrationState` (ranges per module, saved and loaded as
  JSON, no pickle); :func:`quantize_static` freezes those ranges into affine formats with given scales and
  zero points (nothing is computed from the data at run time) and quantizes weights per channel. Another
  ``activation_format`` (e.g. "e4m3": static FP8 with a calibrated per-tensor scale) takes its frozen
  parameters from the same ranges through ``lowbit.calibrate.calibrated_spec``.
- **dynamic**: activation scales are computed from each call's data, per tensor or per token.
- **weight-only**: only weights are quantized (per channel, or per group of ``group_size`` inputs).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lowbit._model import run_batches
from lowbit._persist import Older, Schema, read_json, register, write_json
from lowbit.errors import ConfigError, LowbitError, did_you_mean
from lowbit.flows.recipes import granularity_params
from lowbit.flows.simulated import swap_formats
from lowbit.formats import FormatSpec, resolve
from lowbit.formats.binary import Binary
from lowbit.formats.ternary import Ternary
from lowbit.graph.select import select_layers
from lowbit.nn.roles import RoleFormats

DEFAULT_OPS = ("linear", "conv1d", "conv2d")
OBSERVERS = ("min_max", "moving_average", "percentile", "mse", "histogram")
STATE_VERSION = 2
# 2: sealed (a SHA-256 over the whole file in "seal"); 1: unsealed, loads with a warning. No name key: the layout
# of lowbit 0.x had none, and its files must still load.
STATE_SCHEMA = register(Schema("lowbit.calibration", STATE_VERSION, "calibration state", ConfigError,
                               {1: Older(unsealed=True)}, name_key=None))  # fmt: skip


@dataclasses.dataclass
class CalibrationState:
    """Activation ranges per module (qualified name -> {"min": [...], "max": [...]}) and how they were taken.

    ``activation_format`` names the format :func:`quantize_static` freezes them into ("affine": the integer
    codes of ``bits`` / ``signed`` / ``symmetric``; any other name: see :func:`calibrate`). States saved
    before it existed load as "affine".
    """

    observer: str
    bits: int
    signed: bool
    symmetric: bool
    ranges: dict[str, dict[str, list[float]]]
    batches: int
    activation_format: str = "affine"

    def save(self, path: str | Path) -> None:
        """Write the state as JSON, sealed: ``"seal"`` holds a SHA-256 over every byte of the file."""
        write_json(STATE_SCHEMA, path, dataclasses.asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> CalibrationState:
        """Read a saved state; ConfigError naming the file if it is damaged (seal mismatch) or malformed."""
        data = _read_sealed_state(Path(path))
        fields = [f.name for f in dataclasses.fields(cls)]
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing or set(data) - set(fields):
            raise ConfigError(f"{str(path)!r}: bad calibration state keys (missing {missing}, "
                              f"unknown {sorted(set(data) - set(fields))})")  # fmt: skip
        _check_ranges(data["ranges"], str(path))
        _activation_spec(data.get("activation_format", "affine"), str(path))
        return cls(**data)


def _read_sealed_state(path: Path) -> dict[str, Any]:
    return read_json(STATE_SCHEMA, path).fields


def _check_ranges(ranges: Any, where: str) -> None:
    if not isinstance(ranges, dict):
        raise ConfigError(f"{where}: 'ranges' must be a table of module names")
    for name, entry in ranges.items():
        if not isinstance(entry, dict) or set(entry) != {"min", "max"}:
            raise ConfigError(f"{where}: ranges[{name!r}] needs exactly the keys 'min' and 'max'")
        for key in ("min", "max"):
            values = entry[key]
            if not isinstance(values, list) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                raise ConfigError(f"{where}: ranges[{name!r}][{key!r}] must be a list of finite numbers")


def _targets(model: nn.Module, ops: Iterable[str]) -> dict[str, nn.Module]:
    ops = tuple(ops)
    found = {name: module for name, (module, _) in select_layers(model, ops).items()}
    if not found:
        raise ConfigError(f"the model has no module of the ops {list(ops)}")
    return found


def _make_observer(name: str, arguments: dict[str, Any]):
    from lowbit import calibrate

    classes = {"min_max": calibrate.MinMaxObserver, "moving_average": calibrate.MovingAverageMinMaxObserver,
               "percentile": calibrate.PercentileObserver, "mse": calibrate.MSEObserver,
               "histogram": calibrate.HistogramObserver}  # fmt: skip
    if name not in classes:
        raise ConfigError(f"unknown observer {name!r}{did_you_mean(name, classes)}; observers: {', '.join(classes)}")
    return classes[name](**arguments)


@torch.no_grad()
def calibrate(model: nn.Module, batches: Iterable[Any], *, num_batches: int | None = None,
              ops: Iterable[str] = DEFAULT_OPS, observer: str = "min_max", observer_args: dict | None = None,
              bits: int = 8, signed: bool = False, symmetric: bool = False,
              activation_format: str = "affine") -> CalibrationState:  # fmt: skip
    """Observe the input of every target module over ``num_batches`` batches (all when None).

    ``activation_format`` is recorded for :func:`quantize_static` and checked now: "affine" (integer codes
    of ``bits`` / ``signed`` / ``symmetric``), or a format name that takes calibrated parameters from a
    range (the q* presets, integer / fixed, e5m2 e4m3 e3m2 e2m3 e2m1), whose own defaults then apply.
    The search observers (mse, histogram) search for the integer codes of ``bits`` whatever the format.
    """
    if not isinstance(activation_format, str):
        raise ConfigError("calibrate: activation_format must be a format name (states store names); pass a spec "
                          "to quantize_static instead")  # fmt: skip
    spec = _activation_spec(activation_format, "calibrate")
    activation_format = "affine" if spec is None else spec.format_name
    targets = _targets(model, ops)
    watchers = {name: _make_observer(observer, dict(observer_args or {})) for name in targets}
    hooks = {module: _watch(watchers[name]) for name, module in targets.items()}
    seen = run_batches(model, batches, hooks, num_batches=num_batches)
    if seen == 0:
        raise ConfigError("calibration saw no batches: the data is empty")
    ranges = {}
    for name, watcher in watchers.items():
        low, high = watcher.min_max(bits=bits, signed=signed, symmetric=symmetric)
        ranges[name] = {"min": torch.atleast_1d(low).double().tolist(), "max": torch.atleast_1d(high).double().tolist()}
    return CalibrationState(observer, bits, signed, symmetric, ranges, seen, activation_format)


def _watch(observer):
    def hook(module: nn.Module, inputs: tuple) -> None:
        observer.update(inputs[0].detach())

    return hook


def _weight_spec(bits: int, group_size: int | None, granularity: str | None = None) -> FormatSpec:
    """Symmetric affine weights per output channel, or per group of ``group_size`` inputs."""
    word = granularity or ("channel" if group_size is None else "group")
    try:
        return resolve("affine", bits=bits, symmetric=True, **granularity_params(word, group_size, "weights"))
    except LowbitError as error:
        raise ConfigError(f"weights: {error}") from None


def quantize_static(model: nn.Module, state: CalibrationState, *, weight_bits: int = 8,
                    weight_group_size: int | None = None,
                    activation_format: str | FormatSpec | None = None) -> tuple[nn.Module, dict[str, Any]]:  # fmt: skip
    """Freeze calibrated activation ranges into static formats; weights per channel (or group).

    Activations get ``activation_format`` (default: the state's, "affine") with frozen parameters: affine
    codes as calibrated, or a name / spec such as "e4m3" whose scale comes from the range of each module's
    input (one per tensor: the widest range when the state holds several).
    """
    from lowbit.calibrate.builders import scale_zero_point

    fmt = state.activation_format if activation_format is None else activation_format
    spec = _activation_spec(fmt, "quantize_static")
    if spec is not None:
        return _quantize_static_with(model, state, spec, weight_bits, weight_group_size)
    modules = dict(model.named_modules())
    weight = _weight_spec(weight_bits, weight_group_size)
    plan = {}
    for name, entry in state.ranges.items():
        _check_module(name, modules)
        low, high = torch.tensor(entry["min"]), torch.tensor(entry["max"])
        scale, zero_point = scale_zero_point(low, high, state.bits, signed=state.signed, symmetric=state.symmetric)
        data_in = resolve("affine", bits=state.bits, signed=state.signed, scale=float(scale.flatten()[0]),
                          zero_point=int(zero_point.flatten()[0]))  # fmt: skip
        plan[name] = RoleFormats(data_in=data_in, weight=weight)
    return model, swap_formats(model, plan)


def _activation_spec(fmt: str | FormatSpec, where: str) -> FormatSpec | None:
    """The spec of a static activation format (None for "affine", the default integer path)."""
    from lowbit.calibrate.specs import check_calibratable

    if isinstance(fmt, str) and fmt.strip().lower() == "affine":
        return None
    if not isinstance(fmt, (str, FormatSpec)):
        raise ConfigError(f"{where}: activation_format must be a format name or spec, got {type(fmt).__name__}")
    try:
        spec = check_calibratable(fmt)
    except LowbitError as error:
        raise ConfigError(f"{where}: activation_format={fmt!r}: {error}") from None
    if isinstance(spec, (Binary, Ternary)):
        raise ConfigError(f"{where}: activation_format={fmt!r}: a calibration state holds ranges, and "
                          f"{spec.format_name}'s alpha is a mean of magnitudes; use lowbit.calibrate.calibrated_spec "
                          "with MagnitudeObserver instead")  # fmt: skip
    return spec


def _quantize_static_with(model: nn.Module, state: CalibrationState, spec: FormatSpec, weight_bits: int,
                          weight_group_size: int | None) -> tuple[nn.Module, dict[str, Any]]:  # fmt: skip
    """quantize_static for a non-affine activation spec: its frozen parameters from each module's range."""
    from lowbit.calibrate import MinMaxObserver, calibrated_spec

    modules = dict(model.named_modules())
    weight = _weight_spec(weight_bits, weight_group_size)
    plan = {}
    for name, entry in state.ranges.items():
        _check_module(name, modules)
        observer = MinMaxObserver()
        observer.update(torch.tensor(entry["min"] + entry["max"], dtype=torch.float32))  # the widest range
        plan[name] = RoleFormats(data_in=calibrated_spec(observer, spec), weight=weight)
    return model, swap_formats(model, plan)


def _check_module(name: str, modules: dict[str, nn.Module]) -> None:
    if name not in modules:
        raise ConfigError(f"calibration state names module {name!r}, which the model does not have"
                          f"{did_you_mean(name, [n for n in modules if n])}")  # fmt: skip


def quantize_dynamic(model: nn.Module, *, bits: int = 8, granularity: str | None = None, weight_bits: int = 8,
                     ops: Iterable[str] = ("linear",), per: str | None = None) -> tuple[nn.Module, dict[str, Any]]:  # fmt: skip
    """Activation scale and zero point from each call's data: ``granularity`` "token" (default: one per
    last-dim row) or "tensor" (``per=``, deprecated, is the older spelling of the same word). Simulated; the real-kernel
    counterpart is ``lowbit.quantize_(model, "int8_dynamic")``."""
    if per is not None and granularity is not None and per != granularity:
        raise ConfigError(f"per={per!r} and granularity={granularity!r} disagree; give granularity only")
    if per is not None:
        warnings.warn(f"quantize_dynamic: per={per!r} is the older spelling; write granularity={per!r}",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
    word = granularity or per or "token"
    if word not in ("tensor", "token"):
        raise ConfigError(f"granularity={word!r} is not a dynamic granularity; legal: tensor, token")
    data_in = resolve("affine", bits=bits, **granularity_params(word, where="quantize_dynamic"))
    return _by_type(model, ops, RoleFormats(data_in=data_in, weight=_weight_spec(weight_bits, None)))


def quantize_weight_only(model: nn.Module, *, bits: int = 4, group_size: int | None = None,
                         ops: Iterable[str] = DEFAULT_OPS, granularity: str | None = None) -> tuple[nn.Module, dict[str, Any]]:  # fmt: skip
    """Weights only (symmetric, ``granularity`` "channel" or "group" of ``group_size`` inputs; the default
    follows ``group_size``); data stays float. Simulated; real kernels: ``lowbit.quantize_(model,
    "int8_weight_only" | "int4_weight_only")``."""
    word = granularity or ("group" if group_size is not None else "channel")
    if word not in ("channel", "group"):
        raise ConfigError(f"granularity={word!r} is not a weight granularity here; legal: channel, group")
    weight = _weight_spec(bits, group_size if word == "group" else None, word)
    return _by_type(model, ops, RoleFormats(weight=weight))


def _by_type(model: nn.Module, ops: Iterable[str], formats: RoleFormats) -> tuple[nn.Module, dict[str, Any]]:
    targets = _targets(model, ops)
    return model, swap_formats(model, dict.fromkeys(targets, formats))
