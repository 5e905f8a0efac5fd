"""Tiny random Llama decoders for the algorithm tests (AWQ, SmoothQuant): built from a config, no download."""

from __future__ import annotations

import torch


def outlier_llama(factor: float):
    """A 2-layer Llama (hidden 64, vocab 128) whose norms make activation channels 3, 17 and 40 ``factor``
    times larger, the outliers SmoothQuant and AWQ move into the weights."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight[[3, 17, 40]] *= factor
    return model


def token_batches(count: int, length: int, seed: int = 1) -> list[torch.Tensor]:
    """``count`` random [1, length] token batches of the tiny vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (1, length), generator=generator) for _ in range(count)]


def logits_error(model, reference: torch.Tensor, ids: torch.Tensor) -> float:
    """Relative norm of ``model``'s logits on ``ids`` against ``reference``."""
    with torch.no_grad():
        return float((model(ids).logits - reference).norm() / reference.norm())
