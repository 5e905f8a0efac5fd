"""TWN per tensor with both means from one pass (csrc/sign_window.c): a window around a sampled estimate of
delta. Forced onto small tensors on every build, it gives the eager path's bits and really serves the scale
where delta falls inside; where it cannot tell (the sample unlike the tensor, a piece with too many values
near delta) the second pass runs, with the same bits; the automatic rule takes it only past the cache on
AVX-512 builds."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

import lowbit
from lowbit.native import build, kernels

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")

TWN = lowbit.get_format("ternary")(scaling_factor=True)


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


@pytest.fixture
def window_always():
    with kernels.window_from(1):
        yield


def assert_bits_equal(x: torch.Tensor) -> None:
    got = TWN._native(x.contiguous(), torch.float32)
    assert got is not None, "TWN did not run natively"
    want = TWN._quantize_in_dtype(x, None)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int32)[~nan], want.view(torch.int32)[~nan])


def served_by_window(x: torch.Tensor) -> bool:
    before = kernels.window_served()
    assert_bits_equal(x)
    return kernels.window_served() - before == 1


def sample(kind: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(shape, generator=generator) * 3.0
    if kind == "uniform":
        return torch.rand(shape, generator=generator) - 0.25
    if kind == "laplace":
        u = torch.rand(shape, generator=generator) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs()) * 1e-3
    if kind == "tiny":  # subnormal magnitudes
        return torch.randn(shape, generator=generator) * 1e-40
    x = torch.randn(shape, generator=generator)  # a few non-finite values and signed zeros among normal ones
    flat = x.view(-1)
    flat[1::997], flat[2::1009], flat[3::1013], flat[4::1019] = float("nan"), float("inf"), -float("inf"), -0.0
    return x


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("shape", [(1000,), (384, 384), (2112, 384), (3, 100003)])
@pytest.mark.parametrize("kind", ["normal", "uniform", "laplace", "tiny", "specials"])
def test_the_window_gives_the_scale_bit_for_bit(kind, shape, threads, window_always, request):
    if threads:
        request.getfixturevalue("several_threads")
    x = sample(kind, shape, seed=len(kind) * 7 + shape[0])
    assert served_by_window(x)


def test_many_pieces_on_two_threads_are_served(window_always, several_threads):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert served_by_window(sample("normal", (1 << 21,), seed=3))  # 32 pieces, 16 per thread
    finally:
        torch.set_num_threads(threads)


def test_a_sample_unlike_the_tensor_falls_back_to_the_second_pass(window_always):
    """The strided sample sees only large values, so delta lands far below the window."""
    x = torch.rand(4096 * 64, generator=torch.Generator().manual_seed(5)) * 0.1
    x[:: x.numel() // 4096] = 1000.0
    assert not served_by_window(x)


def test_a_piece_with_too_many_values_near_delta_falls_back(window_always):
    """Half the magnitudes at 1 and half spread over [0.59, 0.62]: delta = 0.75 mean |x| (about 0.602) puts
    every second value inside the window, where a piece keeps at most an eighth of its values."""
    generator = torch.Generator().manual_seed(8)
    x = torch.full((1 << 18,), 1.0)
    x[1::2] = -(0.59 + 0.03 * torch.rand(1 << 17, generator=generator))
    x = x[torch.randperm(x.numel(), generator=generator)]  # the strided sample sees both halves
    assert not served_by_window(x)


def test_values_at_the_edges_of_the_window(window_always):
    """Every magnitude equal (nothing inside the window, all above it), then magnitudes at the threshold and
    one float either side of it."""
    x = torch.full((1 << 16,), 2.0)
    x[1::4] = -2.0
    assert served_by_window(x)  # every magnitude equal: delta = 1.5, nothing inside, all above
    x[2::8] = 1.0
    delta = 0.75 * x.abs().mean()  # float32, as the format computes it
    x[3::8], x[5::8], x[7::8] = delta, torch.nextafter(delta, torch.tensor(0.0)), torch.nextafter(delta, torch.tensor(9.0))
    assert_bits_equal(x)


def test_the_rule_takes_the_window_past_the_cache_on_avx512_builds():
    threshold = kernels.stream_threshold() // 4
    assert not kernels.window_wanted(threshold - 1)
    flags = set(pathlib.Path("/proc/cpuinfo").read_text().split()) if pathlib.Path("/proc/cpuinfo").exists() else set()
    native_avx512 = "avx512f" in flags and not os.environ.get("LOWBIT_NATIVE_MARCH")
    if native_avx512:
        assert kernels.window_wanted(threshold)
    if kernels.window_wanted(threshold):
        assert "avx512f" in flags


def test_the_automatic_rule_on_a_tensor_past_the_cache():
    """Served where this build's rule takes the window (AVX-512), the plain passes elsewhere; the same bits."""
    n = kernels.stream_threshold() // 4
    assert served_by_window(sample("normal", (n,), seed=11)) == kernels.window_wanted(n)
