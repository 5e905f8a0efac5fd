"""quantize_model: which modules each recipe swaps, and real outputs against the fake-quant path."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lowbit
from lowbit import ConfigError
from lowbit.graph import MaseGraph
from lowbit.graph.module_swap import quantize_module_transform_pass
from lowbit.nn import QuantLinear
from lowbit.ops import Int4WeightOnlyLinear, Int8DynamicLinear, Int8WeightOnlyLinear, W8A8StaticLinear
from lowbit.ptq import calibrate, quantize_static, quantize_weight_only

INT8_TOKEN = {"name": "affine", "data_in_bits": 8, "data_in_block_size": [1, -1], "data_in_symmetric": True,
              "weight_bits": 8, "weight_symmetric": True, "weight_axis": 0}  # fmt: skip


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)).eval()


def _data(rows: int = 64) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _classes(model: nn.Module) -> list[str]:
    return [type(module).__name__ for module in model if not isinstance(module, nn.ReLU)]


@torch.no_grad()
def test_int8_dynamic_matches_the_fake_quant_path():
    float_model, x = _mlp(), _data()
    fake, _ = quantize_module_transform_pass(copy.deepcopy(float_model), {"by": "type", "linear": {"config": INT8_TOKEN}})
    real, info = lowbit.quantize_model(copy.deepcopy(float_model), "int8_dynamic")
    assert _classes(real) == ["Int8DynamicLinear"] * 3 and info["counts"] == {"Int8DynamicLinear": 3}
    # same grids; the fake path rounds its scales to 16 significant bits, so a few codes differ by one step:
    # the two differ by far less than either differs from float
    assert _relative(real(x), fake(x)) < 0.3 * _relative(fake(x), float_model(x))
    assert _relative(real(x), float_model(x)) < 0.02


@torch.no_grad()
def test_pass_args_recipe_converts_convertible_layers_and_keeps_the_rest():
    float_model, x = _mlp(), _data()
    fixed = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 6}
    args = {"by": "name", "0": {"config": INT8_TOKEN}, "2": {"config": fixed},
            "4": {"config": {"name": "affine", "data_in_name": "NA", "weight_bits": 4, "weight_block_size": [1, 32]}}}
    fake, _ = quantize_module_transform_pass(copy.deepcopy(float_model), copy.deepcopy(args))
    real, info = lowbit.quantize_model(copy.deepcopy(float_model), args)
    assert _classes(real) == ["Int8DynamicLinear", "QuantLinear", "Int4WeightOnlyLinear"]
    assert "integer" in info["kept"]["2"]
    assert _relative(real(x), fake(x)) < 0.3 * _relative(fake(x), float_model(x))
    hidden = real[:4](x)
    assert torch.equal(real[4](hidden), fake[4](hidden))  # same int4 weight values, same float matmul


@torch.no_grad()
def test_weight_only_recipes_match_fake_quant_weights():
    float_model, x = _mlp(), _data()
    real8, _ = lowbit.quantize_model(copy.deepcopy(float_model), "int8_weight_only")
    fake8, _ = quantize_weight_only(copy.deepcopy(float_model), bits=8)
    assert _classes(real8) == ["Int8WeightOnlyLinear"] * 3
    assert _relative(real8(x), fake8(x)) < 1e-3
    real4, _ = lowbit.quantize_model(copy.deepcopy(float_model), "int4_weight_only", group_size=32, search=False, skip=["4"])
    assert _classes(real4) == ["Int4WeightOnlyLinear", "Int4WeightOnlyLinear", "Linear"]
    assert _relative(real4(x), float_model(x)) < 0.1


@torch.no_grad()
def test_w8a8_static_matches_quantize_static():
    float_model, x = _mlp(), _data()
    batches = [_data(32) for _ in range(4)]
    state = calibrate(float_model, batches, ops=("linear",))
    real, _ = lowbit.quantize_model(copy.deepcopy(float_model), "w8a8_static", calibration=state)
    fake, _ = quantize_static(copy.deepcopy(float_model), state)
    assert _classes(real) == ["W8A8StaticLinear"] * 3
    assert _relative(real(x), fake(x)) < 5e-3
    from_data, _ = lowbit.quantize_model(copy.deepcopy(float_model), "w8a8_static", calibration_data=batches)
    assert torch.equal(from_data(x), real(x))


@torch.no_grad()
def test_int4_calibration_data_and_qgraph():
    float_model, x = _mlp(), _data()
    real, _ = lowbit.quantize_model(copy.deepcopy(float_model), "int4_weight_only", calibration_data=[_data(16)])
    assert isinstance(real[0], Int4WeightOnlyLinear)
    graph = MaseGraph(copy.deepcopy(float_model))
    graph, info = lowbit.quantize_model(graph, {"by": "type", "linear": {"config": INT8_TOKEN}})
    assert info["counts"] == {"Int8DynamicLinear": 3}
    assert _relative(graph.model(x), real(x)) < 0.1


@pytest.mark.parametrize("recipe, options, message", [
    ("int9", {}, "unknown recipe"),
    ("int8_dynamic", {"group_size": 32}, "unknown option"),
    ("w8a8_static", {}, "calibration"),
    ("int4_weight_only", {"group_size": 48}, "divisible"),
    ("int8_dynamic", {"skip": [".*"]}, "no nn.Linear"),
    ("int8_dynamic", {"skip": ["("]}, "regex"),
])  # fmt: skip
def test_bad_recipes_raise_config_error(recipe, options, message):
    with pytest.raises(ConfigError, match=message):
        lowbit.quantize_model(_mlp(), recipe, **options)


@pytest.mark.slow
@torch.no_grad()
def test_minilm_int8_dynamic_keeps_sentence_embeddings():
    minilm = pytest.importorskip("lowbit.models.minilm")
    pytest.importorskip("transformers")
    from lowbit.models.sentences import SENTENCES

    tokenizer, model = minilm.load_minilm()
    reference = minilm.embed(model, tokenizer, list(SENTENCES))
    model, info = lowbit.quantize_model(model, "int8_dynamic")
    assert info["counts"] == {"Int8DynamicLinear": 37}  # 36 encoder Linear layers and the pooler
    cosine = (minilm.embed(model, tokenizer, list(SENTENCES)) * reference).sum(-1)
    assert cosine.mean() >= 0.995 and cosine.min() >= 0.99
    assert all(isinstance(m, (Int8DynamicLinear, nn.Module)) for m in model.modules())
    assert not any(type(m) is nn.Linear or isinstance(m, (QuantLinear, Int8WeightOnlyLinear, W8A8StaticLinear)) for m in model.modules())
