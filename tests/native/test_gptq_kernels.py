"""The native int4 group fit and GPTQ column loop (csrc/gptq.c, lowbit.native.gptq): the torch code's choices
(every code of a group whose range both pick; a group may keep another trial range only where the two tie to
float32 rounding), the same answer on any number of threads, plain rounding under an identity Hessian, and the
torch code wherever the kernel does not apply."""

from __future__ import annotations

import pytest
import torch

from lowbit import backend
from lowbit.native import build, kernels
from lowbit.native import gptq as native_gptq
from lowbit.ops.gptq import HessianAccumulator, gptq_quantize
from lowbit.ops.int4 import quantize_groups

needs_library = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")
SCALE_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture
def native_backend():
    if build.ensure() is None:
        pytest.skip(f"no native library: {build.error()}")
    backend.set_backend("native")
    try:
        yield
    finally:
        backend.set_backend("eager")


def _weighted_error(weight, codes, scale, offset, group, importance, float_zero) -> torch.Tensor:
    """Each group's squared error [N, K / g], weighted by importance, in float64."""
    n, k = weight.shape
    q = codes.double().reshape(n, k // group, group)
    s, o = scale.double().unsqueeze(-1), offset.double().unsqueeze(-1)
    values = q * s + o if float_zero else (q - o) * s
    error = (values - weight.double().reshape(n, k // group, group)).square()
    return (error if importance is None else error * importance.double().reshape(1, k // group, group)).sum(-1)


@needs_library
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("float_zero", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("search", [False, True])
def test_fit_chooses_the_torch_codes_ranges(scale_dtype, float_zero, weighted, search):
    assert build.ensure() is not None, build.error()
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(200, 256, generator=generator) * 0.05
    weight[3, :64] = 0.0  # a group of zeros, and one of a single sign
    weight[4, 64:128] = weight[4, 64:128].abs() + 0.01
    importance = torch.rand(256, generator=generator) + 0.1 if weighted else None
    backend.set_backend("eager")
    want = quantize_groups(weight, 64, scale_dtype, search, importance, float_zero)
    codes, scale, offset = native_gptq.int4_fit(weight.t().contiguous(), 64, scale_dtype, search, importance, float_zero)
    got = (codes, scale.t().to(scale_dtype), offset.t().to(scale_dtype if float_zero else torch.uint8))
    same = (got[1] == want[1]) & (got[2] == want[2])  # [N, K / g]
    assert float(same.float().mean()) >= 0.995 if search else bool(same.all())
    groups_equal = same.repeat_interleave(64, dim=1)
    assert torch.equal(got[0][groups_equal], want[0][groups_equal])
    mine, theirs = (_weighted_error(weight, *result, 64, importance, float_zero) for result in (got, want))
    assert torch.allclose(mine, theirs, rtol=1e-5, atol=0)  # another range only where the two tie


def _problem(n: int, k: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=generator) * 0.05
    x = torch.randn(1024, 16, generator=generator) @ torch.randn(16, k, generator=generator)
    accumulator = HessianAccumulator(k)
    accumulator.add(x + 0.3 * torch.randn(1024, k, generator=generator))
    return weight, accumulator.hessian()


def _dequantized(result, group: int, float_zero: bool) -> torch.Tensor:
    n, k = result.codes.shape
    q = result.codes.float().reshape(n, k // group, group)
    s, o = result.scale.float().unsqueeze(-1), result.zero_point.float().unsqueeze(-1)
    return (q * s + o if float_zero else (q - o) * s).reshape(n, k)


def _output_error(weight, hessian, result, group, float_zero) -> float:
    delta = (_dequantized(result, group, float_zero) - weight).double()
    return float(torch.einsum("nk,kl,nl->", delta, hessian, delta))


@needs_library
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("float_zero", [False, True])
@pytest.mark.parametrize("shape", [(96, 256), (130, 192)])
def test_native_gptq_follows_the_torch_loop(native_backend, act_order, float_zero, shape):
    weight, hessian = _problem(*shape, seed=shape[0])
    settings = {"act_order": act_order, "float_zero": float_zero, "block_size": 64}
    mine = gptq_quantize(weight, hessian, 32, **settings)
    backend.set_backend("eager")
    theirs = gptq_quantize(weight, hessian, 32, **settings)
    assert mine.codes.dtype == theirs.codes.dtype and mine.zero_point.dtype == theirs.zero_point.dtype
    assert float((mine.codes == theirs.codes).float().mean()) > 0.99
    errors = [_output_error(weight, hessian, result, 32, float_zero) for result in (mine, theirs)]
    assert abs(errors[0] - errors[1]) <= 0.01 * errors[1]


@needs_library
@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize("float_zero", [False, True])
def test_native_gptq_with_an_identity_hessian_is_plain_rounding(native_backend, search, float_zero):
    weight, _ = _problem(70, 128, seed=1)
    mine = gptq_quantize(weight, torch.eye(128, dtype=torch.float64), 32, search=search, float_zero=float_zero)
    plain = quantize_groups(weight, 32, torch.bfloat16, search, float_zero=float_zero)
    for got, want in zip(mine, plain, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


@needs_library
def test_native_gptq_is_the_same_on_any_number_of_threads(native_backend):
    weight, hessian = _problem(300, 256, seed=2)
    results, before = [], torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        results.append(gptq_quantize(weight, hessian, 64))
    finally:
        torch.set_num_threads(before)
    with kernels.threads_from(64):  # every call split over the threads, chunks of a tile
        results.append(gptq_quantize(weight, hessian, 64))
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)


@needs_library
def test_kernel_declines_what_it_does_not_take(native_backend):
    columns = torch.randn(64, 8)
    assert native_gptq.int4_fit(columns.half(), 32, torch.bfloat16, True) is None  # not float32
    assert native_gptq.int4_fit(columns.t(), 32, torch.bfloat16, True) is None  # [8, 64]: 8 not a whole group
    assert native_gptq.int4_fit(columns * 1e5, 32, torch.float16, True) is None  # a scale past float16's range
    huge = torch.randn(16, 64) * 1e5  # GPTQ then runs its torch loop: the same result as the eager backend
    weight_result = gptq_quantize(huge, torch.eye(64, dtype=torch.float64), 32, torch.float16)
    backend.set_backend("eager")
    assert torch.equal(weight_result.codes, gptq_quantize(huge, torch.eye(64, dtype=torch.float64), 32, torch.float16).codes)


@needs_library
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("shape,group", [((130, 256), 64), ((64, 96), 32)])
def test_hqq_kernel_follows_the_torch_steps(native_backend, scale_dtype, shape, group):
    from lowbit.ops.hqq import hqq_quantize

    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(group)) * 0.05
    weight[1, :group] = 0.0  # a group of zeros
    mine = hqq_quantize(weight, group, scale_dtype)
    backend.set_backend("eager")
    theirs = hqq_quantize(weight, group, scale_dtype)
    for got, want in zip(mine, theirs, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
    assert float((mine.codes == theirs.codes).float().mean()) > 0.999
    errors = [_weighted_error(weight, *result, group, None, False) for result in (mine, theirs)]
    assert torch.allclose(errors[0], errors[1], rtol=1e-4, atol=1e-9)  # per group: another step only on a tie
    plain = _weighted_error(weight, *quantize_groups(weight, group, scale_dtype, search=False), group, None, False)
    assert bool((errors[0] <= plain * (1 + 1e-6)).all())  # never worse than min-max rounding
