"""The ``kv_cache`` recipe: quantized keys, values (and queries / attention probabilities) in Hugging Face decoders.

Where it hooks (transformers 5.x). Every decoder attention class (LlamaAttention, Qwen2Attention,
Gemma3Attention, ...) projects q / k / v, applies the rotary embedding, hands k / v to ``cache.update`` (which
returns every key and value the layer has: the past ones and the new), then calls the function that
``ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)`` names with
``(module, query, key, value, attention_mask, **kwargs)``. That call is the one place where the keys after RoPE
and the values, past and present, prefill or generation step, cache or no cache, are all in hand as
[batch, kv_heads, kv_len, head_dim] tensors. So:

- lowbit registers one attention function under the name ``"lowbit_quantized"`` (transformers'
  ``AttentionInterface.register``: a new name, no existing function or class changes);
- each selected attention module gets an :class:`~lowbit.nn.attention.AttentionQuantizer` child and its own
  ``config`` view (:class:`AttentionConfigView`): every attribute reads through to the model's config except
  ``_attn_implementation``, which names ``"lowbit_quantized"``. The model's config object is not modified, so
  another model built from the same config, or the float model the user copied from, keeps float attention;
- the function quantizes the operands and calls the implementation the model's config names (``sdpa``,
  ``eager``: the model's own eager function, ...), read at every call, so ``set_attn_implementation`` still
  works. With ``probabilities`` in the roles it runs lowbit's eager arithmetic instead (a fused kernel never forms
  the probabilities), on the same masks.

Keys and values are quantized as a whole each call, so a generation step sees exactly what a full forward over
the same tokens sees (for any granularity, per tensor and per channel included), with Hugging Face's ordinary
float cache. :func:`quantized_cache` builds a cache that stores the codes instead (lowbit.flows.codes_cache).
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

import torch
from torch import nn

from lowbit._model import root_module, skip_patterns
from lowbit.errors import ConfigError
from lowbit.flows.recipes import KVCache, handles
from lowbit.formats import FormatSpec
from lowbit.graph.plan import Ready, apply
from lowbit.nn.attention import AttentionFormats, AttentionQuantizer, attention_with_probabilities

ATTENTION_NAME = "lowbit_quantized"


class AttentionConfigView:
    """An attention module's view of its model's config: every attribute is the config's own (read and
    written through), except ``_attn_implementation``, which is lowbit's quantized attention."""

    __slots__ = ("_config",)

    def __init__(self, config: Any) -> None:
        object.__setattr__(self, "_config", config)

    @property
    def _attn_implementation(self) -> str:
        return ATTENTION_NAME

    @property
    def inner_implementation(self) -> str | None:
        """The implementation the model's config names (what runs after the operands are quantized)."""
        return self._config._attn_implementation

    def __getattr__(self, name: str) -> Any:
        if name == "_config":  # during copying, before the slot is set
            raise AttributeError(name)
        return getattr(self._config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._config, name, value)

    def __deepcopy__(self, memo: dict) -> AttentionConfigView:
        import copy

        return AttentionConfigView(copy.deepcopy(self._config, memo))

    def __reduce__(self):
        return AttentionConfigView, (self._config,)

    def __repr__(self) -> str:
        return f"AttentionConfigView({ATTENTION_NAME} over {self.inner_implementation!r})"


@handles(KVCache)
def quantize_kv_cache(root: nn.Module, recipe: KVCache) -> dict[str, Any]:
    """Install the recipe's attention formats on every attention layer of ``root`` (in place); the info dict."""
    targets = attention_modules(root, recipe.skip)
    if not targets:
        raise ConfigError("kv_cache: the model has no Hugging Face attention layer to quantize (after skip): it needs "
                          "attention modules whose forward calls transformers' ALL_ATTENTION_FUNCTIONS")  # fmt: skip
    spec = recipe.spec()
    formats = AttentionFormats(**dict.fromkeys(recipe.roles, spec), key_per_channel=recipe.key_per_channel)
    _register()
    quantized, attention = {}, {}
    inners = {name: _config_of(module)._attn_implementation for name, module in targets.items()}
    for name, module in targets.items():
        _inner_function(module, inners[name])  # the implementation exists (ConfigError otherwise), before any change
    apply(root, {f"{name}.attention_quantizer": Ready(AttentionQuantizer(formats)) for name in targets})
    for name, module in targets.items():
        inner = inners[name]
        if not isinstance(module.config, AttentionConfigView):
            module.config = AttentionConfigView(module.config)
        quantized[name] = f"{type(module).__name__}: {formats.describe()}"
        attention[name] = "lowbit eager (probabilities quantized)" if formats.probabilities is not None else inner
    return {"recipe": recipe.name, "quantized": quantized, "attention": attention,
            "counts": {"attention": len(quantized)},
            "hook": f"transformers AttentionInterface {ATTENTION_NAME!r} on each layer's config view"}  # fmt: skip


def attention_modules(root: nn.Module, skip: Any = None) -> dict[str, nn.Module]:
    """name -> every attention module of ``root`` whose forward dispatches through transformers' attention
    interface (not matched by the ``skip`` regexes)."""
    patterns = skip_patterns(skip)
    found = {}
    for name, module in root.named_modules():
        if not name or any(pattern.fullmatch(name) for pattern in patterns):
            continue
        if _dispatches(type(module)) and hasattr(module, "config"):
            found[name] = module
    return found


@functools.lru_cache(maxsize=256)
def _dispatches(cls: type) -> bool:
    forward = getattr(cls, "forward", None)
    if forward is None or not cls.__module__.startswith("transformers."):
        return False
    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(inspect.unwrap(forward))
    except (OSError, TypeError):
        return False


def _config_of(module: nn.Module) -> Any:
    config = module.config
    return config._config if isinstance(config, AttentionConfigView) else config


def _register() -> None:
    from transformers import AttentionInterface

    if AttentionInterface._global_mapping.get(ATTENTION_NAME) is not quantized_attention:
        AttentionInterface.register(ATTENTION_NAME, quantized_attention)


def _inner_function(module: nn.Module, name: str | None):
    """The attention function ``name`` means for ``module``: its model's own eager function for "eager"."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if name in (None, "eager", ATTENTION_NAME):
        if eager is None:
            raise ConfigError(f"kv_cache: {type(module).__name__}'s module has no eager_attention_forward; load the "
                              "model with attn_implementation='sdpa'")  # fmt: skip
        return eager
    try:
        return ALL_ATTENTION_FUNCTIONS.get_interface(name, eager)
    except KeyError as error:
        raise ConfigError(f"kv_cache: attention implementation {name!r} is not registered in transformers") from error


def quantized_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """The attention function lowbit registers: the module's quantized roles, then the model's implementation."""
    quantizer = getattr(module, "attention_quantizer", None)
    inner = _inner_function(module, _config_of(module)._attn_implementation)
    if not isinstance(quantizer, AttentionQuantizer):
        return inner(module, query, key, value, attention_mask, **kwargs)
    query, key, value = quantizer.operands(query, key, value)
    probabilities = quantizer.formats.probabilities
    if probabilities is None:
        return inner(module, query, key, value, attention_mask, **kwargs)
    return attention_with_probabilities(module, query, key, value, attention_mask, probabilities, **kwargs)


def stores_per_token(spec: FormatSpec | None) -> bool:
    """Whether ``spec`` quantizes each token's head_dim vector on its own (so codes stored token by token give
    what quantizing the whole tensor gives): probed on tokens of very different magnitudes."""
    if spec is None:
        return True
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.tensor([1e-3, 1.0, 1e3, 10.0]).view(1, 1, 4, 1)
    probe = torch.randn(1, 2, 4, 64, generator=generator) * magnitudes  # [batch, heads, tokens, head_dim]
    whole = spec(probe)
    tokens = torch.cat([spec(probe[:, :, i : i + 1]) for i in range(probe.shape[2])], dim=-2)
    return torch.equal(whole, tokens)


def quantized_cache(model: Any):
    """A transformers Cache that stores the keys and values of every quantized attention layer as lowbit codes
    (``generate(..., cache=quantized_cache(model))``); ``.memory()`` reports its bytes. Needs formats
    that quantize each token on its own (element formats, or blocks along head_dim); ConfigError otherwise."""
    from lowbit.flows.codes_cache import QuantizedKVCache

    root = root_module(model, "quantized_cache")
    per_layer: dict[int, AttentionFormats] = {}
    for name, module in attention_modules(root).items():
        quantizer = getattr(module, "attention_quantizer", None)
        if isinstance(quantizer, AttentionQuantizer):
            _check_storable(name, module, quantizer.formats)
            per_layer[int(module.layer_idx)] = quantizer.formats
    if not per_layer:
        raise ConfigError("quantized_cache: no attention layer is quantized; run lowbit.quantize_(model, 'kv_cache', "
                          "format=...) first")  # fmt: skip
    text_config = root.config.get_text_config() if hasattr(root, "config") else None
    count = max(getattr(text_config, "num_hidden_layers", 0) or 0, max(per_layer) + 1)
    return QuantizedKVCache([per_layer.get(index) for index in range(count)])


def _check_storable(name: str, module: nn.Module, formats: AttentionFormats) -> None:
    if getattr(module, "sliding_window", None) or getattr(module, "is_sliding", False):
        raise ConfigError(f"quantized_cache: {name} is a sliding-window layer; the codes cache keeps full layers only")
    if formats.key_per_channel and formats.key is not None:
        raise ConfigError(f"quantized_cache: {name} quantizes keys per channel (across tokens): codes stored token "
                          "by token cannot reproduce it; use the float cache (simulated) or key_per_channel=False")  # fmt: skip
    for role in ("key", "value"):
        spec = getattr(formats, role)
        if not stores_per_token(spec):
            raise ConfigError(f"quantized_cache: the {role} format {spec.describe()} shares scales across tokens "
                              "(or rounds stochastically); give it block_size=[-1] (per token) or blocks along "
                              "head_dim")  # fmt: skip
