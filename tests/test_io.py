"""lowbit._io: atomic files and folders, crash at every step (old or new, never a mixture, strays cleaned
on the next write), and file modes that never touch the process umask (threads)."""

import os
import stat
import threading
from pathlib import Path

import pytest

from lowbit import _io
from lowbit._io import atomic_directory, atomic_write_bytes, atomic_write_text, remove_stale, write_file
from lowbit.errors import LowbitError


def test_atomic_write_creates_and_replaces(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    assert sorted(os.listdir(target.parent)) == ["out.txt"]


def test_a_folder_in_place_of_the_file_is_one_clear_error(tmp_path):
    (tmp_path / "out.bin").mkdir()
    with pytest.raises(LowbitError, match="a folder of that name exists"):
        atomic_write_bytes(tmp_path / "out.bin", b"data")
    assert os.listdir(tmp_path) == ["out.bin"] and os.listdir(tmp_path / "out.bin") == []


def test_failed_write_keeps_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


# ---- modes and the umask ------------------------------------------------------------------------------------
@pytest.fixture
def umask_027():
    set_umask = os.umask  # kept: a test may forbid os.umask before this teardown runs
    previous = set_umask(0o027)  # the test runs single-threaded here; restored after
    yield 0o027
    set_umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_modes_follow_the_umask_without_reading_it(tmp_path, monkeypatch, umask_027):
    def forbidden(mask):
        raise AssertionError("os.umask called: it changes the umask of every thread")

    monkeypatch.setattr(os, "umask", forbidden)
    atomic_write_bytes(tmp_path / "f.bin", b"x")
    with atomic_directory(tmp_path / "d") as building:
        write_file(building / "a", b"a")
    assert mode(tmp_path / "f.bin") == 0o640 and mode(tmp_path / "d" / "a") == 0o640
    assert mode(tmp_path / "d") == 0o750


def test_other_threads_files_keep_their_mode_while_writing(tmp_path, umask_027):
    errors, made = [], []

    def writer(index):
        try:
            for step in range(30):
                atomic_write_bytes(tmp_path / f"atomic{index}.bin", bytes(step))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def creator(index):
        for step in range(200):
            path = tmp_path / f"plain{index}-{step}"
            with open(path, "w"):
                pass
            made.append(path)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    threads += [threading.Thread(target=creator, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert {mode(path) for path in made} == {0o640}
    assert {mode(tmp_path / f"atomic{i}.bin") for i in range(2)} == {0o640}


# ---- folders ------------------------------------------------------------------------------------------------
def write_version(target, version: str, owned=("a", "b", "c")) -> None:
    with atomic_directory(target, owned=owned) as building:
        for name in ("a", "b", "c"):
            write_file(building / name, f"{name}-{version}".encode())


def version_of(target) -> str | None:
    """'old' / 'new' when every owned file is from that version (foreign file intact), else None."""
    if not target.is_dir() or (target / "foreign.txt").read_text() != "keep":
        return None
    found = {(target / name).read_text().partition("-")[2] for name in ("a", "b", "c") if (target / name).exists()}
    return found.pop() if len(found) == 1 and all((target / n).exists() for n in "abc") else None


def strays(target) -> list[str]:
    return [name for name in os.listdir(target.parent) if name.startswith(f".{target.name}.lowbit-")]


def test_atomic_directory_replaces_owned_files_and_keeps_others(tmp_path):
    target = tmp_path / "out"
    write_version(target, "old", owned=("a", "b", "c", "stale"))
    (target / "foreign.txt").write_text("keep")
    (target / "stale").write_text("from an earlier save")
    (target / "sub").mkdir()
    (target / "sub" / "x").write_text("nested")
    write_version(target, "new", owned=("a", "b", "c", "stale"))
    assert version_of(target) == "new" and not (target / "stale").exists()
    assert (target / "sub" / "x").read_text() == "nested"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_failure_inside_the_block_leaves_the_old_folder(tmp_path):
    target = tmp_path / "out"
    write_version(target, "old")
    (target / "foreign.txt").write_text("keep")
    with pytest.raises(RuntimeError), atomic_directory(target) as building:
        write_file(building / "a", b"half")
        raise RuntimeError("serializer failed")
    assert version_of(target) == "old" and strays(target) == []


def test_refuses_a_file_in_place_of_the_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(LowbitError, match="a file of that name exists"), atomic_directory(tmp_path / "file"):
        pass
    assert (tmp_path / "file").read_text() == "x"


def test_the_working_directory_is_swapped_whole_and_followed(tmp_path, monkeypatch):
    target = tmp_path / "out"
    write_version(target, "old", owned=("a", "b", "c", "stale"))
    (target / "stale").write_text("owned, not written again")
    (target / "foreign.txt").write_text("keep")
    (target / "sub").mkdir()
    monkeypatch.chdir(target / "sub")
    old_inode = os.stat(target).st_ino
    with atomic_directory("..", owned=("a", "b", "c", "stale")) as building:
        for name in ("a", "b", "c"):
            write_file(building / name, f"{name}-new".encode())
    assert os.stat(target).st_ino != old_inode  # one rename published a new folder, not files one by one
    assert version_of(target) == "new" and not (target / "stale").exists()
    assert Path.cwd() == target / "sub" and os.path.samefile(".", target / "sub")  # followed into the new one
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_crash_saving_the_working_directory_leaves_old_or_new(tmp_path, monkeypatch):
    target = tmp_path / "out"
    write_version(target, "old")
    (target / "foreign.txt").write_text("keep")
    monkeypatch.chdir(target)
    monkeypatch.setattr(_io, "_publish", lambda building, target: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt), atomic_directory(".") as building:
        write_file(building / "a", b"a-new")
    assert version_of(target) == "old" and strays(target) == [] and Path.cwd() == target


def test_the_root_is_written_file_by_file_commit_file_last(tmp_path, monkeypatch):
    monkeypatch.setattr(_io, "_is_root", lambda target: True)  # a folder that cannot be renamed
    (tmp_path / "stale").write_text("owned, not written again")
    (tmp_path / "notes").write_text("keep")
    order = []
    monkeypatch.setattr(_io, "_replace", lambda source, target: (order.append(target.name), os.replace(source, target)))
    with atomic_directory(tmp_path, owned=("a", "manifest", "z", "stale"), last="manifest") as building:
        for name in ("manifest", "z", "a"):
            write_file(building / name, name.encode())
    assert order == ["a", "z", "manifest"]
    assert sorted(os.listdir(tmp_path)) == ["a", "manifest", "notes", "z"]
    assert (tmp_path / "manifest").read_text() == "manifest" and (tmp_path / "notes").read_text() == "keep"


STEPS = ("_write", "_replace", "_rename", "_exchange", "_fsync_directory")


def crash_child(target, step_limit: int, exchange: bool) -> int:
    """Fork a writer of 'new' that dies (os._exit, no cleanup) at its ``step_limit``-th step; its exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            count = [0]
            for name in STEPS:
                original = getattr(_io, name)

                def step(*args, _original=original, **kwargs):
                    count[0] += 1
                    if count[0] == step_limit:
                        os._exit(137)
                    return _original(*args, **kwargs)

                setattr(_io, name, step)
            if not exchange:
                _io._exchange = lambda first, second: False
            write_version(target, "new")
        finally:
            os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to kill a writer without cleanup")
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_kill_at_every_step_leaves_old_or_new(tmp_path, exchange):
    outcomes = []
    for limit in range(1, 40):
        target = tmp_path / f"run{limit}" / "out"
        write_version(target, "old")
        (target / "foreign.txt").write_text("keep")
        code = crash_child(target, limit, exchange)
        if code == 0:
            break
        assert code == 137
        if exchange or target.exists():  # two renames: a reader may find the folder missing in between
            assert version_of(target) in ("old", "new"), limit
        remove_stale(target)  # what the next write does first: repairs and removes what the dead writer left
        outcomes.append(version_of(target))
        assert outcomes[-1] in ("old", "new") and strays(target) == [], limit
        write_version(target, "third")
        assert version_of(target) == "third" and strays(target) == []
    assert code == 0 and outcomes[0] == "old" and outcomes[-1] == "new" and len(outcomes) >= 5


def test_stale_files_of_a_live_writer_are_left_alone(tmp_path):
    target = tmp_path / "out.bin"
    dead = tmp_path / f".out.bin.lowbit-{2**22 + 12345}-abc.tmp"  # above Linux's default pid_max
    live = tmp_path / f".out.bin.lowbit-{os.getppid()}-abc.tmp"
    own = tmp_path / f".out.bin.lowbit-{os.getpid()}-abc.tmp"
    foreign = tmp_path / ".out.bin.lowbit-notes.txt"
    for path in (dead, live, own, foreign):
        path.write_bytes(b"x")
    atomic_write_bytes(target, b"new")
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in (target, live, own, foreign))
