"""What the pipeline tells the user while it works: progress bars for long loops (rich's, when it is
installed and bars are wanted), one-line notes and warnings through the ``lowbit`` logger, and
:func:`waiting` around every step that may take more than a few seconds (GPTQ, calibration, export,
warm-up): a line when it starts and one with its duration when it ends (a spinner on a terminal).

The command line sets the logger's level (``-q``: warnings only, ``-v``: details); a Python caller gets
Python's default (warnings on stderr) unless it configures ``logging.getLogger("lowbit")``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("lowbit")


def progress(items: Iterable[Any], description: str, *, enabled: bool = True) -> Iterator[Any]:
    if not enabled:
        yield from items
        return
    try:
        from rich.progress import track
    except ImportError:
        yield from items
        return
    total = len(items) if hasattr(items, "__len__") else None
    yield from track(items, description=description, total=total, transient=True)


def note(message: str) -> None:
    """One line for the user (hidden by ``-q``)."""
    log.info(message)


def warn(message: str) -> None:
    """One warning line (shown even with ``-q``)."""
    log.warning(message)


SLOW_SECONDS = 5.0  # a step that took longer than this is reported even when it was not expected to


@contextmanager
def waiting(message: str, *, slow: bool = True) -> Iterator[None]:
    """Around a step that may take a while: with ``slow``, ``message`` when it starts (a rich spinner
    meanwhile on a terminal) and its duration when it ends; otherwise the duration line only if the step
    took more than :data:`SLOW_SECONDS` (with ``-v``: always)."""
    if slow:
        note(f"{message} ...")
    else:
        log.debug(f"{message} ...")
    start = time.perf_counter()
    status = _spinner(message) if slow and log.isEnabledFor(logging.INFO) else None
    if status is None:
        yield
    else:
        with status:
            yield
    elapsed = time.perf_counter() - start
    level = logging.INFO if slow or elapsed > SLOW_SECONDS else logging.DEBUG
    log.log(level, f"{message}: done in {elapsed:.1f} s")


def _spinner(message: str) -> Any:
    if not sys.stderr.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(stderr=True).status(message)


__all__ = ["SLOW_SECONDS", "log", "note", "progress", "waiting", "warn"]
