"""Every recipe on a causal LM: a tiny random LlamaForCausalLM (tied embeddings, grouped-query attention) built
from a LlamaConfig, nothing downloaded. Quantized models generate (greedy and sampled, with the key-value cache),
run under inference_mode and in bf16, save and load bit for bit, report, and export to ONNX."""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

import lowbit  # noqa: E402
from lowbit.models.causal_lm import generation_speed, perplexity  # noqa: E402

VOCAB, PROMPT = 96, 8


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      tie_word_embeddings=True)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # weights wide enough that the model's choices are not all ties
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.2)
    return model


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(1))


RECIPES = {  # label -> (recipe, options needing calibration batches)
    "int8_dynamic": ("int8_dynamic", False),
    "w8a8_static": ("w8a8_static", True),
    "int8_weight_only": ("int8_weight_only", False),
    "int4_weight_only": ("int4_weight_only", False),
    "int4_gptq": ("int4_weight_only", True),
    "mxint8": ("mxint8", False),
}


def quantized(llama, tokens, label, calibration_as=None):
    recipe, needs_data = RECIPES[label]
    windows = tokens[:128].reshape(4, 32)
    calibration_as = calibration_as or ("dict" if label == "int4_gptq" else "tensor")  # both forms in use
    batches = [windows[:2], windows[2:]] if calibration_as == "tensor" else [{"input_ids": windows[:2]},
                                                                              {"input_ids": windows[2:]}]  # fmt: skip
    options = {"calibration_data": batches} if needs_data else {}
    if label == "int4_gptq":
        options["method"] = "gptq"
    model, info = lowbit.quantize_model(copy.deepcopy(llama), recipe, **options)
    return model, info


@pytest.mark.parametrize("label", list(RECIPES))
def test_recipe_generates_and_round_trips(llama, tokens, label, tmp_path):
    model, info = quantized(llama, tokens, label)
    assert sum(info.get("counts", {}).values()) == 15 or info.get("counts") is None  # 14 projections + lm_head
    fp32_ppl, ppl = perplexity(llama, tokens, 32, 4), perplexity(model, tokens, 32, 4)
    assert math.isfinite(ppl) and abs(ppl / fp32_ppl - 1) < 0.05 and ppl != fp32_ppl
    prompt = tokens[None, :PROMPT]
    greedy = model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert greedy.shape == (1, PROMPT + 6) and torch.equal(greedy[:, :PROMPT], prompt)
    # the cache gives what a full forward over the same tokens gives: the last step's choice
    with torch.no_grad():
        full = model(greedy[:, :-1]).logits[0, -1].argmax()
    assert int(full) == int(greedy[0, -1])
    with torch.inference_mode():
        assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=False), greedy)
    torch.manual_seed(3)
    sampled = model.generate(prompt, max_new_tokens=6, do_sample=True, top_k=10)
    assert sampled.shape == (1, PROMPT + 6) and int(sampled.max()) < VOCAB
    half = copy.deepcopy(model).to(torch.bfloat16)
    with torch.inference_mode():
        half_out = half.generate(prompt, max_new_tokens=3, do_sample=False)
        assert half(prompt).logits.dtype == torch.bfloat16
    assert half_out.shape == (1, PROMPT + 3)
    lowbit.save(model, tmp_path / "saved")
    back = lowbit.load(tmp_path / "saved", model=copy.deepcopy(llama))
    with torch.no_grad():
        assert torch.equal(back(tokens[None, :32]).logits, model(tokens[None, :32]).logits)


def test_calibration_batches_as_dicts_match_tensors(llama, tokens):
    as_tensor, _ = quantized(llama, tokens, "w8a8_static", calibration_as="tensor")
    as_dict, _ = quantized(llama, tokens, "w8a8_static", calibration_as="dict")
    with torch.no_grad():
        assert torch.equal(as_tensor(tokens[None, :32]).logits, as_dict(tokens[None, :32]).logits)


def test_skip_keeps_the_tied_lm_head_float(llama, tokens):
    model, info = lowbit.quantize_model(copy.deepcopy(llama), "int8_weight_only", skip=["lm_head"])
    assert "lm_head" not in info["quantized"] and type(model.lm_head) is torch.nn.Linear
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied


def test_report_of_a_quantized_causal_lm(llama, tokens):
    from lowbit.report import quantization_report_analysis_pass

    model, _ = quantized(llama, tokens, "int8_dynamic")
    batches = [tokens[:64].reshape(2, 32)]
    _, info = quantization_report_analysis_pass(model, {"float_model": llama, "inputs": batches, "latency_runs": 0})
    layers = {layer["name"]: layer for layer in info["report"]["layers"]}
    assert "lm_head" in layers and "model.layers.0.self_attn.q_proj" in layers
    assert all(layer["sqnr_db"] > 20 for layer in layers.values())  # errors add up along the depth


def test_onnx_export_of_a_causal_lm_gives_its_logits(llama, tokens, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    model, _ = quantized(llama, tokens, "int8_weight_only")
    ids = tokens[None, :16]
    lowbit.export_onnx(model, (ids,), tmp_path / "m.onnx")
    options = onnxruntime.SessionOptions()
    # onnxruntime's optimizer would fuse DequantizeLinear -> MatMul on 3-D inputs into a matmul that quantizes
    # the activations too (an error of the quantization's size): the graph itself is read as written
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    with torch.no_grad():
        want = model(ids).logits
    assert got.shape == tuple(want.shape)
    assert float((torch.from_numpy(got) - want).abs().max()) < 1e-5 * float(want.abs().max())


def test_generation_speed_runs_the_cache(llama, tokens):
    speed = generation_speed(llama, tokens[None, :16], 3)
    assert speed.prefill_seconds > 0 and speed.decode_tokens_per_second > 0
