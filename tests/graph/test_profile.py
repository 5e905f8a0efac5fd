"""Statistics profiler: seed 002's flow on toy_tiny, each recorded number checked against NumPy on the
same activations caught independently by forward hooks; the stats alone; errors."""

import copy
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lowbit.calibrate import stats as stats_module
from lowbit.calibrate.stats import create_stat
from lowbit.datasets import get_dataset, toy_tiny
from lowbit.errors import ConfigError
from lowbit.graph import (
    QGraph, add_common_metadata_analysis_pass, add_software_metadata_analysis_pass, init_metadata_analysis_pass,
)  # fmt: skip
from lowbit.graph.profile import profile_statistics_analysis_pass
from lowbit.graph.qgraph import GraphError
from lowbit.models.toy import ToyNet

SEED_STATS = {"range_min_max": {"dims": "all", "abs": False},
              "range_quantile": {"dims": "all", "abs": False, "quantile": 0.5}}  # fmt: skip
SEED_ARGS = {"by": "type", "target_weight_nodes": ["linear"], "target_activation_nodes": ["relu", "linear"],
             "weight_statistics": SEED_STATS, "activation_statistics": SEED_STATS, "num_samples": 32}  # fmt: skip
LINEARS, RELUS = ("seq_blocks_0", "seq_blocks_2", "seq_blocks_4"), ("seq_blocks_1", "seq_blocks_3")


def prepared(model):
    graph = QGraph(model)
    init_metadata_analysis_pass(graph)
    x = toy_tiny("train")[:1][0]
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": x}})
    add_software_metadata_analysis_pass(graph)
    return graph


def toy_graph():
    torch.manual_seed(0)
    return prepared(ToyNet())


def loader():
    return DataLoader(toy_tiny("train"), batch_size=8, shuffle=False)


def hooked_inputs(batches=4):
    """Every seq_blocks module's input on the first ``batches`` batches, caught by forward pre-hooks on a
    separately built ToyNet with the same seed (so nothing of the profiler is involved)."""
    torch.manual_seed(0)
    model = ToyNet()
    seen = {f"seq_blocks_{i}": [] for i in range(5)}
    for i, block in enumerate(model.seq_blocks):
        hook = lambda _module, args, key=f"seq_blocks_{i}": seen[key].append(args[0].clone())  # noqa: E731
        block.register_forward_pre_hook(hook)
    with torch.no_grad():
        for k, (x, _) in enumerate(loader()):
            if k == batches:
                break
            model(x)
    return model, {key: torch.cat(values).numpy() for key, values in seen.items()}


def check_quantile(values, q, got, relative_error=0.01):
    """``got`` is within the sketch's stated bound of NumPy's linear ``q`` quantile of ``values``:
    relative_error x the larger |order statistic| interpolated, + 2^-126 (lowbit.calibrate.quantile)."""
    values = np.sort(np.asarray(values, dtype=np.float64).ravel())
    exact = np.quantile(values, q)
    k = int(np.floor(q * (values.size - 1)))
    largest = np.abs(values[k : k + 2]).max()
    bound = relative_error * largest + 2.0**-126 + 1e-12 * abs(exact)  # last term: float64 rounding
    assert abs(got - exact) <= bound, (got, exact, bound)


def stat_of(graph, node, entry):
    return graph.node(node).meta["mase"]["software"]["args"][entry]["stat"]


@pytest.fixture(scope="module")
def seed_run():
    graph = toy_graph()
    args = {**SEED_ARGS, "input_generator": loader()}
    frozen = copy.deepcopy({k: v for k, v in args.items() if k != "input_generator"})
    reference, captured = hooked_inputs()
    for name, tensor in reference.named_parameters():
        assert torch.equal(tensor, graph.model.get_parameter(name))
    graph, info = profile_statistics_analysis_pass(graph, args)
    assert {k: v for k, v in args.items() if k != "input_generator"} == frozen  # pass_args unchanged
    return graph, info, captured


# ---- the seed-002 flow ----------------------------------------------------------------------------------
def test_seed_flow_batches_and_placement(seed_run):
    graph, info, _ = seed_run
    assert info == {"batches": 4, "samples": 32}  # ceil(32 / 8) batches of 8
    for name in LINEARS:
        assert all(set(stat_of(graph, name, e)) == set(SEED_STATS) for e in ("data_in_0", "weight", "bias"))
    for name in RELUS:
        assert set(graph.node(name).meta["mase"]["software"]["args"]) == {"data_in_0"}
        assert set(stat_of(graph, name, "data_in_0")) == set(SEED_STATS)
    for name in ("x", "size", "view", "output"):
        for entry in graph.node(name).meta["mase"]["software"]["args"].values():
            assert entry["stat"] == {}


def test_seed_flow_weights_match_numpy(seed_run):
    graph, _, _ = seed_run
    for name in LINEARS:
        module = graph.model.get_submodule(graph.node(name).target)
        for entry in ("weight", "bias"):
            values = getattr(module, entry).detach().numpy()
            got = stat_of(graph, name, entry)
            assert got["range_min_max"] == {"min": float(values.min()), "max": float(values.max()),
                                            "range": float(values.max()) - float(values.min()),
                                            "count": values.size}  # fmt: skip
            quantile = got["range_quantile"]
            assert quantile["count"] == values.size and quantile["min"] == quantile["max"] and quantile["range"] == 0
            check_quantile(values, 0.5, quantile["max"])


def test_seed_flow_activations_match_hooks(seed_run):
    graph, _, captured = seed_run
    assert captured["seq_blocks_0"].shape == (32, 4)
    for name, values in captured.items():
        got = stat_of(graph, name, "data_in_0")
        assert got["range_min_max"]["min"] == float(values.min())
        assert got["range_min_max"]["max"] == float(values.max())
        assert got["range_min_max"]["count"] == got["range_quantile"]["count"] == values.size  # 32 x features
        check_quantile(values, 0.5, got["range_quantile"]["max"])


# seed 002's statistics file, for the weights of an untrained ToyNet seeded 0: (min, max, count, median)
SEED_002_WEIGHTS = {
    ("seq_blocks_0", "weight"): (-0.4987639784812927, 0.4998381733894348, 400, -0.0033772289752960205),
    ("seq_blocks_0", "bias"): (-0.49093878269195557, 0.4969978332519531, 100, 0.021730512380599976),
    ("seq_blocks_2", "weight"): (-0.0999840646982193, 0.099988654255867, 10000, 0.00030127764330245554),
    ("seq_blocks_2", "bias"): (-0.09788546711206436, 0.09944488853216171, 100, -0.010821569710969925),
    ("seq_blocks_4", "weight"): (-0.09916079044342041, 0.09934879839420319, 200, 0.003981685731559992),
    ("seq_blocks_4", "bias"): (-0.07179033756256104, 0.0846341997385025, 2, 0.006421931087970734),
}


def test_reproduces_seed_002_weight_statistics(seed_run):
    graph, _, _ = seed_run
    for (name, entry), (low, high, count, median) in SEED_002_WEIGHTS.items():
        got = stat_of(graph, name, entry)
        assert (got["range_min_max"]["min"], got["range_min_max"]["max"]) == (low, high)
        assert got["range_min_max"]["count"] == got["range_quantile"]["count"] == count
        values = getattr(graph.model.get_submodule(graph.node(name).target), entry).detach().numpy()
        assert np.quantile(values.astype(np.float64), 0.5) == pytest.approx(median, rel=1e-6)  # MASE: exact
        check_quantile(values, 0.5, got["range_quantile"]["max"])  # ours: the sketch, within its bound


def test_updates_are_per_batch(monkeypatch):
    calls = []
    original = stats_module.RangeMinMax._update
    monkeypatch.setattr(stats_module.RangeMinMax, "_update",
                        lambda self, batch: (calls.append(batch.shape[0]), original(self, batch)))  # fmt: skip
    profile_statistics_analysis_pass(toy_graph(), {**SEED_ARGS, "input_generator": loader()})
    # 6 parameters once (one sample each), 5 activation inputs x 4 batches of 8 samples
    assert sorted(calls) == [1] * 6 + [8] * 20


def test_linear_as_activation_target_only():
    """MASE asserts here; the weight and bias then get the activation statistics, measured once."""
    graph = toy_graph()
    args = {"by": "name", "target_activation_nodes": ["seq_blocks_0"], "activation_statistics": SEED_STATS,
            "num_samples": 16, "input_generator": loader()}  # fmt: skip
    _, info = profile_statistics_analysis_pass(graph, args)
    assert info == {"batches": 2, "samples": 16}
    assert stat_of(graph, "seq_blocks_0", "weight")["range_min_max"]["count"] == 400
    assert stat_of(graph, "seq_blocks_0", "bias")["range_min_max"]["count"] == 100
    assert stat_of(graph, "seq_blocks_0", "data_in_0")["range_min_max"]["count"] == 16 * 4
    assert stat_of(graph, "seq_blocks_2", "weight") == {}


def test_weights_only_needs_no_inputs():
    graph = toy_graph()
    args = {"by": "type", "target_weight_nodes": ["linear"], "weight_statistics": {"abs_mean": {}}}
    _, info = profile_statistics_analysis_pass(graph, args)
    weight = graph.model.get_submodule("seq_blocks.2").weight.detach().double()
    assert info == {"batches": 0, "samples": 0}
    assert stat_of(graph, "seq_blocks_2", "weight")["abs_mean"]["abs_mean"] == pytest.approx(weight.abs().mean().item())


class FunctionalLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(3))

    def forward(self, x):
        return F.linear(x, self.w, self.b)


def test_functional_weights_are_read_without_running():
    torch.manual_seed(4)
    graph = QGraph(FunctionalLinear())
    init_metadata_analysis_pass(graph)
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.randn(2, 4)}})
    add_software_metadata_analysis_pass(graph)
    args = {"by": "type", "target_weight_nodes": ["linear"], "weight_statistics": {"range_min_max": {}}}
    _, info = profile_statistics_analysis_pass(graph, args)
    assert info == {"batches": 0, "samples": 0}
    software = graph.node("linear").meta["mase"]["software"]["args"]
    w = graph.model.w.detach()
    assert software["weight"]["stat"]["range_min_max"] == {"min": w.min().item(), "max": w.max().item(),
                                                           "range": w.max().item() - w.min().item(), "count": 12}
    assert software["bias"]["stat"]["range_min_max"]["count"] == 3
    assert software["data_in_0"]["stat"] == {}


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, a, b):
        return self.fc(a) + b


def test_dict_batches_two_inputs_and_output_activation():
    torch.manual_seed(1)
    graph = QGraph(TwoInputs())
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    init_metadata_analysis_pass(graph)
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"a": a, "b": b}})
    add_software_metadata_analysis_pass(graph)
    batches = [{"a": a[i : i + 2], "b": b[i : i + 2]} for i in range(0, 5, 2)]  # sizes 2, 2, 1
    args = {"by": "type", "target_activation_nodes": ["add"], "activation_statistics": {"variance_online": {}},
            "num_samples": 100, "input_generator": batches, "profile_output_activation": True}  # fmt: skip
    _, info = profile_statistics_analysis_pass(graph, args)
    assert info == {"batches": 3, "samples": 5}  # the generator ran out first
    add = graph.node("add").meta["mase"]["software"]
    first = graph.model.fc(a).detach().numpy()
    for values, got in ((first, add["args"]["data_in_0"]), (b.numpy(), add["args"]["data_in_1"]),
                        (first + b.numpy(), add["results"]["data_out_0"])):  # fmt: skip
        assert got["stat"]["variance_online"]["variance"] == pytest.approx(np.var(values.astype(np.float64)))
        assert got["stat"]["variance_online"]["count"] == 15


# ---- the stats alone --------------------------------------------------------------------------------------
def feed(stat, data, batch=7):
    for i in range(0, len(data), batch):
        stat.update(torch.from_numpy(data[i : i + batch]))
    return stat.compute()


DATA = np.random.default_rng(0).normal(3.0, 2.0, size=(61, 3, 5))  # 61 samples of [3, 5], float64
AXES = {"all": (0, 1, 2), None: (0,), (1,): (0, 2), (-2,): (0, 1), (0, 1): (0, 1, 2)}


@pytest.mark.parametrize("dims", list(AXES))
def test_stats_match_numpy(dims):
    axes, data = AXES[dims], DATA
    kwargs = {"dims": list(dims) if isinstance(dims, tuple) else dims}
    count = int(np.prod([data.shape[a] for a in axes]))
    got = feed(create_stat("range_min_max", **kwargs), data)
    np.testing.assert_array_equal(got["min"], data.min(axis=axes))
    np.testing.assert_array_equal(got["max"], data.max(axis=axes))
    assert got["count"] == count
    for name in ("variance_online", "variance_precise"):
        got = feed(create_stat(name, **kwargs), data)
        np.testing.assert_allclose(got["variance"], data.var(axis=axes), rtol=1e-12)
        np.testing.assert_allclose(got["mean"], data.mean(axis=axes), rtol=1e-12)
    got = feed(create_stat("abs_mean", **kwargs), -data)
    np.testing.assert_allclose(got["abs_mean"], np.abs(data).mean(axis=axes), rtol=1e-12)
    got = feed(create_stat("range_n_sigma", num_sigma=2, var_mode="precise", abs=True, **kwargs), -data)
    mean, std = np.abs(data).mean(axis=axes), np.abs(data).std(axis=axes)
    np.testing.assert_allclose(got["min"], mean - 2 * std, rtol=1e-12)
    np.testing.assert_allclose(got["range"], 4 * std, rtol=1e-12)


def test_quantile_per_element():
    got = feed(create_stat("range_quantile", dims=None, quantile=0.9), DATA)
    assert np.shape(got["max"]) == (3, 5) and got["count"] == 61
    check_quantile(DATA[:, 1, 2], 0.9, got["max"][1][2])
    check_quantile(DATA[:, 0, 4], 0.1, got["min"][0][4])


def test_variance_precise_far_from_zero():
    data = 1e8 + np.random.default_rng(1).normal(0.0, 1.0, size=(4000,))  # naive sum of squares loses it all
    got = feed(create_stat("variance_precise"), data, batch=333)
    assert got["variance"] == pytest.approx(np.var(data), rel=1e-8)
    assert feed(create_stat("variance_online"), data, batch=333)["variance"] == pytest.approx(np.var(data), rel=1e-8)


def test_too_few_values_give_na():
    one = torch.tensor([[2.5]])
    assert create_stat("variance_online").compute()["variance"] == "NA"
    stat = create_stat("variance_online")
    stat.update(one)
    assert stat.compute() == {"mean": "NA", "variance": "NA", "count": 1}
    stat = create_stat("range_min_max")
    stat.update(one)
    assert stat.compute() == {"min": 2.5, "max": 2.5, "range": "NA", "count": 1}


def test_quantile_millions_of_values_bounded_memory():
    rng = np.random.default_rng(2)
    data = rng.standard_normal(2_100_000).astype(np.float32) * 3 + 1  # > 10^6 values, 8.4 MB
    stat = create_stat("range_quantile")  # quantile 0.975
    for i in range(0, data.size, 1 << 16):
        stat.update(torch.from_numpy(data[i : i + (1 << 16)]).reshape(-1, 16))  # batches of [4096, 16]
    assert len(pickle.dumps(stat)) < data.nbytes // 20  # the state holds a sketch, not the values
    got = stat.compute()
    assert got["count"] == data.size
    check_quantile(data, 0.975, got["max"])
    check_quantile(data, 0.025, got["min"])
    assert got["range"] == pytest.approx(got["max"] - got["min"])


def test_record_keeps_samples():
    stat = create_stat("record", abs=True)
    stat.update(torch.tensor([[-1.0, 2.0], [3.0, -4.0]]))
    stat.update(torch.tensor([[5.0, 6.0]]))
    assert stat.compute() == {"data": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "count": 3, "size_in_bytes": 24}


# ---- errors ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "kwargs", "words"), [
    ("range_minmax", {}, ["range_minmax", "range_min_max"]),
    ("range_min_max", {"dim": "all"}, ["'dim'", "'dims'"]),
    ("range_quantile", {"quantile": 0.2}, ["quantile", "0.2"]),
    ("range_n_sigma", {"var_mode": "precis"}, ["precise"]),
    ("variance_online", {"dims": "some"}, ["dims", "some"]),
])  # fmt: skip
def test_bad_stat(name, kwargs, words):
    with pytest.raises(ConfigError) as error:
        create_stat(name, **kwargs)
    assert all(word in str(error.value) for word in words)


@pytest.mark.parametrize(("change", "words"), [
    ({"target_weight_node": ["linear"]}, ["target_weight_node", "target_weight_nodes"]),
    ({"by": "types"}, ["types", "type"]),
    ({"by": "name", "target_weight_nodes": [], "target_activation_nodes": ["seq_block_1"]},
     ["seq_block_1", "seq_blocks_1"]),
    ({"activation_statistics": {"range_quantil": {}}}, ["range_quantil", "range_quantile"]),
    ({"input_generator": None}, ["input_generator"]),
    ({"num_samples": 0}, ["num_samples"]),
])  # fmt: skip
def test_bad_pass_args(change, words):
    args = {**SEED_ARGS, "input_generator": loader(), **change}
    with pytest.raises(ConfigError) as error:
        profile_statistics_analysis_pass(toy_graph(), args)
    assert all(word in str(error.value) for word in words)


def test_needs_software_metadata():
    torch.manual_seed(0)
    graph = QGraph(ToyNet())
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": torch.zeros(1, 1, 2, 2)}})
    with pytest.raises(GraphError, match="add_software_metadata_analysis_pass"):
        profile_statistics_analysis_pass(graph, {**SEED_ARGS, "input_generator": loader()})


# ---- toy_tiny -------------------------------------------------------------------------------------------------
def test_toy_tiny_dataset():
    train = toy_tiny("train")
    x, y = train.tensors
    assert x.shape == (512, 1, 2, 2) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.min() >= -5 and x.max() < 5
    assert torch.equal(y, (x.reshape(512, 4).double().sum(1) > 0).long())
    expected = ((np.random.RandomState(0).rand(512, 4) - 0.5) * 10).astype(np.float32)
    assert np.array_equal(x.reshape(512, 4).numpy(), expected)
    assert torch.equal(toy_tiny("train", n=10).tensors[0], x[:10])
    assert not torch.equal(toy_tiny("validation").tensors[0], x)
    assert torch.equal(get_dataset("toy-tiny", "test").tensors[0], toy_tiny("test").tensors[0])
    # seed 002's first-layer input min / max (a shuffled batch of MASE's train split) are values of ours
    flat = x.flatten().tolist()
    assert -4.972967624664307 in flat and 4.985265731811523 in flat
    with pytest.raises(ConfigError, match="validation"):
        toy_tiny("validate")
