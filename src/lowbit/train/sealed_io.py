"""Lightning checkpoints with a checksum: :class:`SealedCheckpointIO` serializes a checkpoint in memory and
writes it atomically with a ``.sha256`` sidecar (:mod:`lowbit._checksum`); :func:`verify_checkpoint` checks
one before it is read (a bit-flipped ``last.ckpt`` is refused with an error naming it)."""

from __future__ import annotations

import io
import logging
import os
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lowbit._checksum import sidecar_of, verify_sidecar, write_with_sidecar

_log = logging.getLogger("lowbit")


class SealedCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_with_sidecar(path, buffer.getvalue())

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        sidecar = sidecar_of(path)
        if sidecar.exists():
            sidecar.unlink()


def verify_checkpoint(path: str | os.PathLike) -> None:
    """FormatError naming ``path`` if it does not match its checksum; a warning if it has none."""
    if not verify_sidecar(path):
        _log.warning(f"{path} has no checksum beside it (an older lowbit, or another tool wrote it): not verified")


__all__ = ["SealedCheckpointIO", "verify_checkpoint"]
