"""FormatWeightLinear: NVFP4 / NF4 / codebook weights held as packed codes, rebuilt per call (issue 45).

Checked: the real module computes bit for bit what the simulated QuantLinear with that weight format computes
(its weight is ``lowbit.quantize(weight, spec)`` exactly), on float32 and bfloat16 inputs and on every path;
its bytes; ``lowbit.save`` / ``lowbit.load``; what ``to_real`` keeps simulated and why; bad configs.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import assert_same

import lowbit
from lowbit.convert import to_real
from lowbit.errors import ConfigError
from lowbit.formats import resolve
from lowbit.nn.modules import QuantLinear
from lowbit.nn.roles import RoleFormats
from lowbit.ops.from_fake import convert_quant_linear
from lowbit.ops import REAL_MODULES, FormatWeightLinear

NF4_TABLE = [-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0]
CASES = [
    ("nvfp4", {}),
    ("nf4", {"block_size": 64}),
    ("nf4", {"block_size": 32}),
    ("codebook", {"values": NF4_TABLE, "block_size": 16}),
]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(128, 96), torch.nn.GELU(), torch.nn.Linear(96, 40, bias=False))


def _simulated_and_real(name: str, params: dict):
    simulated = _model()
    lowbit.quantize_(simulated, name, roles=["weight"], params=params)
    real = copy.deepcopy(simulated)
    converted, kept = to_real(real)
    assert converted == {"0": "FormatWeightLinear", "2": "FormatWeightLinear"} and kept == {}
    return simulated, real


@pytest.mark.parametrize("name,params", CASES, ids=lambda v: str(v))
def test_real_module_computes_the_simulated_layer_bit_for_bit(name, params):
    simulated, real = _simulated_and_real(name, params)
    spec = lowbit.formats.resolve(name, **params)
    weight = _model()[0].weight.detach()
    assert_same(real[0].dequantize_weight(), lowbit.quantize(weight, spec))
    x = torch.randn(7, 128)
    with torch.no_grad():
        want = simulated(x)
        assert_same(real(x), want)
        for path in ("reference", "dequantize"):
            real[0].path = real[2].path = path
            assert_same(real(x), want)
        real[0].path = real[2].path = "auto"
        half = real(x.bfloat16())  # bfloat16 compute on the same weight: the input's dtype back
        assert half.dtype == torch.bfloat16 and torch.allclose(half.float(), want, rtol=0.05, atol=0.05)


def test_nvfp4_weight_bytes_are_about_a_seventh_of_float32():
    layer = torch.nn.Linear(256, 256, bias=False)
    real = FormatWeightLinear.from_float(layer, "nvfp4")
    stored = sum(t.numel() * t.element_size() for t in real.state_dict().values())
    assert stored == 256 * 256 // 2 + 256 * 16 + 4 + 2  # codes, E4M3 block scales, tensor scale, shift
    assert stored / (256 * 256 * 4) < 0.141


@pytest.mark.parametrize("name,params", CASES[:2], ids=lambda v: str(v))
def test_save_and_load_rebuild_the_module(tmp_path, name, params):
    _, real = _simulated_and_real(name, params)
    lowbit.save(real, tmp_path / "model")
    back = lowbit.load(tmp_path / "model", _model(seed=1))
    assert type(back[0]) is FormatWeightLinear and REAL_MODULES["FormatWeightLinear"] is FormatWeightLinear
    x = torch.randn(3, 128)
    with torch.no_grad():
        assert_same(back(x), real(x))


def test_inputs_with_a_format_stay_simulated_with_the_reason():
    model = _model()
    lowbit.quantize_(model, "nvfp4", roles=["data_in", "weight"])
    converted, kept = to_real(model)
    assert converted == {} and kept["0"] == "data_in: format 'nvfp4' (kernels run affine integer codes)"
    # int8 weights with NVFP4 inputs: the reason, not an AttributeError as before
    formats = RoleFormats(data_in=resolve("nvfp4"), weight=resolve("affine", bits=8, axis=0, symmetric=True))
    new, why = convert_quant_linear(QuantLinear.from_float(torch.nn.Linear(32, 8), formats))
    assert new is None and why == "data_in: format 'nvfp4' (kernels run affine integer codes)"


def test_bad_configs_are_one_clear_error():
    with pytest.raises(ConfigError, match="holds nvfp4, nf4, codebook weights, not 'affine'"):
        FormatWeightLinear(8, 8, format={"name": "affine", "params": {"bits": 4}})
    with pytest.raises(ConfigError, match="must be a format spec"):
        FormatWeightLinear(8, 8, format=None)
    with pytest.raises(ConfigError, match="path='packed'|legal"):
        layer = FormatWeightLinear.from_float(torch.nn.Linear(32, 8), "nvfp4")
        layer.path = "packed"
        layer(torch.randn(2, 32))


@pytest.mark.parametrize("name,params", CASES, ids=lambda v: str(v))
def test_onnx_export_runs_in_onnxruntime_with_lowbits_weights(tmp_path, name, params):
    """The graph rebuilds the weight as table[code] * block scale (Gather, Mul: onnxruntime has no FP4
    DequantizeLinear); the rebuilt weight is lowbit's bit for bit (checked at export), the outputs agree to the
    matmul's rounding."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    _, real = _simulated_and_real(name, params)
    x = torch.randn(5, 128)
    exported = lowbit.export_onnx(real, (x,), tmp_path / "model.onnx")
    assert exported.layers["0"]["weight"] == f"{name} codes (Gather x scale)"
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        want = real(x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onnx_export_refuses_what_the_table_graph_cannot_hold(tmp_path):
    pytest.importorskip("onnxscript")
    layer = FormatWeightLinear.from_float(torch.nn.Linear(16, 8), {"name": "nf4", "params": {"block_size": [4, 4]}})
    with pytest.raises(lowbit.LowbitError, match="layer '0': its nf4 blocks are not runs of one row's inputs"):
        lowbit.export_onnx(torch.nn.Sequential(layer), (torch.randn(2, 16),), tmp_path / "model.onnx")
    tiny = torch.nn.Linear(32, 8)
    with torch.no_grad():
        tiny.weight.mul_(1e-37)  # NVFP4 decodes a tensor this small at 2^100 times its size
    layer = FormatWeightLinear.from_float(tiny, "nvfp4")
    with pytest.raises(lowbit.LowbitError, match="not table\\[code\\] \\* one float32 scale"):
        lowbit.export_onnx(torch.nn.Sequential(layer), (torch.randn(2, 32),), tmp_path / "tiny.onnx")
    assert not (tmp_path / "model.onnx").exists() and not (tmp_path / "tiny.onnx").exists()
