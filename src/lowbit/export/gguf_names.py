"""What a GGUF file and a Hugging Face causal LM call the same Linear, and llama.cpp's Q / K row order.

Names: the ``gguf`` package's own tensor-name map (``gguf.get_tensor_name_map``: the table llama.cpp's
converter writes with), so ``model.layers.3.self_attn.q_proj`` <-> ``blk.3.attn_q.weight``, ``lm_head`` <->
``output.weight``. Row order: llama.cpp's converter stores a Llama's Q and K projections with the rows of
each head interleaved (its ``permute``: the two rotary halves of a head become pairs); transformers' GGUF
loader undoes that on load (``LlamaTensorProcessor``). Rows are whole blocks, so moving them moves ggml
blocks exactly. Both directions here are index arrays of rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from lowbit.errors import FormatError

PERMUTED_ARCHITECTURES = ("llama",)  # the ones transformers' GGUF loader un-permutes (and llama.cpp permutes)


def _gguf():
    try:
        import gguf
    except ImportError as error:  # pragma: no cover - the gguf extra
        raise FormatError(f"GGUF needs the 'gguf' package (pip install gguf): {error}") from None
    return gguf


def architecture_enum(name: str):
    gguf = _gguf()
    for arch, arch_name in gguf.MODEL_ARCH_NAMES.items():
        if arch_name == name:
            return arch
    raise FormatError(f"GGUF architecture {name!r} is not known to the installed gguf package")


def linear_tensor_names(model: nn.Module, architecture: str, layers: int) -> dict[str, str]:
    """Qualified name of every nn.Linear (or lowbit Linear) -> its GGUF tensor name (``... .weight``)."""
    name_map = _gguf().get_tensor_name_map(architecture_enum(architecture), layers)
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) or hasattr(module, "in_features") and hasattr(module, "out_features"):
            found = name_map.get_name(name)
            if found is not None:
                out[name] = f"{found}.weight"
    return out


def _heads(tensor_name: str, config: Any) -> int | None:
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if ".attn_q." in tensor_name:
        return heads
    if ".attn_k." in tensor_name:
        return kv_heads
    return None


def file_rows(tensor_name: str, rows: int, architecture: str, config: Any) -> np.ndarray | None:
    """For the GGUF tensor's row j, the Hugging Face row it holds (llama.cpp's ``permute``); None: same order."""
    heads = _heads(tensor_name, config) if architecture in PERMUTED_ARCHITECTURES else None
    if heads is None:
        return None
    if rows % (2 * heads):
        raise FormatError(f"{tensor_name}: {rows} rows do not split into {heads} heads of two rotary halves")
    index = np.arange(rows)
    return index.reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(rows)


def model_rows(tensor_name: str, rows: int, architecture: str, config: Any) -> np.ndarray | None:
    """For the Hugging Face row i, the GGUF row holding it (transformers' reverse permute); None: same order."""
    order = file_rows(tensor_name, rows, architecture, config)
    return None if order is None else np.argsort(order)
