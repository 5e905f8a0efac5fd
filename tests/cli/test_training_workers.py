"""Training processes: --devices bounded by the cores present, and workers that end with their launcher
(SIGKILL or SIGTERM of it) through prctl(PR_SET_PDEATHSIG) on Linux or the polling fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lowbit.errors import ConfigError
from lowbit.train.workers import available_cores, check_devices

pytest.importorskip("lightning")


def test_devices_beyond_the_cores_present_are_refused():
    check_devices(available_cores(), "cpu")  # every core: allowed
    with pytest.raises(ConfigError, match="core"):
        check_devices(available_cores() + 1, "cpu")
    check_devices("auto", "cpu")


def test_the_command_line_refuses_99_devices_in_one_line(tmp_path, capsys):
    from lowbit.cli import main

    status = main(["train", "toy", "toy_tiny", "--accelerator", "cpu", "--devices", "99", "--strategy", "ddp",
                   "--project-dir", str(tmp_path), "--no-progress", "--print-config", "false"])  # fmt: skip
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1 and "--devices 99" in error
    assert not (tmp_path / "toy_classification_toy_tiny").exists()  # refused before any work


WORKER = """
import sys, time
from lowbit.train import workers
if sys.argv[1] == "poll":
    workers._parent_death_signal = lambda: False
assert workers.bind_to_launcher(poll_seconds=0.1)
print("ready", flush=True)
time.sleep(120)
"""
LAUNCHER = """
import os, subprocess, sys
os.environ["LOWBIT_LAUNCHER_PID"] = str(os.getpid())
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == "ready"
print(worker.pid, flush=True)
worker.wait()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie waiting to be reaped has ended


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see the worker")
@pytest.mark.parametrize(("how", "kill"), [("prctl", signal.SIGKILL), ("prctl", signal.SIGTERM),
                                           ("poll", signal.SIGKILL)])  # fmt: skip
def test_workers_end_with_their_launcher(how, kill):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, textwrap.dedent(WORKER), how], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "LOCAL_RANK": "1"})  # fmt: skip
    try:
        worker = int(launcher.stdout.readline())
        assert _alive(worker)
        launcher.send_signal(kill)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), f"worker {worker} outlived its launcher ({how}, {kill.name})"
    finally:
        launcher.kill()
        launcher.wait()


def test_a_process_that_is_not_a_worker_is_left_alone(monkeypatch):
    from lowbit.train.workers import LAUNCHER_VARIABLE, bind_to_launcher

    monkeypatch.setenv(LAUNCHER_VARIABLE, str(os.getpid()))
    assert bind_to_launcher() is False
    monkeypatch.delenv(LAUNCHER_VARIABLE)
    assert bind_to_launcher() is False
