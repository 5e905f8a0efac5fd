"""The ``rotate`` recipe on tiny random decoders built from configs: the float function is kept (float64 to
1e-10 with the norms computed in float64, float32 to 1e-4 relative), tied embeddings untied and staying untied,
greedy generation unchanged, any recipe can follow, options validated, other models refused."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

import lowbit  # noqa: E402
from lowbit.errors import ConfigError  # noqa: E402
from lowbit.flows import Rotate, recipe_from_dict  # noqa: E402
from lowbit.flows.rotation import HadamardGatedMLP  # noqa: E402

VOCAB = 128


def _widen(model: torch.nn.Module) -> torch.nn.Module:
    """Weights wide enough to matter, norm gains away from one (so folding them is tested)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.2)
            elif "norm" in name:
                parameter.uniform_(0.5, 1.5)
            else:  # biases
                parameter.normal_(0, 0.1)
    return model.eval()


def tiny(kind: str = "llama", tied: bool = True, hidden: int = 48, heads: int = 4, dtype=torch.float32):
    options = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=64,
                   tie_word_embeddings=tied)  # fmt: skip
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**options, attention_bias=not tied))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**options))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**options, head_dim=hidden // heads))
    return _widen(model.to(dtype))


@pytest.fixture
def float64_norms(monkeypatch):
    """transformers' RMSNorms compute in float32 whatever the input dtype: compute them in the input's dtype,
    so a float64 model checks the rotation's algebra, not float32 rounding."""

    def forward(self, hidden):
        return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    for norm in (modeling_llama.LlamaRMSNorm, modeling_qwen2.Qwen2RMSNorm, modeling_qwen3.Qwen3RMSNorm):
        monkeypatch.setattr(norm, "forward", forward)


def ids(batch=2, length=16, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


OPTIONS = [{}, {"online_down": True}, {"random_signs": False}, {"rotate_heads": False}, {"seed": 7},
           {"online_rotate": True}]  # fmt: skip


CASES = [("llama", True, options) for options in OPTIONS] + [
    (kind, tied, options) for kind, tied in [("llama", False), ("qwen2", False), ("qwen3", True)]
    for options in ({}, {"online_down": True})]  # fmt: skip


@pytest.mark.parametrize("kind,tied,options", CASES, ids=lambda case: str(case))
def test_float64_function_kept(float64_norms, kind, tied, options):
    model = tiny(kind, tied, dtype=torch.float64)
    reference = model(ids()).logits
    rotated, info = lowbit.quantize_model(copy.deepcopy(model), "rotate", **options)
    assert relative(rotated(ids()).logits, reference) < 1e-10
    assert info["untied"] is tied and info["hadamard_factors"] == [12, 4]
    assert info["online_down"] is bool(options.get("online_down") or options.get("online_rotate"))
    assert all(float(layer.input_layernorm.weight.detach().min()) == 1.0 for layer in rotated.model.layers)


def test_float32_function_kept_and_weights_rotated():
    model = tiny()
    rotated = lowbit.quantize_(copy.deepcopy(model), "rotate", online_down=True)
    assert relative(rotated(ids()).logits, model(ids()).logits) < 1e-4
    before, after = model.model.layers[0].self_attn.q_proj.weight, rotated.model.layers[0].self_attn.q_proj.weight
    assert not torch.allclose(before, after)


def test_tied_embeddings_untied_and_stay_untied(caplog):
    model = tiny(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with caplog.at_level("INFO", logger="lowbit"):
        _, info = lowbit.quantize_model(model, "rotate")
    assert info["untied"] and "untied" in caplog.text
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert model.config.tie_word_embeddings is False
    lm_head = model.lm_head.weight.detach().clone()
    model.tie_weights()  # transformers must not tie them back
    assert torch.equal(model.lm_head.weight, lm_head)


def test_generation_unchanged(float64_norms):
    model = tiny(dtype=torch.float64)
    prompt = ids(batch=1, length=6)
    expected = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    rotated = lowbit.quantize_(copy.deepcopy(model), "rotate", online_down=True)
    assert torch.equal(rotated.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0), expected)


FOLLOWERS = [("mxfp4_e2m1", {"roles": ["data_in", "weight"]}), ("int8_dynamic", {}),
             ("int4_weight_only", {"group_size": 16})]


@pytest.mark.parametrize("recipe,options", FOLLOWERS)
def test_any_recipe_follows(recipe, options):
    model = lowbit.quantize_(tiny(), "rotate", online_down=True)
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    assert "model.layers.0.mlp.down_proj" in names and isinstance(model.model.layers[0].mlp, HadamardGatedMLP)
    lowbit.quantize_(model, recipe, **options)
    described = lowbit.flows.describe(model)
    assert set(described) == set(names)
    assert torch.isfinite(model(ids()).logits).all()


def test_rotation_helps_mxfp4_on_outliers():
    """Outlier channels in the residual stream and in the norms' gains (as trained LLMs have): MXFP4 on every
    Linear's inputs and weights hurts much less after the rotation."""
    model = tiny(tied=False, hidden=64)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 3] *= 40.0
        for layer in model.model.layers:
            layer.input_layernorm.weight[3], layer.post_attention_layernorm.weight[5] = 20.0, 20.0
    tokens = ids(4, 32)
    reference = model(tokens).logits
    errors = {}
    for rotate in (False, True):
        candidate = copy.deepcopy(model)
        if rotate:
            lowbit.quantize_(candidate, "rotate", online_down=True)
        lowbit.quantize_(candidate, "mxfp4_e2m1", roles=["data_in", "weight"])
        with torch.no_grad():
            errors[rotate] = float((candidate(tokens).logits - reference).pow(2).mean())
    assert errors[True] < 0.5 * errors[False]  # measured 0.36


@pytest.mark.parametrize("options,match", [
    ({"online_down": "yes"}, "rotate: online_down='yes' must be true or false"),
    ({"random_signs": 1}, "rotate: random_signs=1 must be true or false"),
    ({"seed": -1}, "rotate: seed=-1 must be a non-negative int"),
    ({"online_rotate": "on"}, "rotate: online_rotate='on' must be true or false"),
    ({"skip": ["lm_head"]}, "rotate: skip=.*not supported"),
    ({"online": True}, "unknown option"),
])  # fmt: skip
def test_bad_options(options, match):
    with pytest.raises(ConfigError, match=match):
        lowbit.quantize_(tiny(), "rotate", **options)


def test_recipe_round_trips():
    recipe = Rotate(online_down=True, seed=3)
    assert recipe_from_dict(recipe.to_dict()) == recipe
    assert recipe.to_dict()["recipe"] == "rotate"


def test_refuses_other_models_and_sizes():
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=1,
                                                          num_attention_heads=4, intermediate_size=96))  # fmt: skip
    with pytest.raises(ConfigError, match="model type 'bert'.*not supported.*post-LayerNorm"):
        lowbit.quantize_(bert, "rotate")
    with pytest.raises(ConfigError, match="LlamaModel has no lm_head"):
        lowbit.quantize_(tiny().model, "rotate")
    quantized = lowbit.quantize_(tiny(), "int8_dynamic")
    with pytest.raises(ConfigError, match="already quantized.*apply rotate first"):
        lowbit.quantize_(quantized, "rotate")
    with pytest.raises(ConfigError, match=r"rotate \(hidden_size 36\)|rotate \(head_dim 6;"):
        lowbit.quantize_(tiny(hidden=48, heads=8), "rotate")  # head_dim 6: no Hadamard matrix
    model = tiny(hidden=48, heads=8, dtype=torch.float64)
    _, info = lowbit.quantize_model(model, "rotate", rotate_heads=False)
    assert info["head_dim"] == 6 and not info["rotate_heads"]
    odd = tiny(hidden=40, heads=4)  # 40 = 20 x 2 works, head_dim 10 does not
    with pytest.raises(ConfigError, match=r"head_dim 10; rotate_heads=False skips it\): no Hadamard matrix of size 10"):
        lowbit.quantize_(odd, "rotate")


def test_the_report_header_names_the_rotation():
    from lowbit.report import quantization_report_analysis_pass

    original = tiny()
    model = lowbit.quantize_(copy.deepcopy(original), "rotate", online_down=True)
    assert model.config.lowbit_rotation["hidden_size"] == 48 and model.config.lowbit_rotation["online_down"]
    model.config.to_json_string()  # the record is plain JSON, saved with the config
    lowbit.quantize_(model, "int8_weight_only", skip=["lm_head"])
    report = quantization_report_analysis_pass(model, {"float_model": original, "inputs": [ids()], "histogram_layers": 0,
                                                       "latency_runs": 1})[1]["report"]  # fmt: skip
    assert report["header"]["rotation"].startswith("Hadamard 48 (")
    assert "online before down_proj" in report["header"]["rotation"]
