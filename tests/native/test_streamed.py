"""Outputs written past the cache (csrc/stream.h): from outputs of the cache's size on, every element pass
writes through a tile in L1 and non-temporal stores. The values must be the ones the plain path writes, bit
for bit, however a thread's range falls on the 64-byte lines (odd row lengths, chunks split at odd
elements), with blocks that fill a tile, blocks longer than one, and several threads."""

from __future__ import annotations

import pytest
import torch

import lowbit
from format_cases import CASES
from lowbit import backend
from lowbit.native import build, kernels
from test_equal_to_eager import NATIVE_CASES, assert_bits_equal, inputs

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def odd_shapes() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randn(3, 5000, generator=generator) * 4,  # a tile and a part of one per row
            torch.randn(129, 97, generator=generator) * torch.logspace(-3, 3, 97),  # rows of 388 bytes
            torch.randn(2, 64, 48, generator=generator)]  # fmt: skip


def quantized(spec, x: torch.Tensor, stream: bool, threaded: bool) -> torch.Tensor | None:
    with kernels.stream_from(1 if stream else 1 << 62), kernels.threads_from(64 if threaded else 1 << 40):
        return spec._native(x.contiguous(), torch.float32)


@pytest.mark.parametrize("threaded", [False, True], ids=["one-thread", "threads"])
@pytest.mark.parametrize("case_id", sorted(NATIVE_CASES))
def test_streamed_outputs_equal_the_plain_ones_bit_for_bit(case_id, threaded):
    _, name, params, _ = next(case for case in CASES if case[0] == case_id)
    spec = lowbit.get_format(name)(**params)
    compared = 0
    for x in inputs(spec) + odd_shapes():
        plain = quantized(spec, x, stream=False, threaded=threaded)
        if plain is None:
            continue
        assert_bits_equal(quantized(spec, x, stream=True, threaded=threaded), plain)
        assert_bits_equal(plain, spec._quantize_in_dtype(x, None))
        compared += 1
    assert compared >= 4


BLOCK_SPECS = [
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": (1, 48)}),  # 42 a tile
    ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": (1, 4096)}),  # > a tile
    ("block_minifloat", {"width": 8, "exponent_width": 4, "exponent_bias_width": 4, "block_size": (1, 100)}),
    ("affine", {"bits": 4, "block_size": (1, 64)}),  # whole blocks of 64: 32 a tile
    ("affine", {"bits": 4, "block_size": (1, 4096)}),
    ("affine", {"bits": 8, "block_size": (1, 40)}),  # the rows' last blocks shorter
    ("affine", {"bits": 8, "axis": 1}),  # a channel per column: per-element parameters
    ("affine", {"bits": 8, "axis": 0}),  # a channel per row
    ("mxfp4_e2m1", {}),
    ("e4m3", {"axis": -1}),  # a scale per column
    ("ternary", {"width": 2, "scaling_factor": True, "axis": 0}),  # a group per row
    ("ternary", {"width": 2, "scaling_factor": True, "axis": 1}),  # consecutive groups along the row
]


@pytest.mark.parametrize("name,params", BLOCK_SPECS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BLOCK_SPECS)])
def test_streamed_blocks_and_channels_of_every_length(name, params):
    spec = lowbit.get_format(name)(**params)
    generator = torch.Generator().manual_seed(2)
    for x in [torch.randn(40, 8192, generator=generator) * 3, torch.randn(33, 4100, generator=generator)]:
        for threaded in (False, True):
            plain = quantized(spec, x, stream=False, threaded=threaded)
            assert plain is not None, (name, params)
            assert_bits_equal(quantized(spec, x, stream=True, threaded=threaded), plain)
            assert_bits_equal(plain, spec._quantize_in_dtype(x, None))


def test_the_threshold_is_at_most_32_mib_and_tests_can_move_it():
    own = kernels.stream_threshold()
    assert 0 < own <= 32 << 20
    with kernels.stream_from(1000):
        assert kernels.stream_threshold() == 1000
        assert kernels.streams(250, 1) and not kernels.streams(249, 8)  # forced: one thread too
    assert kernels.stream_threshold() == own


def test_calls_stream_from_the_threshold_on_two_threads_or_more():
    at = kernels.stream_threshold() // 4  # float32 elements
    assert kernels.streams(at, 2) and kernels.streams(at, 64) and kernels.streams(1 << 40, 2)
    assert not kernels.streams(at - 1, 2) and not kernels.streams(at, 1) and not kernels.streams(1 << 40, 1)


def test_an_output_past_the_threshold_streams_by_default_and_stays_exact():
    """2^23 float32 elements: 32 MiB, at or past every threshold the library picks."""
    x = torch.randn(2048, 4096, generator=torch.Generator().manual_seed(4)) * 2
    assert x.numel() * 4 >= kernels.stream_threshold()
    backend.set_backend("native")
    try:
        for spec in [lowbit.get_format("affine")(bits=8), lowbit.get_format("mxint8")(),
                     lowbit.get_format("ternary")(width=2, scaling_factor=True)]:  # fmt: skip
            got = spec.quantize(x)
            assert_bits_equal(got, spec._quantize_in_dtype(x, None))
    finally:
        backend.set_backend("eager")
