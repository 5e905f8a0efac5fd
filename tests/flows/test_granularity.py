"""One granularity vocabulary (tensor / channel / token / group) across recipes, PTQ flows and formats."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError
from lowbit.flows.recipes import granularity_params


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))


@pytest.mark.parametrize(("word", "group_size", "params"), [
    ("tensor", None, {}), ("channel", None, {"axis": 0}), ("token", None, {"block_size": (1, -1)}),
    ("group", 32, {"block_size": (1, 32)}),
])  # fmt: skip
def test_words_map_to_the_formats_own_parameters(word, group_size, params):
    assert granularity_params(word, group_size) == params


@pytest.mark.parametrize(("word", "group_size", "message"), [
    ("group", None, "group_size"), ("channel", 32, "needs granularity='group'"), ("row", None, "legal"),
])  # fmt: skip
def test_bad_granularities_are_config_errors(word, group_size, message):
    with pytest.raises(ConfigError, match=message):
        granularity_params(word, group_size)


def test_dynamic_granularity_and_the_older_per_spelling_agree():
    x = torch.randn(5, 64)
    by_word, _ = lowbit.ptq.quantize_dynamic(_model(), granularity="tensor")
    with pytest.warns(DeprecationWarning, match="granularity='tensor'"):
        by_per, _ = lowbit.ptq.quantize_dynamic(_model(), per="tensor")
    assert by_word[0].formats == by_per[0].formats
    assert torch.equal(by_word(x), by_per(x))
    with pytest.raises(ConfigError, match="disagree"):
        lowbit.ptq.quantize_dynamic(_model(), per="tensor", granularity="token")


def test_weight_only_group_granularity_is_the_group_size_blocks():
    model, _ = lowbit.ptq.quantize_weight_only(_model(), bits=4, granularity="group", group_size=16)
    assert tuple(model[0].formats.weight.block_size) == (1, 16)
    model, _ = lowbit.ptq.quantize_weight_only(_model(), bits=4)
    assert model[0].formats.weight.axis == 0
    with pytest.raises(ConfigError, match="group_size"):
        lowbit.ptq.quantize_weight_only(_model(), granularity="group")
