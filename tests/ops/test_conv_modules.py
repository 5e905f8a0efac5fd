"""Int8Conv2d: exact integer sums on every path for several geometries, paths against the reference, the
config / state-dict contract through lowbit.save / load, memory layouts, errors, and DigitsCNN converted by
quantize_model within half a point of fp32."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit import ConfigError, FormatError
from lowbit.calibrate.builders import scale_zero_point
from lowbit.ops import REAL_MODULES, Int8Conv2d
from lowbit.ops import capabilities
from lowbit.ops.conv_modules import dynamic_qparams, onednn_exact

# (in, out, kernel, stride, padding, dilation, groups)
GEOMETRIES = [
    (3, 8, 3, 1, 0, 1, 1),
    (4, 6, 3, 2, 1, 1, 2),
    (8, 8, 3, 1, 1, 1, 8),  # depthwise
    (5, 7, (3, 5), (1, 2), (2, 0), 1, 1),
    (6, 4, 3, 1, 2, 2, 2),  # dilated
    (16, 32, 1, 1, 0, 1, 1),  # pointwise
]
FAST_PATHS = tuple(path for path, probe in (("int_mm", "int_mm_exact"), ("onednn", "onednn_conv_exact"))
                   if capabilities.probe(probe))  # the paths exact on this CPU


def _integer_module(geometry, seed: int, act_signed: bool, zero_point: int) -> Int8Conv2d:
    """A static module with scales 1: its float output is exactly the integer sum."""
    c, o, kernel, stride, padding, dilation, groups = geometry
    module = Int8Conv2d(c, o, kernel, stride, padding, dilation, groups, bias=False, activation="static", act_signed=act_signed)
    generator = torch.Generator().manual_seed(seed)
    module.weight_codes.copy_(torch.randint(-127, 128, module.weight_codes.shape, generator=generator))
    return module.set_input_qparams(1.0, zero_point)


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("act_signed, zero_point", [(False, 0), (False, 131), (True, -5)])
def test_integer_sums_exact_on_every_path(geometry, act_signed, zero_point):
    module = _integer_module(geometry, GEOMETRIES.index(geometry), act_signed, zero_point)
    low, high = (-128, 127) if act_signed else (0, 255)
    x = torch.randint(low, high + 1, (3, geometry[0], 9, 11), generator=torch.Generator().manual_seed(7)).float()
    x -= zero_point  # real values whose codes are exactly x + zero_point
    c, o, kernel, stride, padding, dilation, groups = geometry
    geometry_args = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    expected = F.conv2d(x.double(), module.weight_codes.double(), **geometry_args)
    assert torch.equal(module.forward_reference(x), expected.float())
    for path in FAST_PATHS:
        module.path = path
        assert torch.equal(module(x), expected.float()), path


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("activation", ["dynamic", "static"])
def test_paths_agree_with_the_reference_and_stay_close_to_float(geometry, activation):
    c, o, kernel, stride, padding, dilation, groups = geometry
    torch.manual_seed(GEOMETRIES.index(geometry))
    conv = nn.Conv2d(c, o, kernel, stride, padding, dilation, groups)
    x = torch.randn(4, c, 10, 12)
    module = Int8Conv2d.from_float(conv, activation=activation)
    if activation == "static":
        scale, zero_point = scale_zero_point(x.min(), x.max(), 8, signed=False)
        module.set_input_qparams(float(scale), int(zero_point))
    reference = module.forward_reference(x)
    float_out = conv(x).detach()
    assert float((reference - float_out).norm() / float_out.norm()) < 0.02
    fast, slow = module.input_codes(x, fast=True), module.input_codes(x)
    assert torch.equal(fast[0], slow[0]) and fast[0].dtype == slow[0].dtype  # identical codes
    if "int_mm" in FAST_PATHS:
        module.path = "int_mm"
        assert torch.equal(module(x), reference)  # same integers, same float64 rescaling
    if onednn_exact():
        module.path = "onednn"  # same integers, float32 rescaling and bias
        assert torch.allclose(module(x), reference, rtol=1e-5, atol=1e-5)


def test_dynamic_qparams_equal_the_builder():
    generator = torch.Generator().manual_seed(3)
    for x in (torch.randn(2, 3, 4, 4, generator=generator), torch.rand(5, 2, 3, 3, generator=generator) + 1,
              -torch.rand(4, 4, generator=generator), torch.zeros(2, 2)):  # fmt: skip
        scale, zero_point = dynamic_qparams(x)
        expected = scale_zero_point(x.amin(), x.amax(), 8, signed=False)
        assert torch.equal(scale, expected.scale) and int(zero_point) == int(expected.zero_point)
    with pytest.raises(FormatError, match="NaN or inf"):
        dynamic_qparams(torch.tensor([1.0, float("nan")]))


def test_output_layout_follows_the_input_unless_channels_last():
    conv = nn.Conv2d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 6, 6)
    module = Int8Conv2d.from_float(conv)
    assert module(x).is_contiguous() and module.forward_reference(x).is_contiguous()
    last = x.contiguous(memory_format=torch.channels_last)
    assert module(last).is_contiguous(memory_format=torch.channels_last) and not module(last).is_contiguous()
    module = Int8Conv2d.from_float(conv, channels_last=True)
    assert not module(x).is_contiguous() and torch.equal(module(x), module(x).contiguous())


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, groups=2),
                         nn.Flatten(), nn.Linear(8 * 3 * 3, 4)).eval()  # fmt: skip


@pytest.mark.parametrize("recipe", ["int8_dynamic", "w8a8_static"])
@torch.no_grad()
def test_save_load_round_trip_and_config_rebuild(recipe, tmp_path):
    x = torch.randn(5, 3, 8, 8)
    options = {"calibration_data": [torch.randn(4, 3, 8, 8) for _ in range(3)]} if recipe == "w8a8_static" else {}
    model, info = lowbit.quantize_model(_model(), recipe, include_conv=True, **options)  # on every machine
    assert info["counts"]["Int8Conv2d"] == 2
    lowbit.save(model, tmp_path / "conv.safetensors")
    loaded = lowbit.load(tmp_path / "conv.safetensors", _model())
    assert [type(m).__name__ for m in loaded] == [type(m).__name__ for m in model]
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert torch.equal(loaded(x), model(x))
    conv = model[2]
    rebuilt = REAL_MODULES["Int8Conv2d"].from_config(json.loads(json.dumps(conv.config())))
    rebuilt.load_state_dict(conv.state_dict())
    assert torch.equal(rebuilt(model[1](model[0](x))), conv(model[1](model[0](x))))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(clone(x), model(x))


def test_quantize_model_conv_options():
    model, info = lowbit.quantize_model(_model(), "int8_dynamic", include_conv=False)
    assert info["counts"] == {"Int8DynamicLinear": 1} and type(model[0]) is nn.Conv2d
    reflect = _model()
    reflect[0] = nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect")
    model, info = lowbit.quantize_model(reflect, "int8_dynamic", include_conv=True)
    assert type(model[0]) is nn.Conv2d and "padding_mode='reflect'" in info["kept"]["0"]
    model, _ = lowbit.quantize_model(_model(), "int8_dynamic", conv_channels_last=True, include_conv=True)
    assert model[0].channels_last and model(torch.randn(2, 3, 8, 8)).shape == (2, 4)
    with pytest.raises(ConfigError, match="unknown option.*include_conv"):
        lowbit.quantize_model(_model(), "int4_weight_only", group_size=8, include_conv=True)
    with pytest.raises(ConfigError, match="include_conv=False"):
        state = lowbit.ptq.calibrate(_model(), [torch.randn(2, 3, 8, 8)], ops=("linear",))
        lowbit.quantize_model(_model(), "w8a8_static", calibration=state, include_conv=True)
    with pytest.raises(ConfigError, match="no nn.Linear or nn.Conv2d"):
        lowbit.quantize_model(_model(), "int8_dynamic", skip=[".*"])
    with pytest.raises(ConfigError, match="include_conv='yes' must be true, false or"):
        lowbit.quantize_model(_model(), "int8_dynamic", include_conv="yes")


@pytest.mark.parametrize("recipe", ["int8_dynamic", "w8a8_static"])
def test_auto_keeps_convolutions_float_where_no_exact_int8_route_beats_float32(recipe):
    """include_conv="auto" (the default) decides per machine: oneDNN's exact convolution (VNNI / AMX) takes
    them; on an AVX2 CPU without VNNI they stay nn.Conv2d and info["kept"] says why (the reference path
    measured 64x fp32 there); True forces Int8Conv2d anyway."""
    options = {"calibration_data": [torch.randn(4, 3, 8, 8)]} if recipe == "w8a8_static" else {}
    with capabilities.injected("avx2"):
        model, info = lowbit.quantize_model(_model(), recipe, **options)
        assert type(model[0]) is nn.Conv2d and type(model[2]) is nn.Conv2d
        assert set(info["kept"]) == {"0", "2"} and "no exact int8 convolution is faster" in info["kept"]["0"]
        assert "class avx2" in info["kept"]["0"] and len(info["counts"]) == 1  # the Linear is converted
        forced, info = lowbit.quantize_model(_model(), recipe, include_conv=True, **options)
        assert info["counts"]["Int8Conv2d"] == 2 and "kept" not in info
    with capabilities.injected("avx512_vnni"):
        model, info = lowbit.quantize_model(_model(), recipe, **options)
        assert info["counts"]["Int8Conv2d"] == 2 and "kept" not in info


def test_only_convolutions_kept_gives_a_model_not_an_error():
    only_conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    with capabilities.injected("avx2"):
        model, info = lowbit.quantize_model(only_conv, "int8_dynamic")
    assert info["quantized"] == {} and type(model[0]) is nn.Conv2d and "0" in info["kept"]


@pytest.mark.parametrize("arguments, message", [
    ({"groups": 3}, "groups=3 must divide"),
    ({"padding": -1}, "must not be negative"),
    ({"kernel_size": (3, 3, 3)}, "kernel_size"),
    ({"stride": 0}, "stride=0"),
    ({"activation": "per_token"}, "activation='per_token'"),
    ({"act_signed": True}, "act_signed"),
    ({"channels_last": "yes"}, "channels_last"),
])  # fmt: skip
def test_bad_configs_raise_config_errors(arguments, message):
    settings = {"in_channels": 4, "out_channels": 8, "kernel_size": 3, **arguments}
    with pytest.raises(ConfigError, match=message):
        Int8Conv2d(**settings)


def test_other_errors():
    with pytest.raises(ConfigError, match="unexpected keyword"):
        Int8Conv2d.from_config({"in_channels": 4, "out_channels": 8, "kernel_size": 3, "colour": 1})
    with pytest.raises(ConfigError, match="expects an nn.Conv2d"):
        Int8Conv2d.from_float(nn.Linear(4, 4))
    with pytest.raises(ConfigError, match="padding_mode"):
        Int8Conv2d.from_float(nn.Conv2d(4, 4, 3, padding_mode="circular"))
    with pytest.raises(ConfigError, match="activation='static'"):
        Int8Conv2d(4, 8, 3).set_input_qparams(0.1, 0)
    module = Int8Conv2d(4, 8, 3)
    with pytest.raises(FormatError, match=r"expected \[B, 4, H, W\]"):
        module(torch.randn(2, 3, 8, 8))
    with pytest.raises(FormatError, match="does not fit"):
        module.path = "reference"
        module(torch.randn(2, 4, 2, 2))
    module.path = "fbgemm"
    with pytest.raises(ConfigError, match="path='fbgemm'"):
        module(torch.randn(2, 4, 8, 8))
    with pytest.raises(FormatError, match="NaN"):
        Int8Conv2d.from_float(nn.Conv2d(4, 4, 3).requires_grad_(False).apply(lambda m: m.weight.fill_(float("nan"))))


# ---- DigitsCNN --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits_cnn():
    pytest.importorskip("sklearn", reason="the data extra (scikit-learn) is not installed")
    from lowbit.datasets.digits import digits
    from lowbit.models import DigitsCNN

    torch.manual_seed(0)
    model = DigitsCNN()
    images, labels = digits("train").tensors
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(15):
        for index in torch.randperm(len(images), generator=generator).split(64):
            optimizer.zero_grad()
            F.cross_entropy(model(images[index]), labels[index]).backward()
            optimizer.step()
    calibration = digits("validation").tensors[0][:256].split(32)
    return model.eval(), digits("test").tensors, list(calibration)


@torch.no_grad()
def _accuracy(model, data) -> float:
    images, labels = data
    return 100.0 * float((model(images).argmax(-1) == labels).float().mean())


@pytest.mark.parametrize("recipe", ["int8_dynamic", "w8a8_static"])
def test_digits_cnn_within_half_a_point(digits_cnn, recipe):
    model, test_data, calibration = digits_cnn
    options = {"calibration_data": calibration} if recipe == "w8a8_static" else {}
    quantized, info = lowbit.quantize_model(copy.deepcopy(model), recipe, include_conv=True, **options)
    assert info["counts"]["Int8Conv2d"] == 2
    fp32, int8 = _accuracy(model, test_data), _accuracy(quantized, test_data)
    assert fp32 >= 94.0 and abs(fp32 - int8) <= 0.5, (fp32, int8)
