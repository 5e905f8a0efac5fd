"""report.json and report.html, published together (lowbit._io.atomic_directory): a reader of the folder
sees both from the previous report or both from the new one; other files in the folder are kept.

JSON has no inf / NaN: non-finite numbers are written as the strings "inf", "-inf" and "nan" (an exact
layer has an SQNR of "inf"), and :func:`read_report` turns them back into floats.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from lowbit._checksum import sidecar_of, sidecar_text, verify_sidecar
from lowbit._io import atomic_directory, read_regular_text, write_file
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
    texts = {"json": to_json(report), "html": render_html(report)}  # both made before anything is written
    sidecar = sidecar_of(paths["json"])  # report.json.sha256, published in the same swap
    with atomic_directory(target, owned=[*(path.name for path in paths.values()), sidecar.name]) as building:
        for key, path in paths.items():
            write_file(building / path.name, texts[key].encode())
        write_file(building / sidecar.name, sidecar_text(paths["json"].name, texts["json"].encode()).encode())
    return paths


def read_report(path: str | os.PathLike) -> dict[str, Any]:
    """A report.json back as a report dict (non-finite strings become floats again); ReportError naming the
    file if it is not JSON or not a report; FormatError if it does not match its ``.sha256`` sidecar (a
    report.json without one, from an older lowbit, is read with a warning)."""
    if not verify_sidecar(path):
        warnings.warn(f"{path} has no checksum file (report.json.sha256): read unchecked", stacklevel=2)
    try:
        doc = json.loads(read_regular_text(path))
    except OSError as error:
        raise ReportError(f"cannot read {path}: {error.strerror or error}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ReportError(f"{path} is not a readable report.json: {error}") from None
    if not isinstance(doc, dict) or "layers" not in doc or "summary" not in doc:
        raise ReportError(f"{path} is not a lowbit report (no 'layers' and 'summary')")
    return _numbers(doc)


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
