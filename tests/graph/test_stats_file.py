"""Statistics TOML (seed 002's layout), loading with checks, and stats -> scaled-ternary quantize config."""

import copy
import tomllib

import pytest

from lowbit.nn import parse_node_config
import torch
from torch import nn
from torch.utils.data import DataLoader

from lowbit.datasets import toy_tiny
from lowbit.errors import ConfigError
from lowbit.graph import (
    QGraph, add_common_metadata_analysis_pass, add_software_metadata_analysis_pass, init_metadata_analysis_pass,
    quantize_transform_pass,
)  # fmt: skip
from lowbit.graph.profile import profile_statistics_analysis_pass
from lowbit.graph.stats_file import (
    graph_statistics, load_statistics, save_statistics, stats_to_config, stats_to_config_file,
)  # fmt: skip
from lowbit.models.toy import ToyNet

STATS = {"range_min_max": {"dims": "all", "abs": False},
         "range_quantile": {"dims": "all", "abs": False, "quantile": 0.5}}  # fmt: skip
TERNARY = {"name": "ternary", "data_in_scaling_factor": True, "data_in_width": 2, "weight_scaling_factor": True,
           "weight_width": 2, "bias_scaling_factor": True, "bias_width": 2}  # fmt: skip


def profiled(model, dummy, targets=("relu", "linear")):
    graph = QGraph(model)
    init_metadata_analysis_pass(graph)
    add_common_metadata_analysis_pass(graph, {"dummy_in": {"x": dummy}})
    add_software_metadata_analysis_pass(graph)
    loader = DataLoader(toy_tiny("train"), batch_size=8)
    args = {"by": "type", "target_weight_nodes": ["linear"], "target_activation_nodes": list(targets),
            "weight_statistics": STATS, "activation_statistics": STATS, "num_samples": 32, "input_generator": loader}
    profile_statistics_analysis_pass(graph, args)
    return graph


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    return profiled(ToyNet(), torch.zeros(1, 1, 2, 2))


@pytest.fixture(scope="module")
def saved(toy, tmp_path_factory):
    path = tmp_path_factory.mktemp("stats") / "stats_for_quantisation.toml"
    save_statistics(toy, path)
    return path


def expected_config(stats, node, roles):
    """What seed 002's script writes for one node, from that node's own statistics."""
    config = {key: value for key, value in TERNARY.items()
              if key == "name" or any(key.startswith(f"{role}_") for role in roles)}  # fmt: skip
    for role in roles:
        entry = "data_in_0" if role == "data_in" else role
        stat = stats[node]["software"]["args"][entry]["stat"]
        config.update({f"{role}_mean": "NA", f"{role}_median": stat["range_quantile"]["max"],
                       f"{role}_max": stat["range_min_max"]["max"]})  # fmt: skip
    return config


# ---- the file ---------------------------------------------------------------------------------------------
def test_saved_file_has_seed_layout(toy, saved):
    doc = tomllib.loads(saved.read_text())
    assert doc["seq_blocks_0"]["common"] == {"mase_type": "module_related_func", "mase_op": "linear"}
    assert doc["view"]["common"] == {"mase_type": "implicit_func", "mase_op": "view"}
    weight = doc["seq_blocks_0"]["software"]["args"]["weight"]["stat"]
    assert set(weight["range_min_max"]) == {"min", "max", "range", "count"} and weight["range_min_max"]["count"] == 400
    assert weight["range_quantile"]["count"] == 400 and weight["range_quantile"]["range"] == 0.0
    assert doc["seq_blocks_1"]["software"]["args"]["data_in_0"]["stat"]["range_min_max"]["count"] == 32 * 100
    assert doc["seq_blocks_0"]["software"]["results"]["data_out_0"]["stat"] == {}
    text = saved.read_text()
    assert "[seq_blocks_0.software.args.weight.stat.range_min_max]" in text
    assert "[seq_blocks_0.common]" in text
    module = toy.model.get_submodule("seq_blocks.0")
    assert weight["range_min_max"]["max"] == module.weight.max().item()


def test_load_round_trip(toy, saved):
    loaded = load_statistics(saved)
    assert loaded == tomllib.loads(saved.read_text()) == graph_statistics(toy)


# ---- stats -> config --------------------------------------------------------------------------------------
def test_stats_to_config_toy(saved):
    stats = load_statistics(saved)
    before = copy.deepcopy(stats)
    config = stats_to_config(stats)
    assert stats == before
    quantize = config["passes"]["quantize"]
    assert quantize["by"] == "name" and quantize["default"] == {"config": {"name": "NA"}}
    assert set(quantize) == {"by", "report", "default", *(f"seq_blocks_{i}" for i in range(5))}
    for i in (0, 2, 4):
        node = f"seq_blocks_{i}"
        assert quantize[node]["config"] == expected_config(stats, node, ("data_in", "weight", "bias"))
    for i in (1, 3):
        node = f"seq_blocks_{i}"
        assert quantize[node]["config"] == expected_config(stats, node, ("data_in",))
    # each node has its own statistics (MASE's script gave every linear the first one's)
    assert quantize["seq_blocks_2"]["config"]["weight_max"] != quantize["seq_blocks_0"]["config"]["weight_max"]


def test_no_shared_dicts(saved):
    quantize = stats_to_config(load_statistics(saved))["passes"]["quantize"]
    quantize["seq_blocks_0"]["config"]["weight_median"] = 123.0
    quantize["seq_blocks_0"]["config"]["name"] = "integer"
    assert quantize["seq_blocks_2"]["config"]["weight_median"] != 123.0
    assert quantize["seq_blocks_4"]["config"]["name"] == "ternary"
    assert quantize["default"]["config"] == {"name": "NA"}
    again = stats_to_config(load_statistics(saved))["passes"]["quantize"]
    assert again["seq_blocks_0"]["config"]["name"] == "ternary"


def test_base_is_kept_and_by_forced_to_name(saved):
    relu = {"name": "ternary", "data_in_scaling_factor": True, "data_in_width": 2, "data_in_median": 1.5}
    quantize = {"by": "type", "report": True, "default": {"config": {**TERNARY, "weight_median": "NA"}},
                "seq_blocks_3": {"config": relu}}  # fmt: skip
    base = {"model": "toy", "dataset": "toy_tiny", "passes": {"quantize": quantize}}
    frozen = copy.deepcopy(base)
    config = stats_to_config(load_statistics(saved), base)
    assert base == frozen
    quantize = config["passes"]["quantize"]
    assert config["model"] == "toy" and quantize["by"] == "name"
    assert quantize["default"]["config"] == {**TERNARY, "weight_median": "NA"}  # default is not filled in
    assert quantize["seq_blocks_3"]["config"]["data_in_median"] == 1.5  # never overwritten
    assert quantize["seq_blocks_3"]["config"]["data_in_mean"] == "NA"
    assert isinstance(quantize["seq_blocks_0"]["config"]["weight_median"], float)  # "NA" in the template is filled


def test_config_quantizes_and_runs(saved):
    torch.manual_seed(0)
    graph = profiled(ToyNet(), torch.zeros(1, 1, 2, 2))  # the same model and data as the fixture's
    config = stats_to_config(graph)  # straight from the graph's metadata
    assert config == stats_to_config(load_statistics(saved))
    graph, info = quantize_transform_pass(graph, config["passes"]["quantize"])
    assert info["quantized"] == [f"seq_blocks_{i}" for i in range(5)]
    weight = graph.model.get_submodule("seq_blocks.2").formats.weight
    assert weight.median == config["passes"]["quantize"]["seq_blocks_2"]["config"]["weight_median"]
    out = graph(toy_tiny("test").tensors[0][:16])
    assert out.shape == (16, 2) and torch.isfinite(out).all()


class Other(nn.Module):
    """Different node names: fc_in, act, fc_out, relu (functional)."""

    def __init__(self):
        super().__init__()
        self.fc_in, self.act, self.fc_out = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)

    def forward(self, x):
        return torch.relu(self.fc_out(self.act(self.fc_in(x.flatten(1)))))


def test_other_model(tmp_path):
    torch.manual_seed(3)
    graph = profiled(Other(), torch.zeros(1, 1, 2, 2))
    stats_path, dest = tmp_path / "stats.toml", tmp_path / "ternary.toml"
    save_statistics(graph, stats_path)
    config = stats_to_config_file(stats_path, dest)
    assert tomllib.loads(dest.read_text()) == config
    quantize = config["passes"]["quantize"]
    assert set(quantize) == {"by", "report", "default", "fc_in", "act", "fc_out", "relu"}
    stats = load_statistics(stats_path)
    assert quantize["fc_out"]["config"] == expected_config(stats, "fc_out", ("data_in", "weight", "bias"))
    assert quantize["relu"]["config"] == expected_config(stats, "relu", ("data_in",))
    _, info = quantize_transform_pass(graph, quantize)
    assert sorted(info["quantized"]) == ["act", "fc_in", "fc_out", "relu"]
    assert torch.isfinite(graph(torch.randn(5, 1, 2, 2))).all()


# ---- seed 002's own numbers ------------------------------------------------------------------------------
SEED = {  # node: (op, {entry: (quantile max, min_max max)}) from seed 002's statistics file
    "seq_blocks_0": ("linear", {"data_in_0": (0.0833507776260376, 4.985265731811523),
                                "weight": (-0.0033772289752960205, 0.4998381733894348),
                                "bias": (0.021730512380599976, 0.4969978332519531)}),
    "seq_blocks_1": ("relu", {"data_in_0": (-0.008840139955282211, 6.567787170410156)}),
    "seq_blocks_2": ("linear", {"data_in_0": (0.0, 6.567787170410156),
                                "weight": (0.00030127764330245554, 0.099988654255867),
                                "bias": (-0.010821569710969925, 0.09944488853216171)}),
    "seq_blocks_3": ("relu", {"data_in_0": (0.03673841804265976, 2.9003794193267822)}),
    "seq_blocks_4": ("linear", {"data_in_0": (0.03673841804265976, 2.9003794193267822),
                                "weight": (0.003981685731559992, 0.09934879839420319),
                                "bias": (0.006421931087970734, 0.0846341997385025)}),
}  # fmt: skip


def seed_stats():
    table = {"x": {"common": {"mase_type": "placeholder", "mase_op": "placeholder"}},
             "view": {"common": {"mase_type": "implicit_func", "mase_op": "view"}}}  # fmt: skip
    for node, (op, entries) in SEED.items():
        args = {entry: {"stat": {"range_quantile": {"min": median, "max": median, "range": 0.0, "count": 10},
                                 "range_min_max": {"min": -1.0, "max": top, "range": top + 1, "count": 10}}}
                for entry, (median, top) in entries.items()}  # fmt: skip
        table[node] = {"common": {"mase_type": "module_related_func", "mase_op": op}, "software": {"args": args}}
    return table


SEED_BASE = {"model": "toy", "dataset": "toy_tiny",
             "passes": {"quantize": {"by": "name", "report": True, "default": {"config": TERNARY},
                                     "seq_blocks_1": {"config": {"name": "ternary", "data_in_scaling_factor": True,
                                                                 "data_in_width": 2, "data_in_mean": "NA",
                                                                 "data_in_median": -0.009714938700199127,
                                                                 "data_in_max": 6.568027019500732}}}}}  # fmt: skip


def test_seed_002_numbers_without_aliasing():
    quantize = stats_to_config(seed_stats(), SEED_BASE)["passes"]["quantize"]
    assert quantize["default"]["config"] == TERNARY  # MASE's script polluted it with seq_blocks_0's numbers
    assert quantize["seq_blocks_1"] == SEED_BASE["passes"]["quantize"]["seq_blocks_1"]  # base kept as it was
    for node, (op, entries) in SEED.items():
        if node == "seq_blocks_1":
            continue
        config = quantize[node]["config"]
        for entry, (median, top) in entries.items():
            role = "data_in" if entry == "data_in_0" else entry
            assert (config[f"{role}_mean"], config[f"{role}_median"], config[f"{role}_max"]) == ("NA", median, top)
    assert quantize["seq_blocks_3"]["config"] == {"name": "ternary", "data_in_scaling_factor": True,
                                                  "data_in_width": 2, "data_in_mean": "NA",
                                                  "data_in_median": 0.03673841804265976,
                                                  "data_in_max": 2.9003794193267822}  # fmt: skip  # as seed 002
    assert quantize["seq_blocks_2"]["config"]["weight_max"] == 0.099988654255867  # seed 002: 0.4998 (aliased)


def test_seed_002_base_with_ternary_frac_width_is_accepted():
    base = copy.deepcopy(SEED_BASE)
    base["passes"]["quantize"]["seq_blocks_1"]["config"]["data_in_frac_width"] = 0  # as in seed 002's base
    config = stats_to_config(seed_stats(), base)
    relu = config["passes"]["quantize"]["seq_blocks_1"]["config"]
    assert relu["data_in_frac_width"] == 0  # kept in the file; the ternary format ignores it (as MASE does)
    assert parse_node_config("relu", relu).data_in.format_name == "ternary"


def test_per_element_stats_cannot_make_a_threshold():
    stats = seed_stats()
    stats["seq_blocks_3"]["software"]["args"]["data_in_0"]["stat"]["range_min_max"]["max"] = [1.0, 2.0]
    with pytest.raises(ConfigError, match="seq_blocks_3.*dims"):
        stats_to_config(stats)


# ---- bad files ------------------------------------------------------------------------------------------------
GOOD = """
[seq_blocks_0.common]
mase_type = "module_related_func"
mase_op = "linear"
[seq_blocks_0.software.args.weight.stat.range_min_max]
min = -0.5
max = 0.5
range = 1.0
count = 400
"""


@pytest.mark.parametrize(("text", "words"), [
    ("[seq_blocks_0\nmin = 1", ["not valid TOML"]),
    (GOOD.replace("max = 0.5", 'max = "abc"'), ["seq_blocks_0", "software.args.weight.stat.range_min_max.max"]),
    (GOOD.replace("max = 0.5\n", ""), ["seq_blocks_0", "range_min_max.max", "missing"]),
    (GOOD.replace("count = 400", "count = -4"), ["seq_blocks_0", "range_min_max.count"]),
    (GOOD.replace("count = 400", "count = 4.5"), ["seq_blocks_0", "range_min_max.count"]),
    (GOOD.replace('mase_op = "linear"\n', ""), ["seq_blocks_0", "common.mase_op", "missing"]),
    (GOOD.replace('mase_op = "linear"', "mase_op = 3"), ["seq_blocks_0", "common.mase_op"]),
    (GOOD.replace("[seq_blocks_0.common]", "[seq_blocks_0.x]"), ["seq_blocks_0", "'common'"]),
    (GOOD + "[seq_blocks_0.software.args.bias]\nstats = 1\n", ["seq_blocks_0", "software.args.bias.stat"]),
    (GOOD + "[seq_blocks_0.software.args.bias]\nstat = 1\n", ["seq_blocks_0", "software.args.bias.stat"]),
])  # fmt: skip
def test_bad_statistics_files(tmp_path, text, words):
    path = tmp_path / "stats.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_statistics(path)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_good_file_and_missing_file(tmp_path):
    path = tmp_path / "stats.toml"
    path.write_text(GOOD)
    assert load_statistics(path)["seq_blocks_0"]["software"]["args"]["weight"]["stat"]["range_min_max"]["max"] == 0.5
    with pytest.raises(ConfigError, match="cannot read"):
        load_statistics(tmp_path / "missing.toml")
