"""The registry of number formats: name -> spec class.

A format module registers its spec classes with :func:`register`; everything else (layers, passes, CLI)
finds formats only through :func:`get_format` / :func:`resolve`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from lowbit.errors import FormatError, did_you_mean

if TYPE_CHECKING:
    from lowbit.formats._base import FormatSpec

_FORMATS: dict[str, type[FormatSpec]] = {}
# resolve(name, **params) -> spec, for hashable parameters: specs are frozen, so one validated object serves
# every call (validation costs tens of microseconds, more than quantizing a small tensor natively).
_RESOLVED: dict[tuple, FormatSpec] = {}
_RESOLVED_LIMIT = 512


def register(cls: type[FormatSpec]) -> type[FormatSpec]:
    """Class decorator: register a spec class under its ``format_name`` (and its ``aliases``)."""
    for name in (cls.format_name, *cls.aliases):
        if name in _FORMATS and _FORMATS[name] is not cls:
            raise RuntimeError(f"format name {name!r} registered twice")
        _FORMATS[name] = cls
    return cls


def list_formats() -> list[str]:
    """Every registered format name (aliases included), sorted."""
    return sorted(_FORMATS)


def get_format(name: str) -> type[FormatSpec]:
    """The spec class registered as ``name``; FormatError (with the nearest name) if there is none."""
    if not isinstance(name, str):
        raise FormatError(f"format name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    if key not in _FORMATS:
        raise FormatError(f"unknown format {name!r}{did_you_mean(key, _FORMATS)}; see lowbit.list_formats()")
    return _FORMATS[key]


def spec_classes() -> dict[str, type[FormatSpec]]:
    """Class name -> spec class, for re-export as ``lowbit.formats.<Spec>``."""
    return {cls.__name__: cls for cls in _FORMATS.values()}


def resolve(fmt: Any, **params: Any) -> FormatSpec:
    """Turn a name or a spec object (plus optional parameter overrides) into a validated spec object."""
    from lowbit.formats._base import FormatSpec

    if isinstance(fmt, FormatSpec):
        return fmt.replace(**params) if params else fmt
    if isinstance(fmt, type) and issubclass(fmt, FormatSpec):
        return fmt.create(**params)
    key = _cache_key(fmt, params)
    spec = _RESOLVED.get(key) if key is not None else None
    if spec is None:
        spec = get_format(fmt).create(**params)
        if key is not None:
            if len(_RESOLVED) >= _RESOLVED_LIMIT:
                _RESOLVED.clear()
            _RESOLVED[key] = spec
    return spec


_PLAIN = frozenset((str, int, bool, type(None)))  # compared by value and type; floats by repr (-0.0, nan)


def _cache_key(name: Any, params: dict[str, Any]) -> tuple | None:
    """A key telling apart every parameter value the checks tell apart (True from 1, 4 from 4.0, -0.0 from
    0.0), or None when a value is not a plain number / string / None or a list / tuple of them (a tensor)."""
    if not isinstance(name, str):
        return None
    items = [name]
    for key in sorted(params):
        value = _plain_key(params[key])
        if value is None:
            return None
        items.append((key, value))
    return tuple(items)


def _plain_key(value: Any) -> tuple | None:
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is float:
        return (kind, repr(value))
    if kind in (list, tuple):
        parts = [_plain_key(item) if type(item) in _PLAIN or type(item) is float else None for item in value]
        return None if None in parts else (kind, tuple(parts))
    return None


def parameter_names(cls: type[FormatSpec]) -> list[str]:
    """The constructor parameters of a spec class, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]
