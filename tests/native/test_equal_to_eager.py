"""Every native kernel gives bit for bit the eager path's result: on every format case, on inputs that hit
every code, every midpoint and the floats either side of it, on random float32 bit patterns (NaN, inf,
subnormals), under every deterministic rounding mode, in float32 / bfloat16 / float16, and on tensors large
enough to run on several threads."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from format_cases import CASES
from helpers import DETERMINISTIC, eager_and_native, float32_patterns

import lowbit
from lowbit import backend
from lowbit.native import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")

# Cases whose parameters have a native kernel: a kernel that stops applying to one of them fails here.
FLOAT_GRID_CASES = {"minifloat-ieee-e4m3", "minifloat-denorm-e4m3"}
INTEGER_CASES = {"integer-8-4", "fixed-6-2", "integer-unsigned", "affine-given", "affine-minmax", "affine-sym-axis0",
                 "affine-pow2-block", "q8s", "q4s", "q2s", "q8f", "q4f", "q2f", "q4s-block-bf16"}  # fmt: skip
SIGN_AND_LOG_CASES = {"log-8-63", "binary-bipolar", "binary-scaled", "binary-residual", "ternary-twn-scaled",
                      "ternary-threshold", "ternary-given-alpha"}  # log / binary / ternary
BLOCK_CASES = {"e5m2", "e4m3", "e3m2", "e2m3", "e2m1", "e2m1-block32", "e4m3-given-scale", "block-fp", "block-minifloat",
               "block-log", "mxint8", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"}  # OCP, block, MX
NATIVE_CASES = FLOAT_GRID_CASES | INTEGER_CASES | SIGN_AND_LOG_CASES | BLOCK_CASES


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def grid_probes(spec) -> torch.Tensor | None:
    """Every value of a scalar format's set, every midpoint, and the float32 neighbours of each midpoint."""
    values = spec.value_set()
    if values is None or values.numel() > 70000:
        return None
    values = values.float()
    middles = ((values[1:].double() + values[:-1].double()) / 2).float()
    probes = torch.cat([values, middles, torch.nextafter(middles, torch.tensor(float("inf"))),
                        torch.nextafter(middles, torch.tensor(-float("inf")))])  # fmt: skip
    width = 32
    total = -(-probes.numel() // width) * width  # every probe, then repeats filling the last row
    return probes.repeat(-(-total // probes.numel()))[:total].reshape(-1, width)


def inputs(spec) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(37, 70, generator=generator) * torch.logspace(-6, 6, 70)
    ties = torch.randint(-4096, 4096, (64, 96), generator=generator) / 256.0
    tensors = [spread, ties, float32_patterns((64, 96), 1), float32_patterns((8, 32), 2) * 0.0]
    probes = grid_probes(spec)
    return tensors + ([probes] if probes is not None else [])


def native_result(spec, x: torch.Tensor) -> torch.Tensor | None:
    return spec._native(x.contiguous(), torch.float32)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    mismatch = (got.view(torch.int32) != want.view(torch.int32)) & ~nan if got.dtype == torch.float32 else \
        (got != want) & ~nan  # fmt: skip
    assert not mismatch.any(), f"{int(mismatch.sum())} differ, e.g. {got[mismatch][:4]} vs {want[mismatch][:4]}"


@pytest.mark.parametrize("name,params", [pytest.param(n, p, id=i) for i, n, p, _ in CASES])
def test_native_equals_eager(name, params, request):
    spec = lowbit.get_format(name)(**params)
    ran = False
    for x in inputs(spec):
        got = native_result(spec, x)
        if got is None:
            continue
        ran = True
        assert_bits_equal(got, spec._quantize_in_dtype(x, None))
    assert ran == (request.node.callspec.id in NATIVE_CASES)


def _rounding_variants():
    for case_id, name, params, _ in CASES:
        if case_id not in NATIVE_CASES:
            continue
        roundings = lowbit.get_format(name).roundings
        for mode in DETERMINISTIC:
            if mode != "nearest_even" and mode in roundings:
                yield pytest.param(name, {**params, "rounding": mode}, id=f"{case_id}-{mode}")


@pytest.mark.parametrize("name,params", list(_rounding_variants()))
def test_native_equals_eager_in_every_rounding_mode(name, params):
    spec = lowbit.get_format(name)(**params)
    for x in inputs(spec):
        got = native_result(spec, x)
        assert got is not None
        assert_bits_equal(got, spec._quantize_in_dtype(x, None))


@pytest.mark.parametrize("case_id", sorted(NATIVE_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_native_backend_equals_eager_in_each_dtype_on_several_threads(case_id, dtype, several_threads):
    _, name, params, _ = next(case for case in CASES if case[0] == case_id)
    spec = lowbit.get_format(name)(**params)
    x = (torch.randn(256, 1056, generator=torch.Generator().manual_seed(3)) * 8).to(dtype)
    want, got = eager_and_native(spec, x)
    assert_bits_equal(got.float(), want.float())
    assert got.dtype == dtype


def test_non_contiguous_and_stochastic_inputs_take_the_eager_path():
    spec = lowbit.get_format("minifloat_ieee")(width=8, exponent_width=4)
    x = torch.randn(64, 64).t()
    backend.set_backend("native")
    try:
        assert backend._native_result(spec, x) is None
        assert backend._native_result(spec, x.contiguous()) is not None
        stochastic = dataclasses.replace(spec, rounding="stochastic")
        assert torch.equal(stochastic(x, seed=1), stochastic(x, seed=1))
    finally:
        backend.set_backend("eager")
