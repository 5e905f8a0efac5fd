"""Real-quantized Linear modules: every fast path against the module's reference path, the config /
state-dict contract, storage sizes and errors."""

from __future__ import annotations

import copy
import json
import os
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lowbit import ConfigError, FormatError
from lowbit.ops import REAL_MODULES, Int4WeightOnlyLinear, Int8DynamicLinear, Int8WeightOnlyLinear, W8A8StaticLinear
from lowbit.ops import capabilities, kernels, routes

DYNAMIC_SETTINGS = [{}, {"act_symmetric": False}, {"act_symmetric": False, "act_granularity": "tensor"}]


def _linear(k: int, n: int, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n)


def _all_modules(linear: torch.nn.Linear) -> list[torch.nn.Module]:
    modules = [Int8DynamicLinear.from_float(linear, **settings) for settings in DYNAMIC_SETTINGS]
    modules += [Int8WeightOnlyLinear.from_float(linear), Int4WeightOnlyLinear.from_float(linear, group_size=32),
                W8A8StaticLinear.from_float(linear).set_input_qparams(0.02, 131),
                W8A8StaticLinear.from_float(linear, act_signed=True).set_input_qparams(0.03, -4)]  # fmt: skip
    return modules


@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.sampled_from([32, 64, 96]), st.integers(1, 24), st.sampled_from(DYNAMIC_SETTINGS))
def test_integer_paths_agree_with_reference(seed, rows, k, n, settings):
    generator = torch.Generator().manual_seed(seed)
    module = Int8DynamicLinear.from_float(_linear(k, n, seed % 100), **settings)
    x = torch.randn(rows, k, generator=generator) * 3
    reference = module.forward_reference(x)
    for path in _exact_paths(module):
        module.path = path
        assert torch.allclose(module(x), reference, rtol=1e-5, atol=1e-5)


def _exact_paths(module) -> list[str]:
    """The module's fast paths whose probes say they run exactly on this machine (the others raise)."""
    bits = getattr(module, "act_bits", 8)
    return [path for path in module.paths[2:] if routes.runs_exactly(path, "cpu", bits)]


def test_fast_paths_exact_with_power_of_two_scales():
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (16, 64), generator=generator, dtype=torch.int16).to(torch.int8)
    scale = 2.0 ** torch.randint(-8, -4, (16,), generator=generator).float()
    module = Int8DynamicLinear.from_float(torch.nn.Linear(64, 16, bias=False), codes=codes, scale=scale)
    x = torch.randint(-127, 128, (20, 64), generator=generator).float() * 2.0**-3
    x[:, 0] = 127 * 2.0**-3  # every row's max|x| is 127 steps of 2^-3: scale exactly 2^-3
    expected = (x.double() @ (codes.double() * scale.double().reshape(-1, 1)).t()).float()
    for path in ["reference", *_exact_paths(module)]:
        if path in ("reference", "fbgemm", "int_mm", "fbgemm_pairs", "float_codes"):  # not oneDNN's rounding
            module.path = path
            assert torch.equal(module(x), expected), path


@pytest.mark.parametrize("index", range(7))
def test_every_module_path_close_to_reference_and_float(index):
    linear = _linear(128, 48)
    module = _all_modules(linear)[index]
    x = torch.randn(3, 5, 128)
    reference = module.forward_reference(x.reshape(-1, 128)).reshape(3, 5, 48)
    float_out = linear(x).detach()
    tolerance = 0.15 if isinstance(module, Int4WeightOnlyLinear) else 0.05
    assert (reference - float_out).norm() / float_out.norm() < tolerance
    for path in _exact_paths(module):
        module.path = path
        out = module(x)
        assert out.shape == (3, 5, 48)
        bf16 = path in ("int8pack", "int4pack", "dequantize_bf16")  # bfloat16 activations
        assert torch.allclose(out, reference, rtol=2e-2 if bf16 else 1e-5, atol=2e-2 if bf16 else 1e-5)


@pytest.mark.parametrize("index", range(7))
def test_config_and_state_dict_rebuild_the_module(index):
    module = _all_modules(_linear(64, 32, seed=3))[index]
    x = torch.randn(9, 64)
    config = json.loads(json.dumps(module.config()))
    rebuilt = REAL_MODULES[type(module).__name__].from_config(config)
    rebuilt.load_state_dict(module.state_dict())
    assert torch.equal(rebuilt(x), module(x))
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert torch.equal(clone(x), module(x))


def test_loading_a_state_dict_drops_packed_kernels():
    first, second = Int8DynamicLinear.from_float(_linear(32, 8, 1)), Int8DynamicLinear.from_float(_linear(32, 8, 2))
    x = torch.randn(4, 32)
    first(x)  # packs first's weight
    first.load_state_dict(second.state_dict())
    assert torch.equal(first(x), second(x))


def test_int4_storage_layout_and_size():
    linear = _linear(384, 1536)
    module = Int4WeightOnlyLinear.from_float(linear, group_size=32)
    codes = module.codes()
    assert torch.equal(kernels.unpack_nibbles(kernels.pack_nibbles(codes)), codes) and int(codes.max()) <= 15
    groups = codes.reshape(1536, 12, 32).float()
    expected = (groups - module.weight_zero_point.float()[..., None]) * module.weight_scale.float()[..., None]
    assert torch.equal(module.dequantized_weight(), expected.reshape(1536, 384))
    weight_bytes = sum(b.numel() * b.element_size() for n, b in module.named_buffers() if n.startswith("weight"))
    assert weight_bytes / (384 * 1536 * 4) <= 0.16
    error = (module.dequantized_weight() - linear.weight).norm() / linear.weight.norm()
    plain = Int4WeightOnlyLinear.from_float(linear, group_size=32, search=False)
    assert error <= (plain.dequantized_weight() - linear.weight).norm() / linear.weight.norm()  # the search helps


def test_int4_importance_weighting_lowers_the_weighted_error():
    linear = _linear(64, 16, 5)
    importance = torch.ones(64)
    importance[:8] = 100.0
    weighted = Int4WeightOnlyLinear.from_float(linear, importance=importance)
    plain = Int4WeightOnlyLinear.from_float(linear)

    def weighted_error(module):
        return ((module.dequantized_weight() - linear.weight).square() * importance).sum()

    assert weighted_error(weighted) <= weighted_error(plain)


@pytest.mark.parametrize("call, error, message", [
    (lambda: Int8DynamicLinear.from_float(_linear(16, 4))(torch.randn(2, 8)), FormatError, "features"),
    (lambda: Int4WeightOnlyLinear(48, 4, group_size=32), FormatError, "divisible"),
    (lambda: Int4WeightOnlyLinear(64, 4, group_size=3), ConfigError, "group_size"),
    (lambda: Int8DynamicLinear(8, 4, act_granularity="channel"), ConfigError, "act_granularity"),
    (lambda: Int8DynamicLinear(8, 4, act_granularity="tensor"), ConfigError, "asymmetric"),
    (lambda: Int8DynamicLinear(0, 4), ConfigError, "in_features"),
    (lambda: Int8DynamicLinear.from_config({"in_features": 4, "outputs": 2}), ConfigError, "config"),
    (lambda: W8A8StaticLinear(8, 4).set_input_qparams(float("nan"), 0), FormatError, "finite"),
    (lambda: W8A8StaticLinear(8, 4).set_input_qparams(0.1, 300), FormatError, "zero_point"),
    (lambda: Int8WeightOnlyLinear.from_float(torch.nn.Linear(4, 2).requires_grad_(False).apply(lambda m: m.weight.fill_(float("nan")))), FormatError, "NaN"),
    (lambda: Int8DynamicLinear.from_float(torch.nn.Conv2d(2, 2, 1)), ConfigError, "nn.Linear"),
])  # fmt: skip
def test_bad_input_raises(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_int4pack_refuses_shapes_it_cannot_run():
    module = Int4WeightOnlyLinear.from_float(_linear(64, 24))
    assert module.choose_path(torch.randn(1, 64)) == "dequantize"
    module.path = "int4pack"
    with pytest.raises(ConfigError, match="% 16"):
        module(torch.randn(1, 64))


def test_bad_path_raises():
    module = Int8WeightOnlyLinear.from_float(_linear(8, 4))  # fbgemm is no path of a weight-only module
    module.path = "fbgemm"
    with pytest.raises(ConfigError, match="path"):
        module(torch.randn(2, 8))


@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
def test_blocked_dequantize_path_on_a_large_weight(cls):
    module = cls.from_float(_linear(1024, 1040, seed=4))  # over 2^20 weights: rebuilt in row blocks
    x = torch.randn(40, 1024)
    for cpu_class in capabilities.CLASS_PRESETS:  # a float32 model stays float32 on every CPU
        with capabilities.injected(cpu_class):
            assert module.choose_path(x) == "dequantize" and module.choose_path(x[:1]) == "dequantize"
    reference = module.forward_reference(x)
    assert torch.allclose(module(x), reference, rtol=1e-5, atol=1e-5)
    module.compute_dtype = "bf16"  # bfloat16 compute asked for explicitly
    assert module.choose_path(x) == "dequantize_bf16"
    assert module.choose_path(x[:8]) in ("int8pack", "int4pack")
    assert module.choose_path(x.bfloat16()) == "dequantize_bf16"
    error = (module(x) - reference).norm() / reference.norm()
    assert 0 < error < 5e-3  # bfloat16 rounding of rows and weights (8 significant bits), float32 sums
    module.compute_dtype = None
    assert module.choose_path(x[:8].bfloat16()) in ("int8pack", "int4pack")  # a bfloat16 model computes in bf16


def test_fast_bfloat16_reads_the_cpu_flags():
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    assert kernels.fast_bfloat16() == ("avx512_bf16" in flags or "amx_bf16" in flags)


needs_exact_int_mm = pytest.mark.skipif(not capabilities.probe("int_mm_exact"),
                                        reason="torch._int_mm saturates on this CPU; the compiled path is refused")


@pytest.fixture
def compiled_backend():
    from lowbit import backend

    backend.clear_cache()
    backend.set_backend("compiled")
    yield backend
    backend.set_backend("eager")
    backend.clear_cache()


@needs_exact_int_mm
@pytest.mark.parametrize("settings", [{}, {"act_symmetric": False}])
@pytest.mark.parametrize("bias", [True, False])
def test_compiled_path_equals_int_mm_path_bit_for_bit(compiled_backend, settings, bias):
    module = Int8DynamicLinear.from_float(torch.nn.Linear(96, 40, bias=bias), **settings)
    generator = torch.Generator().manual_seed(5)
    for rows in (1, 3, 130):  # one kernel serves every row count
        x = torch.randn(rows, 96, generator=generator) * 3
        x[0, 7] = 40.0  # one outlier sets the first row's scale
        module.path = "int_mm"
        want = module(x)
        module.path = "compiled"
        assert torch.equal(module(x), want)
        assert torch.allclose(want, module.forward_reference(x), rtol=1e-5, atol=1e-5)
    torch._dynamo.utils.counters.clear()
    for rows in (7, 300):
        x = torch.randn(rows, 96, generator=generator)
        module.path = "int_mm"
        want = module(x)
        module.path = "compiled"
        assert torch.equal(module(x), want)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # no compile per row count
    kinds = sorted(key[0] for key in compiled_backend._kernels)
    assert kinds == ["token_quantize", "token_rescale"]  # one quantizer and one rescaler for every row count


@pytest.mark.parametrize("settings", [{}, {"act_symmetric": False}, {"act_bits": 7}])
def test_fbgemm_path_equals_the_float_codes_path_bit_for_bit(compiled_backend, settings):
    """fbgemm sums through unit-scale weights and the shared rescaling: the same bits as every exact-sums
    path (eager below FUSED_MIN_ROWS, compiled quantize / in-place rescale from there), so the row-count
    crossover of the automatic choice never changes a result. One symmetric row is fbgemm's own scaling."""
    from lowbit.ops import routes

    module = Int8DynamicLinear.from_float(torch.nn.Linear(96, 40), **settings)
    if not routes.runs_exactly("fbgemm", "cpu", module.act_bits):
        pytest.skip("fbgemm saturates these codes on this CPU (the forced path is refused, tested in test_routes)")
    generator = torch.Generator().manual_seed(6)
    for rows in (4, 7, routes.FUSED_MIN_ROWS + 3):
        x = torch.randn(rows, 96, generator=generator) * 3
        x[1, 4] = float("nan")  # NaN -> code 0 on every path
        x[0, 7] = 40.0
        x[-1, 9] = float("inf")  # an infinite scale: codes 0 (inf * 0 is NaN) on every path
        x[-2] = 0.75  # a constant row; the next one tiny (its scale clamped to the smallest normal)
        x[-3] = torch.randn(96, generator=generator) * 1e-39
        module.path = "float_codes"
        want = module(x)
        module.path = "fbgemm"
        assert torch.equal(module(x).nan_to_num(), want.nan_to_num()), rows
        assert torch.equal(module(x).isnan(), want.isnan())
    kinds = sorted(key[0] for key in compiled_backend._kernels)
    assert kinds == ["token_float_quantize", "token_rescale_"]  # the large batch ran the fused kernels


def test_auto_path_compiles_only_large_token_batches(compiled_backend):
    module = Int8DynamicLinear.from_float(torch.nn.Linear(32, 8))
    small, large = (torch.randn(Int8DynamicLinear.COMPILED_MIN_ROWS + extra, 32) for extra in (-1, 0))
    with capabilities.injected("avx512_vnni"):  # a CPU where torch._int_mm is exact and fast
        assert module.choose_path(large) == "compiled"
        assert module.choose_path(small) == "fbgemm"
        compiled_backend.set_backend("eager")
        assert module.choose_path(large) != "compiled"
        tensor_module = Int8DynamicLinear.from_float(torch.nn.Linear(32, 8), act_symmetric=False, act_granularity="tensor")
        compiled_backend.set_backend("compiled")
        assert tensor_module.choose_path(large) != "compiled"


@needs_exact_int_mm
def test_fused_kernel_compile_failure_falls_back_to_the_eager_function(compiled_backend, monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken_compile)
    module = Int8DynamicLinear.from_float(torch.nn.Linear(32, 8))
    x = torch.randn(100, 32)
    module.path = "compiled"
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found"):
        got = module(x)
    module.path = "int_mm"
    assert torch.equal(got, module(x))
    with capabilities.injected("avx512_vnni"):
        assert module.choose_path(x) != "compiled"  # compiling stays off for the rest of the process
