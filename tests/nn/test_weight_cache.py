"""Quantized modules quantize an unchanged weight once (no_grad / frozen), and never serve a stale copy."""

from __future__ import annotations

import pytest
import torch

import lowbit
from helpers import assert_same
from lowbit.nn import weight_cache
from lowbit.nn.modules import QuantConv2d, QuantLinear
from lowbit.nn.roles import RoleFormats


def counting_formats(monkeypatch, **roles):
    formats = RoleFormats(**{role: lowbit.get_format(name)(**params) for role, (name, params) in roles.items()})
    calls = []
    real = RoleFormats.apply

    def apply(self, role, value):
        calls.append(role)
        return real(self, role, value)

    monkeypatch.setattr(RoleFormats, "apply", apply)
    return formats, calls


def linear(formats):
    torch.manual_seed(0)
    return QuantLinear.from_float(torch.nn.Linear(16, 8), formats)


def reference(module, x):
    """The same forward with nothing cached."""
    w = module.formats.apply("weight", module.weight.detach())
    b = module.formats.apply("bias", module.bias.detach())
    return module.formats.apply("data_out", torch.nn.functional.linear(module.formats.apply("data_in", x), w, b))


def test_weight_quantized_once_under_no_grad_and_equal_to_a_fresh_forward(monkeypatch):
    formats, calls = counting_formats(monkeypatch, weight=("e2m1", {"block_size": [1, 8]}), bias=("e4m3", {}),
                                      data_in=("integer", {"width": 6}))  # fmt: skip
    module = linear(formats).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        outs = [module(x) for _ in range(3)]
    assert calls.count("weight") == 1 and calls.count("bias") == 1 and calls.count("data_in") == 3
    module.train()  # the mode alone does not matter: no gradient path is needed under no_grad
    with torch.no_grad():
        outs.append(module(x))
    assert calls.count("weight") == 1
    for out in outs:
        assert_same(out, reference(module, x))


@pytest.mark.parametrize("change", ["in_place", "optimizer", "load_state_dict", "assign", "to_double", "formats"])
def test_every_change_invalidates_the_cache(monkeypatch, change):
    formats, calls = counting_formats(monkeypatch, weight=("integer", {"width": 4, "frac_width": 2}))
    module = linear(formats)
    x = torch.randn(4, 16)
    with torch.no_grad():
        module(x)
    if change == "in_place":
        with torch.no_grad():
            module.weight.mul_(3)
    elif change == "optimizer":
        module(x).sum().backward()  # grad enabled, weight requires grad: quantized afresh, not cached
        torch.optim.SGD(module.parameters(), lr=1.0).step()
    elif change == "load_state_dict":
        module.load_state_dict({"weight": torch.randn(8, 16), "bias": torch.zeros(8)})
    elif change == "assign":
        module.weight = torch.nn.Parameter(torch.randn(8, 16))
    elif change == "to_double":
        module.double()
        x = x.double()
    else:
        module.formats = RoleFormats(weight=lowbit.get_format("integer")(width=3, frac_width=1))
    before = calls.count("weight")
    with torch.no_grad():
        out = module(x)
    assert calls.count("weight") == before + 1
    with torch.no_grad():
        again = module(x)
    assert calls.count("weight") == before + 1  # and cached again
    assert_same(again, out)
    assert_same(out, reference(module, x))


def test_training_step_never_uses_the_cache_and_gets_weight_gradients(monkeypatch):
    formats, calls = counting_formats(monkeypatch, weight=("integer", {"width": 4, "frac_width": 2}))
    module = linear(formats).train()
    x = torch.randn(4, 16)
    with torch.no_grad():
        module(x)  # cached
    module(x).sum().backward()
    assert calls.count("weight") == 2
    assert torch.equal(module.weight.grad, torch.ones(8, 1) * x.sum(0))  # straight-through gradient
    assert torch.equal(module.bias.grad, torch.full((8,), 4.0))


def test_frozen_weights_are_cached_in_training_mode(monkeypatch):
    formats, calls = counting_formats(monkeypatch, weight=("integer", {"width": 4, "frac_width": 2}))
    module = linear(formats).train().requires_grad_(False)
    x = torch.randn(4, 16, requires_grad=True)
    module(x).sum().backward()
    module(x).sum().backward()
    assert calls.count("weight") == 1
    assert x.grad is not None


def test_inference_mode_copy_is_not_reused_outside_inference_mode(monkeypatch):
    formats, calls = counting_formats(monkeypatch, weight=("integer", {"width": 4, "frac_width": 2}))
    module = linear(formats).requires_grad_(False)
    with torch.inference_mode():
        module(torch.randn(2, 16))
    x = torch.randn(2, 16, requires_grad=True)
    module(x).sum().backward()  # an inference tensor here would raise
    assert calls.count("weight") == 2 and x.grad is not None


def test_dot_to_drops_the_cached_copies_and_conv_modules_cache_too(monkeypatch):
    formats, calls = counting_formats(monkeypatch, weight=("e4m3", {}))
    torch.manual_seed(1)
    conv = QuantConv2d.from_float(torch.nn.Conv2d(3, 4, 3), formats)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        first = conv(x)
        assert_same(conv(x), first)
    assert calls.count("weight") == 1 and "_lowbit_quantized_parameters" in conv.__dict__
    conv.to(torch.float32)
    assert "_lowbit_quantized_parameters" not in conv.__dict__
    weight_cache.clear(conv)  # idempotent
