"""accumulator_backward: the backward GEMMs of Linear / Conv / matmul summed in the accumulator, against the
product-by-product reference."""

import pytest
import torch

from lowbit.errors import ConfigError
from lowbit.formats import resolve
from lowbit.nn import QuantConv2d, QuantLinear, RoleFormats, parse_node_config
from lowbit.nn.accumulate import Accumulator, build_accumulator, reference_matmul
from lowbit.nn.accumulated_backward import sum_to
from lowbit.nn.functional import quantized_matmul


def _ints(shape, low=-128, high=128, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed)).float()


INTEGER = {"data_in": resolve("integer", width=8, frac_width=0), "weight": resolve("integer", width=8, frac_width=0)}


@pytest.mark.parametrize("chunk, flush", [(1, None), (4, None), (1, 8)])
def test_linear_gradients_equal_the_reference(chunk, flush):
    accumulator = Accumulator("integer", width=16, overflow="saturate", chunk=chunk, flush=flush, backward=True)
    layer = torch.nn.Linear(40, 24)
    with torch.no_grad():
        layer.weight.copy_(_ints((24, 40), seed=1)), layer.bias.copy_(_ints((24,), seed=2))
    module = QuantLinear.from_float(layer, RoleFormats(**INTEGER, accumulator=accumulator))
    x = _ints((2, 5, 40), seed=3).requires_grad_(True)
    upstream = _ints((2, 5, 24), -120, 121, seed=4)
    module(x).backward(upstream)
    rows, grad_rows, weight = x.detach().reshape(10, 40), upstream.reshape(10, 24), layer.weight.detach()
    assert torch.equal(x.grad.reshape(10, 40).double(), reference_matmul(grad_rows, weight, accumulator))
    assert torch.equal(module.weight.grad.double(), reference_matmul(grad_rows.t(), rows, accumulator))
    assert torch.equal(module.bias.grad.double(), reference_matmul(torch.ones(1, 10), grad_rows, accumulator)[0])
    float_grad = grad_rows.double() @ weight.double()
    assert not torch.equal(x.grad.reshape(10, 40).double(), float_grad)  # int16 saturates: the test has teeth


def test_without_the_flag_gradients_stay_float():
    layer = torch.nn.Linear(40, 6)
    with torch.no_grad():
        layer.weight.copy_(_ints((6, 40), seed=1))
    module = QuantLinear.from_float(layer, RoleFormats(**INTEGER, accumulator=Accumulator("integer", width=16)))
    x, upstream = _ints((10, 40), seed=3).requires_grad_(True), _ints((10, 6), -60, 61, seed=4)
    module(x).backward(upstream)
    assert torch.equal(x.grad, upstream @ layer.weight.detach())


def test_conv_gradients_equal_the_reference():
    accumulator = Accumulator("integer", width=11, chunk=3, backward=True)
    conv = torch.nn.Conv2d(2, 3, 3, padding=1, stride=2)
    with torch.no_grad():
        conv.weight.copy_(_ints((3, 2, 3, 3), -20, 21, seed=5)), conv.bias.copy_(_ints((3,), seed=6))
    module = QuantConv2d.from_float(conv, RoleFormats(**INTEGER, accumulator=accumulator))
    x = _ints((2, 2, 5, 5), -20, 21, seed=7).requires_grad_(True)
    out = module(x)
    upstream = _ints(tuple(out.shape), -30, 31, seed=8)
    out.backward(upstream)
    columns = torch.nn.functional.unfold(x.detach(), 3, padding=1, stride=2)  # [B, K, L]
    grad = upstream.reshape(2, 3, -1)  # [B, O, L]
    # weight gradient: K = (batch, position), batch first
    left = grad.movedim(1, 0).reshape(3, -1)  # [O, B * L]
    right = columns.movedim(1, 2).reshape(-1, 18)  # [B * L, K]
    assert torch.equal(module.weight.grad.reshape(3, -1).double(), reference_matmul(left, right, accumulator))
    assert not torch.equal(module.weight.grad.reshape(3, -1).double(), left.double() @ right.double())  # saturated
    assert torch.equal(module.bias.grad.double(), reference_matmul(left, torch.ones(left.shape[1], 1), accumulator)[:, 0])
    # input gradient: each batch's column gradient in the register, folded back in float
    column_grads = torch.stack([reference_matmul(conv.weight.detach().reshape(3, -1).t(), grad[b], accumulator)
                                for b in range(2)]).float()  # fmt: skip
    expected = torch.nn.functional.fold(column_grads, (5, 5), 3, padding=1, stride=2)
    assert torch.equal(x.grad, expected)


def test_batched_matmul_gradients_and_sum_to():
    accumulator = build_accumulator({"name": "bf16", "chunk": 2, "backward": True})
    x = torch.randn(3, 4, 8).to(torch.float8_e4m3fn).float().requires_grad_(True)
    y = torch.randn(3, 8, 5).to(torch.float8_e4m3fn).float().requires_grad_(True)
    upstream = torch.randn(3, 4, 5).to(torch.float8_e4m3fn).float()
    quantized_matmul(x, y, config={"accumulator": accumulator.to_dict()}).backward(upstream)
    for b in range(3):
        assert torch.equal(x.grad[b].double(), reference_matmul(upstream[b], y[b].detach().t(), accumulator))
        assert torch.equal(y.grad[b].double(), reference_matmul(x[b].detach().t(), upstream[b], accumulator))
    assert not torch.equal(x.grad, upstream @ y.detach().transpose(1, 2))  # bf16 sums differ from float ones
    grad = _ints((2, 3, 4), seed=9)
    assert torch.equal(sum_to(grad, torch.Size([4]), Accumulator("integer", width=30)), grad.sum((0, 1)))


def test_backward_key_and_errors():
    formats = parse_node_config("linear", {"name": "integer", "data_in_width": 8, "weight_width": 8,
                                           "accumulator_width": 16, "accumulator_backward": True})  # fmt: skip
    assert formats.accumulator.backward and "backward too" in formats.accumulator.describe()
    assert build_accumulator(formats.accumulator.to_dict()) == formats.accumulator
    with pytest.raises(ConfigError, match="accumulator_backward"):
        build_accumulator({"name": "fp32", "backward": "yes"})
    accumulator = {"name": "fp32", "backward": True}
    x, y = torch.randn(2, 3, 4, requires_grad=True), torch.randn(5, 1, 4, 6)  # batch shapes (2,) vs (5, 1)
    with pytest.raises(ConfigError, match="one batch shape"):
        quantized_matmul(x, y, config={"accumulator": accumulator})
