"""Errors of the export layer (safetensors files and ONNX export); both are LowbitErrors."""

from __future__ import annotations

from lowbit.errors import LowbitError


class SerializationError(LowbitError, ValueError):
    """A lowbit file cannot be written or read: corrupt, truncated, wrong schema, missing or mismatched tensor."""


class ExportError(LowbitError, ValueError):
    """A model cannot be exported (e.g. a layer's format has no ONNX equivalent); names the layer and format."""
