"""Backward-pass formats (grad_data_in / grad_weight / grad_bias / grad_data_out) and the seed's claim:
stochastic rounding makes straight-through gradients unbiased on a quadratic cost, nearest rounding does not."""

import copy

import pytest
import torch

from lowbit.errors import ConfigError
from lowbit.formats import resolve
from lowbit.nn import QuantConv2d, QuantLinear, RoleFormats, parse_node_config
from lowbit.nn.functional import quantized_linear, quantized_relu

E5M2 = resolve("e5m2")


def _linear(formats, seed=0):
    torch.manual_seed(seed)
    return QuantLinear.from_float(torch.nn.Linear(6, 4), formats)


def test_each_gradient_role_rounds_its_gradient():
    formats = RoleFormats(grad_data_out=E5M2, grad_data_in=resolve("e4m3"), grad_weight=resolve("integer", width=8, frac_width=6),
                          grad_bias=resolve("integer", width=4, frac_width=1))  # fmt: skip
    module = _linear(formats)
    x = torch.randn(5, 6, requires_grad=True)
    upstream = torch.randn(5, 4)
    module(x).backward(upstream)
    g = E5M2.quantize(upstream)  # what arrives is rounded first, and both backward GEMMs use it
    w = module.weight.detach()
    assert torch.equal(x.grad, resolve("e4m3").quantize(g @ w))
    assert torch.equal(module.weight.grad, resolve("integer", width=8, frac_width=6).quantize(g.t() @ x.detach()))
    assert torch.equal(module.bias.grad, resolve("integer", width=4, frac_width=1).quantize(g.sum(0)))


def test_forward_unchanged_and_float_roles_untouched():
    plain = _linear(RoleFormats())
    rounded = _linear(RoleFormats(grad_weight=E5M2))
    x = torch.randn(3, 6, requires_grad=True)
    assert torch.equal(plain(x), rounded(x))
    rounded(x).sum().backward()
    grad_x = x.grad.clone()
    x.grad = None
    plain(x).sum().backward()
    assert torch.equal(grad_x, x.grad)  # only grad_weight has a format


def test_config_keys_and_plain_dict_round_trip():
    config = {"name": "integer", "data_in_width": 8, "weight_width": 8, "grad_weight_name": "e5m2",
              "grad_data_out_name": "integer", "grad_data_out_width": 8, "grad_data_out_frac_width": 7,
              "grad_data_out_rounding": "stochastic", "seed": 3}  # fmt: skip
    formats = parse_node_config("linear", config)
    assert formats.grad_weight == E5M2 and formats.grad_data_out.is_stochastic and formats.seed == 3
    assert RoleFormats.from_dict(formats.to_dict()) == formats
    with pytest.raises(ConfigError, match="grad_weight"):
        parse_node_config("relu", {"name": "integer", "data_in_width": 8, "grad_weight_width": 8})
    with pytest.raises(ConfigError, match="seed"):
        parse_node_config("linear", {**config, "seed": "x"})


def test_functional_ops_round_gradients():
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(3, 6, requires_grad=True)
    config = {"grad_data_in": {"name": "e5m2"}}
    quantized_linear(x, w, None, config=config).sum().backward()
    assert torch.equal(x.grad, E5M2.quantize(torch.ones(4, 3) @ w.detach()))
    y = torch.randn(10, requires_grad=True)
    quantized_relu(y, config={"grad_data_out": {"name": "integer", "width": 4, "frac_width": 0}}).backward(
        torch.full((10,), 0.7))
    assert torch.equal(y.grad, (y.detach() > 0).float())  # 0.7 rounds to 1 before ReLU's backward


def test_stochastic_gradients_seeded_reproducible_and_fresh_each_step():
    spec = resolve("integer", width=8, frac_width=2, rounding="stochastic")
    module = _linear(RoleFormats(grad_weight=spec, seed=11))
    twin = copy.deepcopy(module)
    x = torch.randn(8, 6)

    def grads(m):
        out = []
        for _ in range(2):
            m.weight.grad = None
            m(x).sum().backward()
            out.append(m.weight.grad.clone())
        return out

    first, second = grads(module), grads(twin)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], first[1])


def test_conv_gradient_roles():
    torch.manual_seed(0)
    conv = QuantConv2d.from_float(torch.nn.Conv2d(2, 3, 3), RoleFormats(grad_weight=E5M2))
    x = torch.randn(2, 2, 6, 6)
    conv(x).sum().backward()
    expected = torch.nn.grad.conv2d_weight(x, conv.weight.shape, torch.ones(2, 3, 4, 4))
    assert torch.equal(conv.weight.grad, E5M2.quantize(expected))


# ---- the seed's claim ------------------------------------------------------------------------------------
def _least_squares(rounding, draws=400, grad_role=False):
    """Gradients of 0.5 * mean (x W^T - y)^2 w.r.t. W through a 3-bit weight quantizer (or, with grad_role, a
    float weight and a 6-bit gradient format): one sample per draw; and the float gradient."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=gen)
    y = torch.randn(64, 1, generator=gen)
    weight = torch.rand(1, 8, generator=gen) * 1.5 - 0.75  # off the grid
    # 3-bit weights (step 1/4, range [-1, 0.75]); 6-bit gradients (step 1/16, range [-2, 1.9375])
    width, frac_width = (6, 4) if grad_role else (3, 2)
    spec = resolve("integer", width=width, frac_width=frac_width, rounding=rounding)
    formats = RoleFormats(grad_weight=spec) if grad_role else RoleFormats(weight=spec)
    layer = torch.nn.Linear(8, 1, bias=False)
    layer.weight.data.copy_(weight)
    module = QuantLinear.from_float(layer, formats)
    torch.manual_seed(1)
    samples = []
    for _ in range(draws):
        module.weight.grad = None
        (0.5 * ((module(x) - y) ** 2).mean()).backward()
        samples.append(module.weight.grad.clone())
    layer.weight.grad = None
    (0.5 * ((layer(x) - y) ** 2).mean()).backward()
    return torch.cat(samples), layer.weight.grad


@pytest.mark.parametrize("grad_role", [False, True], ids=["weight_format", "grad_weight_format"])
def test_stochastic_rounding_gives_unbiased_gradients_nearest_biased(grad_role):
    samples, exact = _least_squares("stochastic", grad_role=grad_role)
    standard_error = samples.std(0) / samples.shape[0] ** 0.5
    assert (standard_error > 0).all()
    z = (samples.mean(0) - exact[0]) / standard_error
    assert z.abs().max() < 4.5  # 8 coordinates, |z| < 4.5 each: false alarm below 1e-4
    nearest, _ = _least_squares("nearest_even", draws=1, grad_role=grad_role)
    bias_z = (nearest[0] - exact[0]).abs() / standard_error
    assert bias_z.max() > 10  # a deterministic offset far outside what an unbiased mean can stray
