"""Hypothesis over every format's parameter space (issue 19): random parameters from each format's own
ranges (invalid combinations included) and random tensors holding NaN, +-inf, +-0, subnormals and values
near the float32 limits.

For every draw: building the spec raises nothing but FormatError; quantizing raises nothing but FormatError
(an axis or a scale count that does not fit the tensor); the result has the input's shape and dtype; NaN
sits exactly where the input has NaN (non-saturating OCP elements aside: they turn an overflow into NaN as
their spec says); and with a deterministic rounding mode q(q(x)) == q(x) bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lowbit
from lowbit.errors import FormatError
from lowbit.formats._registry import get_format
from lowbit.formats.rounding import ROUNDING_MODES

SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45, -1e-42, 1.1754944e-38, 3.4e38, -3.4e38, 1.0, -0.5]
DETERMINISTIC = [mode for mode in ROUNDING_MODES if mode != "stochastic"]

flag = st.booleans()
small_axis = st.sampled_from([None, 0, 1, -1])
block = st.sampled_from([None, 1, 4, 8, 16, -1, [1, 8], [2, 4], [-1, 4]])
scale_dtype = st.sampled_from(["f32", "f16", "bf16"])
positive = st.floats(1e-6, 1e6)


def _affine(bits_range=(1, 16)):
    return st.fixed_dictionaries({}, optional={
        "bits": st.integers(*bits_range), "signed": flag, "symmetric": flag, "narrow_range": flag,
        "power_of_two": flag, "scale": st.one_of(positive, st.lists(positive, min_size=1, max_size=3)),
        "zero_point": st.integers(-4, 4), "axis": small_axis, "block_size": block, "skip_first_dim": flag,
        "scale_dtype": scale_dtype,
    })  # fmt: skip


def _preset():
    return st.fixed_dictionaries({}, optional={"power_of_two": flag, "axis": small_axis, "block_size": block,
                                               "skip_first_dim": flag, "scale_dtype": scale_dtype,
                                               "scale": positive})  # fmt: skip


def _element():
    scales = st.one_of(positive, st.lists(positive, min_size=1, max_size=3))
    return st.fixed_dictionaries({}, optional={"saturate": flag, "axis": small_axis, "block_size": block,
                                               "skip_first_dim": flag, "scale_dtype": scale_dtype,
                                               "scale": scales})  # fmt: skip


def _mx():
    return st.fixed_dictionaries({}, optional={"block_size": st.sampled_from([1, 4, 32, -1]), "axis": small_axis,
                                               "scale_rule": st.sampled_from(["floor", "ceil", "even"]),
                                               "skip_first_dim": flag})  # fmt: skip


PARAMETER_SPACES = {
    "affine": _affine(),
    "integer": st.fixed_dictionaries({"width": st.integers(1, 32)},
                                     optional={"frac_width": st.integers(-70, 70), "signed": flag}),
    "binary": st.fixed_dictionaries({}, optional={"bipolar": flag, "scaling_factor": flag, "axis": small_axis,
                                                  "alpha": positive}),
    "binary_residual": st.fixed_dictionaries({"levels": st.integers(1, 9)},
                                             optional={"means": st.lists(positive, min_size=1, max_size=4)}),
    "ternary": st.fixed_dictionaries({}, optional={"scaling_factor": flag, "threshold": st.floats(-2, 2),
                                                   "mean": st.floats(-2, 2), "median": st.floats(-2, 2),
                                                   "max": st.floats(-2, 2), "axis": small_axis,
                                                   "alpha": positive}),
    "block_fp": st.fixed_dictionaries({"width": st.integers(1, 33)}, optional={
        "exponent_width": st.integers(0, 11), "exponent_bias": st.integers(-130, 1001), "block_size": block,
        "skip_first_dim": flag, "axis": small_axis}),
    "block_log": st.fixed_dictionaries({"width": st.integers(1, 12)}, optional={
        "exponent_bias_width": st.integers(0, 9), "block_size": block, "skip_first_dim": flag,
        "axis": small_axis, "log_domain": flag}),
    "block_minifloat": st.fixed_dictionaries({"width": st.integers(2, 33), "exponent_width": st.integers(0, 9)},
                                             optional={"exponent_bias_width": st.integers(0, 11),
                                                       "block_size": block, "skip_first_dim": flag}),
    "log": st.fixed_dictionaries({"width": st.integers(1, 12)},
                                 optional={"exponent_bias": st.integers(-10, 1100), "log_domain": flag}),
    "minifloat_ieee": st.fixed_dictionaries({"width": st.integers(2, 33), "exponent_width": st.integers(0, 12)},
                                            optional={"exponent_bias": st.integers(-1100, 1100)}),
    "minifloat_denorm": st.fixed_dictionaries({"width": st.integers(2, 33), "exponent_width": st.integers(0, 12)},
                                              optional={"exponent_bias": st.integers(-1100, 1100)}),
}
for _name in ("e5m2", "e4m3", "e3m2", "e2m3", "e2m1"):
    PARAMETER_SPACES[_name] = _element()
for _name in ("mxint8", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"):
    PARAMETER_SPACES[_name] = _mx()
for _name in ("q8s", "q4s", "q2s", "q8f", "q4f", "q2f"):
    PARAMETER_SPACES[_name] = _preset()
PARAMETER_SPACES["fixed"] = PARAMETER_SPACES["integer"]
# issue 45 / 46: the formats LLMs ship in (their oracles are in test_nvfp4 / test_codebook / test_ggml)
PARAMETER_SPACES["nvfp4"] = st.fixed_dictionaries({})
PARAMETER_SPACES["nf4"] = st.fixed_dictionaries({}, optional={"block_size": st.sampled_from([8, 16, 64])})
PARAMETER_SPACES["codebook"] = st.fixed_dictionaries({"values": st.sampled_from([
    [-3.0, -1.0, -0.25, 0.25, 1.0, 3.0], [0.0, 0.5, 2.0], [-1.0, -0.5, 0.0, 0.25, 1.0]])})  # fmt: skip
for _name in ("gguf_q4_0", "gguf_q4_1", "gguf_q5_0", "gguf_q8_0"):
    PARAMETER_SPACES[_name] = st.fixed_dictionaries({})
for _name in ("gguf_q4_k", "gguf_q6_k"):
    PARAMETER_SPACES[_name] = st.fixed_dictionaries({}, optional={"search": st.booleans()})


def test_every_registered_class_has_a_parameter_space():
    classes = {get_format(name) for name in PARAMETER_SPACES}
    assert {get_format(name) for name in lowbit.list_formats()} <= classes


@st.composite
def tensors(draw):
    rows, columns = draw(st.integers(1, 3)), draw(st.integers(1, 40))
    value = st.one_of(st.sampled_from(SPECIAL), st.floats(width=32), st.floats(-4, 4, width=32))
    values = draw(st.lists(value, min_size=rows * columns, max_size=rows * columns))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    return torch.tensor(values, dtype=torch.float32).reshape(rows, columns).to(dtype)


def _largest_value(spec) -> float:
    """The largest magnitude of a fixed value set (0 where it depends on the data or is not enumerated)."""
    if spec.format_name in ("minifloat_ieee", "minifloat_denorm", "log"):
        return float(spec.max_value)  # one fixed grid, up to 32 bits wide: not enumerated
    try:
        values = spec.value_set() if spec.bits <= 16 else None
    except FormatError:
        return 0.0
    return 0.0 if values is None else float(values.abs().max())


def _known_not_idempotent(spec, x: torch.Tensor) -> bool:
    """Cases that can re-derive a different grid from their own output, documented and not yet fixed:
    derived asymmetric affine scales stored as f16 / bf16 under a nearest mode (rounded to nearest, the
    stored scale can leave the top code unused), derived affine scales of codes wider than 11 bits
    (scaling.shorten_scale), derived affine grids whose end lies past the float range (data
    within a step of float32's max: the end value saturates off the grid; the same for MX / block formats'
    shared scales near float32's max), and ternary with a fixed threshold
    at or above its own nonzero value (1 unscaled, or a given alpha): that value is not above the threshold;
    and formats with values past x's dtype's range (they saturate at its max, off their own grid); and
    the two owners' recipes docs/formats.md names (nvfp4, e4m3 with scale_rule="amax"), which re-derive their
    scale from the quantized maximum and are idempotent only to a few float32 ulps (tests/formats/test_nvfp4.py
    checks them against their owners' arithmetic instead); and llama.cpp's Q4_K, whose sub-block minimum is
    rounded to the super-block's dmin step: a sub-block narrower than that step can leave code 0 unused, and
    the K-quants' default least-squares search, which re-fits its own output."""
    if spec.format_name == "nvfp4" or getattr(spec, "scale_rule", None) == "amax":
        return True
    if spec.format_name == "gguf_q4_k" or (spec.format_name == "gguf_q6_k" and spec.search):
        return True  # Q4_K: a sub-block narrower than the dmin step re-derives its minimum; the search re-fits
    if _largest_value(spec) > torch.finfo(x.dtype).max:
        return True  # values past x's dtype: the top saturates to its max, off the format's grid
    finite = x[torch.isfinite(x)].abs()
    if spec.format_name.startswith(("mx", "block_")) and finite.numel() and float(finite.max()) > 1e38:
        return True  # a shared scale derived near float32's max: the block's grid ends past the float range
    if isinstance(spec, lowbit.get_format("ternary")):
        threshold = spec.fixed_threshold or 0.0
        unit = min(spec.alpha) if spec.alpha is not None else (1.0 if not spec.scaling_factor else math.inf)
        return threshold >= unit  # its own nonzero value is not above the threshold
    if not isinstance(spec, lowbit.get_format("affine")) or spec.scale is not None:
        return False
    nearest = spec.rounding.startswith("nearest")
    finite = x[torch.isfinite(x)].abs()
    near_float_max = finite.numel() > 0 and float(finite.max()) > 1e38
    wide_or_rounded = spec.scale_dtype != "f32" and nearest
    return near_float_max or spec.bits > 11 or (not spec.symmetric and wide_or_rounded)


@pytest.mark.parametrize("name", sorted(PARAMETER_SPACES))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_parameters_and_tensors_keep_the_contract(name, data):
    params = data.draw(PARAMETER_SPACES[name], label="params")
    params["rounding"] = data.draw(st.sampled_from(get_format(name).roundings), label="rounding")
    x = data.draw(tensors(), label="x")
    try:
        spec = lowbit.get_format(name)(**params)
        y = spec(x, seed=0)
    except FormatError:
        return  # an invalid combination (or one that does not fit this tensor): the one allowed error
    assert y.shape == x.shape and y.dtype == x.dtype
    assert (torch.isnan(y) | ~torch.isnan(x)).all()  # NaN stays NaN
    if getattr(spec, "saturate", True):  # non-saturating OCP elements without inf turn overflow into NaN
        assert torch.equal(torch.isnan(y), torch.isnan(x))
    if spec.rounding in DETERMINISTIC and not spec.is_stochastic and x.dtype != torch.bfloat16:
        if not _known_not_idempotent(spec, x):
            again = spec(y)
            assert torch.equal(torch.isnan(again), torch.isnan(y))
            assert torch.equal(_nan_as_zero(again), _nan_as_zero(y)), (again, y)


def _nan_as_zero(values: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(values), torch.zeros_like(values), values)  # +-inf kept as they are


GAPS = {  # one concrete input per documented non-idempotent case excluded above (found by search, seed 0)
    "asymmetric derived affine, bf16 scale, nearest": (
        {"name": "affine", "bits": 8, "symmetric": False, "scale_dtype": "bf16"},
        [-0.8567902445793152, 1.5548677444458008, -0.6632249355316162, -1.8938312530517578, 3.338663101196289,
         -0.0026528947055339813, 4.389652252197266, 6.7813615798950195, -0.1678769886493683, 2.6862058639526367,
         1.4338011741638184, -1.5478193759918213, 3.0908265113830566, -1.664554476737976, 1.3171840906143188,
         0.8411442041397095]),
    "asymmetric derived affine, f16 scale, nearest": (
        {"name": "affine", "bits": 8, "symmetric": False, "scale_dtype": "f16"},
        [-0.439140260219574, 2.3401432037353516, 3.628916025161743, 1.8549604415893555, 3.07236647605896,
         -2.3967885971069336, 1.5922789573669434, 2.9188883304595947, 1.6588497161865234, -1.5033912658691406,
         0.36315682530403137, 3.936558246612549, 2.0595004558563232, 1.6569149494171143, -1.204866886138916,
         -1.1013743877410889]),
    "derived affine, codes wider than 11 bits": (
        {"name": "affine", "bits": 16},
        [1.1553125381469727, -0.05629798024892807, 0.36026033759117126, -1.3019810914993286, 0.349465012550354,
         0.2621341347694397, -0.09801405668258667, 0.27892813086509705, 1.428928017616272, 0.3643331229686737,
         -0.21683494746685028, 0.940026044845581, -1.468809723854065, -0.04178731143474579, -0.7002277374267578,
         0.09529253095388412]),
    "MX shared scale near float32's max": ({"name": "mxfp8_e4m3", "block_size": 1, "scale_rule": "even"}, [3.4e38]),
    "ternary with a fixed threshold at its own value": ({"name": "ternary", "threshold": 1.0}, [1.5, -2.0]),
    "Q6_K least-squares search re-fits its output": ({"name": "gguf_q6_k"}, [
        49, -43, -13, 37, -45, -94, 5, 26, 33, 3, -27, -19, -8, -85, 92, 98]),
    "Q4_K sub-block minimum re-derived": ({"name": "gguf_q4_k", "search": False}, [  # the second sub-block: narrow, far below 0
        20, -14, 15, -22, -15, -15, 5, -70, -67, 38, 84, 25, 2, -87, -42, -39, 79, 13, 29, -10, 67, 17, -31, 11, 86,
        63, -1, 59, 35, -91, -5, -71, -39, -53, -58, -51, -44, -55, -51, -42, -58, -42, -48, -53, -46, -60, -55, -43,
        -48, -45, -48, -44, -49, -60, -49, -58, -45, -58, -50, -47, -49, -50, -39, -40]),
}


@pytest.mark.parametrize("case", sorted(GAPS))
def test_each_excluded_case_is_a_real_documented_gap(case):
    """The exclusions of _known_not_idempotent hide real cases (docs/formats/integer.md, mx.md, binary.md):
    each input here moves on a second pass and is one the exclusion names. A format fix that closes a gap
    fails this test, so the exclusion goes with it."""
    params, values = GAPS[case]
    params = dict(params)
    spec = lowbit.get_format(params.pop("name"))(**params)
    x = torch.tensor([values], dtype=torch.float32)
    y = spec(x)
    assert not torch.equal(spec(y), y)
    assert _known_not_idempotent(spec, x)
