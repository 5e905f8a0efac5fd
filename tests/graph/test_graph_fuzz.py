"""Fuzz of saved graph folders: a bit flipped in any byte (every other one, to stay fast) of any of the
files is refused (GraphFileError naming the file), never loaded as another model."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from lowbit.graph.qgraph import QGraph
from lowbit.graph.save_load import GRAPH_FILE, META_FILE, STATE_FILE, GraphFileError, load_graph, save_graph
from lowbit.nn import QuantLinear, parse_node_config

pytest.importorskip("safetensors")


def quantized_graph() -> QGraph:
    torch.manual_seed(0)
    graph = QGraph(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)))
    formats = parse_node_config("linear", {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4,
                                           "weight_width": 8, "weight_frac_width": 4, "bias_width": 8,
                                           "bias_frac_width": 4})  # fmt: skip
    setattr(graph.model, "0", QuantLinear.from_float(getattr(graph.model, "0"), formats))
    graph.node("_0").meta["mase"] = types.SimpleNamespace(parameters={"common": {"mase_op": "linear"}})
    return graph


@pytest.mark.parametrize("name", [GRAPH_FILE, STATE_FILE, META_FILE])
def test_every_flipped_byte_of_every_file_is_refused(tmp_path, name):
    graph, x = quantized_graph(), torch.linspace(-2, 2, 12).reshape(3, 4)
    save_graph(graph, tmp_path)
    assert torch.equal(load_graph(tmp_path)(x), graph(x))
    path = tmp_path / name
    blob = path.read_bytes()
    assert len(blob) > 20
    for position in range(0, len(blob), 2):  # every other byte, every bit index in turn
        mutated = bytearray(blob)
        mutated[position] ^= 1 << (position % 8)
        path.write_bytes(bytes(mutated))
        with pytest.raises(GraphFileError, match=name):
            load_graph(tmp_path)
    path.write_bytes(blob)
    assert torch.equal(load_graph(tmp_path)(x), graph(x))
