"""verify_common_metadata_analysis_pass and the report passes."""

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lowbit.errors import ConfigError
from lowbit.graph.metadata import (
    add_common_metadata_analysis_pass, add_software_metadata_analysis_pass, init_metadata_analysis_pass,
)  # fmt: skip
from lowbit.graph.qgraph import GraphError, QGraph
from lowbit.graph.report import (
    report_node_meta_param_analysis_pass, report_node_shape_analysis_pass, report_node_type_analysis_pass,
)  # fmt: skip
from lowbit.graph.verify import verify_common_metadata_analysis_pass
from lowbit.nn import QuantLinear, parse_node_config

report = importlib.import_module("lowbit.graph.report")  # the module itself, whatever the package re-exports
INT8 = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 4}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = nn.GELU()
        self.soft = nn.Softmax(dim=-1)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return self.soft(self.act(h + F.relu(h) * 0.5))


def mlp_graph(software=False, quantized=False):
    torch.manual_seed(0)
    layers = [nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)]
    if quantized:
        layers[0] = QuantLinear.from_float(layers[0], parse_node_config("linear", INT8))
    graph = QGraph(nn.Sequential(*layers))
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"input": torch.randn(3, 4)}})
    if software:
        add_software_metadata_analysis_pass(graph)
    return graph


def args_of(graph, name):
    return graph.node(name).meta["mase"]["common"]["args"]


# ---- verify ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("quantized", [False, True])
def test_verify_passes_on_good_graphs(quantized):
    graph = mlp_graph(quantized=quantized)
    assert verify_common_metadata_analysis_pass(graph) == (graph, {"checked": 5})


def test_verify_passes_on_functional_and_other_dtypes():
    graph = QGraph(Net())
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(2, 4)}, "add_value": False})
    assert verify_common_metadata_analysis_pass(graph)[1] == {"checked": len(graph.nodes)}
    half = QGraph(nn.Sequential(nn.Linear(4, 2), nn.ReLU()).to(torch.bfloat16))
    add_common_metadata_analysis_pass(half, {"dummy_in": {"input": torch.randn(1, 4, dtype=torch.bfloat16)}})
    assert verify_common_metadata_analysis_pass(half)[1] == {"checked": 4}


def test_verify_lists_every_problem_with_its_node():
    graph = mlp_graph()
    del args_of(graph, "_0")["weight"]["shape"]
    args_of(graph, "_1")["data_in_0"]["type"] = "integr"
    args_of(graph, "_2")["weight"]["shape"] = [2, 5]  # in_features 5, but the input ends in 8
    graph.node("input_1").meta["mase"]["common"]["results"]["data_out_0"]["precision"] = [8]
    del graph.node("input_1").meta["mase"]["common"]["mase_op"]
    with pytest.raises(GraphError) as caught:
        verify_common_metadata_analysis_pass(graph)
    message = str(caught.value)
    assert "5 problem(s)" in message
    assert "_0: args['weight']: missing 'shape'" in message
    assert "_1: args['data_in_0']: type 'integr' is not 'float' or a registered format (did you mean 'integer'?)" in message
    assert "_2: linear data_in_0 [3, 8] does not end in the weight's in_features 5" in message
    assert "input_1: results['data_out_0']: float precision [8] of a torch.float32 tensor" in message
    assert "input_1: common has no 'mase_op'" in message


def test_verify_catches_shape_changes_and_missing_metadata():
    graph = mlp_graph()
    graph.node("_1").meta["mase"]["common"]["results"]["data_out_0"]["shape"] = [3, 9]
    del graph.node("_2").meta["mase"]
    with pytest.raises(GraphError) as caught:
        verify_common_metadata_analysis_pass(graph)
    assert "_1: relu changes the shape: data_in_0 [3, 8] -> data_out_0 [3, 9]" in str(caught.value)
    assert "_2: no MASE metadata" in str(caught.value)
    graph = mlp_graph()
    graph.node("_0").meta["mase"]["common"]["results"]["data_out_0"]["shape"] = [3, 7]
    with pytest.raises(GraphError, match=r"_0: linear data_out_0 \[3, 7\] does not end in the weight's out_features 8"):
        verify_common_metadata_analysis_pass(graph)


def test_verify_needs_common_metadata_and_rejects_pass_args():
    graph = QGraph(nn.Sequential(nn.Linear(2, 2)))
    init_metadata_analysis_pass(graph)
    with pytest.raises(GraphError, match="common has no 'args' dict"):
        verify_common_metadata_analysis_pass(graph)
    with pytest.raises(ConfigError, match="unknown pass_args key 'strict'"):
        verify_common_metadata_analysis_pass(mlp_graph(), {"strict": True})


# ---- reports ---------------------------------------------------------------------------------------------
def test_type_report_rows(capsys):
    graph = mlp_graph(quantized=True)
    graph, info = report_node_type_analysis_pass(graph)
    assert info["table"] == [
        {"name": "input_1", "fx_op": "placeholder", "mase_type": "placeholder", "mase_op": "placeholder", "data_in_0": None},
        {"name": "_0", "fx_op": "call_module", "mase_type": "module_related_func", "mase_op": "linear", "data_in_0": "integer"},
        {"name": "_1", "fx_op": "call_module", "mase_type": "module_related_func", "mase_op": "relu", "data_in_0": "float"},
        {"name": "_2", "fx_op": "call_module", "mase_type": "module_related_func", "mase_op": "linear", "data_in_0": "float"},
        {"name": "output", "fx_op": "output", "mase_type": "output", "mase_op": "output", "data_in_0": "float"},
    ]  # fmt: skip
    printed = capsys.readouterr().out
    assert "Node types" in printed and "module_related_func" in printed and "integer" in printed


def test_reports_print_plain_text_without_rich(monkeypatch, capsys):
    monkeypatch.setattr(report, "_rich_classes", lambda: None)
    report_node_type_analysis_pass(mlp_graph())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Node types" and lines[1].startswith("+---")
    assert any(line.startswith("| _0 ") and "| linear " in line for line in lines)
    report_node_type_analysis_pass(mlp_graph(), {"print": False})
    assert capsys.readouterr().out == ""


def test_shape_report_rows(capsys):
    graph, info = report_node_shape_analysis_pass(mlp_graph(), {"print": False})
    rows = {row["name"]: row for row in info["table"]}
    assert rows["_0"]["in_shapes"] == {"data_in_0": [3, 4], "weight": [8, 4], "bias": [8]}
    assert rows["_0"]["out_shapes"] == {"data_out_0": [3, 8]}
    assert rows["_1"]["in_shapes"] == {"data_in_0": [3, 8]}
    assert rows["input_1"]["in_shapes"] == {} and rows["output"]["out_shapes"] == {"data_out_0": [3, 2]}
    assert capsys.readouterr().out == ""


def test_meta_param_report_sections_and_save(tmp_path, capsys):
    graph = mlp_graph(software=True)
    path = tmp_path / "sub" / "meta.txt"
    _, info = report_node_meta_param_analysis_pass(graph, {"which": ["common"], "save_path": str(path)})
    assert [row["name"] for row in info["table"]] == ["input_1", "_0", "_1", "_2", "output"]
    assert all("common" in row and "software" not in row for row in info["table"])
    assert info["table"][1]["common"]["args"]["weight"]["value"] == "Tensor(shape=[8, 4], dtype=float32)"
    saved = path.read_text()
    assert saved == info["text"] + "\n" and "Tensor(shape=[8, 4], dtype=float32)" in saved
    assert "tensor([" not in saved and [p.name for p in path.parent.iterdir()] == ["meta.txt"]
    assert info["text"] in capsys.readouterr().out
    _, both = report_node_meta_param_analysis_pass(graph, {"print": False})
    assert both["table"][1]["software"]["args"]["weight"] == {"stat": {}} and "common" in both["table"][1]
    _, soft = report_node_meta_param_analysis_pass(graph, {"which": "software", "print": False})
    assert "common" not in soft["table"][0] and soft["save_path"] is None


@pytest.mark.parametrize("pass_args, pattern", [
    ({"which": ["commom"]}, r"unknown which 'commom' \(did you mean 'common'\?\)"),
    ({"which": []}, "non-empty list"),
    ({"wich": ["all"]}, r"unknown pass_args key 'wich' \(did you mean 'which'\?\)"),
    ({"which": ["hardware"]}, "valid: all, common, software"),
])  # fmt: skip
def test_meta_param_report_bad_pass_args(pass_args, pattern):
    with pytest.raises(ConfigError, match=pattern):
        report_node_meta_param_analysis_pass(mlp_graph(), pass_args)


def test_reports_need_metadata():
    with pytest.raises(GraphError, match="nodes without MASE metadata: input_1, _0"):
        report_node_type_analysis_pass(QGraph(nn.Sequential(nn.Linear(2, 2))))


def test_graph_passes_work_without_rich(tmp_path):
    # rich is an optional extra: importing and running the passes must not need it
    script = textwrap.dedent("""
        import sys
        sys.modules["rich"] = None  # any "import rich..." now raises ImportError
        import torch
        from torch import nn
        from lowbit.graph.qgraph import QGraph
        from lowbit.graph.metadata import add_common_metadata_analysis_pass
        from lowbit.graph.report import report_node_type_analysis_pass
        graph = QGraph(nn.Sequential(nn.Linear(4, 2)))
        add_common_metadata_analysis_pass(graph, {"dummy_in": {"input": torch.randn(1, 4)}})
        report_node_type_analysis_pass(graph)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Node types\n+---") and "| _0 " in done.stdout
