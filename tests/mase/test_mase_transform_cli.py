"""Every fixture in MASE's config shapes runs through `lowbit transform` unchanged, and its saved model
reloads in `lowbit test` (the command line side of the ported MASE tests)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lowbit.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
QUANTIZE_FIXTURES = sorted(p.name for p in FIXTURES.glob("*.toml") if "[passes.quantize" in p.read_text())


def _run(tmp_path: Path, capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main([*argv, "--project-dir", str(tmp_path / "out"), "--no-progress", "--print-config", "false"])
    return status, capsys.readouterr().err


@pytest.mark.parametrize("fixture", QUANTIZE_FIXTURES)
def test_fixture_transforms_and_the_result_reloads(fixture, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, err = _run(tmp_path, capsys, "transform", "--config", str(FIXTURES / fixture), "--project", "p")
    assert status == 0, err
    software = tmp_path / "out" / "p" / "software"
    transformed = software / "transform" / "transformed_ckpt"
    assert transformed.is_dir(), sorted(p.name for p in software.rglob("*"))
    status, err = _run(tmp_path, capsys, "test", "toy", "toy_tiny", "--load", str(transformed), "--project", "p")
    assert status == 0, err
    metrics = json.loads((software / "test" / "metrics.json").read_text())
    accuracy = next(value for key, value in metrics.items() if "acc" in key)
    assert math.isfinite(accuracy) and 0.0 <= accuracy <= 1.0


def test_every_quantize_fixture_is_covered():
    assert len(QUANTIZE_FIXTURES) >= 12, QUANTIZE_FIXTURES
