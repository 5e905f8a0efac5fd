"""A Hugging Face Cache whose layers store keys and values as lowbit codes (imports transformers: load lazily).

Each :class:`CodesLayer` keeps, per ``update`` call (the prefill, then one per generated token), the new keys
and values encoded with :func:`lowbit.qtensor.encode` in the layer's formats: integer codes (int8 / uint8, or
packed sub-byte codes) plus per-block scales, never the float tensors. ``update`` returns every key and value
decoded (what the attention then reads). The formats must quantize each token on its own
(``kv_cache.stores_per_token``), so codes stored token by token decode to exactly what quantizing the whole
tensor gives, and the attention's own quantization of the decoded tensors changes nothing (formats are
idempotent). :meth:`QuantizedKVCache.memory` counts the bytes held against float32.
"""

from __future__ import annotations

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


def _bytes(chunk: QTensor | torch.Tensor) -> int:
    return chunk.nbytes if isinstance(chunk, QTensor) else chunk.numel() * chunk.element_size()


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
        self.key_chunks.append(_store(self.formats.key, key_states))  # [batch, kv_heads, new, head_dim]
        self.value_chunks.append(_store(self.formats.value, value_states))
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

    def nbytes(self) -> int:
        return sum(_bytes(chunk) for chunk in (*self.key_chunks, *self.value_chunks))

    def float32_bytes(self) -> int:
        return 4 * sum(chunk.numel() for chunk in (*self.key_chunks, *self.value_chunks))


class QuantizedKVCache(Cache):
    """A Cache of :class:`CodesLayer` (layers given None keep float keys and values: ``DynamicLayer``)."""

    def __init__(self, layer_formats: list[AttentionFormats | None]) -> None:
        layers = [DynamicLayer() if formats is None else CodesLayer(formats) for formats in layer_formats]
        super().__init__(layers=layers)

    def memory(self) -> dict[str, Any]:
        """Bytes of keys and values held (codes + scales), float32's bytes for the same tensors, their ratio."""
        held = float32 = 0
        for layer in self.layers:
            if isinstance(layer, CodesLayer):
                held, float32 = held + layer.nbytes(), float32 + layer.float32_bytes()
            elif layer.is_initialized and layer.keys is not None:
                size = layer.keys.numel() + layer.values.numel()
                held, float32 = held + size * layer.keys.element_size(), float32 + 4 * size
        return {"bytes": held, "float32_bytes": float32, "ratio": held / float32 if float32 else 0.0,
                "tokens": self.get_seq_length()}  # fmt: skip
