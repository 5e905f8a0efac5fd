"""Number formats. Each family lives in one module here and registers its spec classes on import.

Every spec class is re-exported as ``lowbit.formats.<SpecName>`` (e.g. ``lowbit.formats.Integer``).
"""

from __future__ import annotations

import importlib
import pkgutil

from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import get_format, list_formats, register, resolve, spec_classes
from lowbit.formats.rounding import ROUNDING_MODES

# Support modules, not format families.
_HELPERS = {"rounding", "ste", "blocking", "scaling"}

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_") and _info.name not in _HELPERS:
        importlib.import_module(f"{__name__}.{_info.name}")

globals().update(spec_classes())

__all__ = [
    "FormatSpec", "ROUNDING_MODES", "get_format", "list_formats", "register", "resolve",
    *sorted(spec_classes()),
]  # fmt: skip
