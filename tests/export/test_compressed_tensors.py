"""export_compressed_tensors checked by compressed-tensors' own config parser and decompressors: every
quantized layer's weight comes back bit for bit; refusals name the layer; the folder appears whole."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import FormatError

compressed_tensors = pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

COMPRESSORS = {"pack-quantized": PackedQuantizationCompressor, "int-quantized": IntQuantizationCompressor}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 16))


def _decompressed(folder, name: str) -> torch.Tensor:
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    parsed = QuantizationConfig.model_validate(config)
    state = load_file(folder / "model.safetensors")
    for group in parsed.config_groups.values():
        if any(target == "re:^" + name.replace(".", r"\.") + "$" for target in group.targets):
            local = {key[len(name) + 1:]: value for key, value in state.items() if key.startswith(f"{name}.")}
            return COMPRESSORS[group.format].decompress(local, group)["weight"]
    raise AssertionError(f"{name} is in no config group")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.float32 and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("scale_dtype", ["bf16", "f16"])
def test_int4_group_weights_decompress_bit_for_bit(tmp_path, scale_dtype):
    model = lowbit.quantize_(_model(), "int4_weight_only", group_size=32, scale_dtype=scale_dtype, skip=["4"])
    config = lowbit.export_compressed_tensors(model, tmp_path / "ckpt")
    assert config["format"] == "pack-quantized" and config["ignore"] == ["4"]
    for name in ("0", "2"):
        assert _same_bits(_decompressed(tmp_path / "ckpt", name), model.get_submodule(name).dequantized_weight())
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert torch.equal(state["4.weight"], model[4].weight) and torch.equal(state["0.bias"], model[0].bias)


def test_w8a8_dynamic_weights_decompress_bit_for_bit(tmp_path):
    model = lowbit.quantize_(_model(), "int8_dynamic")
    config = lowbit.export_compressed_tensors(model, tmp_path / "ckpt")
    group = next(iter(config["config_groups"].values()))
    assert config["format"] == "int-quantized"
    assert group["input_activations"] == {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                          "dynamic": True}  # fmt: skip
    for name in ("0", "2", "4"):
        module = model.get_submodule(name)
        expected = module.weight_codes.float() * module.weight_scale.reshape(-1, 1)
        assert _same_bits(_decompressed(tmp_path / "ckpt", name), expected)


def test_mixed_checkpoint_lists_both_groups(tmp_path):
    model = lowbit.quantize_(_model(), "int4_weight_only", group_size=32, skip=["4"])
    lowbit.quantize_(model, "int8_dynamic", skip=["0", "2"])
    config = lowbit.export_compressed_tensors(model, tmp_path / "ckpt")
    assert config["format"] == "mixed-precision"
    assert sorted(group["format"] for group in config["config_groups"].values()) == ["int-quantized", "pack-quantized"]
    assert _same_bits(_decompressed(tmp_path / "ckpt", "4"), model[4].weight_codes.float() * model[4].weight_scale.reshape(-1, 1))


def test_unheld_layers_are_refused_and_nothing_is_written(tmp_path):
    model = lowbit.quantize_(_model(), "gguf_q4_0", skip=["4"])
    with pytest.raises(FormatError, match=r"layer '0' \(GGMLLinear\).*int4_weight_only"):
        lowbit.export_compressed_tensors(model, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []
    with pytest.raises(FormatError, match="no quantized layer"):
        lowbit.export_compressed_tensors(_model(), tmp_path / "ckpt")


@pytest.mark.parametrize("tied", [False, True])
def test_symmetric_int4_is_written_symmetric_and_transformers_loads_it(tmp_path, tied):
    """int4_weight_only(symmetric=True): no zero point tensor, symmetric scheme; compressed-tensors' decompressor
    gives the weights bit for bit and transformers' loader reads the folder (it cannot read asymmetric zero
    points, which compressed-tensors packs: vllm-project/llm-compressor#1618). A quantized lm_head of a tied
    model is written untied (its float embedding stays)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=tied)  # fmt: skip
    model = lowbit.quantize_(transformers.LlamaForCausalLM(config).eval(), "int4_weight_only", symmetric=True,
                             group_size=32, skip=[] if tied else ["lm_head"])  # fmt: skip
    quantization = lowbit.export_compressed_tensors(model, tmp_path / "ckpt")
    group = next(iter(quantization["config_groups"].values()))
    assert group["weights"]["symmetric"] is True and group["format"] == "pack-quantized"
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert not any(key.endswith("weight_zero_point") for key in state)
    name = "model.layers.0.mlp.down_proj"
    assert _same_bits(_decompressed(tmp_path / "ckpt", name), model.get_submodule(name).dequantized_weight())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
