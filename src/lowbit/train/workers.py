"""Training processes: how many devices a run may ask for, and DDP workers that end with their launcher.

- :func:`check_devices`: ``devices`` is at most the CPU cores this process may use (``accelerator="cpu"``,
  or ``"auto"`` with no GPU) or the CUDA GPUs present; more is a ConfigError before any process starts.
- :func:`mark_launcher` / :func:`bind_to_launcher`: the launcher records its process id in the environment
  its workers inherit; a worker asks the kernel to send it SIGKILL when its parent ends (Linux
  ``prctl(PR_SET_PDEATHSIG)``), or elsewhere polls its parent process id from a daemon thread, and exits
  at once if the launcher is already gone. A SIGKILL or SIGTERM of the launcher so leaves no worker behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

from lowbit.errors import ConfigError

LAUNCHER_VARIABLE = "LOWBIT_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_devices(devices: Any, accelerator: str) -> None:
    """ConfigError when ``devices`` (a count) exceeds what ``accelerator`` has here."""
    if not isinstance(devices, int):
        return  # "auto", or a list of GPU indices Lightning checks itself
    import torch

    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if gpu:
        present = torch.cuda.device_count()
        if devices > present:
            raise ConfigError(f"--devices {devices}: only {present} CUDA GPU(s) are present here")
    elif accelerator in ("cpu", "auto"):
        cores = available_cores()
        if devices > cores:
            raise ConfigError(f"--devices {devices} with the CPU accelerator: only {cores} core(s) are available "
                              f"to this process (one training process per core at most)")  # fmt: skip


def mark_launcher() -> None:
    """Called in the process that starts training: its workers will know whom to outlive not."""
    os.environ[LAUNCHER_VARIABLE] = str(os.getpid())


def bind_to_launcher(poll_seconds: float = 0.5) -> bool:
    """In a worker (the launcher's id in the environment, and not this process): end with the launcher.
    Returns whether this process is such a worker."""
    text = os.environ.get(LAUNCHER_VARIABLE, "")
    if not text.isdigit() or int(text) == os.getpid():
        return False
    launcher = int(text)
    if not _parent_death_signal():
        threading.Thread(target=_watch_parent, args=(launcher, poll_seconds), daemon=True,
                         name="lowbit-launcher-watch").start()  # fmt: skip
    if os.getppid() != launcher:  # the launcher died before the signal was armed
        os._exit(1)
    return True


def _parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(launcher: int, poll_seconds: float) -> None:
    while os.getppid() == launcher:
        time.sleep(poll_seconds)
    os._exit(1)


__all__ = ["LAUNCHER_VARIABLE", "available_cores", "bind_to_launcher", "check_devices", "mark_launcher"]
