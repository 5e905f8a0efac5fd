"""lowbit's exact int8 GEMM (lowbit.native.gemm, csrc/int8_gemm.c): int32 sums equal to int64 sums for every
shape, code range and thread split, on the AVX2 tiles and on the portable code (make test-kernel-targets
builds the x86-64-v2 one), and the dynamic / static int8 Linear's "native" path bit-identical to its other
exact routes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit import backend
from lowbit.native import build, gemm
from lowbit.native import kernels as native_kernels
from lowbit.ops import Int8DynamicLinear, W8A8StaticLinear, capabilities, routes

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def library():
    assert build.ensure() is not None, build.error()


def codes(rows: int, columns: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    low, high = (0, 256) if dtype == torch.uint8 else (-128, 128)
    return torch.randint(low, high, (rows, columns), generator=generator, dtype=torch.int16).to(dtype)


def exact(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return a.long() @ weight.long().t()


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 100), inner=st.integers(1, 300), columns=st.integers(1, 70),
       unsigned=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_sums_equal_int64_sums(rows, inner, columns, unsigned, seed):
    a = codes(rows, inner, torch.uint8 if unsigned else torch.int8, seed)
    weight = codes(columns, inner, torch.int8, seed + 1).clamp_(-127, 127)
    got = gemm.sums(a, gemm.pack(weight))
    assert got.dtype == torch.int32 and torch.equal(got.long(), exact(a, weight))


@pytest.mark.parametrize("unsigned", [False, True])
def test_worst_case_pairs_do_not_saturate(unsigned):
    """Every pair of products at its largest magnitude, both signs: where vpmaddubsw saturates int16, the
    int16 pairs here add in int32. K past the float32-exact limit of the float routes (2064) too."""
    inner = 4104
    a = torch.full((13, inner), 255 if unsigned else -128, dtype=torch.uint8 if unsigned else torch.int8)
    if not unsigned:
        a[1::2] = 127
    weight = torch.full((33, inner), 127, dtype=torch.int8)
    weight[1::2] = -127
    weight[5, ::3] = -128  # the int8 minimum too
    got = gemm.sums(a, gemm.pack(weight))
    assert torch.equal(got.long(), exact(a, weight))


def test_threaded_split_and_block_edges(several_threads):
    """More rows than one block (48) and more panels than one group, split over threads: the same sums."""
    a, weight = codes(203, 385, torch.int8, 3), codes(150, 385, torch.int8, 4)
    assert torch.equal(gemm.sums(a, gemm.pack(weight)).long(), exact(a, weight))
    with native_kernels.threads_from(1):
        assert torch.equal(gemm.sums(a[:7], gemm.pack(weight)).long(), exact(a[:7], weight))


def test_refuses_what_it_does_not_take():
    weight = codes(16, 32, torch.int8, 0)
    packed = gemm.pack(weight)
    assert gemm.sums(codes(4, 32, torch.int8, 1).float(), packed) is None  # not codes
    assert gemm.sums(codes(4, 31, torch.int8, 1), packed) is None  # packed for another K
    assert gemm.sums(codes(4, 64, torch.int8, 1)[:, ::2], packed) is None  # not contiguous
    assert gemm.pack(weight.float()) is None and gemm.pack(weight.reshape(-1)) is None
    assert gemm.sums(codes(0, 32, torch.int8, 1), packed).shape == (0, 16)


TOKEN_AND_TENSOR = [{}, {"act_symmetric": False}, {"act_granularity": "tensor", "act_symmetric": False}]


@pytest.mark.parametrize("options", TOKEN_AND_TENSOR)
def test_dynamic_native_path_matches_the_other_exact_routes(options):
    torch.manual_seed(0)
    module = Int8DynamicLinear.from_float(torch.nn.Linear(200, 70), **options)
    x = torch.randn(61, 200) * 2
    x[0, 5] = 40.0
    module.path = "float_codes"
    want = module(x)
    module.path = "native"
    assert torch.equal(module(x), want)
    assert torch.allclose(want, module.forward_reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("signed", [False, True])
def test_static_native_path_matches_the_float_route(signed):
    torch.manual_seed(1)
    module = W8A8StaticLinear.from_float(torch.nn.Linear(96, 40), act_signed=signed)
    module.set_input_qparams(0.05, 3 if signed else 120)
    x = torch.randn(33, 96) * 4
    module.path = "float_codes"
    want = module(x)
    module.path = "native"
    assert torch.equal(module(x), want)


def test_route_takes_native_where_fbgemm_saturates_and_says_when_int8_is_slower():
    cpu = torch.device("cpu")
    with capabilities.injected("avx2"):
        assert routes.int8_dynamic(cpu, 2112, 384, 1536, native=True) == "native"
        assert routes.int8_dynamic(cpu, 1, 4096, 1536, native=True) == "native"  # no K limit
        assert routes.int8_dynamic(cpu, 16, 384, 1536, act_bits=7, native=True) == "fbgemm"  # one exact call
        assert routes.w8a8_static(cpu, 16, 384, 1536, native=True) == "native"
        assert routes.int8_dynamic(cpu, 16, 384, 1536, native=False) == "fbgemm_pairs"  # library not loaded yet
        assert routes.int8_linear_problem(cpu, native=True) is None  # the class's probe: measured faster
        assert "slower than float32" in routes.int8_linear_problem(cpu, native=False)
    with capabilities.injected("avx2", native_int8_fast=False):
        assert routes.int8_dynamic(cpu, 16, 384, 1536, native=True) == "native"  # still the fastest exact one
        assert "native int8 kernel measured slower" in routes.int8_linear_problem(cpu, native=True)
    for cpu_class in ("avx512_vnni", "amx"):
        with capabilities.injected(cpu_class):
            assert routes.int8_dynamic(cpu, 16, 384, 1536, native=True) == "fbgemm"
            assert routes.int8_linear_problem(cpu, native=False) is None


def test_recipe_info_says_in_one_line_when_int8_is_slower_than_float32():
    import lowbit

    def model():
        return torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))

    with capabilities.injected("avx2", native_int8_fast=False):
        _, info = lowbit.quantize_model(model(), "int8_dynamic")
        assert "int8 Linear layers run slower than float32" in info["note"] and "\n" not in info["note"]
        assert "note" not in lowbit.quantize_model(model(), "int8_dynamic", act_bits=7)[1]  # one exact fbgemm call
    backend.set_backend("auto")  # the backend that runs native kernels (the suite runs eagerly)
    try:
        with capabilities.injected("avx2"):  # the native kernel measured faster
            assert "note" not in lowbit.quantize_model(model(), "int8_dynamic")[1]
    finally:
        backend.set_backend("eager")
    with capabilities.injected("avx512_vnni"):
        assert "note" not in lowbit.quantize_model(model(), "int8_dynamic")[1]
