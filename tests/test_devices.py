"""Every format, observer and algorithm follows its input's device (issue 16).

``meta`` tensors carry shapes only: runs there check the device plumbing, and a dispatch mode watching every
op fails the test if a CPU tensor appears anywhere in the work ("no hidden CPU tensors"). On CUDA (run when
available) the results must also equal the CPU's bit for bit, except where noted: the quantile sketch and
the histogram search observers bucket values by ``torch.log``, whose CUDA result may differ from the CPU's
by an ulp (so a value on a bucket edge can move one bucket: results within the sketch's relative error),
and GPTQ factorises its Hessian with cuSOLVER (codes compared by agreement, not bit for bit).
"""

from __future__ import annotations

import pytest
import torch
from format_cases import CASE_IDS, CASES
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import lowbit
from lowbit.calibrate import stats
from lowbit.calibrate.histogram_observers import HistogramObserver, MSEObserver
from lowbit.calibrate.magnitude import MagnitudeObserver
from lowbit.calibrate.observers import (
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    PercentileObserver,
)
from lowbit.calibrate.specs import calibrated_spec
from lowbit.errors import FormatError
from lowbit.flows.gptq import _next_stage
from lowbit.formats import resolve
from lowbit.nn.modules import QuantConv2d, QuantLayerNorm, QuantLinear
from lowbit.nn.roles import RoleFormats
from lowbit.ops import AffineCodes, quantized_concat, quantized_linear
from lowbit.ops.gptq import HessianAccumulator, gptq_quantize
from lowbit.qtensor import encode

DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


class NoCpuTensors(TorchDispatchMode):
    """Records every op that returns a CPU tensor while active."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tree_flatten(out)[0]):
            self.cpu_ops.append(str(func))
        return out


def _data(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _assert_same(result: torch.Tensor, expected: torch.Tensor, device: str) -> None:
    assert result.device.type == device and result.shape == expected.shape and result.dtype == expected.dtype
    if device != "meta":
        assert torch.equal(result.cpu().nan_to_num(), expected.nan_to_num())


# ---- formats -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_format_follows_the_device(device, case, dtype):
    _, name, params, _ = case
    spec = resolve(name, **params)
    for x in (_data(4, 64).to(dtype), _data(64, seed=1).to(dtype), _data(seed=2).to(dtype)):
        expected = spec(x)  # also fills any per-dtype constant caches before the watch starts
        with NoCpuTensors() as watch:
            result = spec(x.to(device))
        assert watch.cpu_ops == []
        _assert_same(result, expected, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["affine", "e4m3", "block_fp", "mxfp4_e2m1", "binary", "log"])
def test_stochastic_rounding_with_a_seed_runs_on_the_device(device, name):
    params = {"block_size": [1, 16]} if name == "block_fp" else {}
    spec = resolve(name, rounding="stochastic", **params)
    x = _data(4, 64).to(device)
    with NoCpuTensors() as watch:
        first = spec(x, seed=7)
    assert watch.cpu_ops == [] and first.device.type == device and first.shape == x.shape
    if device != "meta":  # reproducible with a seed on the device's own generator
        assert torch.equal(first, spec(x, seed=7))


@pytest.mark.parametrize("device", DEVICES)
def test_integer_ops_follow_the_device(device):
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (3, 8), generator=generator, dtype=torch.int8)
    b = torch.randint(-128, 128, (4, 8), generator=generator, dtype=torch.int8)

    def run(a, b):
        linear = quantized_linear(a, 0.5, 1, b, 0.25, output_scale=0.125, output_dtype=torch.int8)
        concat = quantized_concat([AffineCodes(a, 0.5, 1), AffineCodes(b, 0.25, 0)], 0.5, 0, dim=0)
        return linear, concat

    expected = run(a, b)
    with NoCpuTensors() as watch:
        results = run(a.to(device), b.to(device))
    assert watch.cpu_ops == []
    for result, wanted in zip(results, expected):
        _assert_same(result, wanted, device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_generator_on_another_device_is_a_format_error():
    with pytest.raises(FormatError, match="generator is on cpu"):
        lowbit.quantize(_data(8).cuda(), "affine", rounding="stochastic", generator=torch.Generator())


def test_meta_tensors_take_a_seed_or_a_generator():
    x = torch.empty(8, device="meta")
    assert lowbit.quantize(x, "affine", rounding="stochastic", seed=1).device.type == "meta"
    assert lowbit.quantize(x, "affine", rounding="stochastic", generator=torch.Generator()).device.type == "meta"


# ---- storage ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_encode_and_dequantize_follow_the_device(device, case):
    _, name, params, _ = case
    spec = resolve(name, **params)
    x = _data(4, 64)
    expected = encode(x, spec)
    with NoCpuTensors() as watch:
        qtensor = encode(x.to(device), spec)
        values = qtensor.dequantize()
        packed = qtensor.pack()
    assert watch.cpu_ops == []
    assert qtensor.codes.device.type == device and packed.words.device.type == device
    assert all(p.device.type == device for p in qtensor.params.values())
    _assert_same(values, expected.dequantize(), device)
    if device != "meta":
        assert torch.equal(qtensor.codes.cpu(), expected.codes)


# ---- observers and statistics -------------------------------------------------------------------------------
RANGE_OBSERVERS = [
    (MinMaxObserver, {}),
    (MinMaxObserver, {"axis": 0}),
    (MovingAverageMinMaxObserver, {"block_size": [2, 16]}),
]
VALUE_OBSERVERS = [  # their buckets depend on the values: no meta run
    (PercentileObserver, {}),
    (MSEObserver, {"axis": 0}),
    (HistogramObserver, {}),
    (MagnitudeObserver, {"axis": 0}),
]


def _batches(device: str) -> list[torch.Tensor]:
    return [_data(4, 64, seed=seed).to(device) for seed in range(3)]


def _observed(cls, options, batches: list[torch.Tensor]):
    observer = cls(**options)
    for batch in batches:
        observer.update(batch)
    return observer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("cls", "options"), RANGE_OBSERVERS)
def test_range_observers_follow_the_device(device, cls, options):
    batches = _batches(device)
    with NoCpuTensors() as watch:
        observer = _observed(cls, options, batches)
        low, high = observer.min_max()
        scale, zero_point = observer.scale_zero_point(bits=4)
    assert watch.cpu_ops == []
    reference = _observed(cls, options, _batches("cpu"))
    expected = (*reference.min_max(), *reference.scale_zero_point(bits=4))
    for result, wanted in zip((low, high, scale, zero_point), expected):
        _assert_same(result, wanted, device)


def test_specs_from_meta_statistics_are_a_format_error():
    observer = _observed(MinMaxObserver, {}, _batches("meta"))
    with pytest.raises(FormatError, match="cannot run on the meta device"):
        observer.affine_spec(bits=8)
    with pytest.raises(FormatError, match="cannot run on the meta device"):
        calibrated_spec(observer, "e4m3")


@pytest.mark.parametrize(("cls", "options"), VALUE_OBSERVERS)
def test_value_observers_on_meta_are_a_format_error(cls, options):
    with pytest.raises(FormatError, match="cannot run on the meta device"):
        cls(**options).update(torch.empty(4, 64, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("cls", "options"), VALUE_OBSERVERS)
def test_value_observers_on_cuda_match_the_cpu(cls, options):
    observer, reference = _observed(cls, options, _batches("cuda")), _observed(cls, options, _batches("cpu"))
    for result, wanted in zip(observer.min_max(), reference.min_max()):
        assert result.device.type == "cuda"
        torch.testing.assert_close(result.cpu(), wanted, rtol=0.02, atol=1e-6)  # see the module docstring


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["range_min_max", "variance_online", "variance_precise", "abs_mean"])
def test_stats_update_on_the_device(device, name):
    stat, reference = stats.create_stat(name, dims=[-1]), stats.create_stat(name, dims=[-1])
    batches = _batches(device)
    with NoCpuTensors() as watch:
        for batch in batches:
            stat.update(batch)
    assert watch.cpu_ops == []
    for batch in _batches("cpu"):
        reference.update(batch)
    if device == "meta":
        with pytest.raises(FormatError, match="cannot run on the meta device"):
            stat.compute()
    else:
        assert stat.compute() == reference.compute()


def test_range_quantile_on_meta_is_a_format_error():
    with pytest.raises(FormatError, match="cannot run on the meta device"):
        stats.create_stat("range_quantile").update(torch.empty(4, 8, device="meta"))


# ---- GPTQ ------------------------------------------------------------------------------------------------------
def test_gptq_on_meta_is_a_format_error():
    weight, hessian = torch.empty(8, 64, device="meta"), torch.empty(64, 64, device="meta")
    with pytest.raises(FormatError, match="cannot run on the meta device"):
        gptq_quantize(weight, hessian, 32)


@pytest.mark.parametrize("device", DEVICES)
def test_hessians_are_built_on_the_weights_device(device):
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)).to(device)
    batches = [_data(5, 64, seed=seed).to(device) for seed in range(2)]
    pending = {"0": model[0], "2": model[2]}
    with NoCpuTensors() as watch:
        hessians = _next_stage(model, pending, batches, lambda root, batch: root(batch), None)
    assert watch.cpu_ops == []
    assert list(hessians) == ["0"] and hessians["0"].device.type == device and hessians["0"].shape == (64, 64)


def test_a_hessian_given_a_device_moves_its_inputs_there():
    accumulator = HessianAccumulator(16, device="meta")
    accumulator.add(_data(3, 16))
    assert accumulator.hessian().device.type == "meta"
    assert HessianAccumulator(16).sum is None  # no device given: made on the first batch's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gptq_on_cuda_stays_there_and_agrees_with_the_cpu():
    weight, x = _data(48, 256) * 0.05, _data(1024, 256, seed=1)
    accumulator = HessianAccumulator(256)
    accumulator.add(x)
    expected = gptq_quantize(weight, accumulator.hessian(), 32)
    result = gptq_quantize(weight.cuda(), accumulator.hessian().cuda(), 32)
    assert all(t.device.type == "cuda" for t in result)
    assert (result.codes.cpu() == expected.codes).float().mean() > 0.95  # cuSOLVER's factors differ in ulps


# ---- quantized modules -----------------------------------------------------------------------------------------
def _modules():
    spec = resolve("affine", bits=8)
    roles = RoleFormats(data_in=spec, weight=resolve("mxfp4_e2m1"), bias=spec, data_out=spec)
    torch.manual_seed(0)
    return [
        (QuantLinear.from_float(nn.Linear(64, 32), roles), _data(4, 64)),
        (QuantConv2d.from_float(nn.Conv2d(3, 8, 3), RoleFormats(data_in=spec, weight=spec)), _data(2, 3, 8, 8)),
        (QuantLayerNorm.from_float(nn.LayerNorm(64), RoleFormats(data_in=spec, data_out=spec)), _data(4, 64)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index", range(3), ids=["linear", "conv2d", "layer_norm"])
def test_quantized_modules_run_on_the_device(device, index):
    module, x = _modules()[index]
    expected = module(x)
    moved = module.to(device)
    with NoCpuTensors() as watch, torch.no_grad():
        result = moved(x.to(device))
    assert watch.cpu_ops == []
    assert result.device.type == device and result.shape == expected.shape
    if device != "meta":
        assert torch.equal(result.cpu(), expected.detach())
