"""Kernel choice per machine: decision tables for every CPU class (injected), every route exact where its
probe says it runs, forced paths checked, and the real no-VNNI behaviour reproduced in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from lowbit import ConfigError
from lowbit.ops import Int4WeightOnlyLinear, Int8DynamicLinear, Int8WeightOnlyLinear, W8A8StaticLinear
from lowbit.ops import capabilities, routes

CPU = torch.device("cpu")
SUM_PATHS = ("int_mm", "onednn", "fbgemm_pairs", "float_codes", "native")  # exact int32 sums, one rescaling: identical


def _module(k: int = 96, n: int = 40, seed: int = 0, **options) -> Int8DynamicLinear:
    torch.manual_seed(seed)
    return Int8DynamicLinear.from_float(torch.nn.Linear(k, n), **options)


# ---- decision tables, one machine per CPU class ------------------------------------------------------------
EXPECTED_INT8 = {  # class -> (1 row, 16 rows, 2112 rows) for the per-token int8 Linear, eager backend
    "amx": ("fbgemm", "fbgemm", "onednn"),
    "avx512_bf16": ("fbgemm", "fbgemm", "int_mm"),
    "avx512_vnni": ("fbgemm", "fbgemm", "int_mm"),
    "avx2": ("fbgemm_pairs", "fbgemm_pairs", "fbgemm_pairs"),
}


@pytest.mark.parametrize("cpu_class", sorted(EXPECTED_INT8))
def test_int8_dynamic_decision_table(cpu_class):
    with capabilities.injected(cpu_class) as machine:
        assert machine.cpu_class == cpu_class
        got = tuple(routes.int8_dynamic(CPU, rows, 384, 1536) for rows in (1, 16, 2112))
        assert got == EXPECTED_INT8[cpu_class]
        seven = routes.int8_dynamic(CPU, 16, 384, 1536, act_bits=7)
        assert seven == "fbgemm"  # 7-bit codes: one exact fbgemm call on every class
        wide = routes.int8_dynamic(CPU, 16, 4096, 1536)  # too wide for the exact float halves of the pairs
        assert wide == ("float_codes" if cpu_class == "avx2" else "fbgemm")
        static = routes.w8a8_static(CPU, 16, 384, 1536)
        assert static == ("float_codes" if cpu_class == "avx2" else "fbgemm")


@pytest.mark.parametrize("cpu_class", sorted(EXPECTED_INT8))
def test_int8_dynamic_row_crossover(cpu_class):
    """fbgemm's prepacked kernel below COMPILED_MIN_ROWS (measured faster at 64 rows on Zen 5), the integer
    matmul route from there where it is fast; no-VNNI classes never take the saturating one-call fbgemm."""
    crossover = routes.COMPILED_MIN_ROWS
    assert 64 < crossover <= 2112
    with capabilities.injected(cpu_class):
        below, at = (routes.int8_dynamic(CPU, rows, 1024, 1024, compile_allowed=True) for rows in (64, crossover))
    big = {"amx": "onednn", "avx2": "fbgemm_pairs"}.get(cpu_class, "compiled")
    assert (below, at) == ("fbgemm_pairs" if cpu_class == "avx2" else "fbgemm", big)


def test_compiled_route_only_where_int_mm_is_fast():
    with capabilities.injected("avx512_vnni"):
        assert routes.int8_dynamic(CPU, 2112, 384, 1536, compile_allowed=True) == "compiled"
    with capabilities.injected("avx2"):
        assert routes.int8_dynamic(CPU, 2112, 384, 1536, compile_allowed=True) == "fbgemm_pairs"
    with capabilities.injected("avx2", fbgemm_half_exact=False):  # a build without fbgemm
        assert routes.int8_dynamic(CPU, 2112, 384, 1536) == "float_codes"


def test_other_devices():
    meta, cuda = torch.device("meta"), torch.device("cuda")
    assert routes.int8_dynamic(meta, 64, 384, 1536) == "float_codes"
    assert routes.weight_only(meta, 64, torch.float32, "int4pack", True, 32) == "dequantize"
    assert routes.weight_only(cuda, 4, torch.bfloat16, "int4pack", True, 32) == "dequantize_bf16"
    assert routes.w8a8_static(meta, 64, 384, 1536) == "float_codes"


@pytest.mark.parametrize("cpu_class", sorted(capabilities.CLASS_PRESETS))
def test_weight_only_never_changes_the_dtype_of_a_float32_model(cpu_class):
    with capabilities.injected(cpu_class):
        for rows in (1, 16, 2112):
            assert routes.weight_only(CPU, rows, torch.float32, "int4pack", True, 32) == "dequantize"
        assert routes.weight_only(CPU, 8, torch.bfloat16, "int4pack", True, 32) == "int4pack"
        assert routes.weight_only(CPU, 8, torch.bfloat16, "int4pack", False, 32) == "dequantize_bf16"
        assert routes.weight_only(CPU, 64, torch.bfloat16, "int4pack", True, 32) == "dequantize_bf16"


@pytest.mark.parametrize("cpu_class", sorted(capabilities.CLASS_PRESETS))
def test_the_native_weight_only_kernel_serves_many_rows_only_where_it_measured_faster(cpu_class):
    with capabilities.injected(cpu_class):
        fast = capabilities.probe("native_linear_rows_fast")
        few = routes.NATIVE_FEW_ROWS
        for rows, want in ((1, "native"), (few, "native"), (few + 1, "native" if fast else "dequantize"),
                           (64, "native" if fast else "dequantize"), (129, "dequantize")):  # fmt: skip
            assert routes.weight_only(CPU, rows, torch.float32, "int4pack", True, 32, native=True) == want
        assert routes.weight_only(CPU, 1, torch.float32, "int4pack", True, 32, native=False) == "dequantize"
    assert capabilities.CLASS_PRESETS["avx2"][1]["native_linear_rows_fast"] is False  # measured on Zen 3


def test_the_native_rows_probe_measures_this_machine():
    from lowbit import native

    if native.ensure() is None:
        pytest.skip(f"no native library: {native.error()}")
    answer = capabilities.PROBES["native_linear_rows_fast"](CPU)
    assert isinstance(answer, bool)  # a timing: either answer is right somewhere; it must run and decide


def test_cpu_class_from_flags():
    def cls(*flags):
        return capabilities.Machine("cpu", frozenset(flags)).cpu_class

    assert cls("avx2", "fma") == "avx2"
    assert cls("avx2", "avx512f") == "avx512"
    assert cls("avx2", "avx_vnni") == "avx_vnni"
    assert cls("avx2", "avx512f", "avx512_vnni") == "avx512_vnni"
    assert cls("avx2", "avx512f", "avx512_vnni", "avx512_bf16") == "avx512_bf16"
    assert cls("avx512_vnni", "amx_tile", "amx_int8", "amx_bf16") == "amx"
    assert cls() == "baseline"


# ---- every route exact where it runs; auto exact on every class -------------------------------------------
@pytest.mark.parametrize("options", [{}, {"act_symmetric": False}, {"act_bits": 7}])
@pytest.mark.parametrize("rows", [1, 5, 70])
def test_sum_routes_are_bit_identical_and_match_the_reference(options, rows):
    module = _module(**options)
    x = torch.randn(rows, 96) * 3
    x[0, 3] = 50.0
    reference = module.forward_reference(x)
    outputs = {}
    for path in module.paths[2:]:
        if not routes.runs_exactly(path, CPU, module.act_bits):
            continue
        module.path = path
        outputs[path] = module(x)
        assert torch.allclose(outputs[path], reference, rtol=1e-5, atol=1e-5), path
    sums = [outputs[p] for p in SUM_PATHS if p in outputs]
    assert len(sums) >= 2 and all(torch.equal(out, sums[0]) for out in sums)


@pytest.mark.parametrize("cpu_class", sorted(capabilities.CLASS_PRESETS))
def test_auto_is_exact_under_every_class(cpu_class):
    module = _module(k=128, n=48)
    for rows in (1, 16, 80):
        x = torch.randn(rows, 128)
        with capabilities.injected(cpu_class):
            path = module.choose_path(x)
        if not routes.runs_exactly(path, CPU):  # the class's route is not exact on the CPU at hand
            continue
        module.path = path
        assert torch.allclose(module(x), module.forward_reference(x), rtol=1e-5, atol=1e-5), path
        module.path = "auto"
        assert torch.allclose(module(x), module.forward_reference(x), rtol=1e-5, atol=1e-5)


def test_forced_inexact_path_raises_and_slow_path_warns(monkeypatch):
    monkeypatch.setattr(routes, "_warned", set())  # warn-once state of its own
    module = _module()
    x = torch.randn(4, 96)
    with capabilities.injected("avx2"):
        module.path = "fbgemm"
        with pytest.raises(ConfigError, match="not exact on this machine"):
            module(x)
        module.path = "int_mm"
        with pytest.warns(UserWarning, match="slow on this machine"):
            module(x)
    tensor_module = _module(act_symmetric=False, act_granularity="tensor")
    tensor_module.path = "fbgemm_pairs"
    with pytest.raises(ConfigError, match="legal: auto, reference, fbgemm, int_mm, compiled, float_codes"):
        tensor_module(x)
    module.path = "onednn"
    with pytest.raises(ConfigError, match="CPU only"):
        module.to("meta")(torch.randn(4, 96, device="meta"))


# ---- modes, threads, devices, dtypes ---------------------------------------------------------------------------
def _recipes() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    return [Int8DynamicLinear.from_float(linear), Int8WeightOnlyLinear.from_float(linear),
            Int4WeightOnlyLinear.from_float(linear), W8A8StaticLinear.from_float(linear).set_input_qparams(0.02, 128)]  # fmt: skip


@pytest.mark.parametrize("index", range(4))
def test_inference_mode_then_no_grad_then_autograd(index):
    module = _recipes()[index]
    xs = [torch.randn(rows, 64) for rows in (3, 80)]
    with torch.inference_mode():
        first = [module(x) for x in xs]
    with torch.no_grad():
        assert all(torch.equal(module(x), want) for x, want in zip(xs, first))
    assert all(torch.equal(module(x.requires_grad_()).detach(), want) for x, want in zip(xs, first))
    with torch.inference_mode():
        assert all(torch.equal(module(x.detach()), want) for x, want in zip(xs, first))


def test_threads_share_a_module():
    module = _module(k=64, n=32)
    xs = [torch.randn(rows, 64) for rows in (2, 70, 130, 5)]
    want = [module(x) for x in xs]
    errors = []

    def work():
        for _ in range(5):
            for x, expected in zip(xs, want):
                if not torch.equal(module(x), expected):
                    errors.append("mismatch")

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


@pytest.mark.parametrize("index", range(4))
def test_dtype_casts_keep_the_quantized_numbers_and_the_device_follows(index):
    module = _recipes()[index]
    x = torch.randn(5, 64)
    want = module(x)
    dtypes = {name: buffer.dtype for name, buffer in module.named_buffers()}
    module.half()
    module.to(torch.bfloat16)
    assert {name: buffer.dtype for name, buffer in module.named_buffers()} == dtypes
    assert torch.equal(module(x), want)
    assert module(x.half()).dtype == torch.float16
    module.to("meta")
    out = module(torch.randn(5, 64, device="meta"))
    assert out.device.type == "meta" and out.shape == (5, 32)
    assert all(buffer.device.type == "meta" for buffer in module.buffers())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("index", range(4))
def test_cuda_matches_cpu(index):
    module = _recipes()[index]
    x = torch.randn(40, 64)
    want = module(x)
    got = module.to("cuda")(x.cuda())
    assert got.device.type == "cuda"
    assert torch.allclose(got.cpu(), want, rtol=1e-4, atol=1e-4)


# ---- the real no-VNNI machine, reproduced in a subprocess ----------------------------------------------------
NO_VNNI_SCRIPT = r"""
import torch, warnings
torch.backends.mkldnn.enabled = False   # torch._int_mm falls back to its scalar loop, as on Zen 3
from lowbit import ConfigError
from lowbit.ops import Int8DynamicLinear, capabilities
assert not capabilities.probe("fbgemm_exact") and capabilities.probe("fbgemm_half_exact")
assert not capabilities.probe("int_mm_fast")
torch.manual_seed(0)
for options in ({}, {"act_symmetric": False}, {"act_bits": 7}):
    module = Int8DynamicLinear.from_float(torch.nn.Linear(256, 64), **options)
    w = module.weight_codes
    w[:, 0::2], w[:, 1::2] = 127, -127   # pairs of products that saturate int16 without VNNI
    x = torch.randn(40, 256)
    x[:, 0::2] = x[:, 0::2].abs() + 1; x[:, 1::2] = -x[:, 1::2].abs() - 1
    path = module.choose_path(x)
    assert path == ("fbgemm" if options.get("act_bits") == 7 else "fbgemm_pairs"), path
    assert torch.allclose(module(x), module.forward_reference(x), rtol=1e-5, atol=1e-5)
    module.path = "float_codes"
    assert torch.allclose(module(x), module.forward_reference(x), rtol=1e-5, atol=1e-5)
    if options.get("act_bits") != 7:
        module.path = "fbgemm"
        try:
            module(x)
        except ConfigError:
            pass
        else:
            raise AssertionError("forced fbgemm ran on a saturating kernel")
print("no-vnni ok")
"""


def test_no_vnni_machine_in_a_subprocess():
    """fbgemm's AVX2 kernels (FBGEMM_ENABLE_INSTRUCTIONS=AVX2) saturate 8-bit codes exactly as on Zen 3; the
    probes see it and auto takes the exact two-call route."""
    env = {**os.environ, "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    result = subprocess.run([sys.executable, "-c", NO_VNNI_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no-vnni ok" in result.stdout
