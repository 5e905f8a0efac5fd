"""Progress bars for long loops (profiling, calibration, evaluation): rich's when it is installed and the
bar is wanted, else the plain iterable."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


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
