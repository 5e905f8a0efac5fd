"""report.json (strict JSON, round trip), report.html (self-contained, one image per chart), the histogram
data behind the charts, and the rich table."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch

from lowbit.report import print_report, quantization_report_analysis_pass, read_report, to_json, write_report

pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
rich_console = pytest.importorskip("rich.console", reason="the report extra (rich) is not installed")


@pytest.fixture(scope="module")
def report(mixed_graph, toy_model, toy_batches):
    batches, labels = toy_batches
    args = {"float_model": toy_model, "inputs": batches, "labels": labels, "histogram_layers": 2}
    return quantization_report_analysis_pass(mixed_graph, args)[1]["report"]


@pytest.fixture(scope="module")
def written(report, tmp_path_factory):
    return write_report(report, tmp_path_factory.mktemp("report") / "out")


def _colours(pixels: np.ndarray) -> int:
    """Distinct RGB colours of an image (floats in [0, 1], as matplotlib reads a PNG)."""
    rgb = np.round(pixels[..., :3] * 255).astype(np.uint32)
    return len(np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]))


def _reject_constant(name):
    raise AssertionError(f"non-standard JSON constant {name}")


def test_json_is_strict_and_round_trips(report, written):
    paths = written
    assert sorted(p.name for p in paths["json"].parent.iterdir()) == ["report.html", "report.json", "report.json.sha256"]
    text = paths["json"].read_text()
    loaded = json.loads(text, parse_constant=_reject_constant)
    assert loaded["schema"] == "lowbit.report/1"
    assert set(loaded) == {"schema", "header", "summary", "layers", "sensitivity", "histogram_layers", "histograms"}
    assert to_json(read_report(paths["json"])) == text
    assert read_report(paths["json"])["layers"][0]["sqnr_db"] == report["layers"][0]["sqnr_db"]


def test_html_is_self_contained_with_one_image_per_chart(report, written):
    page = written["html"].read_text()
    assert "<script" not in page and not re.search(r"(src|href)=\"(https?:|//|file:)", page)
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3 + len(report["histograms"])  # SQNR, bits, sensitivity + histograms
    from matplotlib.image import imread

    for data in images:
        pixels = imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert pixels.shape[0] >= 200 and pixels.shape[1] >= 600
        assert _colours(pixels) > 20  # drawn, not blank
    for row in report["layers"]:
        assert row["name"] in page


def test_histograms_of_the_worst_layers_carry_their_grid(report, mixed_graph, toy_model):
    worst = sorted(report["layers"], key=lambda row: row["sqnr_db"])[:2]
    assert report["histogram_layers"] == [row["name"] for row in worst]
    entries = {(entry["layer"], entry["role"]): entry for entry in report["histograms"]}
    for entry in entries.values():
        assert sum(entry["counts"]) == entry["samples"] and len(entry["bin_edges"]) == len(entry["counts"]) + 1
        assert all(entry["bin_edges"][0] <= value <= entry["bin_edges"][-1] for value in entry["grid"])
    if ("seq_blocks_1", "data_in") in entries:  # unsigned Q2.2: all 16 values, a fixed grid [0, 3.75]
        entry = entries["seq_blocks_1", "data_in"]
        assert entry["grid_kind"] == "fixed" and entry["format_range"] == [0.0, 3.75]
        assert entry["grid"] == [k / 4 for k in range(16)]


def test_observed_grid_of_a_data_derived_format(mixed_graph, toy_model, toy_batches):
    args = {"float_model": toy_model, "inputs": toy_batches[0], "histogram_layers": ["seq_blocks_2"],
            "sensitivity": False}
    report = quantization_report_analysis_pass(mixed_graph, args)[1]["report"]
    entry = next(e for e in report["histograms"] if e["role"] == "weight")
    layer = mixed_graph.model.get_submodule("seq_blocks.2")
    produced = torch.unique(layer.formats.weight.quantize(layer.weight.detach())).double()
    assert entry["grid_kind"] == "observed" and entry["grid_in_view"] == produced.numel()
    assert entry["format"] == layer.formats.weight.describe() and entry["samples"] == 10000


def test_printed_table_and_files_from_the_pass(mixed_graph, toy_model, toy_batches, tmp_path, capsys):
    args = {"float_model": toy_model, "inputs": toy_batches[0][:1], "save_dir": tmp_path, "print_table": True,
            "sensitivity": False, "histogram_layers": 0}  # fmt: skip
    _, info = quantization_report_analysis_pass(mixed_graph, args)
    printed = capsys.readouterr().out
    assert "seq_blocks_2" in printed and "affine(bits=4, symmetric=True, axis=0)" in printed
    assert f"{info['report']['summary']['total_bytes']:,} bytes vs 43,208 in fp32" in printed
    assert (tmp_path / "report.json").is_file() and (tmp_path / "report.html").is_file()
    console = rich_console.Console(record=True, width=200, file=io.StringIO())
    print_report(info["report"], console)
    text = console.export_text()
    assert "Formats per role" in text and "mxint8" in text


def test_a_bit_flipped_report_json_is_refused(tmp_path):
    """report.json.sha256 is published with the report: every flipped byte is refused, none read as other numbers."""
    from lowbit._checksum import sidecar_of, sidecar_text
    from lowbit.errors import FormatError
    from lowbit.report.files import to_json

    report = {"schema": "lowbit.report/1", "summary": {"sqnr_db": 12.5}, "layers": [{"name": "fc", "bits": 4.0}]}
    path = tmp_path / "r" / "report.json"  # written as write_report publishes it (render_html needs a full report)
    path.parent.mkdir()
    path.write_text(to_json(report))
    sidecar_of(path).write_text(sidecar_text(path.name, path.read_bytes()))
    original = path.read_bytes()
    for index in range(len(original)):
        path.write_bytes(original[:index] + bytes([original[index] ^ 0x04]) + original[index + 1 :])
        with pytest.raises(FormatError, match="report.json"):
            read_report(path)
    path.write_bytes(original)
    assert read_report(path)["summary"]["sqnr_db"] == 12.5
    sidecar_of(path).unlink()  # an older lowbit's report: read, with a warning
    with pytest.warns(UserWarning, match="no checksum"):
        assert read_report(path)["summary"]["sqnr_db"] == 12.5
