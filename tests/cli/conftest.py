"""Helpers for the command-line tests: run ``lowbit`` in this process and capture what it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lowbit.cli import main


class Runner:
    def __init__(self, root: Path, capsys) -> None:
        self.root, self.capsys = root, capsys

    def __call__(self, *argv: str, quiet: bool = True) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of ``lowbit argv...`` with outputs under the test's folder."""
        argv = list(argv)
        if argv and argv[0] in ("train", "test", "transform", "report"):
            argv += ["--project-dir", str(self.root / "out"), "--no-progress"]
            if quiet:
                argv += ["--print-config", "false"]
        self.capsys.readouterr()
        status = main(argv)
        captured = self.capsys.readouterr()
        return status, captured.out, captured.err

    def software(self, project: str) -> Path:
        return self.root / "out" / project / "software"

    def metrics(self, project: str, kind: str = "test") -> dict:
        path = self.software(project) / ("test" if kind == "test" else "training_ckpts") / "metrics.json"
        return json.loads(path.read_text())


@pytest.fixture
def lowbit_cli(tmp_path, capsys, monkeypatch) -> Runner:
    monkeypatch.chdir(tmp_path)
    return Runner(tmp_path, capsys)
