"""The compiled path gives bit-identical results to the eager path, for every format case."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import warnings

import pytest
import torch
from format_cases import CASES
from helpers import assert_same

import lowbit
from lowbit import backend, casting

SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-40, -3e38, 2.0**-9, 448.0, 1.9375]


def case_input(seed: int) -> torch.Tensor:
    """Mixed magnitudes, exact ties of many grids (multiples of 2^-8), and every special value."""
    generator = torch.Generator().manual_seed(seed)
    spread = torch.randn(37, 70, generator=generator) * torch.logspace(-6, 6, 70)
    ties = torch.randint(-4096, 4096, (37, 70), generator=generator) / 256.0
    x = torch.where(torch.rand(37, 70, generator=generator) < 0.3, ties, spread)
    x.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
    return x


@pytest.fixture(autouse=True)
def fresh_backend(monkeypatch):
    monkeypatch.setenv("LOWBIT_NATIVE", "0")  # this file is about torch.compile kernels (tests/native: native)
    backend.clear_cache()
    yield
    backend.set_background_compile(None)
    backend.set_backend("eager")
    assert backend.wait_for_background(timeout=300)  # no kernel still compiling into the next test
    backend.clear_cache()


# Cases whose first compile takes over ~5 s with a cold Inductor cache on 2 cores (Zen 3, torch 2.13: 6-44 s each,
# ~390 s together, 35 % of the suite): they run in `make test-compiled` (CI runs it after `make test`); the
# cheaper cases below still cover every family (element, scaled, block, MX, codebook, ternary / binary) here.
HEAVY_COMPILES = {
    "block-log", "affine-pow2-block", "e2m1-block32", "affine-minmax", "block-minifloat", "mxfp6_e2m3", "mxfp6_e3m2",
    "mxfp8_e4m3", "mxfp8_e5m2", "q2f", "mxint8", "q8f", "gguf_q4_0", "gguf_q4_1", "q4s-block-bf16", "q4f", "q8s",
    "nf4", "q2s",
}
COMPILE_MATRIX = pytest.mark.compile_matrix


def _case(case_id: str, name: str, params: dict):
    return pytest.param(name, params, id=case_id, marks=[COMPILE_MATRIX] if case_id in HEAVY_COMPILES else [])


def test_heavy_compile_ids_are_cases():
    assert HEAVY_COMPILES <= {case_id for case_id, *_ in CASES}  # a renamed case would silently leave the matrix


@pytest.mark.parametrize("name,params", [_case(i, n, p) for i, n, p, _ in CASES])
def test_compiled_equals_eager(name, params):
    spec = lowbit.get_format(name)(**params)
    x = case_input(seed=len(name))
    backend.set_backend("eager")
    expected = [spec(x), spec(x[:5, :33].contiguous())]
    backend.set_backend("compiled")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager would hide a failure
        actual = [spec(x), spec(x[:5, :33].contiguous())]
    for got, want in zip(actual, expected, strict=True):
        assert_same(got, want)
    assert (spec, torch.float32, 2, torch.float32) in backend._kernels  # it really ran compiled


@pytest.mark.parametrize(
    "name,params,dtype",
    [pytest.param("q4s", {"block_size": [1, 32], "scale_dtype": "bf16"}, torch.bfloat16,  # output-dtype kernel
                  marks=COMPILE_MATRIX),
     pytest.param("mxfp8_e5m2", {}, torch.float16, marks=COMPILE_MATRIX),  # MX saturates at the output dtype's max
     pytest.param("block_minifloat", {"width": 8, "exponent_width": 4}, torch.float64,  # float64 compute
                  marks=COMPILE_MATRIX),
     ("integer", {"width": 8, "frac_width": 4}, torch.bfloat16),
     ("block_fp", {"width": 6, "exponent_width": 5, "block_size": [1, 16]}, torch.float16)],  # saturates in f16
)  # fmt: skip
def test_compiled_equals_eager_other_dtypes(name, params, dtype):
    spec = lowbit.get_format(name)(**params)
    x = case_input(seed=1).to(dtype)
    backend.set_backend("eager")
    want = spec(x)
    backend.set_backend("compiled")
    assert_same(spec(x), want)
    # scalar formats take the half-precision tensor itself (up-cast, quantize and down-cast in one pass);
    # block formats get float32 (see FormatSpec.upcast_before_kernel)
    kernel_dtype = torch.float32 if spec.upcast_before_kernel and dtype != torch.float64 else dtype
    assert list(backend._kernels) == [(spec, kernel_dtype, 2, kernel_dtype)]


@pytest.mark.parametrize(
    "name,params",
    [("e4m3", {"scale": [2.0 ** (i % 9 - 4) * 1.3 for i in range(70)], "axis": 1}),  # calibrated, per channel
     ("affine", {"bits": 8, "scale": [0.01 * (i + 1) for i in range(70)], "zero_point": [i - 35 for i in range(70)],
                 "axis": -1})],  # the count check once made torch.compile give up (and go eager for good)
)  # fmt: skip
def test_compiled_equals_eager_with_given_parameters_per_channel(name, params):
    spec = lowbit.get_format(name)(**params)
    x = case_input(seed=2)  # [37, 70]: one given value per column
    backend.set_backend("eager")
    want = [spec(x), spec(x[:5].contiguous())]
    backend.set_backend("compiled")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = [spec(x), spec(x[:5].contiguous())]
    for actual, expected in zip(got, want, strict=True):
        assert_same(actual, expected)
    assert (spec, torch.float32, 2, torch.float32) in backend._kernels


def test_one_kernel_serves_every_shape():
    spec = lowbit.get_format("mxint8")()  # blocks of 32 along the last dimension, padded where needed
    backend.set_backend("compiled")

    def check(shapes):
        for rows, columns in shapes:
            x = torch.randn(rows, columns)
            backend.set_backend("eager")
            want = spec(x)
            backend.set_backend("compiled")
            assert_same(spec(x), want)

    check([(8, 64), (9, 50), (33, 17), (3, 1000)])  # with and without padding: a few specialisations at most
    torch._dynamo.utils.counters.clear()
    check([(16, 96), (7, 70), (40, 33), (5, 2000), (64, 128), (11, 45)])  # new shapes of the same kinds
    assert len(backend._kernels) == 1
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # no compile per shape


def test_backend_selection(monkeypatch):
    backend.set_backend("COMPILED")
    assert lowbit.get_backend() == "compiled"
    with pytest.raises(lowbit.ConfigError, match="compild.*did you mean 'compiled'"):
        lowbit.set_backend("compild")
    backend._state["backend"] = None
    monkeypatch.setenv("LOWBIT_BACKEND", "eager")
    assert lowbit.get_backend() == "eager"
    backend._state["backend"] = None
    monkeypatch.setenv("LOWBIT_BACKEND", "fast")
    with pytest.raises(lowbit.ConfigError, match="LOWBIT_BACKEND"):
        lowbit.get_backend()
    backend._state["backend"] = None
    monkeypatch.delenv("LOWBIT_BACKEND")
    assert lowbit.get_backend() == "auto"


def test_auto_compiles_only_large_tensors():
    spec = lowbit.get_format("integer")(width=8, frac_width=4)
    backend.set_backend("auto")
    small, large = torch.randn(4, 4), torch.randn(backend.AUTO_MIN_ELEMENTS)
    assert not backend.wants_compiled(spec, small)
    assert backend.wants_compiled(spec, large)
    for _ in range(backend.HOT_CALLS + 2):
        spec(small)
    assert backend._tiers["calls"] == {} and backend.wait_for_background(timeout=60)  # small: never queued
    stochastic = lowbit.get_format("integer")(width=8, frac_width=4, rounding="stochastic")
    assert not backend.wants_compiled(stochastic, large)  # seeded draws must match the eager path


def test_stochastic_rounding_is_reproducible_on_the_compiled_backend():
    x = torch.randn(64, 64)
    backend.set_backend("eager")
    want = lowbit.quantize(x, "integer", width=8, frac_width=4, rounding="stochastic", seed=3)
    backend.set_backend("compiled")
    assert_same(lowbit.quantize(x, "integer", width=8, frac_width=4, rounding="stochastic", seed=3), want)


def test_compile_failure_warns_once_and_falls_back(monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken_compile)
    backend.set_backend("compiled")
    spec = lowbit.get_format("e4m3")()
    x = torch.randn(10, 10) * 100
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = spec(x)
        second = lowbit.quantize(x, "q8s")
    assert len(record) == 1 and record[0].category is RuntimeWarning
    assert "no C++ compiler found" in str(record[0].message)
    backend.set_backend("eager")
    assert_same(first, spec(x))
    assert_same(second, lowbit.quantize(x, "q8s"))


def test_gradients_pass_through_compiled_kernels():
    backend.set_backend("compiled")
    x = torch.randn(16, 32, requires_grad=True)
    lowbit.quantize(x, "mxfp4_e2m1").mul(torch.arange(32.0)).sum().backward()
    assert torch.equal(x.grad, torch.arange(32.0).expand(16, 32))


class SlowCompiler:
    """torch.compile whose kernels wait for ``gate`` before running, recording the thread of every call."""

    def __init__(self, monkeypatch):
        self.gate, self.threads, real = threading.Event(), [], torch.compile

        def compile_slowly(function, **options):
            compiled = real(function, **options)

            def kernel(x):
                self.threads.append(threading.current_thread())
                self.gate.wait(timeout=120)  # a caller blocked here would hang the test, then fail below
                return compiled(x)

            return kernel

        monkeypatch.setattr(torch, "compile", compile_slowly)


@pytest.mark.parametrize("name,params", [("e4m3", {}), ("mxfp4_e2m1", {}), ("affine", {"bits": 8})])
def test_auto_first_calls_never_wait_for_the_compiler_and_the_swap_keeps_the_bits(monkeypatch, name, params):
    slow = SlowCompiler(monkeypatch)
    spec = lowbit.get_format(name)(**params)
    x = case_input(seed=5).repeat(4, 8)  # 148 x 560: above AUTO_MIN_ELEMENTS
    backend.set_backend("eager")
    want = spec(x)
    backend.set_backend("auto")
    backend.set_background_compile(True)
    signature = backend.kernel_signature(spec, tuple(x.shape), x.dtype)
    before = [spec(x) for _ in range(backend.HOT_CALLS + 3)]  # hot after HOT_CALLS: queued, not awaited
    assert not slow.gate.is_set() and not backend.is_ready(signature)
    assert threading.main_thread() not in slow.threads  # no call went near the (blocked) compiler
    slow.gate.set()
    assert backend.wait_for_background(timeout=300)
    assert backend.is_ready(signature) and slow.threads == [slow.threads[0]] != [threading.main_thread()]
    after = [spec(x), spec(x)]
    assert slow.threads[1:] == [threading.main_thread()] * 2  # the fused kernel now answers the caller
    for got in before + after:
        assert_same(got, want)


def test_auto_compiles_nothing_in_the_background_unless_asked(monkeypatch):
    """Off by default: a compile traces with torch.fx, which patches nn.Module.__call__ for every thread."""
    slow = SlowCompiler(monkeypatch)
    slow.gate.set()
    spec = lowbit.get_format("e4m3")()
    backend.set_backend("auto")
    x = torch.randn(128, 256)
    for _ in range(backend.HOT_CALLS + 3):
        spec(x)
    assert slow.threads == [] and backend._tiers["queued"] == set()
    assert not backend.is_ready(backend.kernel_signature(spec, (128, 256), torch.float32))
    monkeypatch.setenv("LOWBIT_BACKGROUND_COMPILE", "1")
    assert backend.background_compile()
    backend.set_background_compile(False)
    assert not backend.background_compile()
    with pytest.raises(lowbit.ConfigError):
        backend.set_background_compile("yes")


def test_auto_swaps_per_shape_and_keeps_small_tensors_eager(monkeypatch):
    slow = SlowCompiler(monkeypatch)
    slow.gate.set()
    spec = lowbit.get_format("integer")(width=8, frac_width=4)
    backend.set_backend("auto")
    backend.set_background_compile(True)
    big, other = torch.randn(128, 256), torch.randn(64, 512)
    for _ in range(backend.HOT_CALLS):
        spec(big)
    assert backend.wait_for_background(timeout=300)
    slow.gate.clear()
    spec(other)  # a new shape of a hot key: eager now, checked in the background, then fused
    assert not backend.is_ready(backend.kernel_signature(spec, (64, 512), torch.float32))
    slow.gate.set()
    assert backend.wait_for_background(timeout=300)
    assert backend.is_ready(backend.kernel_signature(spec, (64, 512), torch.float32))
    backend.set_backend("eager")
    want = spec(other)
    backend.set_backend("auto")
    assert_same(spec(other), want)


def test_warmup_compiles_up_front_with_progress_and_auto_uses_it_from_the_first_call(monkeypatch):
    slow = SlowCompiler(monkeypatch)
    slow.gate.set()
    backend.set_backend("auto")
    lines = []
    ready = lowbit.warmup(["e2m1", lowbit.get_format("integer")(width=4)], [(64, 300)],
                          dtypes=(torch.float32, torch.bfloat16), progress=lines.append)  # fmt: skip
    assert ready == 4 and len(lines) == 8
    assert lines[0].startswith("lowbit warmup [1/4] compiling e2m1(")
    assert lines[1].startswith("lowbit warmup [1/4] ready in")
    x = torch.randn(64, 300, dtype=torch.bfloat16)
    calls = len(slow.threads)
    got = lowbit.quantize(x, "integer", width=4)
    assert len(slow.threads) == calls + 1  # the very first call ran the fused kernel
    backend.set_backend("eager")
    assert_same(got, lowbit.quantize(x, "integer", width=4))
    assert lowbit.warmup("e2m1", [(8, 8)], progress=lines.append) == 0  # eager: nothing to compile
    assert lines[-1] == "lowbit warmup: the eager backend compiles nothing"


def test_warmup_reports_a_compile_failure(monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken_compile)
    backend.set_backend("auto")
    lines = []
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found"):
        assert lowbit.warmup("e4m3", [(32, 32)], progress=lines.append) == 0
    assert lines[-1] == "lowbit warmup: compiling failed; the eager path will be used"


def test_import_starts_no_thread_and_compiles_nothing():
    code = ("import threading, sys, lowbit, torch; from lowbit import backend; "
            "print(threading.active_count(), len(backend._kernels), backend._tiers['worker'], "
            "'torch._inductor' in sys.modules)")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["1", "0", "None", "False"]


def test_exit_waits_for_the_kernel_being_compiled_and_drops_the_queue(tmp_path):
    """A daemon compile thread killed inside the compiler aborts the process ("terminate called ..."): at
    exit the worker finishes its current kernel and skips the queued ones."""
    import subprocess
    import sys

    marker = tmp_path / "built.txt"
    script = f"""
import time, torch, lowbit.backend as backend
def slow_build(signature):
    time.sleep(1.0)
    with open({str(marker)!r}, "a") as handle:
        handle.write("built\\n")
    return True
backend.build = slow_build
with backend._tier_lock:
    for index in range(3):
        backend._job_queue().put((backend._tiers["generation"], ("key", index)))
time.sleep(0.2)  # the worker is inside the first build when the interpreter exits
"""
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert marker.read_text() == "built\n"  # the running build finished; the two queued ones were dropped


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("special", ["none", "nan", "inf", "-inf", "past the range", "empty"])
def test_saturating_cast_matches_its_rule_on_every_kind_of_tensor(dtype, special):
    """The plain cast after a min / max pass (no NaN, inf or value past the range), the full rule otherwise."""
    x = torch.randn(300, generator=torch.Generator().manual_seed(1)) * 100
    past = min(torch.finfo(dtype).max * 1.5, torch.finfo(torch.float32).max)  # float32, past the narrow range
    replaced = {"nan": float("nan"), "inf": float("inf"), "-inf": -float("inf"), "past the range": -past}
    if special == "empty":
        x = x[:0]
    elif special != "none":
        x[17] = replaced[special]
    limit = torch.finfo(dtype).max
    want = torch.where(torch.isfinite(x), x.clamp(-limit, limit), x).to(dtype)
    got = casting.saturating_cast(x, dtype)
    assert got.dtype == dtype and torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got[~torch.isnan(got)], want[~torch.isnan(want)])
