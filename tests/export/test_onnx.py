"""QDQ ONNX export: structure of the graph, and outputs checked in onnxruntime against lowbit's own."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.export import ExportError, export_onnx
from lowbit.formats import resolve
from lowbit.models import DigitsCNN, DigitsMLP
from lowbit.nn import QuantConv2d, QuantLinear, RoleFormats
from lowbit.ptq import calibrate, quantize_dynamic, quantize_static, quantize_weight_only

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.filterwarnings("ignore")


def inputs(shape, seed=0) -> torch.Tensor:
    """Digit-like images with pixel values in [0, 16) (continuous: integer pixels would sit on exact ties
    x / scale = k + 1/2, which ONNX's x / scale and lowbit's x * (1 / scale) may round apart)."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 16


def run_onnx(path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def node_types(path) -> list[str]:
    return [node.op_type for node in onnx.load(str(path)).graph.node]


def static_int8(model: nn.Module, shape) -> nn.Module:
    torch.manual_seed(0)
    model = model.eval()
    state = calibrate(model, [inputs(shape, seed) for seed in range(4)])
    return quantize_static(model, state)[0]


def one_step_bound(layer: QuantLinear) -> float:
    """How far the layer's output moves when every element of its quantized input moves by one step."""
    scale = layer.formats.data_in.scale[0]
    weight = layer.formats.weight(layer.weight.detach())
    return scale * float(weight.abs().sum(dim=1).max())


def quantized_inputs_onnx(path, x: torch.Tensor) -> list[np.ndarray]:
    """The dequantized activations of every QDQ pair in graph order, read from onnxruntime."""
    model = onnx.load(str(path))
    quantize = {n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    names = [n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in quantize]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(names, {session.get_inputs()[0].name: x.numpy()})


def quantized_inputs_lowbit(model: nn.Module, x: torch.Tensor) -> list[tuple[np.ndarray, float]]:
    """(lowbit's quantized data_in, its scale) of every quantized layer, in call order."""
    found, hooks = [], []
    for module in model.modules():
        if isinstance(module, (QuantLinear, QuantConv2d)):
            hooks.append(module.register_forward_pre_hook(
                lambda m, args: found.append((m.formats.apply("data_in", args[0]).detach().numpy(),
                                              m.formats.data_in.scale[0]))))  # fmt: skip
    model(x)
    for hook in hooks:
        hook.remove()
    return found


@pytest.mark.parametrize(("cls", "shape", "last"), [(DigitsMLP, (16, 64), "fc3"), (DigitsCNN, (16, 1, 8, 8), "fc")])
def test_static_int8_models_run_in_onnxruntime(tmp_path, cls, shape, last):
    torch.manual_seed(1)
    model = static_int8(cls(), shape)
    info = export_onnx(model, inputs(shape), tmp_path / "m.onnx", dynamic_batch=True)
    types = node_types(tmp_path / "m.onnx")
    assert len(info.layers) == 3 and types.count("QuantizeLinear") == 3 and types.count("DequantizeLinear") == 6
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    weights = [init for init in graph.initializer if init.name.endswith(("weight", "weight_codes"))]
    assert weights and all(init.data_type == onnx.TensorProto.INT8 for init in weights)  # no float weights left
    for batch in (16, 5, 1):
        x = inputs((batch,) + shape[1:], seed=10 + batch)
        ours = model(x).detach().numpy()
        theirs = run_onnx(tmp_path / "m.onnx", x)
        assert theirs.shape == ours.shape
        assert np.abs(theirs - ours).max() <= one_step_bound(getattr(model, last)) + 1e-5
        # Every quantized activation agrees with lowbit's within one step (float sums in another order can
        # move a value across a rounding boundary), and nearly all agree exactly.
        for onnx_value, (lowbit_value, scale) in zip(quantized_inputs_onnx(tmp_path / "m.onnx", x),
                                                     quantized_inputs_lowbit(model, x), strict=True):  # fmt: skip
            diff = np.abs(onnx_value.reshape(lowbit_value.shape) - lowbit_value)
            assert diff.max() <= scale * 1.0001 and np.mean(diff == 0) >= 0.99  # 1.0001: float rounding of k * s


def test_output_within_one_step_of_the_output_format(tmp_path):
    torch.manual_seed(2)
    formats = RoleFormats(data_in=resolve("affine", bits=8, scale=0.02, zero_point=-5),
                          weight=resolve("q8s", axis=0), bias=resolve("affine", bits=8, symmetric=True),
                          data_out=resolve("affine", bits=8, signed=False, scale=0.05, zero_point=128))  # fmt: skip
    model = nn.Sequential(QuantLinear.from_float(nn.Linear(32, 24), formats)).eval()
    x = torch.randn(64, 32)
    export_onnx(model, x, tmp_path / "l.onnx")
    assert node_types(tmp_path / "l.onnx").count("DequantizeLinear") == 4  # in, weight, bias, out
    diff = np.abs(run_onnx(tmp_path / "l.onnx", x) - model(x).detach().numpy())
    assert diff.max() <= 0.05 * (1 + 1e-6)  # one step of the output format
    assert np.mean(diff == 0) >= 0.95


def test_weight_only_int4_groups_are_exact(tmp_path):
    torch.manual_seed(3)
    model, _ = quantize_weight_only(DigitsMLP().eval(), bits=4, group_size=16)
    x = inputs((8, 64))
    export_onnx(model, x, tmp_path / "w.onnx")
    graph = onnx.load(str(tmp_path / "w.onnx")).graph
    blocked = [n for n in graph.node if n.op_type == "DequantizeLinear"]
    assert len(blocked) == 3 and all(a.i == 16 for n in blocked for a in n.attribute if a.name == "block_size")
    np.testing.assert_allclose(run_onnx(tmp_path / "w.onnx", x), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_float8_and_fixed_point_roles(tmp_path):
    torch.manual_seed(4)
    formats = RoleFormats(data_in=resolve("e4m3"), weight=resolve("e4m3", axis=0),
                          bias=resolve("integer", width=8, frac_width=5), data_out=resolve("e5m2"))  # fmt: skip
    model = nn.Sequential(QuantLinear.from_float(nn.Linear(16, 8), formats)).eval()
    x = torch.randn(32, 16)
    export_onnx(model, x, tmp_path / "f.onnx")
    graph = onnx.load(str(tmp_path / "f.onnx")).graph
    assert any(init.data_type == onnx.TensorProto.FLOAT8E4M3FN for init in graph.initializer)
    ours, theirs = model(x).detach().numpy(), run_onnx(tmp_path / "f.onnx", x)
    step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ours), 2.0**-14))) - 2)  # one e5m2 step at each output
    assert np.all(np.abs(theirs - ours) <= step)


def test_static_float8_activations(tmp_path):
    """quantize_static(activation_format="e4m3"): one calibrated scale per input, exported as a float8 QDQ pair
    with that scale; ONNX Runtime gives lowbit's outputs."""
    torch.manual_seed(0)
    model = DigitsMLP().eval()
    state = calibrate(model, [inputs((16, 64), seed) for seed in range(4)], activation_format="e4m3")
    model = quantize_static(model, state)[0]
    x = inputs((32, 64), seed=9) * 1.5  # beyond the calibrated range too: saturation at 448 * scale
    export_onnx(model, x, tmp_path / "s.onnx")
    assert node_types(tmp_path / "s.onnx").count("QuantizeLinear") == 3
    # ONNX Runtime 1.31's graph optimizer fuses float8 QDQ + int8 weights into a QGemm that rejects float8
    # input (INVALID_GRAPH); the file itself is valid ONNX and runs with the optimizer off.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "s.onnx"), options, providers=["CPUExecutionProvider"])
    theirs = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(theirs, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("roles", "message"), [
    ({"weight": ("ternary", {"scaling_factor": True})}, r"layer 'fc2', role 'weight', format ternary"),
    ({"weight": ("block_fp", {"width": 8})}, r"format block_fp\(.*ONNX cannot express"),
    ({"weight": ("mxfp4_e2m1", {})}, "mxfp4_e2m1"),
    ({"data_in": ("affine", {"bits": 8})}, "dynamic"),
    ({"data_in": ("e4m3", {"scale": [0.1, 0.2], "axis": 0})}, "given per channel"),
    ({"data_in": ("affine", {"bits": 6, "scale": 0.1})}, "bits=6"),
    ({"data_in": ("minifloat_ieee", {"width": 8})}, "minifloat_ieee"),
    ({"data_in": ("affine", {"bits": 8, "scale": 0.1, "rounding": "nearest_away"})}, "rounds half to even"),
    ({"weight": ("affine", {"bits": 4, "block_size": [2, 8]})}, "blocks run along one axis"),
    ({"weight": ("affine", {"bits": 8, "rounding": "stochastic"})}, "stochastic"),
])  # fmt: skip
def test_unsupported_formats_name_the_layer_and_format(tmp_path, roles, message):
    model = DigitsMLP().eval()
    formats = RoleFormats(**{role: resolve(name, **params) for role, (name, params) in roles.items()})
    model.fc2 = QuantLinear.from_float(model.fc2, formats)
    with pytest.raises(ExportError, match=message):
        export_onnx(model, inputs((2, 64)), tmp_path / "bad.onnx")
    assert not (tmp_path / "bad.onnx").exists()


def test_dynamic_ptq_is_refused(tmp_path):
    model, _ = quantize_dynamic(DigitsMLP().eval())
    with pytest.raises(ExportError, match="layer 'fc1', role 'data_in'.*quantize_static"):
        export_onnx(model, inputs((2, 64)), tmp_path / "d.onnx")


class AddNet(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + x


def test_functional_quantization_in_a_graph_is_refused(tmp_path):
    from lowbit.graph import MaseGraph, quantize_transform_pass

    config = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4}
    graph, _ = quantize_transform_pass(MaseGraph(AddNet()), {"by": "type", "add": {"config": config}})
    functional = [n for n in graph.model.graph.nodes if n.op == "call_function"
                  and getattr(n.target, "__module__", "") == "lowbit.nn.functional"]  # fmt: skip
    assert functional
    with pytest.raises(ExportError, match="fx call_function"):
        export_onnx(graph.model, torch.randn(2, 16), tmp_path / "g.onnx")


def test_export_leaves_the_model_unchanged(tmp_path):
    model = static_int8(DigitsMLP(), (8, 64))
    x = inputs((4, 64))
    before = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx(model, x, tmp_path / "m.onnx")
    assert torch.equal(model(x), before) and isinstance(model.fc1.formats, RoleFormats)
    assert lowbit.LowbitError in ExportError.__mro__
