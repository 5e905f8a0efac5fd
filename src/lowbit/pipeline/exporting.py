"""``lowbit export``: a transformed model (a ``transformed_ckpt`` folder) to QDQ ONNX, lowbit's safetensors
file, a GGUF file (llama.cpp; a SmolLM2 checkpoint with its vocabulary) and / or a compressed-tensors
folder (vLLM). The example input for ONNX is a batch of the model's dataset; a tokenized batch (MiniLM)
becomes the positional inputs in the order of the model's ``forward`` (input_ids, attention_mask, ...)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from pathlib import Path

from lowbit.errors import ConfigError
from lowbit.pipeline.catalog import check_pair, get_split, make_loader, model_inputs
from lowbit.pipeline.checkpoints import load_lowbit, saved_origin
from lowbit.pipeline.progress import waiting


def export(folder: str | os.PathLike, *, onnx_path: str | None = None, safetensors_path: str | None = None,
           gguf_path: str | None = None, compressed_tensors_path: str | None = None, batch_size: int = 1,
           dataset: str | None = None) -> list[str]:  # fmt: skip
    folder = Path(folder)
    if not folder.exists():
        raise ConfigError(f"checkpoint {folder} does not exist")
    with waiting(f"loading {folder}", slow=False):
        model = load_lowbit(folder).eval()
    written = []
    if safetensors_path:
        from lowbit.export import save

        with waiting(f"writing {safetensors_path}", slow=False):
            save(model, safetensors_path)
        written.append(safetensors_path)
    if gguf_path:
        from lowbit.export import export_gguf

        tokenizer, tokenizer_pre = _gguf_vocabulary(folder)
        with waiting(f"writing {gguf_path}", slow=False):
            export_gguf(model, gguf_path, tokenizer, tokenizer_pre=tokenizer_pre)
        written.append(gguf_path)
    if compressed_tensors_path:
        from lowbit.export import export_compressed_tensors

        with waiting(f"writing {compressed_tensors_path}", slow=False):
            export_compressed_tensors(model, compressed_tensors_path)
        written.append(compressed_tensors_path)
    if onnx_path:
        from lowbit.export import export_onnx

        example = _example_input(folder, dataset, batch_size)
        if isinstance(example, Mapping):
            example = positional_inputs(model, example)
        with waiting(f"exporting ONNX to {onnx_path} (torch.onnx.export; a transformer takes up to a minute)"):
            export_onnx(model, example, onnx_path, dynamic_batch=True)
        written.append(onnx_path)
    return written


def _gguf_vocabulary(folder: Path):
    """(tokenizer, llama.cpp pre-tokenizer name) for a catalog model's GGUF file, so llama.cpp can run it:
    SmolLM2's own vocabulary ("smollm", as llama.cpp's converter names it); (None, "default") otherwise."""
    model_name, _ = saved_origin(folder)
    if model_name == "smollm2":
        from lowbit.models.smollm2 import load_smollm2_tokenizer

        return load_smollm2_tokenizer(), "smollm"
    return None, "default"


def positional_inputs(model, batch: Mapping) -> tuple:
    """A keyword batch as positional inputs in the order of ``model.forward``'s parameters (None for a
    parameter the batch does not give, between two it does)."""
    parameters = list(inspect.signature(model.forward).parameters)
    unknown = [key for key in batch if key not in parameters]
    if unknown:
        raise ConfigError(f"the example batch has inputs {unknown} that {type(model).__name__}.forward does not take")
    last = max(parameters.index(key) for key in batch)
    return tuple(batch.get(name) for name in parameters[: last + 1])


def _example_input(folder: Path, dataset: str | None, batch_size: int):
    model_name, saved_dataset = saved_origin(folder)
    dataset = dataset or saved_dataset
    if dataset is None:
        raise ConfigError(f"{folder} does not say which dataset its model takes: pass --dataset")
    if model_name is not None:
        check_pair(model_name, dataset)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    get_split(dataset, "test")  # a clear error for an unknown dataset before the loader is made
    return model_inputs(next(iter(make_loader(dataset, "test", batch_size))))


__all__ = ["export", "positional_inputs"]
