"""The native log / binary / binary_residual / ternary kernels (csrc/log.c, csrc/sign.c) give the eager path's bits on
the parameter variants the shared case table leaves out: other biases and widths, log-domain rounding in
every mode, per-channel statistics on every axis, given scales, thresholds from statistics, non-finite data,
0-d and multi-threaded tensors; and they decline (None) where they do not apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lowbit
from helpers import DETERMINISTIC, float32_patterns
from lowbit.native import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def finite(shape, seed: int, scale: float = 8.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def with_specials(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-45, -3e-39])
    x.view(-1)[: specials.numel()] = specials
    return x


def assert_native_equals_eager(spec, x: torch.Tensor) -> None:
    got = spec._native(x.contiguous(), torch.float32)
    assert got is not None, f"{spec.describe()} did not run natively"
    want = spec._quantize_in_dtype(x, None)
    assert got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    mismatch = (got.view(torch.int32) != want.view(torch.int32)) & ~nan
    assert not mismatch.any(), f"{int(mismatch.sum())} differ: {got[mismatch][:4]} vs {want[mismatch][:4]}"


def log_inputs(spec) -> list[torch.Tensor]:
    values = spec.value_set().float()
    middles = ((values[1:].double() + values[:-1].double()) / 2).float()
    probes = torch.cat([values, middles, torch.nextafter(middles, values[1:]), torch.nextafter(middles, values[:-1])])
    # 2^(k + 1/2) neighbours: the log-domain decision points
    exponents = torch.arange(-140, 128, dtype=torch.float64)
    roots = (2.0 ** (exponents + 0.5)).float()
    roots = torch.cat([roots, torch.nextafter(roots, torch.zeros_like(roots)), torch.nextafter(roots, roots * 2)])
    return [float32_patterns((64, 96), 1), finite((37, 70), 2) * torch.logspace(-30, 30, 70), probes, -probes, roots, -roots]


LOG_PARAMS = [
    {"width": 8}, {"width": 4}, {"width": 2}, {"width": 11}, {"width": 5, "exponent_bias": 1},
    {"width": 6, "exponent_bias": 150}, {"width": 3, "exponent_bias": -60}, {"width": 11, "exponent_bias": 1075},
    {"width": 7, "exponent_bias": 40},
]  # fmt: skip


@pytest.mark.parametrize("params", LOG_PARAMS, ids=str)
@pytest.mark.parametrize("log_domain", [False, True])
@pytest.mark.parametrize("rounding", DETERMINISTIC)
def test_log_in_every_mode_bias_and_domain(params, log_domain, rounding):
    spec = lowbit.get_format("log")(**params, log_domain=log_domain, rounding=rounding)
    for x in log_inputs(spec):
        assert_native_equals_eager(spec, x)


def test_log_declines_stochastic_rounding_and_exponents_float32_cannot_reach():
    log = lowbit.get_format("log")
    x = finite((8, 8), 3)
    assert log(width=8, rounding="stochastic")._native(x, torch.float32) is None
    assert log(width=2, exponent_bias=-500)._native(x, torch.float32) is None  # smallest power 2^501


SIGN_SHAPES = [(48, 80), (3, 17, 20), (7,), (1, 33)]


def with_shapes(specs) -> list:
    """(spec, shape) pairs for every shape that has the spec's axis."""
    return [pytest.param(spec, shape, id=f"{spec.describe()}-{shape}") for spec in specs for shape in SIGN_SHAPES
            if spec.axis is None or -len(shape) <= spec.axis < len(shape)]  # fmt: skip


def binary_specs():
    binary = lowbit.get_format("binary")
    for bipolar in (True, False):
        yield binary(bipolar=bipolar)
        yield binary(bipolar=bipolar, scaling_factor=True)
        for axis in (0, -1, 1):
            yield binary(bipolar=bipolar, scaling_factor=True, axis=axis)
        yield binary(bipolar=bipolar, scaling_factor=True, alpha=0.37)


@pytest.mark.parametrize("spec,shape", with_shapes(binary_specs()))
def test_binary_variants(spec, shape):
    for x in [finite(shape, 4), with_specials(finite(shape, 5)), float32_patterns(shape, 6), finite(shape, 7) * 0]:
        assert_native_equals_eager(spec, x)


def test_binary_given_alpha_per_channel_and_stochastic():
    binary = lowbit.get_format("binary")
    x = with_specials(finite((5, 24), 8))
    assert_native_equals_eager(binary(scaling_factor=True, axis=0, alpha=(0.5, 1.0, 2.0, 0.25, 3.0)), x)
    assert_native_equals_eager(binary(bipolar=False, scaling_factor=True, axis=-1, alpha=tuple(range(1, 25))), x)
    assert binary(stochastic=True, scaling_factor=True)._native(x, torch.float32) is None
    assert binary(scaling_factor=True, axis=0, alpha=(1.0, 2.0))._native(x, torch.float32) is None  # wrong count


def ternary_specs():
    ternary = lowbit.get_format("ternary")
    for scaled in (False, True):
        yield ternary(scaling_factor=scaled)
        yield ternary(scaling_factor=scaled, threshold=-0.8)
        yield ternary(scaling_factor=scaled, mean=-1.3)
        yield ternary(scaling_factor=scaled, median=0.4, max=20.0)
        yield ternary(scaling_factor=scaled, max=60.0)
        for axis in (0, -1, 1):
            yield ternary(scaling_factor=scaled, axis=axis)
        yield ternary(scaling_factor=scaled, axis=0, threshold=3.0)
    yield ternary(scaling_factor=True, alpha=2.5)
    yield ternary(scaling_factor=True, alpha=2.5, axis=0)
    yield ternary(scaling_factor=True, alpha=0.1, threshold=1.0)
    for edge in (0.0, 1e-45, 3.4028234663852886e38, 1e39):  # the selection's clamped bounds (sign_stats.c)
        yield ternary(scaling_factor=True, threshold=edge)


@pytest.mark.parametrize("spec,shape", with_shapes(ternary_specs()))
def test_ternary_variants(spec, shape):
    for x in [finite(shape, 9), with_specials(finite(shape, 10)), float32_patterns(shape, 11), finite(shape, 12) * 0,
              finite(shape, 13).round()]:  # fmt: skip
        assert_native_equals_eager(spec, x)


def test_ternary_requantizes_its_output_and_given_alpha_per_channel():
    ternary = lowbit.get_format("ternary")
    spec = ternary(scaling_factor=True, axis=0)
    once = spec._native(finite((6, 50), 14), torch.float32)
    assert_native_equals_eager(spec, once)
    assert_native_equals_eager(ternary(scaling_factor=True, axis=0, alpha=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)), once)


@pytest.mark.parametrize("name,params", [("ternary", {"scaling_factor": True}), ("ternary", {"axis": 0}),
                                         ("ternary", {"scaling_factor": True, "axis": -1}),
                                         ("binary", {"scaling_factor": True, "axis": -1}),
                                         ("binary", {"scaling_factor": True, "bipolar": False})])  # fmt: skip
def test_statistics_on_several_threads(name, params, several_threads):
    spec = lowbit.get_format(name)(**params)
    x = with_specials(finite((1100, 1030), 15))  # many pieces per group
    assert_native_equals_eager(spec, x)


@pytest.mark.parametrize("name", ["ternary", "binary"])
def test_a_group_per_column_of_many_columns_takes_one_piece_per_thread(name, several_threads):
    """Past 2^16 (piece, group) slots the statistics take one piece of whole rows per thread (sign_stats.c)."""
    spec = lowbit.get_format(name)(scaling_factor=True, axis=-1)
    x = with_specials(finite((1100, 4100), 16))  # 70 pieces of 64K elements x 4100 groups before
    assert_native_equals_eager(spec, x)


def test_zero_dimensional_tensors_and_invalid_axes():
    x = torch.tensor(-1.75)
    for spec in (lowbit.get_format("ternary")(scaling_factor=True), lowbit.get_format("binary")(scaling_factor=True),
                 lowbit.get_format("log")(width=5)):  # fmt: skip
        assert_native_equals_eager(spec, x)
    assert lowbit.get_format("ternary")(axis=2)._native(finite((4, 4), 0), torch.float32) is None
    assert lowbit.get_format("binary")(scaling_factor=True, axis=0)._native(x, torch.float32) is None


@pytest.mark.parametrize("params", [{"levels": 1}, {"levels": 2}, {"levels": 3}, {"levels": 5},
                                    {"levels": 3, "means": (0.5, 1 / 3, 1 / 6)}, {"levels": 4, "means": (4, 2, 1, 0.5)}],
                         ids=str)  # fmt: skip
def test_binary_residual_variants(params):
    spec = lowbit.get_format("binary_residual")(**params)
    values = spec.value_set().float()
    middles = ((values[1:].double() + values[:-1].double()) / 2).float()
    probes = torch.cat([middles, torch.nextafter(middles, values[1:]), torch.nextafter(middles, values[:-1]), values])
    for x in [probes, -probes, float32_patterns((32, 40), 16), finite((32, 40), 17, 0.5)]:
        assert_native_equals_eager(spec, x)


def test_binary_residual_with_too_many_values_takes_the_eager_path():
    spec = lowbit.get_format("binary_residual")(levels=6, means=(32, 16, 8, 4, 2, 1))  # 64 values
    assert spec._native(finite((4, 4), 0), torch.float32) is None


def scaled_sign_specs():
    """The data-driven scales: binary bipolar / unipolar and ternary TWN (scaled and not), per tensor and per
    channel on the first and last axes."""
    binary, ternary = lowbit.get_format("binary"), lowbit.get_format("ternary")
    for axis in (None, 0, -1):
        yield binary(scaling_factor=True, axis=axis)
        yield binary(scaling_factor=True, bipolar=False, axis=axis)
        yield ternary(scaling_factor=True, axis=axis)
        yield ternary(axis=axis)


def statistics_inputs(shape) -> list[torch.Tensor]:
    """Constant tensors (normal, subnormal, huge, negative), magnitudes over float32's whole range (terms that
    underflow once divided by the max), all-infinite and all-NaN ones, and shapes whose runs end in a partial
    vector of sixteen lanes."""
    span = torch.logspace(-45, 38, shape[-1]).expand(shape).contiguous()
    signs = torch.where(finite(shape, 20) > 0, 1.0, -1.0)
    inputs = [torch.full(shape, value) for value in (3.7, -3.7, 1e-40, 3e38, -0.0, float("inf"), float("nan"))]
    return inputs + [span * signs, with_specials(span * signs), finite(shape, 21) * 1e-38, finite(shape, 22) * 1e30]


@pytest.mark.parametrize("spec", list(scaled_sign_specs()), ids=lambda spec: spec.describe())
@pytest.mark.parametrize("shape", [(5, 37), (3, 16), (7, 1), (40, 3)], ids=str)
def test_statistics_on_constant_extreme_and_non_finite_tensors(spec, shape):
    for x in statistics_inputs(shape):
        got = spec._native(x, torch.float32)
        want = spec._quantize_in_dtype(x, None)
        assert got is None or torch.equal(got.view(torch.int32), want.view(torch.int32)), (spec.describe(), x)
        if bool(torch.isfinite(x).all()) and x.abs().max() >= 1e-30:  # the certificate holds on these
            assert got is not None, f"{spec.describe()} declined {x.flatten()[:4]}"


def midpoint_rows(tiny: float, rows: int) -> torch.Tensor:
    """Rows whose mean |x| is (2.5 + 2^-23) / 4 = 0.625 + 2^-25 (the third: half that), a float32 midpoint,
    plus `tiny`: with tiny = 0 the exact mean is the midpoint (the tie rounds to even, 0.625); with a tiny
    nonzero element it lies just above it (rounds up), but the float64 sums drop the tiny term, so neither
    the eager path nor the kernel can decide from them: both take the exact integer sum."""
    row = torch.tensor([1.0, -1.0, 0.5 + 2.0**-23, tiny])
    return torch.stack([row, -row.flip(0), row * 0.5])[:rows]


@pytest.mark.parametrize("axis", [None, 0])
def test_a_mean_next_to_a_float32_midpoint_is_the_exact_mean_rounded(axis):
    spec = lowbit.get_format("binary")(scaling_factor=True, axis=axis)
    rows = 1 if axis is None else 3
    exact = midpoint_rows(0.0, rows)
    assert_native_equals_eager(spec, exact)
    assert spec._quantize_in_dtype(exact, None)[0, 0].item() == 0.625  # the tie went to the even float
    above = midpoint_rows(1e-30, rows)
    assert_native_equals_eager(spec, above)
    assert spec._quantize_in_dtype(above, None)[0, 0].item() == 0.625 + 2.0**-24  # not the float64 sum's 0.625


@pytest.mark.parametrize("params", [{}, {"scaling_factor": True}, {"scaling_factor": True, "alpha": 2.0},
                                    {"scaling_factor": True, "threshold": 1e-35}, {"scaling_factor": True, "axis": 0},
                                    {"scaling_factor": True, "axis": 0, "threshold": 1e-35}], ids=str)  # fmt: skip
def test_ternary_means_next_to_a_midpoint_are_exact_on_both_paths(params):
    """TWN's mean |x| on the midpoint rows (no threshold), or the scale over everything above a threshold
    below the tiny element: the exact step on both paths."""
    spec = lowbit.get_format("ternary")(**params)
    rows = 3 if "axis" in params else 1
    for tiny in (0.0, 1e-30):
        assert_native_equals_eager(spec, midpoint_rows(tiny, rows))


def test_exact_means_of_a_random_tensor_near_a_midpoint():
    """A normal tensor (numpy's generator: the same values on every machine) whose mean |x| lies within the
    float64 sum's error bound of a float32 midpoint (seed 26 of the first 600 at this shape; about 1 in 150):
    eager and native both take the exact step, for binary's scale and ternary's threshold."""
    x = torch.from_numpy(np.random.default_rng(26).standard_normal((2112, 384)).astype(np.float32))
    quotient, spread = x.abs().sum(dtype=torch.float64).item() / x.numel(), (x.numel() + 16) * 2.0**-52
    assert np.float32(quotient * (1 - spread)) != np.float32(quotient * (1 + spread))  # the bound cannot decide
    assert_native_equals_eager(lowbit.get_format("binary")(scaling_factor=True), x)
    assert_native_equals_eager(lowbit.get_format("ternary")(scaling_factor=True), x)
