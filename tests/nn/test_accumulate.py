"""Accumulator simulation: the fast chunked path against the product-by-product reference."""

import pytest
import torch

from lowbit.errors import ConfigError
from lowbit.formats import resolve
from lowbit.nn import QuantConv2d, QuantLinear, RoleFormats, parse_node_config
from lowbit.nn.accumulate import Accumulator, accumulated_matmul, build_accumulator, reference_matmul
from lowbit.nn.functional import quantized_conv1d, quantized_linear, quantized_matmul


def _ints(shape, low=-128, high=128, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("overflow", ["saturate", "wrap"])
@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_integer_accumulator_equals_reference(overflow, chunk):
    a, b, bias = _ints((4, 40)), _ints((40, 5), seed=1), _ints((5,), seed=2)
    acc = build_accumulator({"name": "integer", "width": 16, "overflow": overflow, "chunk": chunk})
    fast = accumulated_matmul(a, b, acc, bias)
    assert torch.equal(fast.double(), reference_matmul(a, b, acc, bias))
    exact = a.double() @ b.double() + bias.double()
    assert (fast.double() != exact).any()  # 16 bits overflow on these sums: the test has teeth


def test_wrapping_sum_is_the_exact_sum_modulo_2_to_the_width():
    a, b = _ints((6, 50)), _ints((50, 3), seed=3)
    acc = Accumulator("integer", width=12, overflow="wrap", chunk=7)
    exact = (a.double() @ b.double()).long()
    expected = ((exact + 2048) % 4096) - 2048
    assert torch.equal(accumulated_matmul(a, b, acc).long(), expected)


def test_saturating_register_hand_example():
    # 100 + 100 saturates at 127 (8-bit), then -50 gives 77; chunk 2 sums 200 - 50 first: 127 (saturated)
    a, b = torch.tensor([[100.0, 100.0, -50.0]]), torch.ones(3, 1)
    assert accumulated_matmul(a, b, Accumulator("integer", width=8)).item() == 77
    assert accumulated_matmul(a, b, Accumulator("integer", width=8, chunk=2)).item() == 77
    assert accumulated_matmul(a, b, Accumulator("integer", width=8, chunk=3)).item() == 127


def test_fixed_point_accumulator_rounds_to_its_step():
    a, b = torch.tensor([[0.3, 0.3]]), torch.ones(2, 1)
    acc = Accumulator("integer", width=16, frac_width=2)  # step 0.25: 0.3 -> 0.25, 0.55 -> 0.5
    assert accumulated_matmul(a.double(), b.double(), acc).item() == 0.5


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "e5m2", "e4m3"])
def test_float_accumulators_equal_sequential_rounding(name):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 48, generator=g).to(torch.float8_e4m3fn).float()  # products exact in fp32 / bf16
    b = torch.randn(48, 4, generator=g).to(torch.float8_e4m3fn).float()
    acc = build_accumulator({"name": name})
    fast = accumulated_matmul(a, b, acc)
    assert torch.equal(fast.double(), reference_matmul(a, b, acc))
    if name != "fp32":
        assert not torch.equal(fast.double(), a.double() @ b.double())


def test_bf16_accumulator_is_torch_bfloat16_addition():
    # independent oracle: a running sum held in a bfloat16 tensor
    g = torch.Generator().manual_seed(5)
    x = torch.randn(200, generator=g).to(torch.bfloat16)
    running = torch.zeros((), dtype=torch.bfloat16)
    for value in x:
        running = running + value
    out = accumulated_matmul(x.float().view(1, -1), torch.ones(200, 1), build_accumulator({"name": "bf16"}))
    assert out.item() == running.item()


def test_float_chunks_within_stated_bound():
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(5, 64, generator=g), torch.randn(64, 3, generator=g)
    acc = build_accumulator({"name": "fp32", "chunk": 16})
    reference, fast = reference_matmul(a, b, acc), accumulated_matmul(a, b, acc).double()
    products = (a.double().abs() @ b.double().abs())
    # chunk sums off by at most 15 * 2^-53 * sum|p| each, then fp32 rounding steps can amplify by one ulp
    bound = 15 * 2.0**-53 * products + reference.abs() * 2.0**-23 * 4
    assert ((fast - reference).abs() <= bound).all()


def test_quant_linear_with_accumulator_matches_functional_and_reference():
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 4)
    config = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 0, "weight_width": 8,
              "weight_frac_width": 4, "accumulator_width": 12, "accumulator_frac_width": 4, "accumulator_chunk": 4}
    formats = parse_node_config("linear", config)
    assert formats.accumulator == Accumulator("integer", width=12, frac_width=4, chunk=4)
    module = QuantLinear.from_float(layer, formats)
    x = torch.randn(3, 24) * 40
    out = module(x)
    qx, qw = formats.data_in(x), formats.weight(layer.weight)
    reference = reference_matmul(qx, qw.t(), formats.accumulator, layer.bias.detach())
    assert torch.equal(out.double(), reference.to(torch.float32).double())
    assert torch.equal(quantized_linear(x, layer.weight, layer.bias, config=formats.to_dict()), out)


def test_accumulator_gradient_is_straight_through():
    layer = torch.nn.Linear(8, 3)
    formats = RoleFormats(accumulator=build_accumulator({"name": "bf16", "chunk": 2}))
    module = QuantLinear.from_float(layer, formats)
    x = torch.randn(4, 8, requires_grad=True)
    module(x).sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    layer(x2).sum().backward()
    assert torch.equal(x.grad, x2.grad) and torch.equal(module.weight.grad, layer.weight.grad)


def test_conv_accumulator_equals_reference():
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(2, 3, 3, padding=1, stride=2)
    formats = RoleFormats(data_in=resolve("integer", width=6, frac_width=2), weight=resolve("integer", width=6, frac_width=4),
                          accumulator=Accumulator("integer", width=10, frac_width=6, chunk=5))  # fmt: skip
    module = QuantConv2d.from_float(conv, formats)
    x = torch.randn(1, 2, 5, 5) * 4
    out = module(x)
    qx, qw = formats.data_in(x), formats.weight(conv.weight)
    columns = torch.nn.functional.unfold(qx, 3, padding=1, stride=2)[0]  # [K, L]
    reference = reference_matmul(qw.reshape(3, -1), columns, formats.accumulator, None)  # [O, L]
    reference = formats.accumulator.round(reference + conv.bias.detach().double().view(-1, 1))
    assert torch.equal(out[0].reshape(3, -1).double(), reference)
    assert not torch.allclose(out, conv(qx.detach()))  # the 10-bit register saturates here


def test_conv1d_and_matmul_functional_paths():
    acc = {"name": "fp16", "chunk": 2}
    x, w = torch.randn(2, 3, 9), torch.randn(4, 3, 3)
    out = quantized_conv1d(x, w, None, 1, 1, config={"accumulator": acc})
    assert out.shape == (2, 4, 9)
    assert torch.allclose(out, torch.nn.functional.conv1d(x, w, None, 1, 1), atol=1e-2)
    y = torch.randn(2, 9, 5)
    assert torch.allclose(quantized_matmul(x, y, config={"accumulator": acc}), x @ y, atol=1e-2)


@pytest.mark.parametrize("name, flush, chunk", [("integer", 16, 1), ("integer", 24, 8), ("e5m2", 32, 4),
                                                ("bf16", 8, 1), ("fp16", 64, 16)])  # fmt: skip
def test_flushed_register_equals_reference(name, flush, chunk):
    """Two levels: the narrow register (saturating int16 here) is rounded into a float32 register every
    ``flush`` products; K = 100 leaves a partial group at the end, flushed too, and the bias is added in float32."""
    params = {"name": name, "chunk": chunk, "flush": flush}
    if name == "integer":
        params.update(width=16, frac_width=0)
    acc = build_accumulator(params)
    a, b, bias = _ints((4, 100)), _ints((100, 5), seed=1), _ints((5,), seed=2) / 3
    fast = accumulated_matmul(a, b, acc, bias)
    assert torch.equal(fast.double(), reference_matmul(a, b, acc, bias))
    assert acc.to_dict()["flush"] == flush and build_accumulator(acc.to_dict()) == acc


def test_flushing_recovers_what_a_narrow_register_loses():
    """Sums of 256 products in 0..1600 overflow int16 and saturate in one register; flushed every 16 products
    (a group sums to at most 16 * 1600 = 25600 < 32767) the float32 total is the exact sum."""
    a, b = _ints((6, 256), 0, 41), _ints((256, 3), 0, 41, seed=3)
    exact = a.double() @ b.double()
    narrow = build_accumulator({"name": "integer", "width": 16})
    flushed = build_accumulator({"name": "integer", "width": 16, "flush": 16})
    assert not torch.equal(accumulated_matmul(a, b, narrow).double(), exact)  # saturation costs
    assert exact.abs().max() > 32767 and torch.equal(accumulated_matmul(a, b, flushed).double(), exact)


def test_flush_by_hand():
    # 8-bit saturating register flushed every 2 products: (100 + 100 -> 127) + (100 + 100 -> 127) = 254 in float32
    a, b = torch.tensor([[100.0, 100.0, 100.0, 100.0]]), torch.ones(4, 1)
    assert accumulated_matmul(a, b, Accumulator("integer", width=8, flush=2)).item() == 254
    assert accumulated_matmul(a, b, Accumulator("integer", width=8)).item() == 127
    assert accumulated_matmul(a, b, Accumulator("integer", width=8, flush=2), torch.tensor([0.5])).item() == 254.5


def test_flush_key_from_pass_args():
    formats = parse_node_config("linear", {"name": "integer", "data_in_width": 8, "weight_width": 8,
                                           "accumulator_width": 16, "accumulator_flush": 128})  # fmt: skip
    assert formats.accumulator == Accumulator("integer", width=16, flush=128)
    assert "flush=128" in formats.accumulator.describe()
    for bad in (0, 3.5, True, 12):  # 12 is no multiple of chunk 8
        with pytest.raises(ConfigError, match="accumulator_flush"):
            build_accumulator({"name": "fp16", "chunk": 8, "flush": bad})


def test_bad_accumulator_configs():
    with pytest.raises(ConfigError, match="accumulator_overflow"):
        parse_node_config("linear", {"name": "integer", "data_in_width": 8, "weight_width": 8,
                                     "accumulator_width": 16, "accumulator_overflow": "clip"})  # fmt: skip
    with pytest.raises(ConfigError, match="accumulator_chunk"):
        build_accumulator({"name": "fp32", "chunk": 0})
    with pytest.raises(ConfigError, match="accumulator_width"):
        build_accumulator({"name": "integer"})
    with pytest.raises(ConfigError, match="integer accumulators"):
        build_accumulator({"name": "e5m2", "overflow": "wrap"})
    with pytest.raises(ConfigError):
        parse_node_config("relu", {"name": "integer", "data_in_width": 8, "accumulator_width": 16})
