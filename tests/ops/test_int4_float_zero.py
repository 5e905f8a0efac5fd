"""int4_weight_only(zero_point_domain="float"): a float offset per group (q * scale + minimum), every path
against the reference, save / load, GGUF's Q4_1 read back by the gguf package bit for bit, clear refusals."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError, FormatError
from lowbit.native import build
from lowbit.ops import Int4WeightOnlyLinear


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32))


@pytest.mark.parametrize("scale_dtype", ["bf16", "f16", "f32"])
def test_values_and_a_lower_error_than_the_integer_domain(scale_dtype):
    model = _model()
    floats = lowbit.quantize_(copy.deepcopy(model), "int4_weight_only", zero_point_domain="float", search=False,
                              scale_dtype=scale_dtype)  # fmt: skip
    ints = lowbit.quantize_(copy.deepcopy(model), "int4_weight_only", search=False, scale_dtype=scale_dtype)
    module = floats[0]
    assert isinstance(module, Int4WeightOnlyLinear) and module.float_zero and not hasattr(module, "weight_zero_point")
    codes = module.codes().reshape(64, 4, 32).float()
    expected = codes * module.weight_scale.float().unsqueeze(-1) + module.weight_min.float().unsqueeze(-1)
    assert torch.equal(module.dequantized_weight(), expected.reshape(64, 128))
    weight = model[0].weight.detach()
    error = {name: float((quantized[0].dequantized_weight() - weight).square().sum())
             for name, quantized in (("float", floats), ("int", ints))}  # fmt: skip
    assert error["float"] < error["int"], error
    searched = lowbit.quantize_(copy.deepcopy(model), "int4_weight_only", zero_point_domain="float",
                                scale_dtype=scale_dtype)  # fmt: skip
    assert float((searched[0].dequantized_weight() - weight).square().sum()) <= error["float"]


@pytest.mark.parametrize("rows", [1, 3, 9, 40])
def test_paths_agree_with_the_reference(rows):
    module = lowbit.quantize_(_model(), "int4_weight_only", zero_point_domain="float", group_size=32)[0]
    assert not module.packed_fits() and module.signed_codes() is None
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
    reference = nn.functional.linear(x, module.dequantized_weight(), module.bias)
    for path in ("reference", "dequantize"):
        module.path = path
        assert torch.equal(module(x), reference), path
    if build.ensure() is not None:  # the native int4_min kind: every weight exactly, sums in their own order
        rebuilt = module.native_weight_rows(0, module.out_features)
        assert torch.equal(rebuilt.view(torch.int32), module.dequantized_weight().view(torch.int32))
        module.path = "native"
        torch.testing.assert_close(module(x), reference, rtol=1e-5, atol=1e-5)


def test_save_and_load_round_trip(tmp_path):
    quantized = lowbit.quantize_(_model(), "int4_weight_only", zero_point_domain="float", group_size=32)
    lowbit.save(quantized, tmp_path / "m.lowbit")
    loaded = lowbit.load(tmp_path / "m.lowbit", model=_model(seed=5))
    x = torch.randn(3, 128)
    assert loaded[0].float_zero and torch.equal(loaded(x), quantized(x))


def test_gguf_writes_group_32_float16_as_q4_1_and_other_exports_refuse(tmp_path):
    gguf = pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    from gguf.quants import dequantize

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model = lowbit.quantize_(transformers.LlamaForCausalLM(config).eval(), "int4_weight_only", group_size=32,
                             scale_dtype="f16", zero_point_domain="float", skip=["lm_head"])  # fmt: skip
    written = lowbit.export_gguf(model, tmp_path / "f.gguf")
    assert written["blk.0.ffn_down.weight"] == "Q4_1"
    tensor = next(t for t in gguf.GGUFReader(str(tmp_path / "f.gguf")).tensors if t.name == "blk.0.ffn_down.weight")
    values = dequantize(tensor.data, tensor.tensor_type).reshape(64, 128)
    expected = model.model.layers[0].mlp.down_proj.dequantized_weight().numpy()
    assert np.array_equal(values.view(np.uint32), expected.view(np.uint32))
    with pytest.raises(FormatError, match="float zero point"):
        lowbit.export_compressed_tensors(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_recipe_refusals():
    for options in ({"method": "awq"}, {"symmetric": True}, {"zero_point_domain": "fp"}):
        with pytest.raises(ConfigError, match="zero_point_domain|symmetric"):
            lowbit.quantize_(_model(), "int4_weight_only", **{"zero_point_domain": "float", **options})


def test_onnx_export_refuses_float_zero_points_in_one_error(tmp_path):
    pytest.importorskip("onnxscript")
    model = lowbit.quantize_(_model(), "int4_weight_only", zero_point_domain="float", group_size=32)
    with pytest.raises(lowbit.LowbitError, match="float zero point"):
        lowbit.export_onnx(model, (torch.randn(2, 128),), tmp_path / "model.onnx")


@torch.no_grad()
def test_gptq_in_the_float_domain_lowers_the_output_error():
    model = _model(3)
    generator = torch.Generator().manual_seed(3)
    mixing = torch.randn(8, 128, generator=generator)
    batches = [torch.randn(64, 8, generator=generator) @ mixing + 0.2 * torch.randn(64, 128, generator=generator)
               for _ in range(4)]  # fmt: skip
    held_out = torch.randn(256, 8, generator=generator) @ mixing + 0.2 * torch.randn(256, 128, generator=generator)
    reference = model(held_out)
    errors = {}
    for method in ("round", "gptq"):
        options = {"calibration_data": batches} if method == "gptq" else {}
        quantized = lowbit.quantize_(copy.deepcopy(model), "int4_weight_only", zero_point_domain="float",
                                     method=method, **options)  # fmt: skip
        layer = quantized[0]
        assert layer.float_zero and layer.weight_min.dtype == torch.bfloat16
        codes = layer.codes().reshape(64, 4, 32).float()
        rebuilt = codes * layer.weight_scale.float().unsqueeze(-1) + layer.weight_min.float().unsqueeze(-1)
        assert torch.equal(layer.dequantized_weight(), rebuilt.reshape(64, 128))
        errors[method] = float((quantized(held_out) - reference).norm() / reference.norm())
    assert errors["gptq"] < 0.7 * errors["round"], errors
