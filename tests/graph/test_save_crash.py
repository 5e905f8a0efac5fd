"""Multi-file outputs survive a crash at any point: save_graph and write_report, interrupted after every
step (monkeypatched) and by real SIGKILLs, leave the previous version or the new one, never a mixture, and
the next write removes what a killed writer left behind."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import lowbit
from lowbit import _io
from lowbit.graph.qgraph import QGraph
from lowbit.graph.save_load import GRAPH_FILE, META_FILE, STATE_FILE, load_graph, save_graph

pytest.importorskip("safetensors")
STEPS = ("_write", "_replace", "_rename", "_exchange", "_fsync_directory")


class Killed(BaseException):
    """Stands for the process dying at that step (not an Exception: nothing may swallow it)."""


def crash_at(monkeypatch, limit: int) -> None:
    count = [0]
    for name in STEPS:
        original = getattr(_io, name)

        def step(*args, _original=original, **kwargs):
            count[0] += 1
            if count[0] == limit:
                raise Killed(limit)
            return _original(*args, **kwargs)

        monkeypatch.setattr(_io, name, step)


def graph(value: float) -> QGraph:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)
    return QGraph(model)


def saved_value(directory) -> float:
    """The one value every parameter of the saved graph holds (load_graph checks all file checksums)."""
    values = {float(v) for p in load_graph(directory).model.parameters() for v in p.detach().flatten()}
    assert len(values) == 1
    return values.pop()


def strays(directory) -> list[str]:
    return [name for name in os.listdir(directory.parent) if ".lowbit-" in name]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_save_graph_interrupted_at_every_step(tmp_path, monkeypatch, exchange):
    seen = []
    for limit in range(1, 40):
        directory = tmp_path / f"n{limit}" / "saved"
        save_graph(graph(1.0), directory)
        (directory / "notes.txt").write_text("a user's file")
        with monkeypatch.context() as patch:
            crash_at(patch, limit)
            if not exchange:
                patch.setattr(_io, "_exchange", lambda first, second: False)
            try:
                save_graph(graph(2.0), directory)
                done = True
            except Killed:
                done = False
        seen.append(saved_value(directory))
        assert seen[-1] in (1.0, 2.0) and (directory / "notes.txt").read_text() == "a user's file"
        assert strays(directory) == [], limit
        if done:
            break
    assert done and seen[0] == 1.0 and seen[-1] == 2.0 and len(seen) > 5


def test_write_report_interrupted_at_every_step(tmp_path, monkeypatch):
    from lowbit.report import html
    from lowbit.report.files import read_report, write_report

    monkeypatch.setattr(html, "render_html", lambda report: f"<p>{report['summary']['version']}</p>")
    for limit in range(1, 40):
        directory = tmp_path / f"n{limit}"
        write_report({"layers": [], "summary": {"version": 1}}, directory)
        with monkeypatch.context() as patch:
            crash_at(patch, limit)
            try:
                write_report({"layers": [], "summary": {"version": 2}}, directory)
                done = True
            except Killed:
                done = False
        version = read_report(directory / "report.json")["summary"]["version"]
        assert (directory / "report.html").read_text() == f"<p>{version}</p>"
        assert strays(directory) == []
        if done:
            break
    assert done and version == 2


WRITER = textwrap.dedent("""
    import sys, torch
    from torch import nn
    import lowbit
    from lowbit.graph.qgraph import QGraph
    from lowbit.graph.save_load import save_graph

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    value = 1.0
    while True:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(value)
        save_graph(QGraph(model), sys.argv[1])
        lowbit.save(model, sys.argv[2])
        print(value, flush=True)
        value += 1.0
""")


def test_sigkill_of_a_saving_process_leaves_a_loadable_save_and_strays_are_cleaned(tmp_path):
    directory, file, rng = tmp_path / "saved", tmp_path / "model.safetensors", random.Random(0)
    for attempt in range(2):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(file)], stdout=subprocess.PIPE,
                                  text=True)  # fmt: skip
        completed = [float(writer.stdout.readline()) for _ in range(1 + rng.randrange(3))]
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        value = saved_value(directory)
        assert completed[-1] <= value <= completed[-1] + 1  # the last reported save, or the one it was writing
        assert sorted(os.listdir(directory)) == [GRAPH_FILE, META_FILE, STATE_FILE]
        state = lowbit.load(file)  # lowbit.save: one file, the last complete version
        assert completed[-1] <= float(state["0.weight"][0, 0]) <= completed[-1] + 1
        save_graph(graph(0.5), directory)  # the next writes remove what the killed one left behind
        lowbit.save({"x": torch.ones(2)}, file)
        assert strays(directory) == [] and strays(file) == [] and saved_value(directory) == 0.5


def test_readers_during_repeated_saves_see_one_whole_save(tmp_path):
    import threading

    directory = tmp_path / "saved"
    save_graph(graph(1.0), directory)
    versions, finished = (graph(1.0), graph(2.0)), threading.Event()

    def writer():
        try:
            for index in range(12):
                save_graph(versions[index % 2], directory)
        finally:
            finished.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = set()
    while not finished.is_set():
        seen.add(saved_value(directory))  # raises if a load mixed two saves
    thread.join()
    assert seen <= {1.0, 2.0} and strays(directory) == []


def test_save_into_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a user's file")
    save_graph(graph(1.0), ".")
    save_graph(graph(2.0), ".")
    assert saved_value(tmp_path) == 2.0 and (tmp_path / "notes.txt").read_text() == "a user's file"
    assert sorted(os.listdir(tmp_path)) == sorted([GRAPH_FILE, META_FILE, STATE_FILE, "notes.txt"])


def test_extra_files_are_published_with_the_graph(tmp_path):
    files = save_graph(graph(1.0), tmp_path / "g", extra_files={"run.json": b'{"model": "toy"}'})
    assert (tmp_path / "g" / "run.json").read_bytes() == b'{"model": "toy"}' and tmp_path / "g" / "run.json" in files
    assert saved_value(tmp_path / "g") == 1.0
    (tmp_path / "g" / "module.json").write_text("{}")  # as a module-style save would have left
    files = save_graph(graph(1.5), tmp_path / "g", extra_files={"module.json": None})
    assert sorted(os.listdir(tmp_path / "g")) == sorted([GRAPH_FILE, META_FILE, STATE_FILE, "run.json"])  # kept
    assert sorted(path.name for path in files) == sorted([GRAPH_FILE, META_FILE, STATE_FILE])
    from lowbit.graph.qgraph import GraphError

    for bad in ({GRAPH_FILE: b"x"}, {"a/b": b"x"}, {"run.json": "text"}):
        with pytest.raises(GraphError, match="extra_files"):
            save_graph(graph(2.0), tmp_path / "g", extra_files=bad)
    assert saved_value(tmp_path / "g") == 1.5
