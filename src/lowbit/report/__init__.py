"""The quantization report: the float and the quantized model side by side on real data.

Per layer: the format of each role, bits per element (scales and zero points included), bytes, SQNR and
relative error of the layer output, the share of clamped values; per model: bytes against fp32, average
bits per weight and the task metric; a sensitivity ranking; a rich table, report.json and a
self-contained report.html with charts. See docs/report.md.

Importing this package does not import matplotlib or rich; drawing and printing do.
"""

from lowbit.errors import ReportError
from lowbit.report.analysis import quantization_report_analysis_pass
from lowbit.report.build import SCHEMA
from lowbit.report.files import read_report, to_json, write_report
from lowbit.report.metrics import relative_error, sqnr_db, storage_bits_per_element, storage_bytes
from lowbit.report.table import print_report


def render_html(report: dict) -> str:
    """report.html's text (imports matplotlib)."""
    from lowbit.report.html import render_html as render

    return render(report)


__all__ = [
    "SCHEMA", "ReportError", "print_report", "quantization_report_analysis_pass", "read_report", "relative_error",
    "render_html", "sqnr_db", "storage_bits_per_element", "storage_bytes", "to_json", "write_report",
]  # fmt: skip
