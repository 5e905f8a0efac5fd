"""Two ``lowbit search`` processes on one study in a real PostgreSQL server (started here on loopback from
Debian's postgresql binaries, which .ci/run installs): no trial lost or numbered twice.

Skipped only when the server binaries (initdb, pg_ctl) are absent; everything else that goes wrong fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from tests.search.configs import TOY_MASE_STRINGS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BINARIES = [shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
            for name in ("initdb", "pg_ctl")]  # fmt: skip
pytestmark = pytest.mark.skipif(None in BINARIES, reason="PostgreSQL server binaries (initdb, pg_ctl) not installed")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_server_user(command: list[str]) -> list[str]:
    """initdb refuses to run as root: run the server as Debian's postgres user then."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture
def postgres_url():
    initdb, pg_ctl = (str(path) for path in BINARIES)
    folder = Path(tempfile.mkdtemp(prefix="lowbit-pg-"))
    os.chmod(folder, 0o755)
    data, sockets = folder / "data", folder / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        shutil.chown(sockets, "postgres")
    port = _free_port()
    subprocess.run(_as_server_user([initdb, "-D", str(data), "-A", "trust", "-U", "lowbit"]), check=True,
                   capture_output=True)  # fmt: skip
    options = f"-h 127.0.0.1 -p {port} -k {sockets}"
    subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start"]),
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield f"postgresql://lowbit@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_two_processes_share_one_postgres_study(tmp_path, postgres_url):
    from lowbit.search import run_search

    config = tmp_path / "search.toml"
    config.write_text(TOY_MASE_STRINGS)
    code = ("import sys; from lowbit.search import run_search; "
            "run_search(sys.argv[1], sys.argv[2], n_trials=3, storage=sys.argv[3], worker=int(sys.argv[4]))")  # fmt: skip
    processes = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", code, str(config), str(tmp_path / f"out{w}"),
                                   postgres_url, str(w)], cwd=ROOT) for w in (0, 1)]  # fmt: skip
    assert [p.wait(timeout=240) for p in processes] == [0, 0]
    result = run_search(config, tmp_path / "out", storage=postgres_url, only_outputs=True)
    assert sorted(r["number"] for r in result["records"]) == list(range(6))
    assert len(result["study"].trials) == 6
