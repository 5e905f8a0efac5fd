"""LogicNets truth tables: the lookup must equal the quantized neuron bit for bit, and the table limits hold."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError
from lowbit.nn.logicnets import LogicNetsLinear, prune_to_fan_in, table_dtype

INPUT = {"name": "integer", "width": 3, "frac_width": 1}  # codes -4..3, values -2.0 .. 1.5
OUTPUT = {"name": "integer", "width": 4, "frac_width": 2}


def pruned_linear(in_features=6, out_features=5, fan_in=3, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features)
    prune_to_fan_in(linear, fan_in)
    return linear


def independent_reference(linear, activation, x, input_params, output_params) -> torch.Tensor:
    """The quantized neuron written out from the documented order, sharing no code with the layer:
    bias, then + w * x_q over the non-zero weights in ascending input order (float64), activation,
    output quantization."""
    x_q = lowbit.quantize(x, input_params["name"], **{k: v for k, v in input_params.items() if k != "name"})
    x_q = x_q.double()
    weight = linear.weight.detach().double()
    bias = linear.bias.detach().double()
    pre = bias.expand(x.shape[0], -1).clone()
    for neuron in range(weight.shape[0]):
        for j in torch.nonzero(weight[neuron]).flatten().tolist():
            pre[:, neuron] = pre[:, neuron] + weight[neuron, j] * x_q[:, j]
    act = activation(pre) if activation is not None else pre
    output = {k: v for k, v in output_params.items() if k != "name"}
    return lowbit.quantize(act, output_params["name"], **output).to(x.dtype)


# ---- pruning ----------------------------------------------------------------------------------------------
def test_prune_keeps_the_largest_magnitudes_per_row():
    linear = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[0.1, -0.9, 0.5, 0.2], [-0.3, 0.05, -0.04, 0.7]]))
    mask = prune_to_fan_in(linear, 2)
    assert mask.tolist() == [[False, True, True, False], [True, False, False, True]]
    assert torch.equal(linear.weight, torch.tensor([[0.0, -0.9, 0.5, 0.0], [-0.3, 0.0, 0.0, 0.7]]))


@pytest.mark.parametrize("fan_in", [0, 5, 1.5])
def test_prune_rejects_bad_fan_in(fan_in):
    with pytest.raises(ConfigError, match=r"fan_in=.*\[1, 4\]"):
        prune_to_fan_in(nn.Linear(4, 2), fan_in)


# ---- structure and table size -----------------------------------------------------------------------------
def test_table_shape_dtype_and_fan_in_order():
    linear = pruned_linear()
    layer = LogicNetsLinear.from_linear(linear, nn.ReLU(), input_format=INPUT, output_format=OUTPUT)
    assert (layer.fan_in, layer.table_entries) == (3, 2 ** (3 * 3))
    assert layer.table.shape == (5, 512) and layer.table.dtype == torch.int8
    for neuron in range(5):
        expected = torch.nonzero(linear.weight[neuron]).flatten()
        assert torch.equal(layer.fan_in_indices[neuron], expected)
        assert torch.equal(layer.weight[neuron], linear.weight[neuron, expected].double())


def test_table_entry_is_the_neuron_at_that_code_combination():
    # Index = codes offset by -q_min, first fan-in input most significant: (c0+4)*64 + (c1+4)*8 + (c2+4).
    linear = pruned_linear()
    layer = LogicNetsLinear.from_linear(linear, nn.ReLU(), input_format=INPUT, output_format=OUTPUT)
    codes = (3, -4, 1)
    index = (codes[0] + 4) * 64 + (codes[1] + 4) * 8 + (codes[2] + 4)
    inputs = layer.fan_in_indices[2]
    pre = linear.bias[2].double()
    for position, code in enumerate(codes):
        pre = pre + linear.weight[2, inputs[position]].double() * (code * 0.5)
    expected_code = torch.round(lowbit.quantize(torch.relu(pre), "integer", width=4, frac_width=2) * 4)
    assert int(layer.table[2, index]) == int(expected_code)


def test_table_dtype_follows_output_width():
    assert table_dtype(lowbit.get_format("integer").create(width=8)) == torch.int8
    assert table_dtype(lowbit.get_format("integer").create(width=8, signed=False)) == torch.int16
    assert table_dtype(lowbit.get_format("integer").create(width=20)) == torch.int32


# ---- exactness --------------------------------------------------------------------------------------------
ACTIVATIONS = {
    "relu": nn.ReLU(),
    "identity": None,
    "tanh": nn.Tanh(),
    "hardtanh": nn.Hardtanh(-0.5, 1.0),
    "function": lambda t: t * t - 1,
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_lookup_equals_quantized_neuron_exactly(name):
    linear = pruned_linear(in_features=7, out_features=6, fan_in=3, seed=1)
    activation = ACTIVATIONS[name]
    layer = LogicNetsLinear.from_linear(linear, activation, input_format=INPUT, output_format=OUTPUT)
    torch.manual_seed(2)
    x = torch.randn(400, 7) * 2.5  # about a third lies outside [-2, 1.5] and must saturate first
    expected = independent_reference(linear, activation, x, INPUT, OUTPUT)
    assert torch.equal(layer(x), expected)
    assert torch.equal(layer.reference(x), expected)
    assert (x.abs() > 2).any()


@pytest.mark.parametrize("signed, codes", [(True, range(-2, 2)), (False, range(0, 4))])
def test_every_code_combination_of_a_small_layer(signed, codes):
    # in=3, fan-in 3, width 2: all 64 input combinations, fed as exact grid values.
    linear = pruned_linear(in_features=3, out_features=4, fan_in=3, seed=3)
    input_params = {"name": "fixed", "width": 2, "frac_width": 0, "signed": signed}
    output_params = {"name": "integer", "width": 5, "frac_width": 1, "signed": False}
    layer = LogicNetsLinear.from_linear(linear, nn.ReLU(), input_format=input_params, output_format=output_params)
    grid = torch.tensor(list(itertools.product(codes, repeat=3)), dtype=torch.float32)
    expected = independent_reference(linear, nn.ReLU(), grid, input_params, output_params)
    assert layer.table_entries == 64
    assert torch.equal(layer(grid), expected)
    assert (expected >= 0).all()


def test_uneven_fan_in_is_padded_with_zero_weights():
    linear = pruned_linear(in_features=5, out_features=3, fan_in=3, seed=4)
    with torch.no_grad():
        linear.weight[1, torch.nonzero(linear.weight[1]).flatten()[0]] = 0.0  # neuron 1 keeps 2 inputs
    layer = LogicNetsLinear.from_linear(linear, nn.ReLU(), input_format=INPUT, output_format=OUTPUT)
    assert layer.fan_in == 3 and layer.weight[1, 2].item() == 0.0
    x = torch.randn(300, 5) * 2
    assert torch.equal(layer(x), independent_reference(linear, nn.ReLU(), x, INPUT, OUTPUT))


def test_batch_shape_and_dtype_are_kept():
    layer = LogicNetsLinear.from_linear(pruned_linear(), nn.ReLU(), input_format=INPUT, output_format=OUTPUT)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    out = layer(x)
    assert out.shape == (2, 3, 5) and out.dtype == torch.float64
    assert torch.equal(out.reshape(6, 5), layer(x.reshape(6, 6)))
    assert not out.requires_grad


def test_batchnorm_activation_runs_in_eval_mode():
    linear = pruned_linear(seed=5)
    norm = nn.BatchNorm1d(5)
    with torch.no_grad():
        norm.running_mean.copy_(torch.linspace(-0.5, 0.5, 5))
        norm.running_var.copy_(torch.linspace(0.5, 2.0, 5))
    layer = LogicNetsLinear.from_linear(linear, norm, input_format=INPUT, output_format=OUTPUT)
    x = torch.randn(200, 6) * 2
    expected = independent_reference(linear, lambda t: norm.double().eval()(t), x, INPUT, OUTPUT)
    assert torch.equal(layer(x), expected)


# ---- errors -----------------------------------------------------------------------------------------------
def test_too_large_table_names_the_sizes_and_the_limit():
    linear = nn.Linear(8, 4)  # dense: fan-in 8 at width 3 = 2^24 entries per neuron
    with pytest.raises(ConfigError) as error:
        LogicNetsLinear.from_linear(linear, input_format=INPUT, output_format=OUTPUT)
    message = str(error.value)
    for part in ("4 neurons", "fan-in 8", "width 3 bits", "16777216 table entries", "max_table_entries=1048576"):
        assert part in message


def test_total_bytes_limit():
    linear = pruned_linear(in_features=6, out_features=5, fan_in=3)  # 5 * 512 int8 entries = 2560 bytes
    with pytest.raises(ConfigError, match=r"2560 bytes in total; the limit is max_table_bytes=2000"):
        LogicNetsLinear.from_linear(linear, input_format=INPUT, output_format=OUTPUT, max_table_bytes=2000)


def test_fan_in_above_the_allowed_maximum():
    linear = pruned_linear(fan_in=4)
    with pytest.raises(ConfigError, match=r"neuron \d has fan-in 4 .* max_fan_in=3; prune"):
        LogicNetsLinear.from_linear(linear, input_format=INPUT, output_format=OUTPUT, max_fan_in=3)


@pytest.mark.parametrize(
    "fmt",
    [{"name": "binary"}, {"name": "affine", "bits": 4}, {"name": "minifloat_ieee", "width": 8, "exponent_width": 4}],
)
def test_non_integer_formats_are_rejected(fmt):
    with pytest.raises(ConfigError, match="input_format must be an integer format"):
        LogicNetsLinear.from_linear(pruned_linear(), input_format=fmt, output_format=OUTPUT)
    with pytest.raises(ConfigError, match="output_format must be an integer format"):
        LogicNetsLinear.from_linear(pruned_linear(), input_format=INPUT, output_format=fmt)


def test_stochastic_rounding_is_rejected():
    stochastic = lowbit.get_format("integer").create(width=3, frac_width=1, rounding="stochastic")
    with pytest.raises(ConfigError, match="deterministic"):
        LogicNetsLinear.from_linear(pruned_linear(), input_format=stochastic, output_format=OUTPUT)


def test_shape_mismatches():
    layer = LogicNetsLinear.from_linear(pruned_linear(), input_format=INPUT, output_format=OUTPUT)
    with pytest.raises(ConfigError, match=r"input shape \(4, 7\) does not end in in_features=6"):
        layer(torch.zeros(4, 7))
    with pytest.raises(ConfigError, match=r"weight shape \(2, 2\) must equal fan_in_indices shape \(2, 3\)"):
        LogicNetsLinear(6, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 2), None, None,
                        input_format=INPUT, output_format=OUTPUT)  # fmt: skip
    with pytest.raises(ConfigError, match=r"fan_in_indices must lie in \[0, 6\)"):
        LogicNetsLinear(6, torch.full((2, 3), 6), torch.zeros(2, 3), None, None,
                        input_format=INPUT, output_format=OUTPUT)  # fmt: skip
    with pytest.raises(ConfigError, match="activation must keep the shape"):
        LogicNetsLinear.from_linear(pruned_linear(), lambda t: t.sum(dim=1), input_format=INPUT, output_format=OUTPUT)
    with pytest.raises(ConfigError, match="expects an nn.Linear"):
        LogicNetsLinear.from_linear(nn.Conv1d(1, 1, 1), input_format=INPUT, output_format=OUTPUT)


def test_nan_input_is_rejected():
    layer = LogicNetsLinear.from_linear(pruned_linear(), input_format=INPUT, output_format=OUTPUT)
    with pytest.raises(ConfigError, match="NaN"):
        layer(torch.tensor([[0.0, float("nan"), 0.0, 0.0, 0.0, 0.0]]))
