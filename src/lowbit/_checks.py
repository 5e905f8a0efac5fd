"""The one-line value checks every option of lowbit goes through (recipe fields, search tables, report pass
arguments): each raises the caller's error class (ConfigError unless told) naming where, the field, the value
and what it must be, in one wording."""

from __future__ import annotations

from typing import Any

from lowbit.errors import ConfigError, LowbitError, did_you_mean


def check_flag(where: str, field: str, value: Any, error: type[LowbitError] = ConfigError) -> bool:
    """``value`` itself when it is True or False (not 0 / 1)."""
    if not isinstance(value, bool):
        raise error(f"{where}: {field}={value!r} must be true or false")
    return value


def check_choice(where: str, field: str, value: Any, legal: tuple, error: type[LowbitError] = ConfigError) -> Any:
    """``value`` when it is one of ``legal``, by type too (7.0 is not 7, True is not 1)."""
    if not any(type(value) is type(option) and value == option for option in legal):
        raise error(f"{where}: {field}={value!r}{did_you_mean(str(value), [str(v) for v in legal])}; "
                    f"legal: {', '.join(str(v) for v in legal)}")  # fmt: skip
    return value


def check_positive_int(where: str, field: str, value: Any, even: bool = False,
                       error: type[LowbitError] = ConfigError) -> int:  # fmt: skip
    """``value`` when it is an int (not a bool) >= 1 (and even, with ``even``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (even and value % 2):
        raise error(f"{where}: {field}={value!r} must be a positive{' even' if even else ''} int")
    return value


def check_text(where: str, field: str, value: Any, error: type[LowbitError] = ConfigError) -> str:
    """``value`` when it is a string."""
    if not isinstance(value, str):
        raise error(f"{where}: {field}={value!r} must be a string")
    return value


def check_texts(where: str, field: str, value: Any, error: type[LowbitError] = ConfigError) -> list[str]:
    """``value`` when it is a list of strings."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise error(f"{where}: {field}={value!r} must be a list of strings")
    return value


__all__ = ["check_choice", "check_flag", "check_positive_int", "check_text", "check_texts"]
