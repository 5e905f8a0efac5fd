"""Block-sequential GPTQ (lowbit.flows.gptq.blockwise_gptq, lowbit.flows.blocks): the same codes as the staged
whole-model driver, each block run a counted number of times per calibration batch (a tiny random Llama causal
LM and a MiniLM-like BERT, no download), layers before / after / between the blocks, errors put back."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lowbit.flows.blocks import call_without_cache, find_blocks
from lowbit.flows.gptq import blockwise_gptq, sequential_gptq
from lowbit.ops import Int4WeightOnlyLinear
from lowbit.ops.gptq import gptq_quantize

GROUP = 32


def _quantize_layer(name, module, hessian):
    result = gptq_quantize(module.weight, hessian, GROUP, search=False)
    return Int4WeightOnlyLinear.from_float(module, group_size=GROUP, codes=result.codes, scale=result.scale,
                                           zero_point=result.zero_point)  # fmt: skip


def _mask(batch):
    return batch.get("attention_mask") if isinstance(batch, dict) else None


def _linears(model: nn.Module) -> dict[str, nn.Module]:
    return {name: module for name, module in model.named_modules() if type(module) is nn.Linear}


def _both_drivers(model: nn.Module, batches: list, counted: type | None = None, monkeypatch=None):
    """(blockwise copy, staged copy, per block of the blockwise copy: its forward's calls)."""
    blockwise, staged = copy.deepcopy(model), copy.deepcopy(model)
    calls: dict[int, int] = {}
    if counted is not None:
        original = counted.forward

        def counting(self, *args, **kwargs):
            calls[id(self)] = calls.get(id(self), 0) + 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(counted, "forward", counting)
    done = blockwise_gptq(blockwise, _linears(blockwise), batches, call_without_cache, _quantize_layer, _mask)
    assert set(done) == set(_linears(model))
    sequential_gptq(staged, _linears(staged), batches, call_without_cache, _quantize_layer, _mask)
    return blockwise, staged, calls


def _assert_same_codes(first: nn.Module, second: nn.Module) -> None:
    states = first.state_dict(), second.state_dict()
    assert set(states[0]) == set(states[1])
    assert any(name.endswith("weight_codes") for name in states[0])
    for name, tensor in states[0].items():
        assert torch.equal(tensor, states[1][name]), name


# ---- a tiny random Llama ---------------------------------------------------------------------------------------
def _llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_llama_blocks_run_six_times_per_batch_and_match_the_staged_driver(monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = _llama()
    tokens = [torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    # dicts with input_ids and attention_mask; the second sequence padded on the right (out of H)
    batches = [{"input_ids": ids, "attention_mask": torch.tensor([[1] * 12, [1] * 9 + [0] * 3])} for ids in tokens]
    blockwise, staged, calls = _both_drivers(model, batches, LlamaDecoderLayer, monkeypatch)
    layers = blockwise.model.layers
    # block 0: the capture + 4 stages (q/k/v, o, gate/up, down) + the run that feeds block 1; later blocks 5
    assert [calls[id(layer)] for layer in layers] == [6 * len(batches), 5 * len(batches)]
    assert isinstance(blockwise.lm_head, Int4WeightOnlyLinear)  # after the blocks: from their cached outputs
    assert all("forward" not in vars(layer) for layer in layers)  # the capture's forwards are put back
    _assert_same_codes(blockwise, staged)


def test_llama_token_batches_and_no_stale_kv_cache():
    model = _llama()
    batches = [torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    grown = copy.deepcopy(model)  # token tensors [batch, seq], the model's own use_cache=True
    blockwise_gptq(grown, _linears(grown), batches, lambda root, batch: root(batch), _quantize_layer)
    cacheless = copy.deepcopy(model)
    blockwise_gptq(cacheless, _linears(cacheless), batches, call_without_cache, _quantize_layer)
    _assert_same_codes(grown, cacheless)  # the captured cache is dropped: blocks never attend to stale keys


# ---- a MiniLM-like BERT ----------------------------------------------------------------------------------------
def test_bert_encoder_layers_with_padding_match_the_staged_driver(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertLayer

    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4, [1] * 8 + [0] * 2])
    batches = [{"input_ids": torch.randint(0, 100, (3, 10), generator=torch.Generator().manual_seed(seed)),
                "attention_mask": mask} for seed in range(2)]  # fmt: skip
    blockwise, staged, calls = _both_drivers(model, batches, BertLayer, monkeypatch)
    layers = blockwise.encoder.layer
    assert [calls[id(layer)] for layer in layers] == [6 * len(batches), 5 * len(batches)]
    assert isinstance(blockwise.pooler.dense, Int4WeightOnlyLinear)
    _assert_same_codes(blockwise, staged)


# ---- layers before, after and between the blocks ---------------------------------------------------------------
class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, hidden, *, scale):
        return (hidden + self.second(torch.relu(self.first(hidden))) * scale,)


class _Stack(nn.Module):
    """A Linear before the blocks (a prefix), three blocks taking a keyword, a head after them; ``between``
    puts a Linear between the first two blocks (the blocks cannot then run alone)."""

    def __init__(self, between: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed, self.head = nn.Linear(32, 32), nn.Linear(32, 8)
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.between = nn.Linear(32, 32) if between else None

    def forward(self, x):
        hidden = self.embed(x)
        for index, block in enumerate(self.blocks):
            hidden = block(hidden, scale=0.5 + index)[0]
            if index == 0 and self.between is not None:
                hidden = self.between(hidden)
        return self.head(hidden)


@pytest.mark.parametrize("between", [False, True])
def test_layers_outside_the_blocks_and_the_fallback(between, monkeypatch):
    model = _Stack(between).eval()
    batches = [torch.randn(4, 5, 32, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]
    blockwise, staged, calls = _both_drivers(model, batches, _Block, monkeypatch)
    if not between:  # block 0: capture + 2 stages + feeding block 1; the last block feeds the head
        assert [calls[id(block)] for block in blockwise.blocks] == [4 * 3, 3 * 3, 3 * 3]
    _assert_same_codes(blockwise, staged)


def test_find_blocks_takes_the_list_holding_the_most_targets():
    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(4))  # 4 targets a block

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Experts() for _ in range(2))  # 8 targets a block
            self.plain = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))  # Linears, not blocks

    model = Model()
    found = find_blocks(model, _linears(model))
    assert found.name == "layers" and [len(members) for members in found.members] == [4, 4]
    assert find_blocks(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), {}) is None


def test_an_error_puts_every_layer_and_forward_back():
    model = _Stack().eval()
    batches = [torch.randn(2, 32, generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    before = copy.deepcopy(model.state_dict())

    def failing(name, module, hessian):
        if name == "blocks.1.second":
            raise RuntimeError("stop here")
        return _quantize_layer(name, module, hessian)

    with pytest.raises(RuntimeError, match="stop here"):
        blockwise_gptq(model, _linears(model), batches, call_without_cache, failing)
    assert set(_linears(model)) == set(_linears(_Stack()))
    assert all("forward" not in vars(block) for block in model.blocks)
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())
