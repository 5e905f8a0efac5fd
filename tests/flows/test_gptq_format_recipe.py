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
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)  # fmt: skip
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
    with pytest.raises(ConfigError, match="nf4"):
        lowbit.quantize_(model, "nf4", roles=["weight"], method="gptq", calibration_data=data[0])
    assert not any(isinstance(module, QuantLinear) for module in model.modules())


def test_mase_gptq_table_gives_the_format_recipe_model(llama, data):
    """pass_args with MASE's "gptq" table: each Linear's own weight format GPTQ-rounded, with MASE's damping
    (0.01); its data-loading keys are accepted and listed as not read."""
    config = {"name": "mxfp4_e2m1", "data_in_name": "NA", "weight_block_size": 32, "bias_name": "NA"}
    table = {"model_name": "HuggingFaceTB/SmolLM2-135M", "dataset": "wikitext2", "nsamples": 8, "seqlen": 32,
             "format": "mxfp", "weight_config": {"weight_block_size": 32, "weight_exponent_width": 2,
                                                 "weight_frac_width": 1}, "quantile_search": True}  # fmt: skip
    by_mase, info = lowbit.quantize_model(copy.deepcopy(llama), {"by": "type", "linear": {"config": config},
                                                                 "gptq": table},
                                          real=False, calibration_data=data[0])  # fmt: skip
    by_recipe = lowbit.quantize_(copy.deepcopy(llama), "mxfp4_e2m1", roles=["weight"], method="gptq",
                                 calibration_data=data[0], damping=0.01)  # fmt: skip
    assert info["gptq"]["settings"] == {"damping": 0.01} and "quantile_search" in info["gptq"]["ignored"]
    assert len(info["gptq"]["layers"]) == 15
    for (name, left), right in zip(by_mase.state_dict().items(), by_recipe.state_dict().values()):
        assert torch.equal(left, right), name
    with pytest.raises(ConfigError, match="calibration_data"):
        lowbit.quantize_(copy.deepcopy(llama), {"by": "type", "linear": {"config": config}, "gptq": table})
    with pytest.raises(ConfigError, match="percdamp"):
        lowbit.quantize_(copy.deepcopy(llama), {"by": "type", "linear": {"config": config}, "gptq": {"percdam": 1}},
                         calibration_data=data[0])  # fmt: skip


def test_saved_gptq_model_loads_bit_for_bit(llama, data, tmp_path):
    model = lowbit.quantize_(copy.deepcopy(llama), "affine", params={"bits": 3, "block_size": [1, 64]},
                             roles=["weight"], method="gptq", calibration_data=data[0])  # fmt: skip
    lowbit.save(model, tmp_path / "model")
    loaded = lowbit.load(tmp_path / "model", model=copy.deepcopy(llama))
    assert torch.equal(loaded(data[1]).logits, model(data[1]).logits)


def test_toml_quantize_model_table_takes_the_gptq_options(llama):
    from lowbit.pipeline.quantizing import check_quantize_model, needs_data, rebuild_structure

    table = {"recipe": "mxfp4_e2m1", "method": "gptq", "damping": 0.01, "act_order": True, "static_groups": False,
             "block_size": 64, "num_batches": 4}  # fmt: skip
    check_quantize_model(table)
    assert needs_data(table) and not needs_data({"recipe": "mxfp4_e2m1"})
    with pytest.raises(ConfigError, match="static_groups"):
        check_quantize_model({**table, "static_groups": "yes"})
    rebuilt = rebuild_structure(copy.deepcopy(llama), table)  # a saved run's layers, rebuilt without data
    assert isinstance(rebuilt.model.layers[0].mlp.down_proj, QuantLinear)
