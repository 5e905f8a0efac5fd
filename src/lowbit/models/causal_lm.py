"""Causal language models: perplexity over non-overlapping windows, and the windows themselves.

:func:`perplexity` follows the GPTQ paper's protocol: the token stream is cut into windows of ``seqlen``
tokens from its start (all full windows, or the first ``windows``), each window is scored on its own (no
context carried over), and the result is exp of the mean next-token negative log-likelihood over every
predicted token (``seqlen - 1`` per window). It equals exp of the mean of the model's own
``model(input_ids=w, labels=w).loss`` over the windows, since every window predicts the same number of tokens.

Any module that maps ``input_ids`` [batch, seq] to logits [batch, seq, vocab] works: a Hugging Face causal LM
(its output's ``.logits``), or a plain module returning the logits tensor.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import torch
from torch import nn

from lowbit.errors import ConfigError, LowbitError


def token_windows(token_ids: torch.Tensor, seqlen: int = 512, windows: int | None = None) -> torch.Tensor:
    """[n, seqlen]: the non-overlapping windows of ``token_ids`` (1-D) from its start; ``n`` = every full
    window, or the first ``windows`` (ConfigError when there are fewer)."""
    _check_ids(token_ids)
    if isinstance(seqlen, bool) or not isinstance(seqlen, int) or seqlen < 2:
        raise ConfigError(f"seqlen={seqlen!r} must be an int >= 2 (a window predicts seqlen - 1 tokens)")
    available = token_ids.numel() // seqlen
    if windows is None:
        windows = available
    elif isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise ConfigError(f"windows={windows!r} must be a positive int or None (every full window)")
    if available < max(windows, 1):
        raise ConfigError(f"{token_ids.numel()} tokens hold {available} full window(s) of {seqlen}, "
                          f"{windows or 1} asked for; give more text, a smaller seqlen or fewer windows")  # fmt: skip
    return token_ids[: windows * seqlen].reshape(windows, seqlen)


def _check_ids(token_ids: Any) -> None:
    if not isinstance(token_ids, torch.Tensor) or token_ids.dim() != 1:
        shape = tuple(token_ids.shape) if isinstance(token_ids, torch.Tensor) else type(token_ids).__name__
        raise ConfigError(f"token_ids must be a 1-D tensor of token ids, got {shape}")
    if token_ids.dtype.is_floating_point or token_ids.dtype.is_complex or token_ids.dtype == torch.bool:
        raise ConfigError(f"token_ids must hold integers (torch.long), got {token_ids.dtype}")


def model_device(model: nn.Module) -> torch.device:
    """Where the model's first parameter or buffer lives (CPU for a model with neither)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def causal_logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """[batch, seq, vocab] logits of ``model`` on ``input_ids`` (no key-value cache is built)."""
    config = getattr(model, "config", None)
    options = {"use_cache": False} if getattr(config, "use_cache", None) is not None else {}
    output = model(input_ids=input_ids, **options)
    logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise LowbitError(f"{type(model).__name__} is not a causal LM: input_ids {tuple(input_ids.shape)} gave "
                          f"{type(output).__name__} instead of logits [batch, seq, vocab] (or an output with .logits)")
    return logits


@torch.no_grad()
def perplexity(model: nn.Module, token_ids: torch.Tensor, seqlen: int = 512, windows: int | None = None,
               *, batch_size: int = 1, bos_token_id: int | None = None) -> float:  # fmt: skip
    """exp(mean next-token NLL) of ``model`` over non-overlapping windows of ``token_ids`` (see the module
    docstring); ``batch_size`` windows run per forward (the result does not depend on it beyond rounding).
    ``bos_token_id``: each window is fed after that token and all ``seqlen`` of its tokens are scored (models
    such as Gemma expect a beginning-of-sequence token at position 0)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be a positive int")
    if bos_token_id is not None and (isinstance(bos_token_id, bool) or not isinstance(bos_token_id, int)
                                     or bos_token_id < 0):  # fmt: skip
        raise ConfigError(f"bos_token_id={bos_token_id!r} must be a token id (an int >= 0) or None")
    chunks = token_windows(token_ids, seqlen, windows)  # [n, seqlen]
    if bos_token_id is not None:
        chunks = torch.cat([torch.full((chunks.shape[0], 1), bos_token_id, dtype=chunks.dtype), chunks], dim=1)
    device, was_training = model_device(model), model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, chunks.shape[0], batch_size):
            batch = chunks[start : start + batch_size].to(device)  # [b, seqlen]
            logits = causal_logits(model, batch)[:, :-1].float()  # [b, seqlen - 1, vocab]
            if not torch.isfinite(logits).all():
                raise LowbitError(f"the model produced NaN or Inf logits on window {start} or after")
            targets = batch[:, 1:].reshape(-1)
            total += float(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets,
                                                       reduction="sum", ).double())  # fmt: skip
            count += targets.numel()
    finally:
        model.train(was_training)
    return math.exp(total / count)


class GenerationSpeed(NamedTuple):
    prefill_seconds: float  # one forward over the prompt, building the key-value cache
    decode_tokens_per_second: float  # greedy steps of one token each, reading the cache


@torch.no_grad()
def generation_speed(model: nn.Module, prompt_ids: torch.Tensor, new_tokens: int = 16) -> GenerationSpeed:
    """Time one prefill over ``prompt_ids`` [batch, seq] and ``new_tokens`` greedy decode steps with the key-value
    cache (a Hugging Face causal LM: ``past_key_values``). One measurement: repeat it and keep the best on a
    shared machine."""
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ConfigError(f"new_tokens={new_tokens!r} must be a positive int")
    model.eval()
    ids = prompt_ids.to(model_device(model))
    start = time.perf_counter()
    output = model(input_ids=ids, use_cache=True)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(new_tokens):
        token = output.logits[:, -1].argmax(-1, keepdim=True)  # [batch, 1]
        output = model(input_ids=token, use_cache=True, **_cache_argument(model, output))
    return GenerationSpeed(prefill, new_tokens / (time.perf_counter() - start))


def _cache_argument(model: nn.Module, output: Any) -> dict[str, Any]:
    """The key-value cache of ``output`` as the next call takes it: ``cache=`` (transformers 5.x) or
    ``past_key_values=`` (earlier versions)."""
    cache = getattr(output, "cache", None)
    if cache is not None:
        return {"cache": cache}
    return {"past_key_values": output.past_key_values}


__all__ = ["GenerationSpeed", "causal_logits", "generation_speed", "model_device", "perplexity", "token_windows"]
