"""Quantized modules: every registered format through QuantLinear and QuantConv2d (forward equals the op on
quantized operands, backward is straight-through), exact copies of weights and biases, every module op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit.nn import (
    QuantBatchNorm2d, QuantConv1d, QuantConv2d, QuantEmbedding, QuantGELU, QuantLayerNorm, QuantLinear,
    QuantReLU, QuantSoftmax, RoleFormats,
)  # fmt: skip

FORMATS = sorted({lowbit.get_format(name).format_name for name in lowbit.list_formats()})


def _all_roles(name: str) -> RoleFormats:
    spec = lowbit.get_format(name)()
    return RoleFormats(data_in=spec, weight=spec, bias=spec, data_out=spec)


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_through_quant_linear(name):
    torch.manual_seed(0)
    float_layer = nn.Linear(12, 6)
    formats = _all_roles(name)
    layer = QuantLinear.from_float(float_layer, formats)
    x = torch.randn(5, 12, requires_grad=True)
    out = layer(x)
    spec = formats.data_in
    expected = spec(F.linear(spec(x.detach()), spec(float_layer.weight.detach()), spec(float_layer.bias.detach())))
    assert torch.equal(out.detach(), expected)
    out.sum().backward()
    # straight-through: d(sum)/dx of linear with a straight-through weight quantizer is colsum of q(W)
    assert torch.allclose(x.grad, spec(float_layer.weight.detach()).sum(0).expand(5, 12), atol=1e-6)
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_through_quant_conv2d(name):
    torch.manual_seed(1)
    float_layer = nn.Conv2d(3, 4, 3, padding=1)
    formats = _all_roles(name)
    layer = QuantConv2d.from_float(float_layer, formats)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    out = layer(x)
    spec = formats.data_in
    quantized_weight = spec(float_layer.weight.detach())
    expected = spec(F.conv2d(spec(x.detach()), quantized_weight, spec(float_layer.bias.detach()), padding=1))
    assert torch.equal(out.detach(), expected)
    out.sum().backward()
    expected_grad = torch.autograd.grad(F.conv2d(x, quantized_weight, padding=1).sum(), x)[0]
    assert torch.allclose(x.grad, expected_grad)
    assert torch.isfinite(layer.bias.grad).all() and layer.bias.grad.abs().sum() > 0


def test_from_float_copies_weights_and_biases_exactly_and_leaves_the_original():
    conv = nn.Conv2d(3, 4, 3, bias=True)
    before = {k: v.clone() for k, v in conv.state_dict().items()}
    quantized = QuantConv2d.from_float(conv, RoleFormats(weight=lowbit.get_format("integer")(width=4)))
    for key, value in before.items():
        assert torch.equal(quantized.state_dict()[key], value)
        assert torch.equal(conv.state_dict()[key], value)
    assert quantized.weight is not conv.weight
    with torch.no_grad():
        quantized.weight.add_(1.0)
    assert torch.equal(conv.weight, before["weight"])
    assert (quantized.stride, quantized.padding, quantized.dilation, quantized.groups) == (
        conv.stride, conv.padding, conv.dilation, conv.groups)


def test_roles_without_format_stay_float():
    layer = nn.Linear(4, 3)
    quantized = QuantLinear.from_float(layer, RoleFormats())
    x = torch.randn(2, 4)
    assert torch.equal(quantized(x), layer(x))
    bypassed = QuantLinear.from_float(layer, RoleFormats(weight=lowbit.get_format("binary")(), bypass=True))
    assert torch.equal(bypassed(x), layer(x))


INT = lowbit.get_format("integer")(width=6, frac_width=3)


def _q(t):
    return INT(t)


@pytest.mark.parametrize(
    "float_module,quant_class,make_input,reference",
    [
        (nn.ReLU(), QuantReLU, lambda: torch.randn(3, 5), lambda m, x: _q(F.relu(_q(x)))),
        (nn.GELU(approximate="tanh"), QuantGELU, lambda: torch.randn(3, 5),
         lambda m, x: _q(F.gelu(_q(x), approximate="tanh"))),
        (nn.Softmax(dim=-1), QuantSoftmax, lambda: torch.randn(3, 5), lambda m, x: _q(F.softmax(_q(x), -1))),
        (nn.LayerNorm(5), QuantLayerNorm, lambda: torch.randn(3, 5),
         lambda m, x: _q(F.layer_norm(_q(x), (5,), _q(m.weight), _q(m.bias), m.eps))),
        (nn.BatchNorm2d(3).eval(), QuantBatchNorm2d, lambda: torch.randn(2, 3, 4, 4),
         lambda m, x: _q(F.batch_norm(_q(x), m.running_mean, m.running_var, _q(m.weight), _q(m.bias), False, 0.1, m.eps))),
        (nn.Embedding(10, 4), QuantEmbedding, lambda: torch.tensor([[1, 2], [9, 0]]),
         lambda m, x: _q(F.embedding(x, _q(m.weight)))),
        (nn.Conv1d(3, 2, 3), QuantConv1d, lambda: torch.randn(2, 3, 7),
         lambda m, x: _q(F.conv1d(_q(x), _q(m.weight), _q(m.bias)))),
    ],
)  # fmt: skip
def test_module_ops_equal_their_reference(float_module, quant_class, make_input, reference):
    torch.manual_seed(2)
    with torch.no_grad():
        for parameter in float_module.parameters():
            parameter.normal_()
    formats = RoleFormats(data_in=INT, weight=INT, bias=INT, data_out=INT)
    quantized = quant_class.from_float(float_module, formats)
    x = make_input()
    assert torch.equal(quantized(x), reference(float_module, x))
    assert isinstance(quantized, type(float_module))


def test_batch_norm_training_updates_running_stats_like_torch():
    torch.manual_seed(3)
    float_bn = nn.BatchNorm2d(3)
    quantized = QuantBatchNorm2d.from_float(float_bn, RoleFormats())
    x = torch.randn(4, 3, 5, 5)
    assert torch.allclose(quantized(x), float_bn(x))
    assert torch.allclose(quantized.running_mean, float_bn.running_mean)
    assert torch.allclose(quantized.running_var, float_bn.running_var)
    assert int(quantized.num_batches_tracked) == int(float_bn.num_batches_tracked) == 1


def test_to_float_round_trip_and_repr():
    layer = QuantLinear.from_float(nn.Linear(4, 3), RoleFormats(weight=INT))
    plain = layer.to_float()
    assert type(plain) is nn.Linear and torch.equal(plain.weight, layer.weight)
    assert "weight=integer(width=6, frac_width=3)" in repr(layer)
