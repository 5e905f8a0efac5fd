"""A trained ToyNet and a few batches of toy_tiny, shared by the report tests (trained once per session)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowbit.datasets import toy_tiny
from lowbit.graph import QGraph, quantize_transform_pass
from lowbit.models import ToyNet

# Different formats per layer, so that every bits-per-element rule shows up (see test_report_numbers.py).
MIXED_CONFIG = {
    "by": "name",
    "seq_blocks_0": {"config": {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4,
                                "weight_width": 8, "weight_frac_width": 4, "bias_width": 8, "bias_frac_width": 4}},
    "seq_blocks_1": {"config": {"name": "integer", "data_in_width": 4, "data_in_frac_width": 2}},
    "seq_blocks_2": {"config": {"name": "affine", "data_in_bits": 8,
                                "weight_bits": 4, "weight_symmetric": True, "weight_axis": 0}},
    "seq_blocks_4": {"config": {"name": "mxint8", "data_in_block_size": 32, "weight_block_size": 32}},
}  # fmt: skip


@pytest.fixture(scope="session")
def mixed_config() -> dict:
    """MIXED_CONFIG for the tests (a fixture: importing a conftest by name finds whichever ran first)."""
    return MIXED_CONFIG


@pytest.fixture(scope="session")
def toy_model() -> ToyNet:
    torch.manual_seed(0)
    model = ToyNet()
    images, labels = toy_tiny("train").tensors
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="session")
def toy_batches() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    images, labels = toy_tiny("test").tensors
    return list(images[:384].split(128)), list(labels[:384].split(128))


@pytest.fixture(scope="session")
def mixed_graph(toy_model) -> QGraph:
    """The trained ToyNet quantized with MIXED_CONFIG (the report never changes the graph it reads)."""
    graph, _ = quantize_transform_pass(QGraph(toy_model), MIXED_CONFIG)
    return graph
