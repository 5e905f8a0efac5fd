"""Export: lowbit's safetensors files (``save`` / ``load``, a versioned JSON header, no pickle) and QDQ
ONNX (``export_onnx``); other owners' formats: GGUF (``export_gguf`` / ``load_gguf``, llama.cpp) and
compressed-tensors (``export_compressed_tensors``, vLLM). safetensors, onnx, gguf and transformers are imported
only when these functions run."""

from __future__ import annotations

from typing import Any

from lowbit.export._errors import ExportError, SerializationError


def save(obj: Any, path, **kwargs: Any) -> None:
    """See :func:`lowbit.export.safetensors_io.save`."""
    from lowbit.export.safetensors_io import save as _save

    _save(obj, path, **kwargs)


def load(path, model: Any = None, **kwargs: Any) -> Any:
    """See :func:`lowbit.export.safetensors_io.load`."""
    from lowbit.export.safetensors_io import load as _load

    return _load(path, model, **kwargs)


def export_onnx(model: Any, example_inputs: Any, path, **kwargs: Any) -> Any:
    """See :func:`lowbit.export.onnx_export.export_onnx`."""
    from lowbit.export.onnx_export import export_onnx as _export

    return _export(model, example_inputs, path, **kwargs)


def load_gguf(path, **kwargs: Any) -> Any:
    """See :func:`lowbit.export.gguf_load.load_gguf`."""
    from lowbit.export.gguf_load import load_gguf as _load_gguf

    return _load_gguf(path, **kwargs)


def export_gguf(model: Any, path, tokenizer: Any = None, **kwargs: Any) -> Any:
    """See :func:`lowbit.export.gguf_export.export_gguf`."""
    from lowbit.export.gguf_export import export_gguf as _export_gguf

    return _export_gguf(model, path, tokenizer, **kwargs)


def export_compressed_tensors(model: Any, directory, **kwargs: Any) -> Any:
    """See :func:`lowbit.export.compressed_tensors_export.export_compressed_tensors`."""
    from lowbit.export.compressed_tensors_export import export_compressed_tensors as _export_ct

    return _export_ct(model, directory, **kwargs)


__all__ = ["ExportError", "SerializationError", "export_compressed_tensors", "export_gguf", "export_onnx", "load",
           "load_gguf", "save"]  # fmt: skip
