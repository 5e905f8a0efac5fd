"""MASE's quantize tests ported to lowbit, with fixtures in the shapes of MASE's config files.

- ``test_quantize``: an MLP with functional ReLUs, by type, default "NA", integer Linear layers.
- ``test_quantize_module``: the module-swap pass by name on ``fc1``.
- ``test_complex_quantize``: a model with Linear / ReLU modules and functions, add / mul / sub with tensors
  and scalars, view, conv2d, pooling, conv1d, matmul and bmm; statistics profiled, then every config file
  applied in turn to the same graph. MASE's test only checks that nothing raises; here the numbers are
  checked against oracles and every forward runs.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import lowbit
from lowbit import ConfigError
from lowbit.config.toml_config import load_run_config
from lowbit.graph import (
    QGraph,
    add_common_metadata_analysis_pass,
    add_software_metadata_analysis_pass,
    init_metadata_analysis_pass,
    profile_statistics_analysis_pass,
    quantize_module_transform_pass,
    quantize_transform_pass,
    summarize_quantization_analysis_pass,
)
from lowbit.nn import QuantLinear, QuantReLU
from lowbit.nn.config import ConfigWarning
from lowbit.pipeline.passes import PASSES

FIXTURES = Path(__file__).parent / "fixtures"


def integer_oracle(x: torch.Tensor, width: int, frac: int, signed: bool = True) -> torch.Tensor:
    """clamp(round-half-even(x * 2^f), codes) / 2^f, in float64."""
    low, high = (-(2 ** (width - 1)), 2 ** (width - 1) - 1) if signed else (0, 2**width - 1)
    return torch.clamp(torch.round(x.double() * 2.0**frac), low, high) / 2.0**frac


def quantize_args(name: str) -> dict:
    return dict(load_run_config(FIXTURES / name, PASSES).passes)["quantize"]


# ---- test_quantize / test_quantize_module ---------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 28 * 28)
        self.fc2 = nn.Linear(28 * 28, 28 * 28 * 4)
        self.fc3 = nn.Linear(28 * 28 * 4, 10)

    def forward(self, x):
        x = torch.flatten(x, start_dim=1, end_dim=-1)
        x = nn.functional.relu(self.fc1(x))
        x = nn.functional.relu(self.fc2(x))
        return self.fc3(x)


LINEAR_8_4 = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8,
              "weight_frac_width": 4, "bias_width": 8, "bias_frac_width": 4}  # fmt: skip


def _integer_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight, bias = integer_oracle(layer.weight, 8, 4).float(), integer_oracle(layer.bias, 8, 4).float()
    return nn.functional.linear(integer_oracle(x, 8, 4).float(), weight, bias)


def test_quantize(tmp_path):
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(2, 28, 28)
    graph = QGraph(MLP())
    graph.model.load_state_dict(model.state_dict())
    graph, _ = init_metadata_analysis_pass(graph, {})
    graph, _ = add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": x}, "add_value": False})
    args = {"by": "type", "default": {"config": {"name": None}}, "linear": {"config": LINEAR_8_4}}
    graph, info = quantize_transform_pass(graph, args)
    assert info["counts"] == {"linear": 3} and args["by"] == "type"  # pass_args are not consumed
    _, summary = summarize_quantization_analysis_pass(graph, {"save_dir": str(tmp_path), "print": False})
    assert {row["node"] for row in summary["table"] if row["changed"]} == {"fc1", "fc2", "fc3"}
    # relu functions stay float; each Linear quantizes input, weight and bias with integer(8, 4)
    hidden = torch.relu(_integer_linear(model.fc1, torch.flatten(x, 1)))
    hidden = torch.relu(_integer_linear(model.fc2, hidden))
    assert torch.equal(graph.model(x), _integer_linear(model.fc3, hidden))


def test_quantize_module():
    torch.manual_seed(1)
    model = MLP()
    x = torch.randn(2, 28, 28)
    expected_fc1 = _integer_linear(model.fc1, torch.flatten(x, 1))
    model, info = quantize_module_transform_pass(model, {"by": "name", "fc1": {"config": LINEAR_8_4}})
    assert info["quantized"] == ["fc1"] and isinstance(model.fc1, QuantLinear)
    assert type(model.fc2) is nn.Linear and type(model.fc3) is nn.Linear
    assert torch.equal(model.fc1(torch.flatten(x, 1)), expected_fc1)


# ---- test_complex_quantize ------------------------------------------------------------------------------
class CustomFnNet(nn.Module):
    """Linear / ReLU modules and functions, elementwise ops with tensors and scalars, conv, matmul, bmm."""

    def __init__(self) -> None:
        super().__init__()
        self.seq_blocks = nn.Sequential(nn.Linear(48, 100), nn.ReLU())
        self.conv2d = nn.Conv2d(1, 4, 3, padding="same")
        self.conv1d = nn.Conv1d(1, 6, 1)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))

    def forward(self, x):
        x = self.seq_blocks(torch.flatten(x, start_dim=1))
        x = nn.functional.relu(x)
        x = x + x
        x = x + 2
        x = x * x
        x = x * 0.5
        x = x - 1
        x = x.view(x.size(0), 1, 10, 10)
        y = self.conv2d(x)
        x = self.pool(x + y[:, :1])
        x = self.conv1d(x.view(x.size(0), 1, -1))
        x = x.view(x.size(0), -1)
        x = torch.matmul(torch.ones(5, x.size(0)), x)
        x = x.view(1, x.size(0), x.size(1))
        return torch.bmm(x, x.transpose(1, 2))


CONFIGS = ["integer.toml", "integer_by_name.toml", "block_fp.toml", "log.toml", "block_log.toml",
           "block_minifloat.toml", "binary.toml", "binary_float_inputs.toml", "binary_uniform.toml", "ternary.toml",
           "ternary_scaled.toml", "minifloat_denorm.toml", "minifloat_ieee.toml"]  # fmt: skip


@pytest.fixture(scope="module")
def profiled():
    torch.manual_seed(2)
    model = CustomFnNet()
    batches = [torch.randn(8, 3, 4, 4) for _ in range(4)]
    graph = QGraph(model)
    graph, _ = init_metadata_analysis_pass(graph, None)
    graph, _ = add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": batches[0]}, "add_value": False})
    graph, _ = add_software_metadata_analysis_pass(graph, None)
    statistics = {"range_min_max": {"abs": False, "dims": "all"},
                  "range_quantile": {"abs": False, "dims": "all", "quantile": 0.5}}  # fmt: skip
    graph, _ = profile_statistics_analysis_pass(graph, {
        "by": "type", "target_weight_nodes": ["linear"], "target_activation_nodes": ["relu", "linear"],
        "weight_statistics": statistics, "activation_statistics": statistics, "input_generator": iter(batches),
        "num_samples": 32})  # fmt: skip
    return graph, batches[0]


def test_complex_quantize_every_config_in_turn(profiled, tmp_path):
    graph, x = profiled
    for name in CONFIGS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph, info = quantize_transform_pass(graph, quantize_args(name))
        assert [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)] == (
            ["quantize by type: 'seq_blocks_1' is a node name, not an op, so this config is never used (MASE "
             "ignores it too); write by = \"name\" to configure that node"] if name == "ternary_scaled.toml" else [])
        summarize_quantization_analysis_pass(graph, {"save_dir": str(tmp_path / name), "print": False})
        out = graph.model(x)
        assert out.shape == (1, 5, 5) and torch.isfinite(out).all(), name
        # every quantizable node is quantized: linear, relu x2, add x3, mul x2, sub, conv2d, conv1d, matmul, bmm
        assert sum(info["counts"].values()) == 13, (name, info["counts"])
        # ReLU / add / ... ignore the shared config's weight and bias keys; the summary says so
        assert set(info["unused_keys"]["seq_blocks_1"]) >= {k for k in quantize_args(name)["default"]["config"]
                                                            if k.startswith(("weight_", "bias_"))}  # fmt: skip
        assert "weight_width" in _row(tmp_path / name, "seq_blocks_1")["unused_keys"]
        assert _row(tmp_path / name, "seq_blocks_0")["unused_keys"] == ""


def _row(directory: Path, node: str) -> dict:
    import csv

    with open(directory / "quantize_table.csv") as handle:
        return next(row for row in csv.DictReader(handle) if row["node"] == node)


def test_complex_integer_numbers(profiled):
    graph, x = profiled
    graph, _ = quantize_transform_pass(graph, quantize_args("integer.toml"))
    linear = graph.modules["seq_blocks.0"]
    assert isinstance(linear, QuantLinear) and isinstance(graph.modules["seq_blocks.1"], QuantReLU)
    flat = torch.flatten(x, 1)
    expected = nn.functional.linear(integer_oracle(flat, 8, 4).float(), integer_oracle(linear.weight, 6, 4).float(),
                                     integer_oracle(linear.bias, 8, 5).float())  # fmt: skip
    assert torch.equal(linear(flat), expected)
    # a ReLU's input is unsigned (MASE): [0, 255 / 16]
    relu_in = torch.tensor([-1.0, 0.03, 3.3, 20.0])
    assert graph.modules["seq_blocks.1"](relu_in).tolist() == [0.0, 0.0, 3.3125, 255 / 16]
    by_name, _ = quantize_transform_pass(graph, quantize_args("integer_by_name.toml"))
    assert by_name.modules["seq_blocks.0"].formats.weight.width == 12
    assert by_name.modules["seq_blocks.1"].formats.data_in.width == 8


def test_binary_keys_and_the_float_idiom(profiled):
    graph, _ = profiled
    graph, info = quantize_transform_pass(graph, quantize_args("binary.toml"))
    formats = graph.modules["seq_blocks.0"].formats
    assert formats.data_in.format_name == formats.weight.format_name == formats.bias.format_name == "binary"
    graph, info = quantize_transform_pass(graph, quantize_args("binary_float_inputs.toml"))
    formats = graph.modules["seq_blocks.0"].formats
    assert formats.data_in is None and formats.bias is None and formats.weight.bipolar
    assert graph.modules["seq_blocks.1"].formats.data_in is None  # width 32: the ReLU stays float as well
    layer = graph.modules["seq_blocks.0"]
    flat = torch.randn(3, 48)
    assert torch.equal(layer(flat), nn.functional.linear(flat, torch.where(layer.weight >= 0, 1.0, -1.0), layer.bias))
    graph, _ = quantize_transform_pass(graph, quantize_args("binary_uniform.toml"))
    formats = graph.modules["seq_blocks.0"].formats
    assert formats.weight.stochastic and formats.data_in.stochastic and formats.bias.bipolar


def test_shared_configs_reach_only_mase_operands():
    # a default config's data_out keys reach a Linear (MASE's optional operand) but not a ReLU; weight keys
    # at a ReLU are unused
    parsed = lowbit.nn.config.read_node_config("relu", {**LINEAR_8_4, "data_out_width": 8}, shared=True)
    assert parsed.formats.data_out is None and set(parsed.unused) == {
        "weight_width", "weight_frac_width", "bias_width", "bias_frac_width", "data_out_width"}
    linear = lowbit.nn.config.read_node_config("linear", {**LINEAR_8_4, "data_out_width": 8}, shared=True)
    assert linear.formats.data_out.width == 8 and linear.unused == {}


@pytest.mark.parametrize("args, words", [
    # a config that names one op type or one node is strict
    ({"by": "type", "relu": {"config": {**LINEAR_8_4}}}, ["weight_width", "no 'weight' operand"]),
    ({"by": "name", "seq_blocks_1": {"config": {**LINEAR_8_4}}}, ["weight_width", "no 'weight' operand"]),
    # typos are refused in a shared config too
    ({"by": "type", "default": {"config": {**LINEAR_8_4, "wieght_width": 8}}}, ["wieght_width"]),
    ({"by": "type", "default": {"config": {**LINEAR_8_4, "stochastc": 1}}}, ["stochastc"]),
    ({"by": "type", "lienar": {"config": LINEAR_8_4}}, ["lienar", "linear"]),
])  # fmt: skip
def test_strict_configs_and_typos_are_refused(args, words):
    graph = QGraph(CustomFnNet())
    with pytest.raises(ConfigError) as error:
        quantize_transform_pass(graph, args)
    for word in words:
        assert word in str(error.value)


def test_module_swap_reports_unused_keys_and_warns_on_node_names():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.warns(ConfigWarning, match="'0' is a module name"):
        model, info = quantize_module_transform_pass(model, {"by": "type", "default": {"config": LINEAR_8_4},
                                                             "0": {"config": LINEAR_8_4}})  # fmt: skip
    assert info["quantized"] == ["0", "1"] and "weight_width" in info["unused_keys"]["1"]
    assert math.isclose(model[1](torch.tensor([20.0])).item(), 255 / 16)
