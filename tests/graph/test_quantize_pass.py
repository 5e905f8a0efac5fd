"""quantize_transform_pass: the seed-000 snippet, by type / name / regex on the toy model, default-None
skipping, node counts, exact numbers against the op chained by hand, and bad configs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit import ConfigError
from lowbit.graph import (
    MaseGraph, QGraph, add_common_metadata_analysis_pass, init_metadata_analysis_pass, quantize_transform_pass,
    summarize_quantization_analysis_pass,
)  # fmt: skip
from lowbit.models import ToyNet
from lowbit.nn import QuantConv2d, QuantLinear, QuantReLU


class MLP(nn.Module):
    """The seed-000 test model: 28x28 -> 784 -> 784 -> 3136 -> 10 with functional ReLUs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 28 * 28)
        self.fc2 = nn.Linear(28 * 28, 28 * 28 * 4)
        self.fc3 = nn.Linear(28 * 28 * 4, 10)

    def forward(self, x):
        x = torch.flatten(x, start_dim=1, end_dim=-1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def test_seed_000_snippet_equals_linear_chained_by_hand():
    torch.manual_seed(0)
    mlp = MLP()
    dummy_in = {"x": torch.randn(1, 28, 28)}
    # --- the seed-000 snippet, only its import line changed ---
    mg = MaseGraph(model=mlp)
    mg, _ = init_metadata_analysis_pass(mg, {})
    mg, _ = add_common_metadata_analysis_pass(mg, {"dummy_in": dummy_in, "add_value": False})
    quan_args = {
        "by": "type",
        "default": {"config": {"name": None}},
        "linear": {
            "config": {
                "name": "integer",
                "data_in_width": 8, "data_in_frac_width": 4,
                "weight_width": 8, "weight_frac_width": 4,
                "bias_width": 8, "bias_frac_width": 4,
            }
        },
    }  # fmt: skip
    mg, info = quantize_transform_pass(mg, quan_args)
    # --- checks ---
    assert info["counts"] == {"linear": 3} and set(info["skipped"]) == {"relu", "relu_1"}
    q = lowbit.get_format("integer")(width=8, frac_width=4)
    x = torch.randn(4, 28, 28)
    h = torch.flatten(x, 1)
    for layer in (mlp.fc1, mlp.fc2):
        h = F.relu(F.linear(q(h), q(layer.weight), q(layer.bias)))
    expected = F.linear(q(h), q(mlp.fc3.weight), q(mlp.fc3.bias))
    assert torch.equal(mg.model(x), expected)
    assert not torch.equal(mlp(x), expected)  # the caller's float model is untouched and differs
    entry = mg.node("fc1").meta["mase"].parameters["common"]["args"]["weight"]
    assert entry["type"] == "integer" and entry["precision"] == [8, 4]


TOY_LINEAR = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 5, "weight_width": 6,
              "weight_frac_width": 4, "bias_width": 8, "bias_frac_width": 5}  # fmt: skip
TOY_RELU = {"name": "integer", "data_in_width": 4, "data_in_frac_width": 2}


def _toy_graph():
    torch.manual_seed(1)
    return QGraph(ToyNet())


def _types(graph):
    return {name: type(module).__name__ for name, module in graph.model.seq_blocks.named_children()}


def test_toy_by_name_quantizes_exactly_the_named_nodes():
    graph = _toy_graph()
    node_count = len(graph.nodes)
    args = {"by": "name", "default": {"config": {"name": "NA"}},
            "seq_blocks_0": {"config": TOY_LINEAR}, "seq_blocks_3": {"config": TOY_RELU}}  # fmt: skip
    graph, info = quantize_transform_pass(graph, args)
    assert _types(graph) == {"0": "QuantLinear", "1": "ReLU", "2": "Linear", "3": "QuantReLU", "4": "Linear"}
    assert len(graph.nodes) == node_count == 9
    assert info["quantized"] == ["seq_blocks_0", "seq_blocks_3"]
    assert info["skipped"] == ["seq_blocks_1", "seq_blocks_2", "seq_blocks_4"]


def test_toy_by_regex_first_match_wins_and_default_applies_to_the_rest():
    graph = _toy_graph()
    float_model = copy.deepcopy(graph.model)
    args = {"by": "regex_name", "default": {"config": TOY_RELU},
            r"seq_blocks_[02]": {"config": TOY_LINEAR}, r"seq_blocks_\d": {"config": {"name": "NA"}}}  # fmt: skip
    graph, info = quantize_transform_pass(graph, args)
    assert _types(graph) == {"0": "QuantLinear", "1": "ReLU", "2": "QuantLinear", "3": "ReLU", "4": "Linear"}
    x = torch.rand(8, 1, 2, 2) * 10 - 5
    lin = lowbit.get_format("integer")
    qx, qw, qb = lin(width=8, frac_width=5), lin(width=6, frac_width=4), lin(width=8, frac_width=5)
    blocks = dict(float_model.seq_blocks.named_children())
    h = F.relu(F.linear(qx(x.view(8, -1)), qw(blocks["0"].weight), qb(blocks["0"].bias)))
    h = F.relu(F.linear(qx(h), qw(blocks["2"].weight), qb(blocks["2"].bias)))
    assert torch.equal(graph.model(x), blocks["4"](h))


def test_toy_by_type_default_and_counts():
    graph = _toy_graph()
    args = {"by": "type", "default": {"config": {"name": "NA"}}, "linear": {"config": TOY_LINEAR},
            "relu": {"config": TOY_RELU}}  # fmt: skip
    graph, info = quantize_transform_pass(graph, args)
    assert info["counts"] == {"linear": 3, "relu": 2}
    assert sum(isinstance(m, (QuantLinear, QuantReLU)) for m in graph.modules.values()) == 5
    relu = graph.model.seq_blocks.get_submodule("1")
    assert relu.formats.data_in.signed is False  # MASE's ReLU quantizes its input unsigned


def test_pass_args_are_not_mutated_and_pass_can_run_twice():
    args = {"by": "type", "default": {"config": {"name": "NA"}}, "linear": {"config": TOY_LINEAR}}
    frozen = copy.deepcopy(args)
    graph, _ = quantize_transform_pass(_toy_graph(), args)
    graph, info = quantize_transform_pass(graph, args)  # MASE pops "by": a second call raises KeyError there
    assert args == frozen and info["counts"] == {"linear": 3}


def test_quantized_graph_retraces_to_same_nodes_and_outputs():
    graph = _toy_graph()
    graph, _ = quantize_transform_pass(graph, {"by": "type", "default": {"config": TOY_RELU},
                                               "linear": {"config": TOY_LINEAR}})  # fmt: skip
    retraced = QGraph(_retrace(graph.model))
    assert [n.name for n in retraced.nodes] == [n.name for n in graph.nodes]
    x = torch.randn(5, 1, 2, 2)
    assert torch.equal(retraced.model(x), graph.model(x))


def _retrace(module):
    """Trace an already-traced GraphModule again as a plain module (what QGraph does to any model)."""
    from lowbit.graph.qgraph import _trace

    return _trace(module, None, ())


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).flatten(1))


def test_conv_bias_is_copied_not_reinitialised():
    torch.manual_seed(2)
    model = ConvNet()
    graph = QGraph(model)
    config = {"name": "integer", "data_in_width": 8, "weight_width": 8, "weight_frac_width": 6}
    graph, _ = quantize_transform_pass(graph, {"by": "type", "default": {"config": {"name": "NA"}},
                                               "conv2d": {"config": config}})  # fmt: skip
    conv = graph.model.conv
    assert isinstance(conv, QuantConv2d)
    assert torch.equal(conv.bias, model.conv.bias) and torch.equal(conv.weight, model.conv.weight)
    assert conv.formats.bias is None  # no bias_* keys: the bias stays float, and is the trained one


@pytest.mark.parametrize(
    "args,words",
    [
        ({"by": "type", "lienar": {"config": TOY_LINEAR}}, ["lienar", "linear"]),
        ({"by": "typ", "linear": {"config": TOY_LINEAR}}, ["typ", "type"]),
        ({"linear": {"config": TOY_LINEAR}}, ["'by'"]),
        ({"by": "type", "linear": {"config": {"name": "integer", "data_in_width": 8}}}, ["seq_blocks_0", "weight"]),
        ({"by": "type", "linear": {"config": {**TOY_LINEAR, "weight_width": 0}}}, ["seq_blocks_0", "width=0"]),
        ({"by": "type", "linear": {"config": {**TOY_LINEAR, "wieght_width": 4}}}, ["wieght_width", "weight_width"]),
        ({"by": "name", "seq_block_0": {"config": TOY_LINEAR}}, ["seq_block_0", "seq_blocks_0"]),
        ({"by": "name", "view": {"config": TOY_LINEAR}}, ["view", "cannot be quantized"]),
        ({"by": "regex_name", "seq_blocks_[": {"config": TOY_LINEAR}}, ["regular expression"]),
        ({"by": "type", "linear": TOY_LINEAR}, ["'config'"]),
        ({"by": "type", "linear": {"config": {"data_in_width": 8}}}, ["'name'"]),
    ],
)  # fmt: skip
def test_bad_pass_args_raise_config_error_and_leave_graph_unchanged(args, words):
    graph = _toy_graph()
    before = [(n.name, n.op, n.target) for n in graph.nodes]
    module_types = _types(graph)
    with pytest.raises(ConfigError) as error:
        quantize_transform_pass(graph, args)
    for word in words:
        assert word in str(error.value)
    assert [(n.name, n.op, n.target) for n in graph.nodes] == before and _types(graph) == module_types


def test_summary_table_and_csv(tmp_path):
    graph = _toy_graph()
    graph, _ = quantize_transform_pass(graph, {"by": "type", "default": {"config": {"name": "NA"}},
                                               "linear": {"config": TOY_LINEAR}})  # fmt: skip
    _, info = summarize_quantization_analysis_pass(graph, {"save_dir": str(tmp_path), "print": False})
    rows = {row["node"]: row for row in info["table"]}
    assert rows["seq_blocks_0"]["quantized_type"] == "QuantLinear" and rows["seq_blocks_0"]["changed"]
    assert rows["seq_blocks_1"]["changed"] is False
    assert {h["op"]: (h["total"], h["changed"]) for h in info["histogram"]}["Linear"] == (3, 3)
    table = (tmp_path / "quantize_table.csv").read_text().splitlines()
    assert table[0] == "node,mase_type,mase_op,original_type,quantized_type,formats,changed,unused_keys"
    assert len(table) == 1 + 7  # size, view and the five blocks
    histogram = (tmp_path / "quantize_histogram.csv").read_text().splitlines()
    assert "Linear,3,3,0" in histogram and "ReLU,2,0,2" in histogram


def test_quantize_after_init_metadata_only_and_then_verify():
    from lowbit.graph import verify_common_metadata_analysis_pass

    graph, _ = init_metadata_analysis_pass(_toy_graph(), {})
    graph, info = quantize_transform_pass(graph, {"by": "type", "linear": {"config": TOY_LINEAR}})
    assert info["counts"] == {"linear": 3}
    graph, _ = add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(2, 1, 2, 2)}})
    graph, checked = verify_common_metadata_analysis_pass(graph)
    assert checked["checked"] == 9
    weight = graph.node("seq_blocks_2").meta["mase"].parameters["common"]["args"]["weight"]
    assert (weight["type"], weight["precision"], weight["shape"]) == ("integer", [6, 4], [100, 100])


FORMAT_NAMES = sorted({lowbit.get_format(name).format_name for name in lowbit.list_formats()})


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_every_format_through_the_pass_on_a_small_conv_net(name):
    torch.manual_seed(4)
    model = ConvNet()
    config = {"name": name, "data_in_name": name, "weight_name": name, "bias_name": name}
    graph, info = quantize_transform_pass(QGraph(model), {"by": "type", "conv2d": {"config": config},
                                                          "linear": {"config": config}})  # fmt: skip
    assert info["counts"] == {"conv2d": 1, "linear": 1}
    assert isinstance(graph.model.conv, QuantConv2d) and isinstance(graph.model.fc, QuantLinear)
    q = lowbit.get_format(name)()
    x = torch.randn(2, 1, 8, 8, requires_grad=True)
    out = graph.model(x)
    hidden = F.relu(F.conv2d(q(x.detach()), q(model.conv.weight), q(model.conv.bias), padding=1))
    expected = F.linear(q(hidden.flatten(1)), q(model.fc.weight), q(model.fc.bias))
    assert torch.equal(out.detach(), expected.detach())
    out.square().sum().backward()
    for parameter in graph.model.parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all()
    assert torch.isfinite(x.grad).all() and x.grad.shape == x.shape
