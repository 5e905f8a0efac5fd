"""AWQ (``int4_weight_only`` with method="awq" / "awq+gptq"): on a tiny random Llama with activation outlier
channels the int4 model's logits come closer to the float model's than plain rounding's; the folded scales keep
the float function; info names each group's exponent; a missing calibration_data is refused."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import lowbit
from lowbit.errors import ConfigError

transformers = pytest.importorskip("transformers")

GROUP = 32


def outlier_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight[[3, 17, 40]] *= 10
    return model


def _batches(count=16, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (1, 64), generator=generator) for _ in range(count)]


def _error(model, reference, ids):
    with torch.no_grad():
        return float((model(ids).logits - reference).norm() / reference.norm())


@pytest.fixture(scope="module")
def setting():
    model = outlier_llama()
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = model(ids).logits
    return model, ids, reference


def _quantized(model, method, **options):
    data = {} if method == "round" else {"calibration_data": _batches()}
    return lowbit.quantize_model(copy.deepcopy(model), "int4_weight_only", group_size=GROUP, method=method,
                                 **data, **options)  # fmt: skip


def test_awq_no_worse_than_round(setting):
    model, ids, reference = setting
    plain = _quantized(model, "round", search=False)[0]
    awq, info = _quantized(model, "awq")
    assert len(info["awq"]) == 9 and all(0 <= entry["alpha"] < 1 for entry in info["awq"].values())
    assert all(entry["error_ratio"] <= 1 for entry in info["awq"].values())
    assert _error(awq, reference, ids) < _error(plain, reference, ids)
    scaled_only = _quantized(model, "awq", search=False)[0]
    assert _error(scaled_only, reference, ids) < _error(plain, reference, ids)


def test_awq_then_gptq(setting):
    model, ids, reference = setting
    plain = _quantized(model, "round", search=False)[0]
    both, info = _quantized(model, "awq+gptq")
    assert len(info["awq"]) == 9
    assert _error(both, reference, ids) < _error(plain, reference, ids)


def test_awq_scales_keep_the_float_function():
    from lowbit.flows.awq import awq_scale

    model = outlier_llama().double()
    ids = _batches(1, 5)[0]
    targets = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    with torch.no_grad():
        before = model(ids).logits
        info, power = awq_scale(model, targets, _batches(), GROUP, "f32")
        after = model(ids).logits
    assert any(entry["alpha"] > 0 for entry in info["awq"].values())
    assert float((after - before).norm() / before.norm()) < 1e-12
    assert set(power) == set(targets)


@pytest.mark.parametrize("method", ["awq", "awq+gptq"])
def test_awq_needs_calibration_data(method):
    with pytest.raises(ConfigError, match=re.escape(f"int4_weight_only: method='{method}' needs calibration_data=")):
        lowbit.flows.make_recipe("int4_weight_only", method=method)
