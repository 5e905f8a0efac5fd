"""calibrated_spec: every observer kind into every format family that takes calibrated parameters, the
frozen parameters against independent formulas, and the ConfigErrors for block / scale-less formats."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lowbit
from lowbit.calibrate import (
    HistogramObserver,
    MagnitudeObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MSEObserver,
    PercentileObserver,
    calibrated_spec,
    scale_zero_point,
)
from lowbit.errors import ConfigError
from lowbit.formats.ocp_float import ELEMENT_FORMATS

OBSERVERS = {
    "min_max": MinMaxObserver, "moving_average": lambda **g: MovingAverageMinMaxObserver(0.1, **g),
    "percentile": lambda **g: PercentileObserver(99.9, **g), "mse": MSEObserver, "histogram": HistogramObserver,
    "magnitude": MagnitudeObserver,
}  # fmt: skip
OCP = ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1")
SCALE_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def calibration(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 12, generator=generator) * (1 + 0.5 * i) - 0.3 for i in range(4)]


def observed(kind: str, **granularity):
    observer = OBSERVERS[kind](**granularity)
    for batch in calibration():
        observer.update(batch)
    return observer


@pytest.mark.parametrize("kind", OBSERVERS)
@pytest.mark.parametrize("axis", [None, 1])
def test_affine_and_presets_use_the_builders(kind, axis):
    observer = observed(kind, axis=axis)
    x = torch.cat(calibration(1))
    spec = calibrated_spec(observer, "affine", bits=4, symmetric=True)
    reference = observer.affine_spec(bits=4, symmetric=True)  # the existing path
    assert (spec.scale, spec.zero_point, spec.axis) == (reference.scale, reference.zero_point, axis)
    assert torch.equal(spec(x), reference(x))
    preset = calibrated_spec(observer, "q8s")
    low, high = observer.min_max(bits=8, symmetric=True, narrow_range=True)
    want = scale_zero_point(low, high, 8, symmetric=True, narrow_range=True).scale
    assert preset.format_name == "q8s" and preset.scale == tuple(want.reshape(-1).tolist())


@pytest.mark.parametrize("kind", OBSERVERS)
@pytest.mark.parametrize("name", OCP)
def test_ocp_scale_covers_the_calibrated_max(kind, name):
    observer = observed(kind)
    top = ELEMENT_FORMATS[name].max_value
    low, high = observer.min_max()
    amax = max(-low.item(), high.item())
    for scale_dtype in ("f32", "bf16"):
        spec = calibrated_spec(observer, name, scale_dtype=scale_dtype)
        (scale,) = spec.scale
        stored = torch.tensor(scale).to(SCALE_TORCH[scale_dtype])
        assert stored.item() == scale  # a value of scale_dtype
        smaller = torch.nextafter(stored, torch.zeros_like(stored)).item()
        assert np.float32(scale) * np.float32(top) >= np.float32(amax) > np.float32(smaller) * np.float32(top)
        edge = torch.tensor([amax, -amax])  # the calibrated max maps onto the element max
        assert torch.equal(spec(edge), torch.tensor([top, -top]) * np.float32(scale))
        later = torch.cat(calibration(5)) * 10  # a later batch beyond the range: same scale, saturated
        assert spec(later).abs().max().item() == np.float32(top) * np.float32(scale)
        assert torch.equal(spec.scales(later), torch.full((1, 1), scale))


@pytest.mark.parametrize("kind", ["min_max", "percentile", "magnitude"])
def test_ocp_per_channel(kind):
    observer = observed(kind, axis=1)
    spec = calibrated_spec(observer, "e4m3")
    low, high = observer.min_max()
    assert spec.axis == 1 and len(spec.scale) == 12
    for scale, amax in zip(spec.scale, torch.maximum(-low, high).tolist()):
        assert np.float32(scale) * np.float32(448) >= np.float32(amax)
    assert calibrated_spec(observed(kind), "e4m3", axis=0).axis == 0  # a spec's own axis with one scale


def test_integer_frac_width_is_the_finest_that_holds_the_range():
    observer = MinMaxObserver()
    observer.update(torch.tensor([-3.1, 0.2, 2.0]))
    spec = calibrated_spec(observer, "integer", width=8)
    assert spec.frac_width == 5  # -128 / 32 = -4 <= -3.1 and 127 / 32 >= 2; at 6: -128 / 64 = -2 > -3.1
    assert lowbit.quantize(torch.tensor([-3.1, 2.0]), spec).tolist() == [-3.09375, 2.0]
    unsigned = calibrated_spec(observer, "fixed", width=4, signed=False)
    assert unsigned.frac_width == 2  # 15 / 4 = 3.75 >= 2, 15 / 8 < 2; negatives clamp to 0 anyway
    zero = MinMaxObserver()
    zero.update(torch.zeros(3))
    assert calibrated_spec(zero, "integer", width=8, frac_width=3).frac_width == 3  # nothing to fit: kept


@pytest.mark.parametrize("axis", [None, 1])
def test_binary_alpha_is_the_least_squares_mean(axis):
    observer = observed("magnitude", axis=axis)
    values = torch.cat(calibration()).double()  # [256, 12]
    reduce = {} if axis is None else {"dim": 0}
    positive = values > 0
    mean_abs = values.abs().mean(**reduce).reshape(-1).tolist()
    mean_positive = (torch.where(positive, values, 0.0).sum(**reduce) / positive.sum(**reduce)).reshape(-1).tolist()
    bipolar = calibrated_spec(observer, "binary")
    unipolar = calibrated_spec(observer, "binary", bipolar=False)
    assert bipolar.scaling_factor and bipolar.axis == axis
    assert bipolar.alpha == pytest.approx(mean_abs, rel=1e-7)
    assert unipolar.alpha == pytest.approx(mean_positive, rel=1e-7)
    if axis is None:  # least squares: a nudged alpha fits the calibration data worse
        alpha, signs = bipolar.alpha[0], torch.where(values >= 0, 1.0, -1.0)
        error = [float(((values - a * signs) ** 2).sum()) for a in (alpha * 0.999, alpha, alpha * 1.001)]
        assert error[1] < min(error[0], error[2])


def test_ternary_alpha_is_the_mean_above_delta():
    observer = observed("magnitude")
    magnitudes = torch.cat(calibration()).double().abs()
    delta = 0.75 * magnitudes.mean()  # TWN over the calibration data
    spec = calibrated_spec(observer, "ternary")
    exact = magnitudes[magnitudes > delta].mean()
    assert spec.scaling_factor and spec.threshold is None and abs(spec.alpha[0] - exact) / exact <= 3e-4
    fixed = calibrated_spec(observer, "ternary", threshold=1.5)
    exact = magnitudes[magnitudes > 1.5].mean()
    assert abs(fixed.alpha[0] - exact) / exact <= 3e-4
    assert set(fixed(torch.randn(100) * 5).abs().unique().tolist()) == {0.0, fixed.alpha[0]}
    nothing = calibrated_spec(observer, "ternary", threshold=1e6)  # nothing above delta: alpha = delta
    assert nothing.alpha == (1e6,)


@pytest.mark.parametrize("name", ["block_fp", "block_minifloat", "block_log", "mxint8", "mxfp8_e4m3", "mxfp4_e2m1"])
def test_block_formats_have_no_calibrated_form(name):
    with pytest.raises(ConfigError, match=rf"{name}: a block format's shared exponent / scale is part of each "
                                          r"block's encoding \(as in OCP MX v1.0"):  # fmt: skip
        calibrated_spec(observed("min_max"), name)


@pytest.mark.parametrize("name", ["minifloat_ieee", "minifloat_denorm", "log", "binary_residual"])
def test_formats_without_a_scale(name):
    with pytest.raises(ConfigError, match=f"{name} has no scale to calibrate"):
        calibrated_spec(observed("min_max"), name)


@pytest.mark.parametrize("call, message", [
    (lambda: calibrated_spec(observed("min_max", block_size=(8, 4)), "e4m3"), r"per-block ranges \(block_size="),
    (lambda: calibrated_spec(observed("min_max"), "e4m3", block_size=[1, 32]), "block_size=.*drop block_size"),
    (lambda: calibrated_spec(observed("min_max", axis=1), "affine", axis=0), "axis=1 but affine has axis=0"),
    (lambda: calibrated_spec(observed("min_max"), "binary"), "MinMaxObserver keeps only a range.*MagnitudeObserver"),
    (lambda: calibrated_spec(observed("histogram"), "ternary"), "HistogramObserver keeps only a range"),
    (lambda: calibrated_spec(observed("min_max", axis=1), "integer"), "per-tensor observer"),
    (lambda: calibrated_spec(observed("min_max"), "e4m3", scale=1.0), "scale= is what calibration sets"),
    (lambda: calibrated_spec(MinMaxObserver(), "e4m3"), "has seen no data"),
    (lambda: calibrated_spec(torch.zeros(3), "e4m3"), "needs a lowbit.calibrate observer, got Tensor"),
])  # fmt: skip
def test_configuration_errors(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_spec_objects_and_nonfinite_calibration():
    observer = MinMaxObserver()
    observer.update(torch.tensor([1.0, -2.0, math.inf, math.nan]))
    spec = calibrated_spec(observer, lowbit.formats.E5M2(saturate=False, rounding="toward_zero"))
    assert spec.saturate is False and spec.rounding == "toward_zero" and spec.scale[0] * 57344 >= 2.0
    assert calibrated_spec(observer, "e5m2", saturate=False, rounding="toward_zero") == spec
