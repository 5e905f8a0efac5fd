"""Per-channel scales folded between producers and Linears (lowbit.flows.smoothing): the groups found in a tiny
random Llama (grouped-query attention) and a BERT encoder, the float function unchanged after folding any
positive scale (float32 and float64), and what cannot be folded skipped with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lowbit.flows.smoothing import fold_scale, smoothing_groups

transformers = pytest.importorskip("transformers")


def tiny_llama(dtype=torch.float32):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128)  # fmt: skip
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                     vocab_size=100)  # fmt: skip
    return transformers.BertModel(config).eval()


def _fold_random(model: nn.Module, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for group in smoothing_groups(model)[0]:
        fold_scale(group, torch.rand(group.channels, generator=generator, dtype=torch.float64) * 20 + 0.05)


def test_llama_groups():
    groups, skipped = smoothing_groups(tiny_llama())
    layer = "model.layers.0"
    found = {group.producer: (sorted(group.consumers), group.repeat) for group in groups}
    assert len(found) == 9 and not skipped
    assert found["model.norm"] == (["lm_head"], 1)  # the final norm feeds the (untied) head
    assert found[f"{layer}.input_layernorm"][0] == [f"{layer}.self_attn.{p}_proj" for p in "kqv"]
    assert found[f"{layer}.self_attn.v_proj"] == ([f"{layer}.self_attn.o_proj"], 2)  # 4 heads read 2 kv heads
    assert found[f"{layer}.post_attention_layernorm"][0] == [f"{layer}.mlp.gate_proj", f"{layer}.mlp.up_proj"]
    assert found[f"{layer}.mlp.up_proj"][0] == [f"{layer}.mlp.down_proj"]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_llama_fold_keeps_the_function(dtype, tolerance):
    model = tiny_llama(dtype)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        weight = model.model.layers[0].mlp.down_proj.weight.clone()
        _fold_random(model)
        after = model(ids).logits
    assert not torch.equal(weight, model.model.layers[0].mlp.down_proj.weight)  # the weights did change
    assert float((after - before).norm() / before.norm()) < tolerance


def test_bert_value_group_only_and_reasons():
    model = tiny_bert()
    groups, skipped = smoothing_groups(model)
    assert [group.producer for group in groups] == [f"encoder.layer.{i}.attention.self.value" for i in range(2)]
    assert "post-norm" in skipped["encoder.layer.0.attention.self.query/key/value"]
    assert "GELU" in skipped["encoder.layer.1.output.dense"]
    ids = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).last_hidden_state
        _fold_random(model)
        after = model(ids).last_hidden_state
    assert float((after - before).norm() / before.norm()) < 1e-5


class _OnePlusNorm(nn.Module):
    """A Gemma-style RMSNorm (output * (1 + weight)): its channels do not scale with its weight."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)


def test_unfoldable_norm_and_tied_weight_are_skipped():
    model = tiny_llama()
    model.model.layers[0].input_layernorm = _OnePlusNorm(64)
    model.model.layers[1].mlp.gate_proj.weight = model.model.layers[0].mlp.gate_proj.weight  # tied
    groups, skipped = smoothing_groups(model)
    producers = {group.producer for group in groups}
    assert "does not scale" in skipped["model.layers.0.input_layernorm"]
    assert "shared" in skipped["model.layers.1.post_attention_layernorm"]
    assert "model.layers.0.input_layernorm" not in producers and len(producers) == 6  # both gate_proj groups


def test_fold_refuses_non_positive_scales():
    group = smoothing_groups(tiny_llama())[0][0]
    with pytest.raises(ValueError, match="positive"):
        fold_scale(group, torch.zeros(group.channels))
    with pytest.raises(ValueError, match="positive"):
        fold_scale(group, torch.ones(group.channels + 1))


def test_tied_head_folded_only_when_untied():
    model = tiny_llama()
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's
    assert "shared" in smoothing_groups(model)[1]["model.norm"]
    groups = {group.producer: group for group in smoothing_groups(model, untie={"lm_head"})[0]}
    embedding = model.model.embed_tokens.weight.detach().clone()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        fold_scale(groups["model.norm"], torch.rand(64, dtype=torch.float64) * 20 + 0.05)
        after = model(ids).logits
    assert torch.equal(model.model.embed_tokens.weight, embedding)  # the head got its own copy
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert float((after - before).norm() / before.norm()) < 1e-5
