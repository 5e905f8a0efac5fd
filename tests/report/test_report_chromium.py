"""report.html opens in headless Chromium and shows its charts: a screenshot of the page has many colours,
many non-white pixels and the charts' own bar colour. CI installs Debian's chromium (.ci/run)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from lowbit.report import quantization_report_analysis_pass, write_report

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason=f"headless Chromium ({CHROMIUM}) is not installed; .ci/run installs it"
)
BAR_BLUE = np.array([0x4C, 0x72, 0xB0])  # charts._BAR: the SQNR bars and the histograms


def _screenshot(page: str, directory) -> np.ndarray:
    shot = directory / "shot.png"
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={directory / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
        f"file://{page}",
    ]  # fmt: skip
    environment = {**os.environ, "HOME": str(directory)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=environment, cwd=directory)
    assert shot.is_file(), f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    from matplotlib.image import imread

    return np.round(imread(shot)[..., :3] * 255).astype(np.int64)  # [2000, 1200, 3]


def test_report_html_shows_its_charts_in_chromium(mixed_graph, toy_model, toy_batches, tmp_path):
    batches, labels = toy_batches
    args = {"float_model": toy_model, "inputs": batches[:1], "labels": labels[:1], "histogram_layers": 1}
    report = quantization_report_analysis_pass(mixed_graph, args)[1]["report"]
    page = write_report(report, tmp_path / "out")["html"]
    pixels = _screenshot(str(page.resolve()), tmp_path)
    assert pixels.shape == (2000, 1200, 3)
    packed = (pixels[..., 0] << 16) | (pixels[..., 1] << 8) | pixels[..., 2]
    assert len(np.unique(packed)) > 500  # text, tables and anti-aliased charts, not a blank page
    not_white = float((pixels.min(axis=-1) < 235).mean())
    assert not_white > 0.05, not_white
    bar_pixels = int((np.abs(pixels - BAR_BLUE).max(axis=-1) <= 6).sum())
    assert bar_pixels > 2000, bar_pixels  # the SQNR chart's bars are on the first screen
