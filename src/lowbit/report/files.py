"""report.json and report.html, written atomically.

JSON has no inf / NaN: non-finite numbers are written as the strings "inf", "-inf" and "nan" (an exact
layer has an SQNR of "inf"), and :func:`read_report` turns them back into floats.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from lowbit._io import atomic_write_text
from lowbit.errors import ReportError

_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def to_json(report: dict[str, Any]) -> str:
    """The report as strict JSON (non-finite numbers as strings)."""
    return json.dumps(_plain(report), indent=2, allow_nan=False) + "\n"


def write_report(report: dict[str, Any], directory: str | os.PathLike) -> dict[str, Path]:
    """Write ``report.json`` and ``report.html`` (self-contained, charts inline) into ``directory``."""
    from lowbit.report.html import render_html

    _check(report)
    target = Path(directory)
    paths = {"json": target / "report.json", "html": target / "report.html"}
    atomic_write_text(paths["json"], to_json(report))
    atomic_write_text(paths["html"], render_html(report))
    return paths


def read_report(path: str | os.PathLike) -> dict[str, Any]:
    """A report.json back as a report dict (non-finite strings become floats again)."""
    with open(path, encoding="utf-8") as stream:
        return _numbers(json.load(stream))


def _check(report: Any) -> None:
    if not isinstance(report, dict) or "layers" not in report or "summary" not in report:
        raise ReportError("write_report needs the report dict returned by quantization_report_analysis_pass")


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _numbers(value: Any) -> Any:
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    if isinstance(value, dict):
        return {key: _numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    return value
