"""The native per-token steps of the dynamic int8 Linear (lowbit.native.token) give the eager steps' bits,
and the default backend never compiles them."""

from __future__ import annotations

import pytest
import torch

from lowbit import backend
from lowbit.native import build, token
from lowbit.native import kernels as native_kernels
from lowbit.ops import Int8DynamicLinear, kernels, routes

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def library():
    assert build.ensure() is not None, build.error()
    yield
    backend.set_backend("eager")


def hard_rows(rows: int, columns: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, columns, generator=generator) * 3
    x[0, 7] = 40.0  # an outlier sets the first row's scale
    x[1, 4] = float("nan")  # NaN row: codes 0
    x[2, 9], x[2, 10] = float("inf"), -float("inf")  # infinite scale: codes 0
    x[3] = -0.75  # constant row, all negative (its max is negative)
    x[4] = torch.randn(columns, generator=generator) * 1e-39  # subnormal row: scale clamped to the smallest normal
    x[5] = 0.0
    x[6, ::2] = -0.0
    if rows > 7:
        x[7, -1] = float("nan")  # a NaN in the last column (past the 32-lane body when columns % 32 != 0)
        x[7, -2] = 55.0  # and the row's max beside it
    return x


def same(got: torch.Tensor | None, want: torch.Tensor | None) -> bool:
    if got is None or want is None:
        return got is want
    return got.dtype == want.dtype and got.shape == want.shape and torch.equal(got.isnan(), want.isnan()) and \
        torch.equal(got.nan_to_num(), want.nan_to_num())  # fmt: skip


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("q_max", [127, 63])
@pytest.mark.parametrize("rows", [8, 1100])  # 1100 x 1000: many rows of 16-lane blocks and a tail
def test_token_quantize_equals_the_eager_steps(symmetric, q_max, rows, several_threads):
    x = hard_rows(rows, 1000 if rows > 8 else 96, seed=rows)
    for float_codes, eager in ((False, kernels.token_quantize), (True, kernels.token_float_quantize)):
        got = token.quantize(x, symmetric, q_max, float_codes)
        want = eager(x, symmetric, q_max)
        assert all(same(g, w) for g, w in zip(got, want)), float_codes


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("sums_dtype,owned", [(torch.int32, False), (torch.int32, True), (torch.float32, False)])
@pytest.mark.parametrize("rows,columns,threaded", [(37, 50, False), (300, 1000, True)])
def test_token_rescale_equals_the_eager_step(symmetric, with_bias, sums_dtype, owned, rows, columns, threaded):
    """Into a new tensor, or in place (float32 sums; int32 sums handed over, whose buffer becomes the result),
    on one thread and on several (row chunks)."""
    generator = torch.Generator().manual_seed(3)
    acc = torch.randint(-(2**20), 2**20, (rows, columns), generator=generator).to(sums_dtype)
    scale, weight_scale = torch.rand(rows, 1, generator=generator), torch.rand(columns, generator=generator)
    offset = None if symmetric else torch.randn(rows, 1, generator=generator)
    sums = None if symmetric else torch.randn(columns, generator=generator) * 100
    bias = torch.randn(columns, generator=generator) if with_bias else None
    want = kernels.token_rescale(acc, scale, weight_scale, offset, sums, bias)
    given = acc.clone()
    with native_kernels.threads_from(1 << 10 if threaded else 1 << 40):
        got = token.rescale(given, scale, weight_scale, offset, sums, bias, owned=owned)
    assert same(got, want)
    assert (got.data_ptr() == given.data_ptr()) == (owned or sums_dtype == torch.float32)


def test_mismatched_vectors_are_refused_not_read_past_their_end():
    acc = torch.zeros(4, 6, dtype=torch.int32)
    assert token.rescale(acc, torch.ones(4, 1), torch.ones(5), None, None, None) is None
    assert token.rescale(acc, torch.ones(3, 1), torch.ones(6), None, None, None) is None
    assert token.rescale(acc, torch.ones(4, 1), torch.ones(6), None, None, torch.ones(7)) is None
    assert token.quantize(torch.ones(4, 6, dtype=torch.float64), True, 127, False) is None
    assert token.quantize(torch.ones(6, 4).t(), True, 127, False) is None


@pytest.mark.parametrize("settings", [{}, {"act_symmetric": False}, {"act_bits": 7}])
@pytest.mark.parametrize("rows", [7, routes.FUSED_MIN_ROWS + 5])
def test_every_path_of_the_module_gives_the_eager_bits_natively(settings, rows):
    module = Int8DynamicLinear.from_float(torch.nn.Linear(96, 40), **settings)
    x = hard_rows(rows, 96, seed=11)
    paths = ["int_mm", "float_codes", "compiled"] + (["fbgemm"] if routes.runs_exactly("fbgemm", "cpu", module.act_bits) else [])
    for path in paths:
        if path == "compiled" and not routes.runs_exactly("compiled", "cpu", module.act_bits):
            continue
        module.path = path
        backend.set_backend("eager")
        want = module(x)
        backend.set_backend("native")
        assert same(module(x), want), path


def test_auto_never_compiles_the_token_steps(monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("torch.compile called on the default backend")

    monkeypatch.setattr(torch, "compile", no_compile)
    module = Int8DynamicLinear.from_float(torch.nn.Linear(96, 40))
    x = torch.randn(routes.FUSED_MIN_ROWS + 5, 96)
    backend.set_backend("eager")
    want = module(x)
    backend.set_backend("auto")
    assert torch.equal(module(x), want)  # native steps
    monkeypatch.setenv("LOWBIT_NATIVE", "0")
    assert torch.equal(module(x), want)  # eager steps: still no compile
