"""GGMLLinear and the gguf_* recipes (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K): ggml's block bytes exactly, every path
against the reference, the pass_args spelling, save / load, clear refusals."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError, FormatError
from lowbit.ops import GGMLLinear
from lowbit.ops.ggml import fields_from_block_bytes, from_block_bytes, ggml_block_bytes

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's Python side) is not installed")
from gguf.quants import dequantize, quantize  # noqa: E402

TYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
         "q5_0": gguf.GGMLQuantizationType.Q5_0, "q8_0": gguf.GGMLQuantizationType.Q8_0}  # fmt: skip
K_TYPES = {"q4_k": gguf.GGMLQuantizationType.Q4_K, "q6_k": gguf.GGMLQuantizationType.Q6_K}


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32))


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_recipe_holds_ggml_block_bytes(ggml_type):
    model = _model()
    quantized = lowbit.quantize_(copy.deepcopy(model), f"gguf_{ggml_type}")
    for index in (0, 2):
        module = quantized[index]
        assert isinstance(module, GGMLLinear) and module.ggml_type == ggml_type
        weight = model[index].weight.detach().numpy()
        blocks = quantize(weight, TYPES[ggml_type])
        assert np.array_equal(ggml_block_bytes(module), blocks)
        expected = dequantize(blocks, TYPES[ggml_type])
        assert np.array_equal(module.dequantize_weight().numpy().view(np.uint32), expected.view(np.uint32))
        assert torch.equal(module.bias, model[index].bias.detach())
        back = from_block_bytes(ggml_type, blocks, weight.shape, model[index].bias)
        assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), module.state_dict().values()))


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_paths_agree_with_the_reference(ggml_type):
    module = GGMLLinear.from_float(_model()[0], ggml_type)
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    reference = nn.functional.linear(x, module.dequantize_weight(), module.bias)
    for path in ("reference", "dequantize"):
        module.path = path
        assert torch.equal(module(x), reference), path
    module.path = "auto"  # the native Q4_0 kernel (once built; never waited for here) sums in its own order
    torch.testing.assert_close(module(x), reference, rtol=1e-5, atol=1e-5)
    assert module(x.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("ggml_type", list(TYPES))
def test_pass_args_and_format_recipe_build_the_same_module(ggml_type):
    from lowbit.flows.real import linear_from_formats, recipe_formats
    from lowbit.flows import make_recipe

    model = _model()
    by_recipe = lowbit.quantize_(copy.deepcopy(model), f"gguf_{ggml_type}")
    formats = recipe_formats(make_recipe(f"gguf_{ggml_type}"))
    by_formats = linear_from_formats(model[0], formats)
    assert all(torch.equal(a, b) for a, b in zip(by_recipe[0].state_dict().values(), by_formats.state_dict().values()))
    simulated = lowbit.quantize(model[0].weight.detach(), f"gguf_{ggml_type}")
    assert torch.equal(simulated, by_recipe[0].dequantize_weight())


def test_storage_is_a_fraction_of_float32():
    module = GGMLLinear.from_float(nn.Linear(256, 64, bias=False), "q4_1")
    assert module.weight_bytes() / (256 * 64 * 4) == pytest.approx(0.625 / 4)


def test_refusals():
    model = nn.Sequential(nn.Linear(40, 8))
    with pytest.raises(ConfigError, match=r"in_features=40 is not a multiple of 32.*skip"):
        lowbit.quantize_(model, "gguf_q4_0")
    with pytest.raises(ConfigError, match="ggml_type"):
        GGMLLinear(64, 8, ggml_type="q5_1")
    with pytest.raises(FormatError, match="NaN or inf"):
        GGMLLinear.from_float(nn.Linear(32, 2).requires_grad_(False).apply(lambda m: m.weight.fill_(float("nan"))))
    with pytest.raises(FormatError, match="bytes"):
        fields_from_block_bytes("q4_0", np.zeros(17, dtype=np.uint8), (1, 32))
    with pytest.raises(FormatError, match="block of 256"):
        GGMLLinear(288, 8, ggml_type="q4_k")


def test_onnx_export_refuses_ggml_codes_with_one_clear_error(tmp_path):
    pytest.importorskip("onnxscript")
    model = torch.nn.Sequential(torch.nn.Linear(64, 16))
    lowbit.quantize_(model, "gguf_q4_0")
    with pytest.raises(lowbit.LowbitError, match="layer '0': a GGMLLinear holds llama.cpp's block codes"):
        lowbit.export_onnx(model, (torch.randn(2, 64),), tmp_path / "model.onnx")  # was a TypeError traceback


def _k_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 96), nn.ReLU(), nn.Linear(96, 8))


@pytest.mark.parametrize("ggml_type", list(K_TYPES))
def test_k_quant_recipe_holds_what_gguf_reads_and_falls_back_as_llama_cpp(ggml_type):
    model = _k_model()
    quantized, info = lowbit.quantize_model(copy.deepcopy(model), f"gguf_{ggml_type}")
    for index in (0, 2):
        module = quantized[index]
        assert isinstance(module, GGMLLinear) and module.ggml_type == ggml_type
        data = ggml_block_bytes(module)
        expected = dequantize(data, K_TYPES[ggml_type])
        assert np.array_equal(module.dequantize_weight().numpy().view(np.uint32), expected.view(np.uint32))
        simulated = lowbit.quantize(model[index].weight.detach(), f"gguf_{ggml_type}")
        assert torch.equal(simulated, module.dequantize_weight())
        back = from_block_bytes(ggml_type, data, tuple(model[index].weight.shape), model[index].bias)
        assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), module.state_dict().values()))
    fallback = {"q4_k": "q5_0", "q6_k": "q8_0"}[ggml_type]  # 96 inputs: not whole super-blocks of 256
    assert quantized[4].ggml_type == fallback and info["gguf_fallback"] == {"4": fallback}


@pytest.mark.parametrize("ggml_type", ["q5_0", *K_TYPES])
@pytest.mark.parametrize("rows", [1, 3, 9, 40])
def test_new_types_paths_agree_with_the_reference(ggml_type, rows):
    module = GGMLLinear.from_float(_k_model()[0], ggml_type)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    reference = nn.functional.linear(x, module.dequantize_weight(), module.bias)
    for path in ("reference", "dequantize"):
        module.path = path
        assert torch.equal(module(x), reference), path
    module.path = "auto"
    torch.testing.assert_close(module(x), reference, rtol=1e-5, atol=1e-5)
    rebuilt = module.native_weight_rows(0, module.out_features)
    if rebuilt is not None:  # the native library is built: every weight exactly the format's value
        assert torch.equal(rebuilt.view(torch.int32), module.dequantize_weight().view(torch.int32))


@pytest.mark.parametrize("ggml_type", [*TYPES, *K_TYPES])
def test_save_load_and_bytes(tmp_path, ggml_type):
    quantized = lowbit.quantize_(_k_model(), f"gguf_{ggml_type}")
    lowbit.save(quantized, tmp_path / "m.lowbit")
    loaded = lowbit.load(tmp_path / "m.lowbit", model=_k_model(seed=5))
    x = torch.randn(3, 512)
    assert isinstance(loaded[0], GGMLLinear) and torch.equal(loaded(x), quantized(x))
    per_weight = {"q4_0": 0.5 + 2 / 32, "q4_1": 0.5 + 4 / 32, "q5_0": 1 + 2 / 32, "q8_0": 1 + 2 / 32,
                  "q4_k": 0.5 + 4 / 256 + 2 / 32, "q6_k": 1 + 2 / 256 + 1 / 16}[ggml_type]  # fmt: skip
    assert quantized[0].weight_bytes() - 256 * 4 == pytest.approx(512 * 256 * per_weight)
