"""Calibrated specs: ``calibrated_spec(observer, fmt, **overrides)`` -> a FormatSpec with frozen parameters.

The observer's statistics become the format's given parameters, so the spec quantizes every later tensor
with the same grid, whatever its data (static quantization):

=============================== =========================== ================================================
format family                   frozen parameter            from the observer
=============================== =========================== ================================================
affine, q8s q4s q2s q8f q4f q2f ``scale``, ``zero_point``   the range via ``builders.scale_zero_point`` with
                                                            the spec's bits / signed / symmetric / ...
integer, fixed                  ``frac_width``              the largest frac_width whose codes hold the range
e5m2 e4m3 e3m2 e2m3 e2m1        ``scale``                   covering_scale(max(|min|, |max|)): the smallest
                                                            ``scale_dtype`` s with element max * s >= amax
binary                          ``alpha``                   mean |x| (bipolar), mean of the positive x
                                                            (unipolar): MagnitudeObserver
ternary                         ``alpha``                   mean |x| over |x| > delta, delta by the spec's
                                                            rule (TWN: 0.75 mean |x| of the calibration
                                                            data): MagnitudeObserver
=============================== =========================== ================================================

Per tensor or per channel: the observer's ``axis`` becomes the spec's (a spec's own ``axis`` must agree).
Per-block ranges have no given-scale form in any format (ConfigError). Block formats (block_fp,
block_minifloat, block_log, MX) raise ConfigError: their shared exponent is part of each block's encoding.
Formats without a scale (minifloats, log, binary_residual) raise ConfigError too. See docs/calibration.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from lowbit.calibrate.observers import Observer
from lowbit.errors import ConfigError
from lowbit.formats import FormatSpec, resolve
from lowbit.formats.binary import Binary
from lowbit.formats.block_fp import BlockFP
from lowbit.formats.block_log import BlockLog
from lowbit.formats.block_minifloat import BlockMinifloat
from lowbit.formats.affine import Affine
from lowbit.formats.integer import Integer
from lowbit.formats.mx import _MXFormat
from lowbit.formats.ocp_float import _OcpFloat, covering_scale
from lowbit.formats.ternary import TWN_FACTOR, Ternary

if TYPE_CHECKING:
    from lowbit.calibrate.magnitude import MagnitudeObserver

BLOCK_FORMATS = (BlockFP, BlockMinifloat, BlockLog, _MXFormat)
CALIBRATED_PARAMETERS = ("scale", "zero_point", "alpha")
_SMALLEST_SCALE = float(torch.finfo(torch.float32).tiny)  # the scale of an all-zero group, as formats use
_FRAC_WIDTHS = range(64, -65, -1)  # integer / fixed's legal frac_width, finest step first


def calibrated_spec(observer: Observer, fmt: str | FormatSpec, **overrides: Any) -> FormatSpec:
    """``fmt`` (a name or spec, ``overrides`` as for ``lowbit.quantize``) with parameters frozen from
    ``observer``'s statistics (see the module docstring for each family's rule)."""
    if not isinstance(observer, Observer):
        raise ConfigError(f"calibrated_spec needs a lowbit.calibrate observer, got {type(observer).__name__}")
    spec = check_calibratable(fmt, **overrides)
    observer.require_values("a calibrated spec's parameters are Python numbers")
    return _builder_for(spec)(observer, spec)


def check_calibratable(fmt: str | FormatSpec, **overrides: Any) -> FormatSpec:
    """The spec of ``fmt`` if it takes calibrated parameters; ConfigError saying why not otherwise."""
    frozen = sorted(set(overrides) & set(CALIBRATED_PARAMETERS))
    if frozen:
        raise ConfigError(f"calibrated_spec: {frozen[0]}= is what calibration sets; leave it out of the overrides")
    spec = resolve(fmt, **overrides)
    _builder_for(spec)
    return spec


def _builder_for(spec: FormatSpec) -> Callable[[Observer, FormatSpec], FormatSpec]:
    for family, builder in _BUILDERS:
        if isinstance(spec, family):
            return builder
    if isinstance(spec, BLOCK_FORMATS):
        raise ConfigError(
            f"{spec.format_name}: a block format's shared exponent / scale is part of each block's encoding "
            "(as in OCP MX v1.0, where every block stores the scale derived from its own largest magnitude), so "
            "it has no calibrated form; quantize with it directly, or calibrate a scaled element format "
            "(e4m3 / e2m1 with axis=) or affine"
        )
    raise ConfigError(
        f"{spec.format_name} has no scale to calibrate (its parameters fix its values); formats that take "
        "calibrated parameters: affine and the q* presets, integer / fixed, e5m2 e4m3 e3m2 e2m3 e2m1, binary, ternary"
    )


# ---- granularity ------------------------------------------------------------------------------------------
def _given_axis(observer: Observer, spec: FormatSpec) -> int | None:
    """The axis of the calibrated spec: the observer's (per channel) or the spec's own (None: per tensor)."""
    name = type(observer).__name__
    if observer.block_size is not None:
        raise ConfigError(
            f"{name} keeps per-block ranges (block_size={list(observer.block_size)}); {spec.format_name} takes "
            "calibrated parameters per tensor or per channel only: observe per tensor or with axis="
        )
    if getattr(spec, "block_size", None) is not None:
        raise ConfigError(
            f"{spec.format_name}: block_size={list(spec.block_size)} derives every block's scale from its data; "
            "a calibrated spec has one scale per tensor or per channel (the observer's): drop block_size"
        )
    if observer.axis is not None and spec.axis is not None and observer.axis != spec.axis:
        raise ConfigError(f"{name} has axis={observer.axis} but {spec.format_name} has axis={spec.axis}; use one axis")
    return observer.axis if observer.axis is not None else spec.axis


def _floats(values: torch.Tensor) -> tuple[float, ...]:
    return tuple(float(v) for v in values.reshape(-1).tolist())


# ---- one builder per family --------------------------------------------------------------------------------
def _affine(observer: Observer, spec: Affine) -> FormatSpec:
    """Scale and zero point by the builders (torch.ao's rule), for the spec's own code format."""
    axis = _given_axis(observer, spec)
    target = {name: getattr(spec, name) for name in ("bits", "signed", "symmetric", "power_of_two", "narrow_range")}
    scale, zero_point = observer.scale_zero_point(**target)
    symmetric = spec.symmetric and bool((zero_point == 0).all())  # unsigned symmetric codes: zero point 2^(b-1)
    zero_points = tuple(int(z) for z in zero_point.reshape(-1).tolist())
    return spec.replace(scale=_floats(scale), zero_point=zero_points, axis=axis, symmetric=symmetric)


def _ocp_float(observer: Observer, spec: _OcpFloat) -> FormatSpec:
    """The covering scale of max(|min|, |max|): the calibrated max lands at or just below the element max."""
    axis = _given_axis(observer, spec)
    low, high = observer.min_max()
    scale = covering_scale(torch.maximum(-low, high).clamp(min=0.0), spec.element.max_value, spec.scale_dtype)
    return spec.replace(scale=_floats(scale), axis=axis)


def _fixed_point(observer: Observer, spec: Integer) -> FormatSpec:
    """The largest frac_width (finest step) whose codes hold the range; an all-zero range keeps the spec's."""
    if observer.axis is not None or observer.block_size is not None:
        raise ConfigError(f"{spec.format_name} has one step 2^-frac_width per tensor; calibrate it with a "
                          "per-tensor observer (no axis, no block_size)")  # fmt: skip
    low, high = (float(v) for v in observer.min_max())
    q_min, q_max = spec.code_range
    ends = [(high, q_max)] if high > 0 else []
    ends += [(low, q_min)] if low < 0 and q_min < 0 else []  # unsigned codes clamp negatives to 0 anyway
    if not ends:
        return spec
    fits = (f for f in _FRAC_WIDTHS if all(abs(value) <= abs(code) * 2.0**-f for value, code in ends))
    return spec.replace(frac_width=next(fits, _FRAC_WIDTHS[-1]))


def _magnitudes(observer: Observer, spec: FormatSpec, what: str) -> MagnitudeObserver:
    if not getattr(observer, "keeps_magnitudes", False):  # a MagnitudeObserver (no import: it builds on observers)
        raise ConfigError(
            f"{spec.format_name}'s alpha is the least-squares scale of its signs, {what}; a range (min, max) does "
            f"not determine it and {type(observer).__name__} keeps only a range: calibrate with MagnitudeObserver"
        )
    return observer


def _alphas(alpha: torch.Tensor) -> tuple[float, ...]:
    return _floats(alpha.clamp(min=_SMALLEST_SCALE))  # an all-zero group: the smallest normal, as scales


def _binary(observer: Observer, spec: Binary) -> FormatSpec:
    axis = _given_axis(observer, spec)
    if spec.bipolar:
        alpha = _magnitudes(observer, spec, "mean |x| (bipolar)").mean_abs()
    else:
        alpha = _magnitudes(observer, spec, "the mean of the positive x (unipolar)").mean_positive()
    return spec.replace(scaling_factor=True, alpha=_alphas(alpha), axis=axis)


def _ternary(observer: Observer, spec: Ternary) -> FormatSpec:
    """alpha = mean |x| above delta of the calibration data, delta by the spec's rule; where nothing lies
    above delta, alpha = delta (the limit of that mean as the set shrinks to delta)."""
    axis = _given_axis(observer, spec)
    magnitudes = _magnitudes(observer, spec, "mean |x| over the elements beyond the threshold delta")
    delta = spec.fixed_threshold
    if delta is None:
        delta = TWN_FACTOR * magnitudes.mean_abs()
    else:  # on the statistics' device, as alpha below
        delta = torch.full((), delta, dtype=torch.float32, device=magnitudes.histogram.device)
    alpha = magnitudes.mean_abs_above(delta)
    alpha = torch.where(alpha > 0, alpha, delta.expand_as(alpha))
    return spec.replace(scaling_factor=True, alpha=_alphas(alpha), axis=axis)


# Lookup table: the first family a spec belongs to gives its builder (the presets are Affine, fixed Integer).
_BUILDERS: tuple[tuple[type, Callable[[Observer, Any], FormatSpec]], ...] = (
    (Affine, _affine),
    (_OcpFloat, _ocp_float),
    (Integer, _fixed_point),
    (Binary, _binary),
    (Ternary, _ternary),
)
