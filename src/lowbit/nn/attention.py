"""Quantized attention operands: the query, keys, values and attention probabilities of an attention layer.

An :class:`AttentionFormats` names one format (or None: float) per attention role:

- ``query``: the queries after the rotary embedding, [batch, heads, q_len, head_dim];
- ``key``: the keys after the rotary embedding, as stored in the cache and attended to,
  [batch, kv_heads, kv_len, head_dim]; ``key_per_channel`` quantizes them transposed
  ([..., head_dim, kv_len]: a block runs along the tokens of one channel, KIVI's key granularity);
- ``value``: the values, [batch, kv_heads, kv_len, head_dim];
- ``probabilities``: softmax(q k^T * scaling + mask), [batch, heads, q_len, kv_len] (a block runs along the keys
  of one query).

A format's blocks apply to the last dimension as in :func:`lowbit.quantize`: ``block_size=[-1]`` is one scale per
token and head (a head_dim vector), ``[16]`` groups of 16 channels. :class:`AttentionQuantizer` is the module an
attention layer carries them in (no parameters, no buffers); :func:`attention_with_probabilities` is the eager
attention arithmetic with the probabilities quantized, for models whose fused kernel never forms them. Nothing
here knows Hugging Face: ``lowbit.flows.kv_cache`` wires it into a model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lowbit.errors import ConfigError
from lowbit.formats import FormatSpec

ATTENTION_ROLES: tuple[str, ...] = ("query", "key", "value", "probabilities")


@dataclasses.dataclass(frozen=True)
class AttentionFormats:
    """The format of each attention role (None: that role stays float)."""

    query: FormatSpec | None = None
    key: FormatSpec | None = None
    value: FormatSpec | None = None
    probabilities: FormatSpec | None = None
    key_per_channel: bool = False

    def __post_init__(self) -> None:
        for role in ATTENTION_ROLES:
            value = getattr(self, role)
            if value is not None and not isinstance(value, FormatSpec):
                raise ConfigError(f"attention role {role!r} needs a format spec or None, got {type(value).__name__}")

    def active(self) -> dict[str, FormatSpec]:
        return {role: getattr(self, role) for role in ATTENTION_ROLES if getattr(self, role) is not None}

    def describe(self) -> str:
        parts = [f"{role}={spec.describe()}" for role, spec in self.active().items()]
        if self.key_per_channel and self.key is not None:
            parts.append("keys per channel")
        return ", ".join(parts) or "float"


def quantize_role(spec: FormatSpec | None, x: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """``spec(x)`` (straight-through gradient), along the tokens when ``transposed``; None passes x through."""
    if spec is None:
        return x
    if transposed:
        return spec(x.transpose(-1, -2)).transpose(-1, -2)
    return spec(x)


class AttentionQuantizer(nn.Module):
    """The quantized roles of one attention layer (lowbit.flows.kv_cache installs it as
    ``<attention>.attention_quantizer``)."""

    def __init__(self, formats: AttentionFormats) -> None:
        super().__init__()
        self.formats = formats

    def operands(self, query, key, value) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self.formats
        return (quantize_role(f.query, query), quantize_role(f.key, key, f.key_per_channel),
                quantize_role(f.value, value))  # fmt: skip

    def extra_repr(self) -> str:
        return self.formats.describe()


def repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[batch, kv_heads, seq, dim] -> [batch, kv_heads * groups, seq, dim] (each kv head serves ``groups`` heads)."""
    if groups == 1:
        return x
    batch, heads, seq, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, seq, dim).reshape(batch, heads * groups, seq, dim)


def attention_with_probabilities(
    module: nn.Module,
    query: torch.Tensor,  # [batch, heads, q_len, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, kv_len, head_dim]
    value: torch.Tensor,  # [batch, kv_heads, kv_len, head_dim]
    attention_mask: torch.Tensor | None,
    probabilities: FormatSpec | None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **ignored: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with the softmax output quantized: returns (output [batch, q_len, heads, head_dim],
    probabilities). ``attention_mask`` is additive (float), boolean (True: attend) or None (causal when
    ``module.is_causal`` and q_len > 1, aligned to the last key)."""
    if ignored.get("s_aux") is not None:
        raise ConfigError("quantized attention probabilities do not support attention sinks (s_aux)")
    groups = query.shape[1] // key.shape[1]
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, repeat_heads(key, groups).transpose(2, 3)) * scale  # [b, h, q, k]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    scores = _masked(scores, attention_mask, causal)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = quantize_role(probabilities, weights)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, repeat_heads(value, groups))  # [b, h, q, d]
    return output.transpose(1, 2).contiguous(), weights


def _masked(scores: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    q_len, kv_len = scores.shape[-2:]
    if mask is None:
        if not causal or q_len == 1:
            return scores
        rows = torch.arange(q_len, device=scores.device)[:, None] + (kv_len - q_len)
        mask = torch.arange(kv_len, device=scores.device)[None, :] <= rows  # [q, k]
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask[..., :kv_len], torch.finfo(scores.dtype).min)
    return scores + mask[..., :kv_len]


__all__ = ["ATTENTION_ROLES", "AttentionFormats", "AttentionQuantizer", "attention_with_probabilities", "quantize_role",
           "repeat_heads"]  # fmt: skip
