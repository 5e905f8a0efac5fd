"""The one error hierarchy of lowbit.

Every error a user can cause by passing bad input derives from :class:`LowbitError`, so a caller (and the
CLI) can catch them all in one place. Messages name the offending key, its value and what would be valid.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LowbitError(Exception):
    """Base class of every error lowbit raises on purpose."""


class FormatError(LowbitError, ValueError):
    """A number format was given an unknown name, an unknown parameter or an illegal value."""


class ConfigError(LowbitError, ValueError):
    """A configuration (pass_args, TOML, statistics file) is missing a key or has a bad one."""


class UsageError(LowbitError):
    """Bad command-line arguments (the CLI's exit status 2)."""


class ReportError(ConfigError):
    """The quantization report cannot compare the models it was given (layers that do not match, no data)."""


def nearest_name(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name`` (for "did you mean ...?" hints), or None if nothing is close."""
    matches = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.5)
    return matches[0] if matches else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ready-to-append hint: ``" (did you mean 'x'?)"`` or an empty string."""
    best = nearest_name(name, candidates)
    return f" (did you mean {best!r}?)" if best else ""
