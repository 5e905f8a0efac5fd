"""Common / software metadata passes: classification, recorded shapes, dtypes, values, formats, errors."""

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lowbit.errors import ConfigError
from lowbit.graph.metadata import (
    MaseMetadata, add_common_metadata_analysis_pass, add_software_metadata_analysis_pass,
    init_metadata_analysis_pass, node_formats, record_formats, role_arg_keys,
)  # fmt: skip
from lowbit.graph.qgraph import GraphError, QGraph
from lowbit.nn import QuantLinear, parse_node_config
from lowbit.nn.functional import quantized_add, quantized_layer_norm, quantized_linear

INT8 = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 4}
ADD_CONFIG = parse_node_config("add", {"name": "integer", "data_in_width": 6, "data_in_frac_width": 2}).to_dict()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


class FuncNet(nn.Module):
    """conv2d, BatchNorm2d, size/view methods, torch.relu, F.relu, + and *, matmul, a tuple return."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.w = nn.Parameter(torch.randn(8, 5))

    def forward(self, x, y):
        a = self.bn(self.conv(x))
        b = a.view(a.size(0), -1)
        c = torch.relu(b)
        d = F.relu(c)
        e = c + d
        f = e * 2.0
        g = torch.matmul(f, self.w)
        return g + y, g


def common(graph, name):
    return graph.node(name).meta["mase"]["common"]


def run_mlp(**extra):
    graph = QGraph(mlp())
    graph, info = add_common_metadata_analysis_pass(graph, {"dummy_in": {"input": torch.randn(3, 4)}, **extra})
    return graph, info


def run_funcnet(add_value=True):
    torch.manual_seed(0)
    graph = QGraph(FuncNet())
    dummy = {"x": torch.randn(2, 1, 4, 4), "y": torch.randn(2, 5)}
    add_common_metadata_analysis_pass(graph, {"dummy_in": dummy, "add_value": add_value})
    return graph


# ---- init / MaseMetadata ---------------------------------------------------------------------------------
def test_init_gives_every_node_fresh_metadata():
    graph = QGraph(mlp())
    graph, info = init_metadata_analysis_pass(graph)
    assert info == {"nodes": 5}
    metas = [node.meta["mase"] for node in graph.nodes]
    assert all(isinstance(meta, MaseMetadata) for meta in metas)
    assert all(meta.parameters == {"common": {}, "software": {}} for meta in metas)
    assert len({id(meta["common"]) for meta in metas}) == 5
    layer = graph.node("_0").meta["mase"]
    assert layer.module is graph.model.get_submodule("0") and layer.node is graph.node("_0")
    assert layer.model is graph.model and graph.node("output").meta["mase"].module is None
    layer["common"] = {"mase_op": "linear"}
    assert layer.parameters["common"] == {"mase_op": "linear"} and "software" in layer


# ---- classification --------------------------------------------------------------------------------------
def test_mlp_kinds_shapes_and_values():
    graph, info = run_mlp()
    assert info == {"nodes": 5}
    kinds = {node.name: (common(graph, node.name)["mase_type"], common(graph, node.name)["mase_op"])
             for node in graph.nodes}  # fmt: skip
    assert kinds == {
        "input_1": ("placeholder", "placeholder"), "_0": ("module_related_func", "linear"),
        "_1": ("module_related_func", "relu"), "_2": ("module_related_func", "linear"), "output": ("output", "output"),
    }  # fmt: skip
    first = common(graph, "_0")
    assert list(first["args"]) == ["data_in_0", "weight", "bias"]
    assert [first["args"][k]["shape"] for k in first["args"]] == [[3, 4], [8, 4], [8]]  # bias is 1-D, not [1, 8]
    assert first["results"]["data_out_0"]["shape"] == [3, 8]
    for entry in [*first["args"].values(), *first["results"].values()]:
        assert entry["type"] == "float" and entry["precision"] == [32] and entry["torch_dtype"] == "torch.float32"
    assert torch.equal(first["args"]["weight"]["value"], graph.model.get_submodule("0").weight)
    assert first["args"]["weight"]["value"] is not graph.model.get_submodule("0").weight  # a clone
    assert common(graph, "output")["results"]["data_out_0"] is common(graph, "_2")["results"]["data_out_0"]
    assert common(graph, "output")["args"]["data_in_0"]["shape"] == [3, 2]
    assert common(graph, "input_1")["results"]["data_out_0"]["shape"] == [3, 4]


def test_functional_model_kinds_match_mase_rules():
    graph = run_funcnet()
    kinds = {node.name: (common(graph, node.name)["mase_type"], common(graph, node.name)["mase_op"])
             for node in graph.nodes}  # fmt: skip
    assert kinds == {
        "x": ("placeholder", "placeholder"), "y": ("placeholder", "placeholder"),
        "conv": ("module_related_func", "conv2d"), "bn": ("module", "batch_norm2d"),
        "size": ("implicit_func", "size"), "view": ("implicit_func", "view"),
        "relu": ("module_related_func", "relu"), "relu_1": ("module_related_func", "relu"),
        "add": ("builtin_func", "add"), "mul": ("builtin_func", "mul"), "w": ("get_attr", "constant"),
        "matmul": ("builtin_func", "matmul"), "add_1": ("builtin_func", "add"), "output": ("output", "output"),
    }  # fmt: skip
    assert graph.node("add").target is operator.add and graph.node("relu").target is torch.relu


def test_functional_model_args_and_results():
    graph = run_funcnet()
    size, view = common(graph, "size"), common(graph, "view")
    assert size["args"]["data_in_0"]["shape"] == [2, 2, 2, 2]  # self is recorded (MASE leaves it out)
    assert size["args"]["data_in_1"] == {"type": "int", "precision": [], "shape": [], "value": 0}
    assert size["results"]["data_out_0"] == {"type": "int", "precision": [], "shape": [], "value": 2}
    assert [view["args"][f"data_in_{i}"].get("value") for i in (1, 2)] == [2, -1]
    assert view["results"]["data_out_0"]["shape"] == [2, 8]
    assert common(graph, "relu_1")["args"]["inplace"]["value"] is False
    mul = common(graph, "mul")["args"]
    assert mul["data_in_1"] == {"type": "float", "precision": [], "shape": [], "value": 2.0}
    assert "torch_dtype" not in mul["data_in_1"] and mul["data_in_0"]["torch_dtype"] == "torch.float32"
    assert common(graph, "matmul")["args"]["data_in_1"]["shape"] == [8, 5]
    assert common(graph, "matmul")["results"]["data_out_0"]["shape"] == [2, 5]
    bn = common(graph, "bn")["args"]
    assert list(bn) == ["data_in_0", "weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert bn["running_mean"]["shape"] == [2] and bn["num_batches_tracked"]["type"] == "int"
    assert bn["num_batches_tracked"]["precision"] == [64]
    out = common(graph, "output")
    assert list(out["args"]) == ["data_in_0", "data_in_1"] and list(out["results"]) == ["data_out_0", "data_out_1"]
    assert out["results"]["data_out_1"]["shape"] == [2, 5]
    assert graph.meta["mase"]["common"]["nodes_in"] == ["x", "y"]
    assert graph.meta["mase"]["common"]["nodes_out"] == ["add_1", "matmul"]
    assert graph.meta["mase"]["common"]["args"]["y"]["shape"] == [2, 5]


def test_batchnorm_state_and_train_mode_are_left_alone():
    torch.manual_seed(0)
    model = FuncNet().train()
    graph = QGraph(model)
    before = {k: v.clone() for k, v in graph.model.state_dict().items()}
    # batch size 1 in train mode makes BatchNorm fail (MASE issue); the pass runs in eval mode
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(1, 1, 4, 4), "y": torch.randn(1, 5)}})
    after = graph.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert graph.model.training and graph.model.get_submodule("bn").training


def test_add_value_off_drops_tensor_values_only():
    graph = run_funcnet(add_value=False)
    for node in graph.nodes:
        for entry in [*common(graph, node.name)["args"].values(), *common(graph, node.name)["results"].values()]:
            assert ("value" in entry) == ("torch_dtype" not in entry)
    assert common(graph, "view")["args"]["data_in_2"]["value"] == -1


def test_values_are_taken_before_an_inplace_op():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))
    graph = QGraph(model)
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"input": torch.randn(16, 4)}})
    relu = common(graph, "_1")
    assert relu["args"]["data_in_0"]["value"].min() < 0 and relu["results"]["data_out_0"]["value"].min() >= 0


@pytest.mark.parametrize("dtype, bits", [(torch.float64, 64), (torch.bfloat16, 16), (torch.float16, 16)])
def test_precision_follows_the_dtype(dtype, bits):
    graph = QGraph(mlp().to(dtype))
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"input": torch.randn(3, 4, dtype=dtype)}})
    entry = common(graph, "_0")["args"]["weight"]
    assert entry["precision"] == [bits] and entry["torch_dtype"] == str(dtype) and entry["type"] == "float"


def test_list_arguments_hold_tensor_entries():
    class Cat(nn.Module):
        def forward(self, x):
            return torch.cat([x, x * 2], dim=1).chunk(2, dim=0)

    graph = QGraph(Cat())
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(4, 3)}, "add_value": False})
    cat = common(graph, "cat")
    assert cat["args"]["data_in_0"]["type"] == "list" and cat["args"]["dim"]["value"] == 1
    assert [item["shape"] for item in cat["args"]["data_in_0"]["value"]] == [[4, 3], [4, 3]]
    chunk = common(graph, "chunk")["results"]
    assert [chunk[f"data_out_{i}"]["shape"] for i in (0, 1)] == [[2, 6], [2, 6]]


def test_graph_module_deepcopies_with_metadata():
    graph, _ = run_mlp()
    clone = copy.deepcopy(graph.model)
    node = next(n for n in clone.graph.nodes if n.name == "_0")
    assert node.meta["mase"]["common"]["args"]["weight"]["shape"] == [8, 4]


# ---- quantized nodes -------------------------------------------------------------------------------------
def quantized_mlp_graph():
    torch.manual_seed(0)
    q = QuantLinear.from_float(nn.Linear(4, 3), parse_node_config("linear", INT8))
    graph = QGraph(nn.Sequential(q, nn.ReLU()))
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"input": torch.randn(2, 4)}})
    return graph


def test_quantized_module_args_carry_the_format():
    graph = quantized_mlp_graph()
    layer = common(graph, "_0")
    assert (layer["mase_type"], layer["mase_op"]) == ("module_related_func", "linear")
    for key in ("data_in_0", "weight"):
        entry = layer["args"][key]
        assert entry["type"] == "integer" and entry["precision"] == [8, 4]
        assert entry["format"] == "integer(width=8, frac_width=4)"
        assert entry["shape"] == ([2, 4] if key == "data_in_0" else [3, 4])
    assert layer["args"]["bias"]["type"] == "float" and layer["args"]["bias"]["precision"] == [32]
    assert layer["results"]["data_out_0"]["type"] == "float" and "format" not in layer["results"]["data_out_0"]
    assert common(graph, "_1")["args"]["data_in_0"]["type"] == "float"


def test_quantized_function_args_carry_the_format():
    class Net(nn.Module):
        def forward(self, x, y):
            return quantized_add(x, y + 1, config=ADD_CONFIG)

    graph = QGraph(Net())
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(2, 3), "y": torch.randn(2, 3)}})
    node = next(n for n in graph.nodes if n.target is quantized_add)
    entries = common(graph, node.name)
    assert (entries["mase_type"], entries["mase_op"]) == ("builtin_func", "add")
    assert "config" not in entries["args"]
    assert [entries["args"][f"data_in_{i}"]["type"] for i in (0, 1)] == ["integer", "integer"]
    assert entries["args"]["data_in_1"]["precision"] == [6, 2]
    assert node_formats(node, graph.model).data_in.format_name == "integer"


def test_record_formats_sets_and_resets():
    graph, _ = run_mlp()
    node = graph.node("_0")
    formats = parse_node_config("linear", {**INT8, "data_out_width": 4, "data_out_frac_width": 1})
    record_formats(node, formats)
    entries = common(graph, "_0")
    assert entries["args"]["weight"]["precision"] == [8, 4]
    out = entries["results"]["data_out_0"]
    assert (out["type"], out["precision"], out["format"]) == ("integer", [4, 1], "integer(width=4, frac_width=1)")
    assert common(graph, "output")["results"]["data_out_0"] is not out  # _0 is not the returned node
    assert entries["args"]["bias"]["type"] == "float"  # no bias format in INT8
    record_formats(node, None)
    assert entries["args"]["weight"]["type"] == "float" and entries["args"]["weight"]["precision"] == [32]
    assert "format" not in entries["args"]["weight"]
    with pytest.raises(GraphError, match="add_common_metadata"):
        record_formats(QGraph(mlp()).node("_0"), formats)


def test_role_arg_keys():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(3))

        def forward(self, x):
            a = F.linear(x, weight=self.w, bias=self.b)
            n = F.layer_norm(a, (3,), self.b, self.b)  # fx passes weight / bias of F.layer_norm by keyword
            m = quantized_layer_norm(n, (3,), self.b, self.b, config={})  # a leaf: positional as written
            return torch.bmm(m.unsqueeze(0), m.t().unsqueeze(0)) * quantized_linear(x, self.w, config={})

    graph = QGraph(Net())
    assert role_arg_keys(graph.node("x"), "placeholder") == {} and role_arg_keys(graph.node("output"), "output") == {}
    assert role_arg_keys(graph.node("linear"), "linear") == {
        "data_in": ["data_in_0"], "weight": ["weight"], "bias": ["bias"], "data_out": ["data_out_0"]}
    assert role_arg_keys(graph.node("layer_norm"), "layer_norm")["weight"] == ["weight"]
    assert role_arg_keys(graph.node("layer_norm_1"), "layer_norm")["weight"] == ["data_in_2"]
    assert role_arg_keys(graph.node("layer_norm_1"), "layer_norm")["bias"] == ["data_in_3"]
    assert role_arg_keys(graph.node("bmm"), "bmm") == {
        "data_in": ["data_in_0"], "weight": ["data_in_1"], "data_out": ["data_out_0"]}
    assert role_arg_keys(graph.node("mul"), "mul")["data_in"] == ["data_in_0", "data_in_1"]
    assert role_arg_keys(graph.node("linear_1"), "linear")["bias"] == ["data_in_2"]
    assert role_arg_keys(graph.node("unsqueeze"), "unsqueeze") == {"data_in": ["data_in_0"], "data_out": ["data_out_0"]}
    assert role_arg_keys(QGraph(mlp()).node("_0"), "linear")["weight"] == ["weight"]


# ---- software --------------------------------------------------------------------------------------------
def test_software_stats_are_distinct_dicts():
    graph = run_funcnet()
    add_software_metadata_analysis_pass(graph)
    stats = []
    for node in graph.nodes:
        software = node.meta["mase"]["software"]
        assert software["results"] == {"data_out_0": {"stat": {}}}
        stats += [entry["stat"] for entry in software["args"].values()] + [software["results"]["data_out_0"]["stat"]]
    assert len({id(stat) for stat in stats}) == len(stats)
    bn = graph.node("bn").meta["mase"]["software"]["args"]
    assert list(bn) == ["data_in_0", "weight", "bias", "running_mean", "running_var"]  # no num_batches_tracked
    assert list(graph.node("view").meta["mase"]["software"]["args"]) == ["data_in_0"]  # tensors only
    assert list(graph.node("matmul").meta["mase"]["software"]["args"]) == ["data_in_0", "data_in_1"]


def test_software_renames_functional_parameters():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            a = F.linear(x, self.lin.weight, self.lin.bias)
            b = F.layer_norm(a, (4,), self.lin.bias, self.lin.bias)
            return F.batch_norm(b, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias)

    graph = QGraph(Net())
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(3, 4)}})
    add_software_metadata_analysis_pass(graph)
    names = {n: list(graph.node(n).meta["mase"]["software"]["args"]) for n in ("linear", "layer_norm", "batch_norm")}
    assert names == {"linear": ["data_in_0", "weight", "bias"], "layer_norm": ["data_in_0", "weight", "bias"],
                     "batch_norm": ["data_in_0", "running_mean", "running_var", "weight", "bias"]}  # fmt: skip


def test_software_needs_common_metadata():
    graph = QGraph(mlp())
    init_metadata_analysis_pass(graph)
    with pytest.raises(GraphError, match="add_common_metadata_analysis_pass"):
        add_software_metadata_analysis_pass(graph)


# ---- errors ----------------------------------------------------------------------------------------------
def test_missing_placeholder_is_named():
    graph = QGraph(FuncNet())
    with pytest.raises(ConfigError, match=r"placeholder 'y'.*placeholders: x, y"):
        add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(2, 1, 4, 4)}})
    with pytest.raises(ConfigError, match=r"'yy' is not a placeholder \(did you mean 'y'\?\)"):
        add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(2, 1, 4, 4), "yy": 1}})


@pytest.mark.parametrize("pass_args, pattern", [
    ({"dumy_in": {}}, r"unknown pass_args key 'dumy_in' \(did you mean 'dummy_in'\?\)"),
    ({}, "needs the key 'dummy_in'"),
    ({"dummy_in": [1]}, "dummy_in must be a dict"),
    ({"dummy_in": {}, "add_value": "yes"}, "add_value must be true or false"),
    ({"dummy_in": {}, "force_device_meta": True}, "force_device_meta"),
    ("dummy_in", "pass_args must be a dict"),
])  # fmt: skip
def test_bad_pass_args(pass_args, pattern):
    with pytest.raises(ConfigError, match=pattern):
        add_common_metadata_analysis_pass(QGraph(mlp()), pass_args)


def test_other_passes_reject_unknown_keys():
    with pytest.raises(ConfigError, match="init_metadata_analysis_pass: unknown pass_args key 'x'"):
        init_metadata_analysis_pass(QGraph(mlp()), {"x": 1})
    with pytest.raises(ConfigError, match="add_software_metadata_analysis_pass"):
        add_software_metadata_analysis_pass(run_mlp()[0], {"by": "type"})
    with pytest.raises(GraphError, match="QGraph"):
        init_metadata_analysis_pass(mlp())


def test_pass_args_are_not_mutated():
    dummy = {"input": torch.randn(3, 4)}
    pass_args = {"dummy_in": dummy}
    add_common_metadata_analysis_pass(QGraph(mlp()), pass_args)
    assert pass_args == {"dummy_in": dummy} and list(dummy) == ["input"]


def test_runtime_failure_names_the_node():
    with pytest.raises(GraphError, match=r"at node '_0' \(call_module 0\).*RuntimeError"):
        add_common_metadata_analysis_pass(QGraph(mlp()), {"dummy_in": {"input": torch.randn(3, 5)}})
