"""quantize_(model, <format>, roles=["weight"], method="gptq", calibration_data=...): the format recipe's GPTQ.

On a tiny random Llama: GPTQ's model is closer to the float model than plain rounding's (MX, affine int3,
e4m3), its layers are the ordinary simulated QuantLinear of the format whose stored weight the format gives
back unchanged, method="round" is today's result bit for bit, the recipe round-trips, and bad options are
refused with one line naming the field.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError
from lowbit.flows import FormatRecipe, make_recipe, recipe_from_dict
from lowbit.nn.modules import QuantLinear

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama():
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _tokens(seed, rows=4, length=32):
    # a skewed token distribution, so that the layer inputs are correlated the way text makes them
    probabilities = torch.linspace(1.0, 0.01, 128) ** 3
    return torch.multinomial(probabilities, rows * length, replacement=True,
                             generator=torch.Generator().manual_seed(seed)).reshape(rows, length)  # fmt: skip


@pytest.fixture(scope="module")
def data():
    return [_tokens(1), _tokens(2)], _tokens(3)


def _logit_error(model, reference, tokens):
    with torch.no_grad():
        return float((model(tokens).logits - reference(tokens).logits).square().mean())


CASES = {
    "mxfp4_e2m1": ("mxfp4_e2m1", {}),
    "affine int3 g64": ("affine", {"params": {"bits": 3, "block_size": [1, 64]}}),
    "e4m3": ("e4m3", {}),
}


@pytest.mark.parametrize("label", list(CASES))
def test_gptq_is_closer_to_the_float_model_than_rounding(llama, data, label):
    batches, held_out = data
    name, options = CASES[label]
    rounded = lowbit.quantize_(copy.deepcopy(llama), name, roles=["weight"], **options)
    model, info = lowbit.quantize_model(copy.deepcopy(llama), name, roles=["weight"], method="gptq",
                                        calibration_data=batches, **options)  # fmt: skip
    assert len(info["gptq"]["layers"]) == 15 and info["counts"] == {"linear": 15}  # 14 projections + lm_head
    assert _logit_error(model, llama, held_out) < 0.9 * _logit_error(rounded, llama, held_out)


def test_layers_are_plain_quantlinear_whose_weight_the_format_gives_back(llama, data):
    model, info = lowbit.quantize_model(copy.deepcopy(llama), "mxfp4_e2m1", roles=["weight"], method="gptq",
                                        calibration_data=data[0], act_order=True)  # fmt: skip
    layers = [module for module in model.modules() if isinstance(module, QuantLinear)]
    assert len(layers) == 15 and all(type(layer) is QuantLinear for layer in layers)
    assert info["gptq"]["moved"] == 0
    for layer in layers:
        assert layer.formats.data_in is None and layer.formats.weight.format_name == "mxfp4_e2m1"
        assert torch.equal(layer.formats.weight.quantize(layer.weight.detach()), layer.weight.detach())
    assert lowbit.flows.describe(model)["model.layers.0.mlp.down_proj"] == "simulated weight=mxfp4_e2m1()"


def test_round_is_todays_result_bit_for_bit(llama, data):
    plain = lowbit.quantize_(copy.deepcopy(llama), "mxint8")
    explicit = lowbit.quantize_(copy.deepcopy(llama), "mxint8", method="round")
    for (name, left), right in zip(plain.state_dict().items(), explicit.state_dict().values()):
        assert torch.equal(left, right), name
    assert torch.equal(plain(data[1]).logits, explicit(data[1]).logits)


def test_every_role_and_convolutions_keep_the_format(data):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    batches = [torch.randn(16, 4, 8, generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    _, info = lowbit.quantize_model(model, "mxint8", method="gptq", calibration_data=batches)
    assert info["gptq"]["layers"] == ["2", "4"] and info["counts"] == {"conv1d": 1, "linear": 2}
    assert model[2].formats.data_in is not None and model[0].formats.weight is not None


def test_recipe_round_trips_without_its_batches():
    recipe = make_recipe("mxfp4_e2m1", roles=["weight"], method="gptq", calibration_data=[torch.zeros(1, 4)],
                         act_order=True, static_groups=True, damping=0.01, block_size=64)  # fmt: skip
    data = recipe.to_dict()
    assert "calibration_data" not in data
    assert data["method"] == "gptq" and data["act_order"] and data["static_groups"] and data["block_size"] == 64
    again = recipe_from_dict({**data, "method": "round"})
    assert isinstance(again, FormatRecipe) and again.damping == 0.01


@pytest.mark.parametrize("options, field", [
    ({"method": "gptq"}, "calibration_data"),
    ({"method": "gptq", "calibration_data": [1], "roles": ["data_in"]}, "roles"),
    ({"method": "gtpq"}, "method"),
    ({"damping": 0}, "damping"),
    ({"block_size": 0}, "block_size"),
    ({"act_order": "yes"}, "act_order"),
    ({"static_groups": 1}, "static_groups"),
])  # fmt: skip
def test_bad_options_are_refused_naming_the_field(options, field):
    with pytest.raises(ConfigError, match=field):
        make_recipe("mxfp4_e2m1", **options)


def test_a_format_gptq_cannot_round_is_refused_before_any_work(llama, data):
    model = copy.deepcopy(llama)
    with pytest.raises(ConfigError, match="nvfp4"):
        lowbit.quantize_(model, "nvfp4", roles=["weight"], method="gptq", calibration_data=data[0])
    assert not any(isinstance(module, QuantLinear) for module in model.modules())
