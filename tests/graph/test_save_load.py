"""Saving and loading graphs: exact round trips, no pickle by default, and refusal of bad or tampered files."""

from __future__ import annotations

import hashlib
import json
import operator
import re
import tomllib
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lowbit._io import PLACEHOLDER, sealed
from lowbit.errors import ConfigError, LowbitError
from lowbit.graph import save_load
from lowbit.graph.qgraph import QGraph
from lowbit.graph.save_load import (
    GRAPH_FILE, META_FILE, PICKLE_FILE, STATE_FILE, load_graph, load_mase_graph_interface_pass, save_graph,
    save_mase_graph_interface_pass, save_node_meta_param_interface_pass,
)  # fmt: skip
from lowbit.nn import OP_ROLES, QuantConv2d, QuantLinear, parse_node_config
from lowbit.nn.functional import quantized_add, quantized_matmul

INTEGER = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8,
           "weight_frac_width": 4, "bias_width": 8, "bias_frac_width": 4}  # fmt: skip


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.relu(self.bn(self.conv(x))), 1))


class Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 6))
        self.register_buffer("offset", torch.randn(6))

    def forward(self, x, y):
        z = torch.add(x, y)
        z = operator.mul(z, x)
        z = torch.matmul(z, self.weight) + self.offset
        z = F.relu(z)
        return z.view(z.size(0), -1)


class Custom(nn.Module):  # a user class: not on the load allowlist
    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def _formats(op: str):
    """INTEGER restricted to the operands ``op`` has (add has no weight, matmul no bias)."""
    roles = [role for group in OP_ROLES[op] for role in group]
    return parse_node_config(op, {k: v for k, v in INTEGER.items() if k == "name" or k.startswith(tuple(roles))})


def _quantize(graph: QGraph, name: str, cls, op: str) -> None:
    formats = _formats(op)
    setattr(graph.model, name, cls.from_float(getattr(graph.model, name), formats))


def _retarget(graph: QGraph, node_name: str, function, op: str) -> None:
    node = graph.node(node_name)
    node.target = function
    node.kwargs = {**node.kwargs, "config": _formats(op).to_dict()}
    graph.model.recompile()


def _roundtrip(graph: QGraph, tmp_path, *inputs) -> QGraph:
    expected = graph(*inputs)
    save_graph(graph, tmp_path)
    loaded = load_graph(tmp_path)
    assert torch.equal(loaded(*inputs), expected)
    assert [(n.name, n.op, str(n.target)) for n in loaded.nodes] == [(n.name, n.op, str(n.target)) for n in graph.nodes]
    assert not (tmp_path / PICKLE_FILE).exists()
    return loaded


def _sequential() -> QGraph:
    torch.manual_seed(0)
    return QGraph(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


def _edit(path, change, reseal=True) -> None:
    """Apply ``change`` to graph.json; ``reseal``: seal it again (as a deliberate forger could), so the checks
    behind the seal are reached."""
    doc = json.loads(path.read_text())
    change(doc)
    if reseal:
        doc["seal_sha256"] = PLACEHOLDER
        path.write_bytes(sealed(json.dumps(doc).encode()))
    else:
        path.write_text(json.dumps(doc))


# ---- round trips ----------------------------------------------------------------------------------------
def test_float_sequential_round_trip(tmp_path):
    graph = _sequential()
    loaded = _roundtrip(graph, tmp_path, torch.randn(5, 4))
    assert sorted(p.name for p in tmp_path.iterdir()) == [GRAPH_FILE, META_FILE, STATE_FILE]
    assert loaded.model.state_dict().keys() == graph.model.state_dict().keys()


def test_quantized_linear_round_trip_keeps_formats(tmp_path):
    graph = _sequential()
    _quantize(graph, "0", QuantLinear, "linear")
    _quantize(graph, "2", QuantLinear, "linear")
    loaded = _roundtrip(graph, tmp_path, torch.randn(7, 4))
    for name in ("0", "2"):
        assert type(getattr(loaded.model, name)) is QuantLinear
        assert getattr(loaded.model, name).formats == getattr(graph.model, name).formats


def test_quantized_conv_net_keeps_batchnorm_stats_and_eval_mode(tmp_path):
    torch.manual_seed(1)
    model = ConvNet()
    model(torch.randn(8, 3, 6, 6))  # training step: running stats move away from their initial values
    graph = QGraph(model.eval())
    _quantize(graph, "conv", QuantConv2d, "conv2d")
    _quantize(graph, "fc", QuantLinear, "linear")
    loaded = _roundtrip(graph, tmp_path, torch.randn(2, 3, 6, 6))
    assert not loaded.model.training and not loaded.model.bn.training
    assert torch.equal(loaded.model.bn.running_var, graph.model.bn.running_var)
    assert int(loaded.model.bn.num_batches_tracked) == 1
    assert loaded.model.conv.formats == graph.model.conv.formats


def test_functional_graph_with_quantized_functions(tmp_path):
    torch.manual_seed(2)
    graph = QGraph(Functional())
    _retarget(graph, "add", quantized_add, "add")
    _retarget(graph, "matmul", quantized_matmul, "matmul")
    loaded = _roundtrip(graph, tmp_path, torch.randn(3, 6), torch.randn(3, 6))
    assert loaded.node("add").target is quantized_add
    assert loaded.node("add").kwargs["config"] == graph.node("add").kwargs["config"]
    doc = json.loads((tmp_path / GRAPH_FILE).read_text())
    targets = {node["name"]: node["target"] for node in doc["nodes"]}
    assert targets["add"] == "lowbit.nn.functional:quantized_add"
    assert targets["mul"] == "operator:mul" and targets["relu"] == "torch.nn.functional:relu"
    assert targets["view"] == "view"  # call_method targets are method names


def test_shared_tensors_stay_shared(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    graph = QGraph(model)
    loaded = _roundtrip(graph, tmp_path, torch.randn(2, 4))
    assert getattr(loaded.model, "0").weight is getattr(loaded.model, "1").weight


def test_frozen_parameters_and_half_precision_survive(tmp_path):
    graph = _sequential()
    graph.model.half()
    getattr(graph.model, "0").weight.requires_grad_(False)
    save_graph(graph, tmp_path)
    loaded = load_graph(tmp_path)
    assert getattr(loaded.model, "0").weight.dtype is torch.float16
    assert not getattr(loaded.model, "0").weight.requires_grad and getattr(loaded.model, "2").weight.requires_grad


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)  # its constructor builds out_proj
        self.rnn = nn.LSTM(4, 3, batch_first=True)  # RNNs take mode from their subclass and cache weights

    def forward(self, x):
        y = self.body(x) + torch.tensor([1.0, 2.0, 3.0, 4.0])  # a tensor constant: a get_attr node
        attended, _ = self.attn(y, y, y)
        out, _ = self.rnn(attended)
        return out.to(torch.float64).sum(dim=(1,), keepdim=True), y[..., None, 1:3]


def test_nested_modules_constants_and_shared_modules(tmp_path):
    torch.manual_seed(3)
    graph = QGraph(Nested())
    graph.model.alias = graph.model.attn.out_proj  # one module under two paths
    x = torch.randn(2, 3, 4)
    expected = graph(x)
    save_graph(graph, tmp_path)
    loaded = load_graph(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(loaded(x), expected, strict=True))
    assert loaded.model.alias is loaded.model.attn.out_proj
    assert [type(m) for m in loaded.model.modules()][1:] == [type(m) for m in graph.model.modules()][1:]
    assert loaded.model.state_dict().keys() == graph.model.state_dict().keys()


def test_unlisted_function_needs_pickle(tmp_path):
    graph = _sequential()
    node = graph.node("_1")
    node.target, node.op, node.args = _user_function, "call_function", (node.args[0],)
    graph.recompile()
    with pytest.raises(LowbitError, match=r"_user_function is not on the allowlist"):
        save_graph(graph, tmp_path)


def _user_function(x):
    return x + 1


def test_real_metadata_passes_round_trip(tmp_path):
    metadata = pytest.importorskip("lowbit.graph.metadata")
    graph, _ = metadata.init_metadata_analysis_pass(_sequential())
    graph, _ = metadata.add_common_metadata_analysis_pass(graph, {"dummy_in": {"input": torch.randn(2, 4)}})
    save_graph(graph, tmp_path)
    loaded = load_graph(tmp_path)
    meta = loaded.node("_0").meta["mase"]
    assert isinstance(meta, metadata.MaseMetadata) and meta.model is loaded.model
    assert meta.parameters["common"]["mase_op"] == "linear"
    assert meta.parameters["common"]["args"]["weight"]["shape"] == [8, 4]


def test_node_metadata_round_trip(tmp_path):
    graph = _sequential()
    parameters = {"common": {"mase_op": "linear", "args": {"data_in_0": {"shape": (1, 4), "value": None}},
                             "weight": torch.zeros(8, 4)}, "software": {}}  # fmt: skip
    graph.node("_0").meta["mase"] = types.SimpleNamespace(parameters=parameters)
    save_graph(graph, tmp_path)
    text = (tmp_path / META_FILE).read_text()
    assert '"NA"' in text and "shape = [" in text and "0.0" not in text  # tensors are summarised, not dumped
    meta = load_graph(tmp_path).node("_0").meta["mase"]
    restored = getattr(meta, "parameters", meta)
    assert restored["common"]["args"]["data_in_0"] == {"shape": [1, 4], "value": None}
    assert restored["common"]["weight"] == {"shape": [8, 4], "dtype": "float32"}


# ---- pickle: only when asked ----------------------------------------------------------------------------
def test_custom_module_needs_allow_pickle_and_trust_pickle(tmp_path):
    graph = QGraph(nn.Sequential(nn.Linear(3, 3), Custom(3.0)), custom_leaf_modules=[Custom])
    with pytest.raises(LowbitError, match=r"module '1'.*Custom.*allow_pickle"):
        save_graph(graph, tmp_path)
    assert not any(tmp_path.iterdir())
    save_graph(graph, tmp_path, allow_pickle=True)
    assert (tmp_path / PICKLE_FILE).exists()
    with pytest.raises(LowbitError, match="trust_pickle=True"):
        load_graph(tmp_path)
    x = torch.randn(2, 3)
    assert torch.equal(load_graph(tmp_path, trust_pickle=True)(x), graph(x))
    save_graph(_sequential(), tmp_path)  # a pickle-free save over it removes the stale pickle
    assert not (tmp_path / PICKLE_FILE).exists() and load_graph(tmp_path)


def test_pickled_graph_keeps_quantized_functions_as_nodes(tmp_path):
    graph = QGraph(nn.Sequential(Custom(), nn.ReLU()), custom_leaf_modules=[Custom])
    node = next(n for n in graph.nodes if n.op == "call_module")
    with graph.fx_graph.inserting_after(node):
        added = graph.fx_graph.call_function(quantized_add, (node, node), {"config": _formats("add").to_dict()})
    node.replace_all_uses_with(added, delete_user_cb=lambda user: user is not added)
    graph.recompile()
    save_graph(graph, tmp_path, allow_pickle=True)
    loaded = load_graph(tmp_path, trust_pickle=True)
    assert any(n.target is quantized_add for n in loaded.nodes)
    x = torch.randn(2, 3)
    assert torch.equal(loaded(x), graph(x))


# ---- refusing bad files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("class_path", [
    "os:system", "builtins:eval", "collections:OrderedDict", "torch.fx.graph_module:GraphModule",
    "torch.nn.modules.module:OrderedDict",  # importable from an allowed module, but not an nn.Module
])  # fmt: skip
def test_non_allowlisted_class_is_refused(tmp_path, class_path):
    save_graph(_sequential(), tmp_path)
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["modules"]["1"].update({"class": class_path}))
    with pytest.raises(LowbitError, match=f"{class_path}.*not on the allowlist"):
        load_graph(tmp_path)


@pytest.mark.parametrize("target", ["os:system", "builtins:eval", "operator:call", "torch:load", "subprocess:run"])
def test_non_allowlisted_function_is_refused(tmp_path, target):
    save_graph(QGraph(Functional()), tmp_path)
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["nodes"][3].update({"target": target}))
    with pytest.raises(LowbitError, match="not on the allowlist"):
        load_graph(tmp_path)


@pytest.mark.parametrize("index, field, value, message", [
    # fx pastes these strings into the Python source it generates and runs
    (0, "target", "x=__import__('os').system('echo pwned')", "not an allowed placeholder target"),
    (10, "target", "view(1); __import__('os')", "not an allowed call_method target"),
    (10, "target", "tofile", "not an allowed call_method target"),  # numpy's: x.numpy().tofile(path)
    (10, "kwargs", {"a=1); print(2": 1}, "keyword names must be identifiers"),
    (3, "name", "weight; import os", "not a valid, unique node name"),
    (4, "target", "__class__", "not an allowed attribute path"),
])  # fmt: skip
def test_code_injection_in_strings_is_refused(tmp_path, index, field, value, message):
    save_graph(QGraph(Functional()), tmp_path)
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["nodes"][index].update({field: value}))
    with pytest.raises(LowbitError, match=re.escape(message)):
        load_graph(tmp_path)


@pytest.mark.parametrize("attribute", ["__class__", {"node": "add"}])  # a node named like a Tensor method
def test_getattr_of_non_tensor_attribute_is_refused(tmp_path, attribute):
    save_graph(QGraph(Functional()), tmp_path)
    getattr_node = {"name": "evil", "op": "call_function", "target": "builtins:getattr",
                    "args": [{"node": "x"}, attribute], "kwargs": {}}  # fmt: skip
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["nodes"].insert(3, getattr_node))
    with pytest.raises(LowbitError, match="public torch.Tensor attributes"):
        load_graph(tmp_path)


def test_truncated_state_is_refused(tmp_path):
    save_graph(_sequential(), tmp_path)
    data = (tmp_path / STATE_FILE).read_bytes()
    (tmp_path / STATE_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(LowbitError, match=STATE_FILE):
        load_graph(tmp_path)


def test_corrupt_state_with_matching_checksum_is_refused(tmp_path):
    save_graph(_sequential(), tmp_path)
    data = (tmp_path / STATE_FILE).read_bytes()[:40]
    (tmp_path / STATE_FILE).write_bytes(data)
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["files"].update({STATE_FILE: hashlib.sha256(data).hexdigest()}))
    with pytest.raises(LowbitError, match=f"{STATE_FILE} is malformed"):
        load_graph(tmp_path)


@pytest.mark.parametrize("name", [GRAPH_FILE, STATE_FILE, META_FILE])
def test_missing_file_is_refused(tmp_path, name):
    save_graph(_sequential(), tmp_path)
    (tmp_path / name).unlink()
    with pytest.raises(LowbitError, match=name):
        load_graph(tmp_path)


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(LowbitError, match="not a graph saved"):
        load_graph(tmp_path / "nowhere")


@pytest.mark.parametrize("change, message", [
    (lambda doc: doc.update(version=3), "version 3"),
    (lambda doc: doc.update(version=1), "earlier lowbit .*Save the graph again"),
    (lambda doc: doc.update(schema="mase"), "schema"),
    (lambda doc: doc["files"].update({"../../etc/passwd": "0"}), "files"),
])  # fmt: skip
def test_wrong_schema_or_version_is_refused(tmp_path, change, message):
    save_graph(_sequential(), tmp_path)
    _edit(tmp_path / GRAPH_FILE, change)
    with pytest.raises(LowbitError, match=message):
        load_graph(tmp_path)


@pytest.mark.parametrize("change", [
    lambda doc: doc["modules"]["0"]["kwargs"].update(out_features=9),
    lambda doc: doc.update(training=[]),
    lambda doc: doc.update(seal_sha256="0" * 64),
    lambda doc: None,  # only the JSON spacing changes
])  # fmt: skip
def test_unsealed_edits_of_graph_json_are_refused(tmp_path, change):
    save_graph(_sequential(), tmp_path)
    _edit(tmp_path / GRAPH_FILE, change, reseal=False)
    with pytest.raises(LowbitError, match="sealed with"):
        load_graph(tmp_path)


def test_bad_json_is_refused(tmp_path):
    save_graph(_sequential(), tmp_path)
    text = (tmp_path / GRAPH_FILE).read_text()
    (tmp_path / GRAPH_FILE).write_text(text[: len(text) // 2])
    with pytest.raises(LowbitError, match="not valid JSON"):
        load_graph(tmp_path)


def test_state_must_match_the_architecture(tmp_path):
    save_graph(_sequential(), tmp_path)
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["modules"]["0"]["kwargs"].update(out_features=9))
    with pytest.raises(LowbitError, match=r"'0.weight'.*shape"):
        load_graph(tmp_path)
    save_graph(_sequential(), tmp_path)
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["tensors"].pop("2.bias"))
    with pytest.raises(LowbitError, match="unexpected tensor '2.bias'"):
        load_graph(tmp_path)


def test_failed_save_leaves_the_previous_one_loadable(tmp_path, monkeypatch):
    graph = _sequential()
    save_graph(graph, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    getattr(graph.model, "0").weight.data.add_(1.0)
    monkeypatch.setattr(save_load, "node_meta_toml", lambda gm: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        save_graph(graph, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    load_graph(tmp_path)


# ---- MASE-named passes ----------------------------------------------------------------------------------
def test_mase_passes_round_trip_without_touching_pass_args(tmp_path):
    graph = _sequential()
    _quantize(graph, "0", QuantLinear, "linear")
    save_args, load_args = {"save_dir": str(tmp_path)}, {"load_dir": str(tmp_path), "trust_pickle": False}
    same, info = save_mase_graph_interface_pass(graph, save_args)
    assert same is graph and {p.rsplit("/", 1)[-1] for p in info["files"]} == {GRAPH_FILE, STATE_FILE, META_FILE}
    loaded, info = load_mase_graph_interface_pass(None, load_args)
    assert info == {} and save_args == {"save_dir": str(tmp_path)} and len(load_args) == 2
    x = torch.randn(3, 4)
    assert torch.equal(loaded(x), graph(x))
    target = _sequential()
    into, _ = load_mase_graph_interface_pass(target, load_args)
    assert into is target and torch.equal(into(x), graph(x))


def test_mase_pass_errors(tmp_path):
    graph = _sequential()
    with pytest.raises(ConfigError, match=r"'save_dri'.*did you mean 'save_dir'"):
        save_mase_graph_interface_pass(graph, {"save_dri": str(tmp_path)})
    with pytest.raises(ConfigError, match="needs the key 'load_dir'"):
        load_mase_graph_interface_pass(None, {})
    with pytest.raises(LowbitError, match="tuple"):
        load_mase_graph_interface_pass((graph, {}), {"load_dir": str(tmp_path)})


def test_save_node_meta_param_pass(tmp_path):
    graph = _sequential()
    graph.node("_2").meta["mase"] = types.SimpleNamespace(parameters={"common": {"mase_op": "linear", "x": None}})
    out = tmp_path / "meta.toml"
    assert save_node_meta_param_interface_pass(graph, {"save_path": str(out)}) == (graph, {})
    header, body = out.read_text().split("\n", 1)
    assert header.startswith("# lowbit.statistics version 1 sha256 ")  # sealed: stats-to-config reads this file
    assert body == '[_2.common]\nmase_op = "linear"\nx = "NA"\n'
    assert tomllib.loads(out.read_text()) == {"_2": {"common": {"mase_op": "linear", "x": "NA"}}}  # still TOML


def test_forged_huge_module_is_refused_before_allocating(tmp_path, monkeypatch):
    save_graph(_sequential(), tmp_path)
    _edit(tmp_path / GRAPH_FILE, lambda doc: doc["modules"]["0"]["kwargs"].update(in_features=2**40))
    real_empty = torch.empty

    def guarded_empty(*size, **kwargs):  # nn.Linear allocates its weight with torch.empty
        device = kwargs.get("device") or torch.get_default_device()  # meta inside `with torch.device("meta")`
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        if torch.device(device).type != "meta" and torch.Size(shape).numel() > 10**8:
            raise AssertionError(f"allocation of {shape} was attempted")
        return real_empty(*size, **kwargs)

    monkeypatch.setattr(torch, "empty", guarded_empty)
    with pytest.raises(LowbitError, match="expects"):
        load_graph(tmp_path)
