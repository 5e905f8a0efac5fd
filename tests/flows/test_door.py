"""lowbit.quantize_: one door, one mechanism (recipes and pass_args give bit-identical models), typed recipes,
format names, Hugging Face batches, dtype / device moves after quantizing, save / load of every kind."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError
from lowbit.flows import FormatRecipe, Int4WeightOnly, Int8Dynamic, make_recipe, recipe_from_dict
from lowbit.nn.modules import QuantLinear


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32), nn.GELU(), nn.Linear(32, 16))


def _inputs(rows: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed))


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value for name, value in model.state_dict().items()}


PASS_ARGS = {
    "int8_dynamic": {"name": "affine", "data_in_bits": 8, "data_in_block_size": [1, -1], "data_in_symmetric": True,
                     "weight_bits": 8, "weight_symmetric": True, "weight_axis": 0},
    "int8_weight_only": {"name": "affine", "data_in_name": "NA", "weight_bits": 8, "weight_symmetric": True,
                         "weight_axis": 0},
    "int4_weight_only": {"name": "affine", "data_in_name": "NA", "weight_bits": 4, "weight_signed": False,
                         "weight_block_size": [1, 32], "weight_scale_dtype": "bf16"},
}  # fmt: skip
RECIPE_OPTIONS = {"int8_dynamic": {}, "int8_weight_only": {}, "int4_weight_only": {"search": False}}


@pytest.mark.parametrize("recipe", sorted(PASS_ARGS))
def test_recipe_and_pass_args_give_bit_identical_models(recipe):
    by_recipe = lowbit.quantize_(_model(), recipe, **RECIPE_OPTIONS[recipe])
    by_pass_args, info = lowbit.quantize_model(_model(), {"by": "type", "linear": {"config": PASS_ARGS[recipe]}})
    assert not info["kept"], info["kept"]
    assert [type(m) for m in by_recipe.modules()] == [type(m) for m in by_pass_args.modules()]
    left, right = _buffers(by_recipe), _buffers(by_pass_args)
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype and torch.equal(left[name], right[name]), name
    x = _inputs()
    assert torch.equal(by_recipe(x), by_pass_args(x))


@pytest.mark.parametrize("recipe", ["int8_weight_only", "int4_weight_only"])
def test_real_weights_are_the_simulated_weights_codes(recipe):
    """One rounding rule: the real module's dequantized weight equals the simulated weight bit for bit."""
    simulated, _ = lowbit.quantize_model(_model(), {"by": "type", "linear": {"config": PASS_ARGS[recipe]}}, real=False)
    simulated_weight = simulated[0].formats.weight(simulated[0].weight.detach())
    real = lowbit.quantize_(_model(), recipe, **RECIPE_OPTIONS[recipe])
    assert torch.equal(real[0].dequantized_weight(), simulated_weight)


def test_quantize_returns_the_same_model_changed_in_place():
    model = _model()
    assert lowbit.quantize_(model, "int8_dynamic") is model
    assert type(model[0]).__name__ == "Int8DynamicLinear"
    assert lowbit.flows.describe(model) == {name: "real Int8DynamicLinear" for name in ("0", "2", "4")}


def test_a_format_name_quantizes_every_role_of_every_linear():
    model = _model()
    reference = copy.deepcopy(model)
    lowbit.quantize_(model, "mxfp4_e2m1", skip=["4"])
    assert isinstance(model[0], QuantLinear) and isinstance(model[2], QuantLinear)
    assert type(model[4]) is nn.Linear
    x = _inputs()
    spec = lowbit.get_format("mxfp4_e2m1")()
    layer = reference[0]
    expected = nn.functional.linear(spec(x), spec(layer.weight), spec(layer.bias))
    assert torch.equal(model[0](x), expected)


def test_typed_recipes_round_trip_through_plain_dicts():
    for recipe in (Int8Dynamic(act_bits=7), Int4WeightOnly(group_size=64, search=False, skip=("head",)),
                   FormatRecipe(format="affine", params={"bits": 4, "axis": 0}, roles=("weight",))):  # fmt: skip
        data = recipe.to_dict()
        assert recipe_from_dict(data) == recipe
        assert "calibration_data" not in data


@pytest.mark.parametrize(("config", "options", "message"), [
    ("int8_dynamik", {}, "did you mean 'int8_dynamic'"),
    ("int8_dynamic", {"act_bit": 7}, "unknown option"),
    ("int8_dynamic", {"act_bits": 6}, "act_bits=6"),
    ("int4_weight_only", {"method": "gptq"}, "needs calibration_data"),
    ("int4_weight_only", {"group_size": 3}, "group_size=3"),
    (42, {}, "config must be"),
])  # fmt: skip
def test_bad_recipes_are_config_errors(config, options, message):
    with pytest.raises(ConfigError, match=message):
        make_recipe(config, **options)


def test_huggingface_batch_encoding_calibrates_static_and_gptq():
    transformers = pytest.importorskip("transformers")

    class Keyworded(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _model()

        def forward(self, input_values, attention_mask=None):
            return self.inner(input_values)

    batches = [transformers.BatchEncoding({"input_values": _inputs(8, seed), "attention_mask": torch.ones(8)})
               for seed in range(3)]  # fmt: skip
    static = lowbit.quantize_(Keyworded(), "w8a8_static", calibration_data=batches)
    assert type(static.inner[0]).__name__ == "W8A8StaticLinear"
    gptq = lowbit.quantize_(Keyworded(), "int4_weight_only", method="gptq", calibration_data=batches)
    assert type(gptq.inner[0]).__name__ == "Int4WeightOnlyLinear"
    state = lowbit.ptq.calibrate(Keyworded(), batches)
    assert set(state.ranges) == {"inner.0", "inner.2", "inner.4"}


@pytest.mark.parametrize("recipe", ["int8_weight_only", "int4_weight_only", "int8_dynamic", "mxfp4_e2m1"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_moves_after_quantizing(recipe, dtype):
    model = lowbit.quantize_(_model(), recipe)
    float_out = model(_inputs())
    model.to(dtype)
    out = model(_inputs().to(dtype))
    assert out.dtype == dtype
    assert torch.allclose(out.float(), float_out, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("config", ["int8_dynamic", "int4_weight_only", "mxfp4_e2m1", "block_minifloat",
                                    {"by": "type", "linear": {"config": {"name": "ternary", "data_in_name": "NA",
                                                                         "weight_scaling_factor": True}}}])  # fmt: skip
def test_every_kind_of_quantized_model_round_trips_through_save_and_load(tmp_path, config):
    real = config in ("int8_dynamic", "int4_weight_only")
    model = lowbit.quantize_(_model(), config, **({"skip": ["4"]} if real else {}))
    if real:  # a mixture: real layers and one simulated layer
        lowbit.quantize_(model, "e4m3", skip=["0", "2"])
        assert isinstance(model[4], QuantLinear)
    path = tmp_path / "model.lowbit"
    lowbit.save(model, path)
    loaded = lowbit.load(path, model=_model(seed=5))  # other float weights: everything comes from the file
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
    for a, b in zip(model.modules(), loaded.modules()):
        if isinstance(a, QuantLinear):
            assert a.formats == b.formats
    x = _inputs()
    assert torch.equal(loaded(x), model(x))


def test_save_refuses_what_it_cannot_record(tmp_path):
    from lowbit.export import SerializationError
    from lowbit.nn.lutnet import LUTNetLinear

    model = nn.Sequential(LUTNetLinear.from_binary_linear(nn.Linear(8, 4), k=2))
    with pytest.raises(SerializationError, match="no record"):
        lowbit.save(model, tmp_path / "m.lowbit")
    assert not (tmp_path / "m.lowbit").exists()
