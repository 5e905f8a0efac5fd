"""Hugging Face transformers reading a GGUF file into a float32 causal LM, quietly, without the file's marks
(the SmolLM2 and Gemma loaders share it)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from lowbit.errors import LowbitError


def offline_llm_extra(who: str, install: str) -> None:
    """Hugging Face offline from here on (unless the user said otherwise), and LowbitError naming ``install``
    when a package of the llm extra (transformers, gguf, accelerate) is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for module in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise LowbitError(f"{who} needs the llm extra ({module} is missing): {install}")


def read_float_model(path: Path) -> torch.nn.Module:
    """The float32 causal LM transformers builds from the GGUF file at ``path`` (offline, eval mode, its reader's
    notices and progress bars silenced meanwhile)."""
    with _quiet_transformers():
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True,
                                                     dtype=torch.float32)  # fmt: skip
    return as_plain_float(model).eval()


def read_tokenizer(path: Path) -> Any:
    """The tokenizer built from the GGUF file's vocabulary (offline)."""
    with _quiet_transformers():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()  # the GGUF reader's notices
    logging.disable_progress_bar()  # and transformers' own bars
    try:
        with _quiet_gguf_converter():
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


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
