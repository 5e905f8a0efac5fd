"""Sign formats (binary, ternary) over bfloat16 / float16 storage (csrc/sign.c's half_phase: each statistics
and element pass reads tiles of x widened into float32, the element pass narrows its tiles into out): the same
bits as the eager path (float32 arithmetic, then casting.saturating_cast) for every 16-bit input, per tensor
and per channel on the first and last axes, on one and several threads, over several pieces, and where a mean
lies on a float32 midpoint (the exact step reads the halves too)."""

from __future__ import annotations

import pytest
import torch
from helpers import eager_and_native
from test_half_storage import assert_native_half_equals_eager, every_pattern

import lowbit
from lowbit.native import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")

SIGN_FORMATS = [
    ("binary", {}), ("binary", {"bipolar": False}), ("binary", {"alpha": 0.5, "scaling_factor": True}),
    ("ternary", {}), ("ternary", {"threshold": 0.25}), ("ternary", {"alpha": 3.0, "scaling_factor": True}),
]  # fmt: skip


def sign_specs():
    for name, params in SIGN_FORMATS:
        for axis in (None, 0, -1):
            scaled = {} if "scaling_factor" in params else {"scaling_factor": True}
            yield lowbit.get_format(name)(**params, **scaled, axis=axis)
    yield lowbit.get_format("ternary")()  # TWN's threshold, no scale
    yield lowbit.get_format("binary")()  # no statistic: the element pass alone


@pytest.fixture(scope="module", autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def finite_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every finite 16-bit value, shuffled (NaN or inf anywhere leave a scale NaN, inf or 0: one sample of
    those below)."""
    x = every_pattern(dtype)
    x = x[torch.isfinite(x)]
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(8))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec", list(sign_specs()), ids=lambda spec: spec.describe())
def test_every_half_input_gives_the_eager_bits(spec, dtype):
    finite = finite_patterns(dtype)
    whole, ragged = finite[: 30 * 2048].view(30, 2048), finite[: 31 * 1999].view(31, 1999)
    for x in (whole, ragged, every_pattern(dtype).view(64, -1)):
        assert_native_half_equals_eager(spec, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(700, 300), (3, 100003)], ids=str)  # several pieces; pieces that cut tiles
def test_pieces_on_several_threads(dtype, shape, several_threads):
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(shape[0])) * 3).to(dtype)
    for spec in sign_specs():
        assert_native_half_equals_eager(spec, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("axis", [None, 0])
def test_a_mean_on_a_float32_midpoint_takes_the_exact_step_over_halves(dtype, axis):
    """Rows [1, -1, 0.5, 2^-23]: mean |x| = 0.625 + 2^-25 exactly, a float32 midpoint, which the float64 sum
    cannot certify: the exact integer sum reads the halves and the tie goes to the even float, 0.625."""
    row = torch.tensor([1.0, -1.0, 0.5, 2.0**-23])
    x = torch.stack([row, -row.flip(0), row])[: 1 if axis is None else 3].to(dtype)
    spec = lowbit.get_format("binary")(scaling_factor=True, axis=axis)
    assert_native_half_equals_eager(spec, x)
    assert spec._native(x, dtype)[0, 0].item() == 0.625
    _, got = eager_and_native(lowbit.get_format("ternary")(scaling_factor=True, axis=axis), x)
    assert got.dtype == dtype
