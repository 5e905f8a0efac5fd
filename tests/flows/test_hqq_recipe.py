"""``quantize_(model, "int4_weight_only", method="hqq")`` on a tiny random Llama built from a config: every
Linear becomes an Int4WeightOnlyLinear holding the HQQ parameters, the model runs and generates, saves and
loads bit for bit, its weights are no worse than min-max rounding's, and bad options are refused."""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

import lowbit  # noqa: E402
from lowbit.errors import ConfigError  # noqa: E402
from lowbit.models.causal_lm import perplexity  # noqa: E402
from lowbit.ops import Int4WeightOnlyLinear  # noqa: E402
from lowbit.pipeline.quantizing import check_quantize_model  # noqa: E402

VOCAB = 96


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=True)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.2)
    return model


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (256,), generator=torch.Generator().manual_seed(1))


def weight_error(model, float_model) -> float:
    floats = dict(float_model.named_modules())
    total = 0.0
    for name, module in model.named_modules():
        if isinstance(module, Int4WeightOnlyLinear):
            total += float((module.dequantized_weight() - floats[name].weight.detach()).square().sum())
    return total


def test_hqq_end_to_end_and_round_trip(llama, tokens, tmp_path):
    model, info = lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", group_size=32, method="hqq")
    assert info["counts"] == {"Int4WeightOnlyLinear": 15}  # 14 projections + lm_head
    plain, _ = lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", group_size=32, search=False)
    assert weight_error(model, llama) < 0.97 * weight_error(plain, llama)
    fp32_ppl, ppl = perplexity(llama, tokens, 32, 4), perplexity(model, tokens, 32, 4)
    assert math.isfinite(ppl) and abs(ppl / fp32_ppl - 1) < 0.05
    prompt = tokens[None, :8]
    assert model.generate(prompt, max_new_tokens=4, do_sample=False).shape == (1, 12)
    lowbit.save(model, tmp_path / "saved")
    back = lowbit.load(tmp_path / "saved", model=copy.deepcopy(llama))
    with torch.no_grad():
        assert torch.equal(back(tokens[None, :32]).logits, model(tokens[None, :32]).logits)


def test_hqq_is_deterministic_and_iterations_count(llama):
    first, _ = lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", group_size=64, method="hqq")
    second, _ = lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", group_size=64, method="hqq")
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    one, _ = lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", group_size=64, method="hqq",
                                   hqq_iterations=1)  # fmt: skip
    assert weight_error(first, llama) <= weight_error(one, llama)


def test_round_is_unchanged_by_the_new_option(llama):
    """method="round" (the default) ignores hqq_iterations and still builds the range-searched codes."""
    default, _ = lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", group_size=64)
    with_option, _ = lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", group_size=64, hqq_iterations=3)
    reference = Int4WeightOnlyLinear.from_float(llama.model.layers[0].mlp.down_proj, group_size=64)
    assert torch.equal(default.model.layers[0].mlp.down_proj.weight_codes, reference.weight_codes)
    for a, b in zip(default.state_dict().values(), with_option.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options, words", [
    ({"method": "hqqq"}, "method='hqqq'"),
    ({"method": "hqq", "hqq_iterations": 0}, "hqq_iterations=0"),
    ({"method": "hqq", "hqq_iterations": 2.5}, "hqq_iterations=2.5"),
    ({"method": "hqq", "calibration_data": [torch.zeros(1, 4, dtype=torch.long)]}, "data-free"),
])  # fmt: skip
def test_bad_options_are_refused(llama, options, words):
    with pytest.raises(ConfigError, match="int4_weight_only") as error:
        lowbit.quantize_model(copy.deepcopy(llama), "int4_weight_only", **options)
    assert words in str(error.value)


def test_toml_table_accepts_hqq():
    check_quantize_model({"recipe": "int4_weight_only", "method": "hqq", "group_size": 64, "hqq_iterations": 10})
    with pytest.raises(ConfigError, match="method"):
        check_quantize_model({"recipe": "int4_weight_only", "method": "hq"})
    with pytest.raises(ConfigError, match="data-free"):
        check_quantize_model({"recipe": "int4_weight_only", "method": "hqq", "num_batches": 4})
