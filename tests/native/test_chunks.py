"""Passes over tensors past the cache are handed out in chunks to whichever thread is free, on torch's
OpenMP pool or on threads of the library's own (csrc/parallel.c); within the cache each thread keeps one
share. No result depends on the split: every chunk count gives the eager path's bits, for kernels of one
pass, of statistics then elements, and of three phases (TWN, with its window)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import lowbit
from lowbit.native import build, kernels

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")

FORMATS = [
    ("ternary", {"scaling_factor": True}),  # TWN: the window's pass, its resolution, the element pass
    ("binary", {"scaling_factor": True}),  # a mean, then the elements
    ("affine", {"bits": 8}),  # minimum and maximum in parts, then the elements
    ("affine", {"bits": 4, "symmetric": True, "axis": 0}),
    ("affine", {"bits": 4, "power_of_two": True, "block_size": (1, 32)}),
    ("e4m3", {"axis": -1}),  # maxima per column in parts of rows, then the elements
    ("mxfp4_e2m1", {}),
    ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": (1, 16)}),
    ("integer", {"width": 8, "frac_width": 4}),
    ("log", {"width": 8, "exponent_bias": 63}),
]


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


@contextlib.contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def awkward_tensor() -> torch.Tensor:
    """192 x 1000: rows whose blocks end past a chunk's end, and a few zeros and huge values."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(192, 1000, generator=generator) * 3
    x[7, :40] = 0.0
    x[100, 3] = 3.0e38
    return x


@pytest.mark.parametrize(("name", "params"), FORMATS, ids=lambda value: str(value))
@pytest.mark.parametrize("chunks", [1, 2, 5, 64])
def test_every_split_gives_the_eager_bits(name, params, chunks):
    spec = lowbit.get_format(name)(**params)
    x = awkward_tensor()
    want = spec._quantize_in_dtype(x, None)
    before = kernels.chunks_run()
    with torch_threads(3), kernels.threads_from(1 << 10), kernels.window_from(1), kernels.chunks(chunks):
        got = spec._native(x.contiguous(), torch.float32)
    assert got is not None, f"{name} did not run natively"
    assert kernels.chunks_run() - before >= min(3 * chunks, 2)  # the pool really ran the passes
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int32)[~nan], want.view(torch.int32)[~nan])


def chunks_of_one_call(x: torch.Tensor) -> int:
    spec = lowbit.get_format("integer")(width=8, frac_width=4)  # one pass, grains of 64 elements
    before = kernels.chunks_run()
    assert spec._native(x, torch.float32) is not None
    return kernels.chunks_run() - before


def test_the_rule_chunks_past_the_cache_and_keeps_shares_within_it():
    x = torch.randn(1 << 20)  # 4 MiB
    with torch_threads(2), kernels.threads_from(1 << 10):  # threads of our own start from 4M elements
        assert chunks_of_one_call(x) == 2  # within the cache (stream.h's size): a share a thread
        with kernels.stream_from(1 << 12):  # the "cache" made small: x is past it
            assert chunks_of_one_call(x) == 32  # 16 a thread, 2^15 elements each
        with kernels.stream_from(1 << 12), kernels.chunks(1):
            assert chunks_of_one_call(x) == 2
