"""Element-wise native kernels over bfloat16 / float16 storage (csrc/stream.h: a tile widened into float32,
computed, narrowed): on every 16-bit input pattern, in every deterministic rounding mode where the format has
modes, on one and several threads and at lengths that end in a partial tile, the same bits as the eager path
(which computes on the float32 value and casts back with casting.saturating_cast)."""

from __future__ import annotations

import pytest
import torch
from helpers import DETERMINISTIC, eager_and_native

import lowbit
from lowbit.native import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")

HALF_FORMATS = [
    ("integer", {"width": 8, "frac_width": 4}),
    ("integer", {"width": 4, "frac_width": -3}),
    ("minifloat_ieee", {"width": 8, "exponent_width": 4, "exponent_bias": 7}),
    ("minifloat_denorm", {"width": 6, "exponent_width": 3}),
    ("e4m3", {}),
    ("e5m2", {"saturate": False}),
    ("log", {"width": 8, "exponent_bias": 63}),
    ("binary_residual", {"levels": 2}),
    ("affine", {"bits": 8}),  # per tensor: min / max over the halves, then the elements
    ("affine", {"bits": 4, "symmetric": True, "power_of_two": True}),
    ("affine", {"bits": 8, "scale": (0.05,), "zero_point": (3,)}),
]


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def every_pattern(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)


def assert_native_half_equals_eager(spec, x: torch.Tensor) -> None:
    assert spec._native_takes_halves()
    want, through_backend = eager_and_native(spec, x)
    if spec.narrows_directed:  # narrowed toward the input (casting.narrow_toward): the backend goes through
        got = through_backend  # float32, since the half kernels narrow to nearest
    else:
        got = spec._native(x.contiguous(), x.dtype)  # the kernel itself: None would mean it declined
        assert got is not None and got.dtype == x.dtype
        assert torch.equal(through_backend.view(torch.int16), got.view(torch.int16))  # the backend takes it
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    mismatch = (got.view(torch.int16) != want.view(torch.int16)) & ~nan
    assert not mismatch.any(), (  # the message is built only when the assertion fails
        f"{int(mismatch.sum())} differ: {x[mismatch][:4]} -> {got[mismatch][:4]} vs {want[mismatch][:4]}")


def rounding_variants(params: dict, name: str) -> list[dict]:
    modes = lowbit.get_format(name).roundings
    return [{**params, "rounding": mode} for mode in DETERMINISTIC if mode in modes] or [params]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,params", HALF_FORMATS)
def test_every_half_input_gives_the_eager_bits(name, params, dtype):
    for variant in rounding_variants(params, name):
        assert_native_half_equals_eager(lowbit.get_format(name)(**variant), every_pattern(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("length", [1, 7, 2047, 2049, 65531])
def test_partial_tiles_on_several_threads(dtype, length, several_threads):
    x = every_pattern(dtype)[torch.randperm(65536, generator=torch.Generator().manual_seed(length))][:length]
    for name, params in HALF_FORMATS:
        assert_native_half_equals_eager(lowbit.get_format(name)(**params), x.view(1, -1))


@pytest.mark.parametrize(("params", "shape"), [
    ({"bits": 8, "axis": 1}, (6, 2, 40)),  # a channel of an inner dimension: statistics across rows
    ({"bits": 4, "block_size": [1, 24]}, (3, 4104)),  # rows longer than a tile, in blocks not of 16
    ({"bits": 8, "scale": (0.1, 0.2, 0.3), "axis": 1}, (2, 3, 1000)),  # given per channel: slices past a tile
], ids=str)  # fmt: skip
def test_affine_in_other_layouts_goes_through_float32(params, shape):
    """The kernel declines halves there; the backend then widens x and narrows the float32 kernel's result."""
    spec = lowbit.get_format("affine")(**params)
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 4).bfloat16()
    assert spec._native(x, x.dtype) is None
    assert spec._native(x.float(), x.dtype) is not None  # the float32 kernel runs there
    want, got = eager_and_native(spec, x)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
