"""The checkpoint folder of one training project, across runs: a new run never overwrites an earlier one
silently.

- a folder holding ``best.ckpt`` or ``last.ckpt`` is refused (ConfigError, exit 2) unless the run says
  ``resume`` (continue from ``last.ckpt``: epoch, optimizer, schedule, data order, RNG) or ``overwrite``;
- ``overwrite`` starts afresh but keeps the previous ``best.ckpt`` as ``best.previous.ckpt`` (one
  generation), so a better earlier model is never lost to a worse new one;
- ``resume`` checks ``last.ckpt``'s checksum before Lightning reads it (:mod:`lowbit.train.sealed_io`) and
  removes ``metrics.json`` (it described the earlier run's best checkpoint; the resumed run writes a new one,
  naming the SHA-256 of the best.ckpt it describes).

A DDP worker started by Lightning's launcher (``LOCAL_RANK`` > 0) takes the launcher's decision as given.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lowbit._checksum import sidecar_of
from lowbit.errors import ConfigError

CHECKPOINT_NAMES = ("best.ckpt", "last.ckpt")
PREVIOUS_BEST = "best.previous.ckpt"
_log = logging.getLogger("lowbit")


def prepare_run_folder(directory: str | os.PathLike, *, resume: bool, overwrite: bool) -> Path | None:
    """Check ``directory`` for an earlier run; returns the checkpoint to resume from (None: a fresh start)."""
    from lowbit.train.sealed_io import verify_checkpoint

    directory = Path(directory)
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: give one")
    last = directory / "last.ckpt"
    if resume:
        if not last.is_file():
            raise ConfigError(f"nothing to resume: {last} does not exist (drop --resume to start a new run)")
        verify_checkpoint(last)
        _remove(directory, "metrics.json")  # it described the earlier run's best; the resumed run writes anew
        return last
    found = [name for name in CHECKPOINT_NAMES if (directory / name).exists()]
    if not found or is_launched_worker():
        return None
    if not overwrite:
        raise ConfigError(f"{directory} already holds {' and '.join(found)} from an earlier run: pass --resume to "
                          f"continue it or --overwrite to start again (the old best.ckpt is then kept as "
                          f"{PREVIOUS_BEST})")  # fmt: skip
    _set_aside(directory)
    return None


def _set_aside(directory: Path) -> None:
    best = directory / "best.ckpt"
    if best.exists():
        os.replace(best, directory / PREVIOUS_BEST)
        _move_sidecar(best, directory / PREVIOUS_BEST)
        _log.warning(f"--overwrite: the previous best checkpoint is kept as {directory / PREVIOUS_BEST}")
    for name in ("last.ckpt", "metrics.json"):
        _remove(directory, name)


def _remove(directory: Path, name: str) -> None:
    for path in (directory / name, sidecar_of(directory / name)):
        if path.exists():
            path.unlink()


def _move_sidecar(source: Path, destination: Path) -> None:
    sidecar = sidecar_of(source)
    if sidecar.exists():
        os.replace(sidecar, sidecar_of(destination))


def is_launched_worker() -> bool:
    """True in a DDP worker that Lightning's launcher started (not the launcher itself)."""
    rank = os.environ.get("LOCAL_RANK", "0")
    return rank.isdigit() and int(rank) > 0


__all__ = ["CHECKPOINT_NAMES", "PREVIOUS_BEST", "is_launched_worker", "prepare_run_folder"]
