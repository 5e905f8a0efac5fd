"""The kv_cache recipe on tiny random Hugging Face decoders (no download): keys / values (and queries /
attention probabilities) quantized in prefill and generation, decode steps equal to full forwards, the codes
cache and its bytes, the float model left alone, errors."""

from __future__ import annotations

import copy

import pytest
import torch

import lowbit
from lowbit.errors import ConfigError

transformers = pytest.importorskip("transformers")

# float64 models: a generation step and a full forward differ by ~1e-16 before quantization, far from any
# rounding tie, so the quantized results must agree to that level too.
TOLERANCE = 1e-12
INT8_F16 = {"bits": 8, "block_size": [-1], "symmetric": True, "scale_dtype": "f16"}


def _llama_config(**changes):
    options = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, max_position_embeddings=64)  # fmt: skip
    return transformers.LlamaConfig(**{**options, **changes})


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny GEMMs on two threads of a shared machine wait on each other (30 ms a Linear); one thread: 1-3 ms."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def float_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(_llama_config()).eval().double()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(1))


def _quantized(model, **options):
    copied = copy.deepcopy(model)
    _, info = lowbit.quantize_model(copied, "kv_cache", **options)
    return copied, info


def _step_logits(model, tokens, prefill, cache=None):
    """Logits of the prefill and then of one generation step per remaining token, with the cache."""
    with torch.no_grad():
        out = model(tokens[:, :prefill], cache=cache, use_cache=True)
        logits, cache = [out.logits], out.cache
        for index in range(prefill, tokens.shape[1]):
            out = model(tokens[:, index : index + 1], cache=cache, use_cache=True)
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


def _full_logits(model, tokens):
    with torch.no_grad():
        return model(tokens, use_cache=False).logits


CASES = {
    "e4m3": {"format": "e4m3"},
    "int8 per token": {"format": "affine", "params": {"bits": 8, "block_size": [-1]}},
    "int4 groups of 16": {"format": "affine", "params": {"bits": 4, "block_size": [16]}},
    "every role e4m3": {"format": "e4m3", "roles": ["query", "key", "value", "probabilities"]},
}
# scales shared across tokens: a forward's keys of every token shape every token's result
ACROSS_TOKENS = {
    "int4 per tensor": {"format": "affine", "params": {"bits": 4}},
    "int4 keys per channel": {"format": "affine", "params": {"bits": 4, "block_size": [-1]}, "key_per_channel": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_generation_steps_equal_full_forward(float_llama, tokens, case):
    """Formats that quantize each token on its own: prefill and every generation step give the logits of one
    full forward over all the tokens."""
    model, _ = _quantized(float_llama, **CASES[case])
    full = _full_logits(model, tokens)
    assert (full - _full_logits(float_llama, tokens)).abs().max() > 1e-4  # the quantization does something
    torch.testing.assert_close(_step_logits(model, tokens, prefill=6), full, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", list(ACROSS_TOKENS))
def test_scales_across_tokens_cover_every_key_a_step_sees(tokens, case):
    """Per tensor / per channel: a step re-quantizes all of its layer's keys and values, so in a one-layer model
    (whose cached keys do not depend on later tokens) each step equals a full forward over the tokens so far."""
    torch.manual_seed(0)
    float_model = transformers.LlamaForCausalLM(_llama_config(num_hidden_layers=1)).eval().double()
    model, _ = _quantized(float_model, **ACROSS_TOKENS[case])
    assert (_full_logits(model, tokens) - _full_logits(float_model, tokens)).abs().max() > 1e-4
    stepped = _step_logits(model, tokens, prefill=6)
    for index in range(5, tokens.shape[1]):
        last = _full_logits(model, tokens[:, : index + 1])[:, -1]
        torch.testing.assert_close(stepped[:, index], last, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("params", [INT8_F16, {"bits": 4, "block_size": [16]}, None])
def test_codes_cache_steps_equal_full_forward_and_hold_codes(float_llama, tokens, params):
    fmt = "e4m3" if params is None else "affine"
    model, _ = _quantized(float_llama, format=fmt, params=params or {})
    cache = lowbit.flows.quantized_cache(model)
    stepped = _step_logits(model, tokens, prefill=6, cache=cache)
    torch.testing.assert_close(stepped, _full_logits(model, tokens), atol=TOLERANCE, rtol=0)
    layer = cache.layers[0]
    assert len(layer.key_chunks) == 1 and layer.key_chunks[0].codes.dtype in (torch.int8, torch.uint8)  # joined
    assert layer.key_chunks[0].shape == (2, 2, tokens.shape[1], 64)
    memory = cache.memory()
    batch, kv_heads, head_dim, layers = 2, 2, 64, 2
    elements = 2 * layers * batch * kv_heads * tokens.shape[1] * head_dim  # keys and values
    assert memory["float32_bytes"] == 4 * elements and memory["tokens"] == tokens.shape[1]
    if params is None:  # e4m3: one byte per element, no scale
        held = packed = head_dim
    elif params["bits"] == 8:  # int8 codes and one f16 scale per token
        held = packed = head_dim + 2
    else:  # 4-bit codes (a byte each held, two per byte packed), one f32 scale and one int8 zero point per 16
        held, packed = head_dim + (head_dim // 16) * 5, head_dim // 2 + (head_dim // 16) * 5
    assert (memory["bytes"], memory["packed_bytes"]) == (elements // head_dim * held, elements // head_dim * packed)
    if params is INT8_F16:
        assert memory["ratio"] <= 0.26


def test_greedy_generate_with_codes_cache_matches_float_cache(float_llama, tokens):
    model, _ = _quantized(float_llama, format="affine", params={"bits": 4, "block_size": [-1]})
    options = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(tokens[:, :4]))
    with torch.no_grad():
        with_codes = model.generate(tokens[:, :4], cache=lowbit.flows.quantized_cache(model), **options)
        with_floats = model.generate(tokens[:, :4], **options)
    assert with_codes.shape == (2, 10)
    assert torch.equal(with_codes, with_floats)


def test_the_float_model_and_models_sharing_its_config_stay_float(float_llama, tokens):
    before = _full_logits(float_llama, tokens)
    sibling = transformers.LlamaForCausalLM(float_llama.config).eval().double()  # the same config object
    sibling.load_state_dict(float_llama.state_dict())
    model, _ = _quantized(float_llama, format="affine", params={"bits": 4, "block_size": [-1]})
    assert not torch.equal(_full_logits(model, tokens), before)
    assert torch.equal(_full_logits(float_llama, tokens), before)
    assert torch.equal(_full_logits(sibling, tokens), before)
    assert float_llama.config._attn_implementation == "sdpa" and sibling.config._attn_implementation == "sdpa"
    for module in (*float_llama.modules(), *sibling.modules()):
        assert not hasattr(module, "attention_quantizer")
    assert lowbit.flows.describe(float_llama) == {}


def test_info_and_describe_name_every_layer(float_llama):
    model, info = _quantized(float_llama, format="e4m3", roles=["key", "value", "probabilities"])
    names = [f"model.layers.{i}.self_attn" for i in range(2)]
    assert list(info["quantized"]) == names and info["counts"] == {"attention": 2}
    assert info["quantized"][names[0]] == "LlamaAttention: key=e4m3(), value=e4m3(), probabilities=e4m3()"
    assert info["attention"][names[1]] == "lowbit eager (probabilities quantized)"
    assert set(lowbit.flows.describe(model)) == {f"{name}.attention_quantizer" for name in names}
    skipped, info = _quantized(float_llama, format="e4m3", skip=[r"model\.layers\.0\.self_attn"])
    assert list(info["quantized"]) == names[1:]
    copied = copy.deepcopy(model)  # a copy of a quantized model is quantized, on its own config
    assert copied.model.layers[1].self_attn.config._config is copied.config
    assert lowbit.flows.describe(copied) == lowbit.flows.describe(model)


def test_every_role_matches_a_hand_written_attention(float_llama, tokens):
    """Layer 0 with queries, keys, values and probabilities in e4m3 against its arithmetic written out here."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model, _ = _quantized(float_llama, format="e4m3", roles=["query", "key", "value", "probabilities"])
    attention = model.model.layers[0].self_attn
    hidden = torch.randn(2, 7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(7)[None].expand(2, 7)
    cos, sin = model.model.rotary_emb(hidden, positions)
    with torch.no_grad():
        got, probabilities = attention(hidden, position_embeddings=(cos, sin), attention_mask=None)
        split = lambda x: x.view(2, 7, -1, 64).transpose(1, 2)  # noqa: E731
        q, k = apply_rotary_pos_emb(split(attention.q_proj(hidden)), split(attention.k_proj(hidden)), cos, sin)
        q, k, v = (lowbit.quantize(t, "e4m3") for t in (q, k, split(attention.v_proj(hidden))))
        k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))  # 4 heads share 2 kv heads
        scores = (q @ k.transpose(2, 3)) * 64**-0.5
        scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
        expected_probabilities = lowbit.quantize(scores.softmax(-1), "e4m3")
        expected = attention.o_proj((expected_probabilities @ v).transpose(1, 2).reshape(2, 7, -1))
    torch.testing.assert_close(probabilities, expected_probabilities, atol=1e-15, rtol=0)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


def test_eager_implementation_and_switching_after_quantization(float_llama, tokens):
    model, _ = _quantized(float_llama, format="affine", params={"bits": 4, "block_size": [-1]})
    with_sdpa = _full_logits(model, tokens)
    model.set_attn_implementation("eager")
    assert model.model.layers[0].self_attn.config._attn_implementation == "lowbit_quantized"
    with_eager = _full_logits(model, tokens)  # Llama's eager softmax runs in float32: ~1e-8 from sdpa's float64
    torch.testing.assert_close(with_eager, with_sdpa, atol=1e-6, rtol=0)
    torch.testing.assert_close(_step_logits(model, tokens, 5), with_eager, atol=1e-6, rtol=0)


def test_qwen2_takes_the_same_hook(tokens):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)  # fmt: skip
    float_model = transformers.Qwen2ForCausalLM(config).eval().double()
    model, info = _quantized(float_model, format="affine", params={"bits": 4, "block_size": [16]})
    assert info["counts"] == {"attention": 2}
    full = _full_logits(model, tokens)
    assert not torch.allclose(full, _full_logits(float_model, tokens))
    torch.testing.assert_close(_step_logits(model, tokens, 6, lowbit.flows.quantized_cache(model)), full,
                               atol=TOLERANCE, rtol=0)  # fmt: skip


def test_gemma3_sliding_window_layers_take_the_same_hook(tokens):
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                           max_position_embeddings=64, sliding_window=4,
                                           layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    float_model = transformers.Gemma3ForCausalLM(config).eval().double()
    model, info = _quantized(float_model, format="affine", params={"bits": 4, "block_size": [-1]})
    assert list(info["quantized"].values())[0].startswith("Gemma3Attention: key=affine(bits=4")
    full = _full_logits(model, tokens)
    assert not torch.allclose(full, _full_logits(float_model, tokens))
    torch.testing.assert_close(_step_logits(model, tokens, 6), full, atol=TOLERANCE, rtol=0)
    with pytest.raises(ConfigError, match="sliding-window layer"):
        lowbit.flows.quantized_cache(model)


def test_a_quantized_attention_model_is_not_saved_half(float_llama, tmp_path):
    model, _ = _quantized(float_llama, format="e4m3")
    with pytest.raises(lowbit.LowbitError, match="AttentionQuantizer"):
        lowbit.save(model, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_recipe_round_trips_through_its_table():
    recipe = lowbit.flows.make_recipe("kv_cache", format="affine", params={"bits": 4}, roles=["key"])
    table = recipe.to_dict()
    assert table == {"recipe": "kv_cache", "skip": [], "format": "affine", "params": {"bits": 4}, "roles": ["key"],
                     "key_per_channel": False}  # fmt: skip
    assert lowbit.flows.recipe_from_dict(table) == recipe


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"format": "affine", "params": {"bits": 99}}, "bits"),
        ({"format": "affinee"}, "affinee"),
        ({}, "format=None"),
        ({"format": "e4m3", "params": [8]}, "params"),
        ({"format": "e4m3", "roles": ["keys"]}, "roles='keys'"),
        ({"format": "e4m3", "roles": "key"}, "roles"),
        ({"format": "e4m3", "key_per_channel": "yes"}, "key_per_channel"),
        ({"format": "e4m3", "granularity": "token"}, "granularity"),
    ],
)
def test_bad_options_name_the_key(float_llama, options, named):
    with pytest.raises(ConfigError, match=named):
        lowbit.quantize_(copy.deepcopy(float_llama), "kv_cache", **options)


def test_models_and_formats_the_recipe_or_the_codes_cache_cannot_take(float_llama):
    with pytest.raises(ConfigError, match="no Hugging Face attention layer"):
        lowbit.quantize_(torch.nn.Sequential(torch.nn.Linear(4, 4)), "kv_cache", format="e4m3")
    with pytest.raises(ConfigError, match="no attention layer is quantized"):
        lowbit.flows.quantized_cache(float_llama)
    per_tensor, _ = _quantized(float_llama, format="affine", params={"bits": 8})
    with pytest.raises(ConfigError, match="shares scales across tokens"):
        lowbit.flows.quantized_cache(per_tensor)
    per_channel, _ = _quantized(float_llama, format="e4m3", key_per_channel=True)
    with pytest.raises(ConfigError, match="per channel"):
        lowbit.flows.quantized_cache(per_channel)
