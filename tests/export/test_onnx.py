"""QDQ ONNX export: structure of the graph, and outputs checked in onnxruntime against lowbit's own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    assert weights and all(init.data_type == onnx.TensorProto.UINT8 for init in weights)  # no float weights left
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


# ---- weight flavour: uint8 codes with the zero point moved by 128 (exact int8 products on every CPU) ----------
def exported_weights(path) -> dict[str, tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """layer -> (codes data type, codes, zero point, dequantized weight) of every weight DequantizeLinear,
    dequantized the way DequantizeLinear defines it: (codes - zero_point) * scale in float32."""
    model = onnx.load(str(path))
    inits = {init.name: init for init in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or not node.input[0].endswith("._onnx_weight_codes"):
            continue
        codes, scale, zero = (onnx.numpy_helper.to_array(inits[name]) for name in node.input)
        attrs = {a.name: a.i for a in node.attribute}
        axis, block = attrs.get("axis", 1) % codes.ndim, attrs.get("block_size", 0)
        if block:
            scale = np.repeat(scale, block, axis=axis).take(range(codes.shape[axis]), axis=axis)
            zero_full = np.repeat(zero, block, axis=axis).take(range(codes.shape[axis]), axis=axis)
        elif scale.ndim == 1:
            shape = [1] * codes.ndim
            shape[axis] = -1
            scale, zero_full = scale.reshape(shape), zero.reshape(shape)
        else:
            zero_full = zero
        value = (codes.astype(np.int32) - zero_full.astype(np.int32)).astype(np.float32) * scale.astype(np.float32)
        found[node.input[0].removesuffix("._onnx_weight_codes")] = (inits[node.input[0]].data_type, codes, zero, value)
    return found


@pytest.mark.parametrize("case", ["static MLP", "static CNN", "int4 groups"])
def test_weights_are_uint8_with_zero_point_128_and_dequantize_to_lowbits(tmp_path, case):
    torch.manual_seed(1)
    if case == "static MLP":
        model, shape = static_int8(DigitsMLP(), (16, 64)), (4, 64)
    elif case == "static CNN":
        model, shape = static_int8(DigitsCNN(), (16, 1, 8, 8)), (4, 1, 8, 8)
    else:
        model, shape = quantize_weight_only(DigitsMLP().eval(), bits=4, group_size=16)[0], (4, 64)
    export_onnx(model, inputs(shape), tmp_path / "m.onnx")
    weights = exported_weights(tmp_path / "m.onnx")
    assert len(weights) == 3
    for name, (data_type, codes, zero, value) in weights.items():
        module = model.get_submodule(name)
        spec = module.formats.weight
        assert data_type == onnx.TensorProto.UINT8 and zero.dtype == np.uint8 and np.all(zero == 128)
        # the stored bytes are lowbit's signed codes plus 128 ...
        signed_codes = lowbit.encode(module.weight.detach(), spec).codes.numpy().astype(np.int32)
        np.testing.assert_array_equal(codes.astype(np.int32) - 128, signed_codes)
        # ... and dequantize to exactly lowbit's quantized weight
        np.testing.assert_array_equal(value, spec(module.weight.detach()).numpy())


def saturating_case(kind: str):
    """A layer on which ONNX Runtime's u8s8 kernels without VNNI go wrong: activation codes 200..255 (uint8, zero
    point 0) times weight codes of one sign per output channel, +100..+127 or -101..-128 (zero point 0). Any two
    products of one output add up to at least 2 * 200 * 100 = 40000 in magnitude, beyond int16, so a kernel that
    sums pairs of u8 * s8 products into int16 with saturation (vpmaddubsw: AVX2, AVX-512 without VNNI) clips every
    pair. Returns (model, x, the exact output, K products per output, the output step)."""
    g = torch.Generator().manual_seed(7)
    sx, sw, step = 2.0**-8, 2.0**-7, 0.5  # powers of two: every product and sum below is exact in float32
    if kind == "linear":
        layer, x_shape, cls = nn.Linear(64, 8, bias=False), (4, 64), QuantLinear
    else:
        layer, x_shape, cls = nn.Conv2d(4, 8, 3, bias=False), (2, 4, 6, 6), QuantConv2d
    sign = (torch.arange(layer.weight.shape[0]) % 2 == 0).reshape(-1, *[1] * (layer.weight.dim() - 1))
    magnitude = torch.randint(100, 128, layer.weight.shape, generator=g)
    w_codes = torch.where(sign, magnitude, -magnitude - 1)  # alternating channels: +100..+127, -101..-128
    x_codes = torch.randint(200, 256, x_shape, generator=g)
    with torch.no_grad():
        layer.weight.copy_(w_codes * sw)
    formats = RoleFormats(data_in=resolve("affine", bits=8, signed=False, scale=sx, zero_point=0),
                          weight=resolve("affine", bits=8, scale=sw, zero_point=0),
                          data_out=resolve("affine", bits=8, signed=False, scale=step, zero_point=128))  # fmt: skip
    model = nn.Sequential(cls.from_float(layer, formats)).eval()
    if kind == "linear":
        exact = x_codes.double() @ w_codes.double().T
    else:
        exact = torch.nn.functional.conv2d(x_codes.double(), w_codes.double())
    return model, x_codes.float() * sx, (exact * sx * sw).numpy(), w_codes[0].numel(), step


def fused_int8_ops(path, optimized) -> dict[str, int]:
    """op type -> data type of the weight input, for each fused integer op ONNX Runtime's optimizer made."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    model = onnx.load(str(optimized))
    types = {init.name: init.data_type for init in model.graph.initializer}
    return {n.op_type: types.get(n.input[3]) for n in model.graph.node
            if n.op_type in ("QGemm", "QLinearMatMul", "QLinearConv")}  # fmt: skip


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_products_beyond_int16_are_exact_in_onnxruntime(tmp_path, kind):
    model, x, exact, k, step = saturating_case(kind)
    # By construction a kernel that clips each pair of products to int16 cannot come within one step: at most
    # ceil(K / 2) pairs of at most 32768 each, against an exact sum at least `step` larger in magnitude.
    clipped = -(-k // 2) * 32768 * 2.0**-15
    assert np.all(np.abs(exact) - clipped > step)
    export_onnx(model, x, tmp_path / "s.onnx")
    fused = fused_int8_ops(tmp_path / "s.onnx", tmp_path / "s.opt.onnx")
    assert fused and set(fused.values()) == {onnx.TensorProto.UINT8}  # ORT runs it as one u8u8 integer op
    theirs = run_onnx(tmp_path / "s.onnx", x)
    assert np.abs(theirs - exact).max() <= step * (1 + 1e-6)
    assert np.abs(model(x).detach().numpy() - exact).max() <= step * (1 + 1e-6)


# ---- the same models on an emulated AVX2 CPU without VNNI ---------------------------------------------------
# ONNX Runtime has no switch that makes MLAS pick a lower instruction set (it reads CPUID itself), so the AVX2
# kernels are reached by running onnxruntime under QEMU's user-mode emulator with an AMD Zen 3 CPU model (AVX2, no
# AVX-512, no VNNI), where the int8 flavour of these files does go wrong. Skipped where qemu-x86_64 is missing.
_GUEST = """
import sys, numpy as np, onnxruntime as ort
features = np._core._multiarray_umath.__cpu_features__
if not features["AVX2"] or features["AVX512F"]:
    print("NOT-AVX2-ONLY"); sys.exit(0)
data, out = np.load(sys.argv[1]), {}
for i in range(int(data["count"])):
    session = ort.InferenceSession(str(data[f"path{i}"]), providers=["CPUExecutionProvider"])
    out[f"y{i}"] = session.run(None, {session.get_inputs()[0].name: data[f"x{i}"]})[0]
np.savez(sys.argv[2], **out)
"""


def run_on_emulated_avx2(tmp_path, runs: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or os.uname().machine != "x86_64":
        pytest.skip("needs qemu-x86_64 (Debian package qemu-user) on an x86-64 host")
    data = {"count": np.array(len(runs))}
    for i, (path, x) in enumerate(runs):
        data[f"path{i}"], data[f"x{i}"] = np.array(str(path)), x
    np.savez(tmp_path / "in.npz", **data)
    site = os.pathsep.join({os.path.dirname(os.path.dirname(m.__file__)) for m in (np, ort)})
    env = {**os.environ, "PYTHONPATH": site}
    done = subprocess.run([qemu, "-cpu", "EPYC-Milan", os.path.realpath(sys.executable), "-c", _GUEST,
                           str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    if "NOT-AVX2-ONLY" in done.stdout:
        pytest.skip("this QEMU does not emulate an AVX2 CPU without AVX-512 (QEMU 7.2 or later does)")
    out = np.load(tmp_path / "out.npz")
    return [out[f"y{i}"] for i in range(len(runs))]


def as_int8_flavour(path, to) -> str:
    """The same file with signed weights stored as int8 (codes - 128, zero point - 128): the flavour lowbit wrote
    before, which ONNX Runtime computes with saturating u8s8 kernels on AVX2."""
    model = onnx.load(str(path))
    inits = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].endswith("._onnx_weight_codes"):
            for i in (0, 2):  # new initializers: the exporter may share a zero point with an activation's
                signed = (onnx.numpy_helper.to_array(inits[node.input[i]]).astype(np.int16) - 128).astype(np.int8)
                node.input[i] += "_s8"
                model.graph.initializer.append(onnx.numpy_helper.from_array(signed, node.input[i]))
    onnx.save(model, str(to))
    return str(to)


def test_exact_on_an_emulated_avx2_cpu_without_vnni(tmp_path):
    runs, checks = [], []
    for kind in ("linear", "conv"):
        model, x, exact, _, step = saturating_case(kind)
        export_onnx(model, x, tmp_path / f"{kind}.onnx")
        runs += [(tmp_path / f"{kind}.onnx", x.numpy()),
                 (as_int8_flavour(tmp_path / f"{kind}.onnx", tmp_path / f"{kind}.s8.onnx"), x.numpy())]  # fmt: skip
        checks += [(exact, step, True), (exact, step, False)]
    for cls, shape, last in [(DigitsMLP, (16, 64), "fc3"), (DigitsCNN, (16, 1, 8, 8), "fc")]:
        torch.manual_seed(1)
        model = static_int8(cls(), shape)
        export_onnx(model, inputs(shape), tmp_path / f"{cls.__name__}.onnx", dynamic_batch=True)
        x = inputs((16,) + shape[1:], seed=26)
        runs.append((tmp_path / f"{cls.__name__}.onnx", x.numpy()))
        checks.append((model(x).detach().numpy(), one_step_bound(getattr(model, last)) + 1e-5, True))
    for theirs, (expected, bound, within) in zip(run_on_emulated_avx2(tmp_path, runs), checks, strict=True):
        # uint8 weights stay within the bound; the int8 flavour of the saturating layers leaves it, which shows
        # that the emulated CPU really runs the clipping u8s8 kernels
        assert (np.abs(theirs - expected).max() <= bound * (1 + 1e-6)) == within


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
