"""Export: lowbit's safetensors files (``save`` / ``load``, a versioned JSON header, no pickle) and QDQ
ONNX (``export_onnx``). safetensors and onnx are imported only when these functions run."""

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


__all__ = ["ExportError", "SerializationError", "export_onnx", "load", "save"]
