"""ONNX export of real-quantized modules (lowbit.ops): their own codes and scales, checked in onnxruntime against
the module's reference path (bit for bit where the ONNX graph does the same integer and float64 arithmetic)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.export import export_onnx
from lowbit.models import DigitsCNN
from lowbit.nn import QuantLinear, RoleFormats
from lowbit.ops import Int4WeightOnlyLinear, Int8Conv2d, Int8DynamicLinear, Int8WeightOnlyLinear, W8A8StaticLinear

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.filterwarnings("ignore")


def run_onnx(path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def linear(seed: int = 0, k: int = 64, n: int = 32) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n)


LINEAR_CASES = {
    "dynamic token": lambda m: Int8DynamicLinear.from_float(m),
    "dynamic token centred": lambda m: Int8DynamicLinear.from_float(m, act_symmetric=False),
    "dynamic token 7 bits": lambda m: Int8DynamicLinear.from_float(m, act_bits=7),
    "dynamic tensor": lambda m: Int8DynamicLinear.from_float(m, act_symmetric=False, act_granularity="tensor"),
    "weight-only int8": lambda m: Int8WeightOnlyLinear.from_float(m),
    "weight-only int4": lambda m: Int4WeightOnlyLinear.from_float(m, group_size=32),
    "static": lambda m: W8A8StaticLinear.from_float(m).set_input_qparams(0.02, 120),
    "static signed": lambda m: W8A8StaticLinear.from_float(m, act_signed=True).set_input_qparams(0.02, -3),
}  # fmt: skip
EXACT = {"dynamic token", "dynamic token centred", "dynamic token 7 bits", "dynamic tensor"}


@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_real_linear_modules_match_their_reference_in_onnxruntime(tmp_path, case):
    module = LINEAR_CASES[case](linear()).eval()
    model = nn.Sequential(module)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    info = export_onnx(model, x, tmp_path / "m.onnx", dynamic_batch=True)
    assert set(info.layers) == {"0"} and "weight" in info.layers["0"]
    for batch in (6, 1, 3):
        x = torch.randn(batch, 64, generator=torch.Generator().manual_seed(10 + batch))
        with torch.no_grad():
            reference = module.forward_reference(x).numpy()
        theirs = run_onnx(tmp_path / "m.onnx", x)
        if case in EXACT:  # same codes, exact int32 sums, the same float64 rescaling
            assert np.array_equal(theirs, reference), np.abs(theirs - reference).max()
        else:  # same codes and dequantized weight; float sums in another order
            assert np.abs(theirs - reference).max() <= 1e-5 * np.abs(reference).max()


def dequantized_initializers(path) -> list[tuple[np.ndarray, np.ndarray]]:
    """(codes, (codes - zero point) * scale) of every weight DequantizeLinear, as DequantizeLinear defines it."""
    model = onnx.load(str(path))
    inits = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        codes, scale, zero = (inits[name] for name in node.input)
        attrs = {a.name: a.i for a in node.attribute}
        axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
        if block:
            scale, zero = np.repeat(scale, block, axis=axis), np.repeat(zero, block, axis=axis)
        else:
            shape = [1] * codes.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        found.append((codes, (codes.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale))
    return found


@pytest.mark.parametrize("case", ["weight-only int8", "weight-only int4", "static"])
def test_weight_initializers_are_the_modules_codes(tmp_path, case):
    module = LINEAR_CASES[case](linear()).eval()
    export_onnx(nn.Sequential(module), torch.randn(2, 64), tmp_path / "m.onnx")
    ((codes, dequantized),) = dequantized_initializers(tmp_path / "m.onnx")
    assert codes.dtype == np.uint8  # exact u8u8 kernels in onnxruntime (test_onnx.py)
    assert np.array_equal(dequantized, module.dequantized_weight().numpy())  # bit for bit
    if case == "weight-only int4":
        assert np.array_equal(codes, module.codes().numpy())
    else:
        assert np.array_equal(codes.astype(np.int32) - 128, module.weight_codes.numpy().astype(np.int32))


def test_products_beyond_int16_are_exact(tmp_path):
    """Weights and inputs at full scale: pairs of products past 32767 (where u8s8 kernels saturate) stay exact."""
    torch.manual_seed(0)
    layer = nn.Linear(256, 16)
    with torch.no_grad():
        layer.weight.copy_(torch.where(torch.rand(16, 256) < 0.5, -1.0, 1.0))
    module = Int8DynamicLinear.from_float(layer).eval()
    x = torch.where(torch.rand(4, 256) < 0.9, 3.0, -3.0)
    export_onnx(nn.Sequential(module), x, tmp_path / "m.onnx")
    with torch.no_grad():
        reference = module.forward_reference(x).numpy()
    assert np.array_equal(run_onnx(tmp_path / "m.onnx", x), reference)


def test_three_dimensional_inputs_keep_their_shape(tmp_path):
    module = Int8DynamicLinear.from_float(linear()).eval()
    x = torch.randn(2, 5, 64)
    export_onnx(nn.Sequential(module), x, tmp_path / "m.onnx")
    with torch.no_grad():
        reference = module.forward_reference(x.reshape(-1, 64)).reshape(2, 5, 32).numpy()
    assert np.array_equal(run_onnx(tmp_path / "m.onnx", x), reference)


@pytest.mark.parametrize("activation", ["dynamic", "static"])
def test_int8_conv2d_matches_its_reference(tmp_path, activation):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2)
    module = Int8Conv2d.from_float(conv, activation=activation)
    if activation == "static":
        module.set_input_qparams(0.02, 128)
    x = torch.randn(3, 4, 9, 9, generator=torch.Generator().manual_seed(2))
    info = export_onnx(nn.Sequential(module), x, tmp_path / "m.onnx")
    types = [node.op_type for node in onnx.load(str(tmp_path / "m.onnx")).graph.node]
    assert ("ConvInteger" in types) == (activation == "dynamic") and "Conv" in types or "ConvInteger" in types
    with torch.no_grad():
        reference = module.forward_reference(x).numpy()
    theirs = run_onnx(tmp_path / "m.onnx", x)
    if activation == "dynamic":
        assert np.array_equal(theirs, reference)
    else:
        assert np.abs(theirs - reference).max() <= 1e-5 * np.abs(reference).max()
    assert info.layers["0"]["data_in"].startswith(activation)


def test_a_model_from_quantize_model_exports(tmp_path):
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    quantized, _ = lowbit.quantize_model(copy.deepcopy(model), "int8_dynamic", include_conv=True)  # every CPU
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(3)) * 16
    info = export_onnx(quantized, x, tmp_path / "m.onnx", dynamic_batch=True)
    assert set(info.layers) == {"conv1", "conv2", "fc"}
    reference = x
    with torch.no_grad():  # every layer on its reference path
        for name, module in quantized.named_children():
            reference = module.forward_reference(reference) if hasattr(module, "forward_reference") else module(reference)
            if name == "pool2":
                reference = reference.flatten(1)
    assert np.array_equal(run_onnx(tmp_path / "m.onnx", x), reference.numpy())


def test_simulated_and_real_layers_in_one_model(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    formats = RoleFormats.from_dict({"weight": {"name": "affine", "bits": 8, "symmetric": True, "axis": 0}})
    mixed = nn.Sequential(QuantLinear.from_float(model[0], formats), nn.ReLU(), Int8DynamicLinear.from_float(model[2]))
    x = torch.randn(4, 16)
    info = export_onnx(mixed, x, tmp_path / "m.onnx")
    assert set(info.layers) == {"0", "2"}
    with torch.no_grad():
        ours = mixed(x).numpy()
    assert np.abs(run_onnx(tmp_path / "m.onnx", x) - ours).max() <= 1e-5 * np.abs(ours).max()


def test_export_leaves_the_real_model_unchanged(tmp_path):
    module = Int8DynamicLinear.from_float(linear())
    model = nn.Sequential(module)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    export_onnx(model, torch.randn(2, 64), tmp_path / "m.onnx")
    assert model[0] is module and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
