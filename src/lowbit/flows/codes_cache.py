"""A Hugging Face Cache whose layers store keys and values as lowbit codes (imports transformers: load lazily).

Each :class:`CodesLayer` encodes, at each ``update`` call (the prefill, then one per generated token), the new
keys and values with :func:`lowbit.qtensor.encode` in the layer's formats: integer codes (int8 / uint8, one per
element; sub-byte codes are packed only when saved) plus per-block scales, never the float tensors. Codes whose
blocks hold one token each are appended to one QTensor per layer (codes and scales concatenated along the
tokens), so a step decodes one tensor. ``update`` returns every key and value
decoded (what the attention then reads). The formats must quantize each token on its own
(``kv_cache.stores_per_token``), so codes stored token by token decode to exactly what quantizing the whole
tensor gives, and the attention's own quantization of the decoded tensors changes nothing (formats are
idempotent). :meth:`QuantizedKVCache.memory` counts the bytes held against float32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from lowbit.nn.attention import AttentionFormats
from lowbit.qtensor import QTensor, encode


def _store(spec, x: torch.Tensor) -> QTensor | torch.Tensor:
    """x as codes in ``spec`` (a float tensor when the role stays float)."""
    return x.detach() if spec is None else encode(x.detach(), spec, signed_zero=False)


def _load(chunk: QTensor | torch.Tensor) -> torch.Tensor:
    return chunk.dequantize() if isinstance(chunk, QTensor) else chunk


def _tensor_bytes(x: torch.Tensor | None) -> int:
    return 0 if x is None else x.numel() * x.element_size()


def _bytes(chunk: QTensor | torch.Tensor) -> tuple[int, int]:
    """(bytes held in memory, bytes with sub-byte codes packed as lowbit.save writes them)."""
    if not isinstance(chunk, QTensor):
        return _tensor_bytes(chunk), _tensor_bytes(chunk)
    held = _tensor_bytes(chunk.codes) + sum(map(_tensor_bytes, chunk.params.values())) + _tensor_bytes(chunk.zero_sign)
    return held, chunk.nbytes


def _append(chunks: list, new: QTensor | torch.Tensor) -> None:
    """Add ``new`` (its tokens follow the last chunk's): joined to the last chunk where both are codes whose
    blocks hold one token each (a block grid of one row per token), else as a chunk of its own."""
    last = chunks[-1] if chunks else None
    if isinstance(last, QTensor) and isinstance(new, QTensor) and _joinable(last, new):
        params = {name: torch.cat([value, new.params[name]], dim=-2) for name, value in last.params.items()}
        chunks[-1] = dataclasses.replace(last, codes=torch.cat([last.codes, new.codes], dim=-2), params=params)
    elif isinstance(last, torch.Tensor) and isinstance(new, torch.Tensor):
        chunks[-1] = torch.cat([last, new], dim=-2)
    else:
        chunks.append(new)


def _joinable(first: QTensor, second: QTensor) -> bool:
    one_token = first.block is None or (len(first.block) >= 2 and first.block[-2] == 1)
    return (one_token and first.block == second.block and first.spec == second.spec and first.zero_sign is None
            and second.zero_sign is None and first.params.keys() == second.params.keys())  # fmt: skip


class CodesLayer(DynamicLayer):
    """One attention layer's keys and values as lowbit codes, one chunk per ``update``."""

    is_croppable = False

    def __init__(self, formats: AttentionFormats) -> None:
        super().__init__()
        self.formats = formats
        self.key_chunks: list[QTensor | torch.Tensor] = []
        self.value_chunks: list[QTensor | torch.Tensor] = []
        self.cumulative_length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        _append(self.key_chunks, _store(self.formats.key, key_states))  # [batch, kv_heads, new, head_dim]
        _append(self.value_chunks, _store(self.formats.value, value_states))
        self.cumulative_length += key_states.shape[-2]
        return self.decoded()

    def decoded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every key and value held, decoded: [batch, kv_heads, tokens, head_dim] each."""
        keys = torch.cat([_load(chunk) for chunk in self.key_chunks], dim=-2)
        values = torch.cat([_load(chunk) for chunk in self.value_chunks], dim=-2)
        return keys, values

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def reset(self) -> None:
        self.key_chunks, self.value_chunks = [], []
        self.cumulative_length = 0
        self.is_initialized = False

    def _remap(self, change) -> None:
        """Apply ``change`` along the batch to every chunk (decode, change, encode again: formats are idempotent)."""
        self.key_chunks = [_store(self.formats.key, change(_load(chunk))) for chunk in self.key_chunks]
        self.value_chunks = [_store(self.formats.value, change(_load(chunk))) for chunk in self.value_chunks]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._remap(lambda x: x.index_select(0, beam_idx.to(x.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._remap(lambda x: x.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._remap(lambda x: x[indices, ...])

    def offload(self) -> None:  # codes stay where they are
        pass

    def prefetch(self) -> None:
        pass

    def nbytes(self) -> tuple[int, int]:
        """(bytes held, bytes packed) of the keys and values."""
        sizes = [_bytes(chunk) for chunk in (*self.key_chunks, *self.value_chunks)]
        return sum(held for held, _ in sizes), sum(packed for _, packed in sizes)

    def float32_bytes(self) -> int:
        return 4 * sum(chunk.numel() for chunk in (*self.key_chunks, *self.value_chunks))


class QuantizedKVCache(Cache):
    """A Cache of :class:`CodesLayer` (layers given None keep float keys and values: ``DynamicLayer``)."""

    def __init__(self, layer_formats: list[AttentionFormats | None]) -> None:
        layers = [DynamicLayer() if formats is None else CodesLayer(formats) for formats in layer_formats]
        super().__init__(layers=layers)

    def memory(self) -> dict[str, Any]:
        """Bytes of the keys and values: ``bytes`` held in memory (codes one per byte at most 8 bits, plus
        scales / zero points), ``packed_bytes`` with sub-byte codes packed (what lowbit.save writes), float32's
        bytes for the same tensors, and the ratios to it."""
        held = packed = float32 = 0
        for layer in self.layers:
            if isinstance(layer, CodesLayer):
                layer_held, layer_packed = layer.nbytes()
                held, packed, float32 = held + layer_held, packed + layer_packed, float32 + layer.float32_bytes()
            elif layer.is_initialized and layer.keys is not None:
                size = _tensor_bytes(layer.keys) + _tensor_bytes(layer.values)
                held, packed = held + size, packed + size
                float32 += 4 * (layer.keys.numel() + layer.values.numel())
        ratio = (lambda value: value / float32 if float32 else 0.0)  # noqa: E731
        return {"bytes": held, "packed_bytes": packed, "float32_bytes": float32, "ratio": ratio(held),
                "packed_ratio": ratio(packed), "tokens": self.get_seq_length()}  # fmt: skip
