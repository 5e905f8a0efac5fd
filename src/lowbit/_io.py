"""Crash-safe output: a reader sees the old version of a file or folder or the new one, never a mixture.

- :func:`atomic_write_bytes` / :func:`atomic_write_text`: one file, written to a temporary sibling, fsynced,
  renamed over the target; :func:`atomic_file` the same for a writer that takes a file name.
- :func:`sealed` / :func:`seal_matches`: a SHA-256 seal over every byte of a file, kept inside it.
- :func:`atomic_directory`: a folder of several files, built in a temporary sibling folder and swapped in
  with one rename (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames, see below).
- :func:`read_regular_file` / :func:`check_regular_file`: what every reader uses: only regular files, opened
  so that a FIFO cannot block, read no further than the size the file had when opened.

Temporary names are ``.<target name>.lowbit-<pid>-<token>.tmp`` (a new file or folder being built) and
``...old`` (a replaced folder waiting to be removed). A writer killed mid-way leaves them behind; the next
write of the same target removes those whose process is gone (a live writer's are left alone), and, where a
fallback swap was cut between its two renames, puts the previous folder back first.

File modes: temporaries are created with ``os.open(..., 0o666)`` / ``os.mkdir(..., 0o777)``, so the kernel
applies the process umask itself at creation. The umask is never read or changed (reading it with
``os.umask`` means setting it, which races with other threads creating files).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from lowbit.errors import LowbitError

_MARK = ".lowbit-"


# ---- one file ----------------------------------------------------------------------------------------------
def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    target, temporary = _file_target(path)
    try:
        write_file(temporary, data)
        _replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(target.parent)


def _file_target(path: str | os.PathLike) -> tuple[Path, Path]:
    """(the file to publish, its temporary sibling): refused if a folder has that name; its parent made and
    stale temporaries of earlier writers removed."""
    target = Path(path)
    if target.is_dir():
        raise LowbitError(f"cannot write the file {str(path)!r}: a folder of that name exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    return target, _temporary_name(target, "tmp")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling path for a writer that wants a file name (a library's own writer); once the block
    ends without an error that file is fsynced and renamed over ``path``, else removed."""
    target, temporary = _file_target(path)
    try:
        yield temporary
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        _replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(target.parent)


def write_file(path: str | os.PathLike, data: bytes) -> None:
    """Create ``path`` (it must not exist; mode 0o666 less the umask), write ``data``, fsync. Not atomic by
    itself: for files inside a folder that :func:`atomic_directory` publishes, or a temporary file."""
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    with os.fdopen(handle, "wb") as stream:
        _write(stream, data)
        stream.flush()
        os.fsync(stream.fileno())


# ---- a folder ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, owned: Iterable[str] | None = None,
                     last: str | None = None) -> Iterator[Path]:  # fmt: skip
    """Build a new version of the folder ``path`` and publish it whole.

    Yields an empty temporary folder beside ``path``; write the new files there (:func:`write_file`). When
    the ``with`` block ends without an exception, the folder is fsynced and swapped in with one rename, and
    the previous version removed; on an exception it is removed and ``path`` is left as it was.

    ``owned``: the names this writer manages. Entries of the previous folder not in ``owned`` and not
    written anew (another tool's files in the same folder) are carried into the new version as hard links
    (copies where links are impossible), so they are not lost. ``owned=None``: the writer owns the whole
    folder; nothing is carried over.

    A folder holding the working directory (``"."``) is swapped like any other, and the process then moves
    its working directory into the new version (the same relative place, or the folder itself): a relative
    path opened meanwhile by another thread of this process, or another process's working directory there,
    still points into the previous version. The file system root cannot be swapped: it is written file by
    file, each file atomically, ``last`` (the file that commits the save, e.g. a manifest of checksums) after
    the others, owned files not written anew removed.
    """
    target = Path(os.path.realpath(path))  # "." and symlinks: the folder itself, beside its real parent
    if target.exists() and not target.is_dir():
        raise LowbitError(f"cannot write the folder {str(path)!r}: a file of that name exists")
    in_place = _is_root(target)
    working = _working_directory()
    home = target / ".lowbit-dir" if in_place else target
    home.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(home)
    building = _temporary_name(home, "tmp")
    os.mkdir(building, 0o777)
    try:
        yield building
        if in_place:
            _move_files(building, target, set(owned or ()), last)
            return
        if owned is not None and target.is_dir():
            _carry_over(target, building, set(owned))
        _fsync_directory(building)
        _publish(building, target)
        if working.is_relative_to(target):
            _follow_into(target, working)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _is_root(target: Path) -> bool:
    return target == target.parent


def _follow_into(target: Path, working: Path) -> None:
    """The working directory was inside the folder just swapped out: move it to the same place in the new one."""
    same_place = target / working.relative_to(target)
    with contextlib.suppress(OSError):  # the save itself is done; a folder we may not enter is not its failure
        os.chdir(same_place if same_place.is_dir() else target)


def _move_files(building: Path, target: Path, owned: set[str], last: str | None) -> None:
    names = sorted(os.listdir(building), key=lambda name: (name == last, name))
    for name in names:
        _replace(building / name, target / name)
    for name in owned - set(names):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target / name)
    _fsync_directory(target)


def _working_directory() -> Path:
    try:
        return Path.cwd()
    except OSError:  # the working directory was removed: it cannot be inside the target
        return Path("/\0")


def _carry_over(old: Path, new: Path, owned: set[str]) -> None:
    for entry in os.scandir(old):
        if entry.name in owned or (new / entry.name).exists():
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.copytree(entry.path, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry.path, new / entry.name)


def _link_or_copy(source: str, destination: str | os.PathLike) -> None:
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, destination, follow_symlinks=False)


def _publish(building: Path, target: Path) -> None:
    """Put ``building`` at ``target``: one atomic exchange where the system has it, else two renames."""
    if not target.exists():
        _rename(building, target)
    elif _exchange(building, target):
        shutil.rmtree(building, ignore_errors=True)  # it now holds the previous version
    else:  # a reader may find ``target`` missing between the two renames; remove_stale repairs a crash there
        old = _temporary_name(target, "old")
        _rename(target, old)
        try:
            _rename(building, target)
        except BaseException:
            os.rename(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    _fsync_directory(target.parent)


# ---- seals: one SHA-256 over every byte of a file, stored inside the file itself --------------------------
# The writer puts 64 "?" where the digest goes, hashes the whole file, and writes the 64 hex digits in their
# place (same length, so nothing else moves). The reader finds the recorded digest (exactly once in the sealed
# region), reads it back as 64 "?" and hashes again: any changed byte, the digest's own included, makes the
# two differ. A seal detects corruption and accidental edits; it is not a signature (whoever edits a file on
# purpose can seal it again).
PLACEHOLDER = "?" * 64
_HEX = frozenset("0123456789abcdef")


def seal_of(blob: bytes, start: int) -> str:
    """SHA-256 (hex) of ``blob`` with the 64 bytes at ``start`` read as ``?``."""
    digest = hashlib.sha256(memoryview(blob)[:start])
    digest.update(PLACEHOLDER.encode())
    digest.update(memoryview(blob)[start + len(PLACEHOLDER) :])
    return digest.hexdigest()


def sealed(blob: bytes, begin: int = 0, end: int | None = None) -> bytes:
    """``blob`` with its one placeholder (searched in ``blob[begin:end]``) replaced by the seal; ValueError
    when the placeholder is missing or occurs more than once."""
    token = PLACEHOLDER.encode()
    start = blob.find(token, begin, end)
    if start < 0 or blob.find(token, start + 1, end) >= 0:
        raise ValueError("the seal placeholder must occur exactly once")
    return blob[:start] + seal_of(blob, start).encode() + blob[start + len(token) :]


def seal_matches(blob: bytes, recorded: object, begin: int = 0, end: int | None = None) -> bool:
    """Whether ``recorded`` (the digest a reader parsed) is the valid seal of ``blob``."""
    if not isinstance(recorded, str) or len(recorded) != 64 or not set(recorded) <= _HEX:
        return False
    token = recorded.encode()
    start = blob.find(token, begin, end)
    if start < 0 or blob.find(token, start + 1, end) >= 0:
        return False
    return seal_of(blob, start) == recorded


# ---- reading back ------------------------------------------------------------------------------------------
# Every file lowbit reads goes through these: a path that names a device (/dev/zero never ends), a FIFO (its
# open waits for a writer) or a socket is refused before a byte is read, and a read takes at most the size the
# file had when it was opened. The refusal is an OSError, so each reader's own "cannot read" error names it.
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def check_regular_file(path: str | os.PathLike) -> os.stat_result:
    """``os.stat`` of ``path``; OSError (its strerror says what the path is) unless it is a regular file."""
    info = os.stat(path)
    _refuse_irregular(path, info)
    return info


def read_regular_file(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most its size when opened (and at most ``limit``).

    Opened non-blocking, so a FIFO without a writer cannot hang the open; anything but a regular file is an
    OSError before reading, and so is a file larger than ``limit`` (nothing is allocated for it)."""
    handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(handle)
        _refuse_irregular(path, info)
        size = info.st_size
        if limit is not None and size > limit:
            raise OSError(errno.EFBIG, f"larger than the {limit} bytes such a file may have ({size} bytes)", str(path))
        chunks, remaining = [], size
        while remaining > 0:
            chunk = os.read(handle, min(remaining, 1 << 24))
            if not chunk:
                break  # shrank while being read: the reader's own checks see the short content
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(handle)


def read_regular_text(path: str | os.PathLike, limit: int | None = None) -> str:
    """:func:`read_regular_file` decoded as UTF-8 (UnicodeDecodeError for other bytes)."""
    return read_regular_file(path, limit).decode("utf-8")


def _refuse_irregular(path: str | os.PathLike, info: os.stat_result) -> None:
    if stat.S_ISREG(info.st_mode):
        return
    kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
    raise OSError(errno.EINVAL, f"{kind}, not a regular file: lowbit reads only regular files", str(path))


# ---- stale temporaries -------------------------------------------------------------------------------------
def remove_stale(path: str | os.PathLike) -> list[Path]:
    """Remove the temporaries that dead writers of ``path`` left beside it; returns what was removed. If a
    fallback swap was interrupted between its renames (``path`` missing, a previous version waiting), that
    version is put back first."""
    target = Path(path)
    prefix = f".{target.name}{_MARK}"
    try:
        names = sorted(os.listdir(target.parent))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if not name.startswith(prefix) or not _dead_writer(name[len(prefix) :]):
            continue
        stale = target.parent / name
        if name.endswith(".old") and not os.path.lexists(target):
            _rename(stale, target)
            continue
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        removed.append(stale)
    return removed


def _dead_writer(rest: str) -> bool:
    """``rest`` is ``<pid>-<token>.<tmp|old>``: true when that process no longer runs."""
    pid_text, _, tail = rest.partition("-")
    if not pid_text.isdigit() or not (tail.endswith(".tmp") or tail.endswith(".old")):
        return False  # not one of ours
    pid = int(pid_text)
    if pid == os.getpid() or os.name != "posix":
        return False  # another thread of this process may be writing it; elsewhere os.kill(pid, 0) terminates
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError):
        return False  # alive, someone else's
    return False


def _temporary_name(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}{_MARK}{os.getpid()}-{secrets.token_hex(6)}.{kind}"


# ---- the primitive steps (one function each, so tests can interrupt any of them) --------------------------
def _write(stream, data: bytes) -> None:
    stream.write(data)


def _replace(source: Path, destination: Path) -> None:
    os.replace(source, destination)


def _rename(source: Path, destination: Path) -> None:
    os.rename(source, destination)


def _fsync_directory(directory: Path) -> None:
    if os.name != "posix":
        return
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    except OSError:  # some file systems cannot fsync a directory
        pass
    finally:
        os.close(handle)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths atomically (Linux renameat2); False where the system or file system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(second))


_LIBC: list = []


def _renameat2():
    if not _LIBC:
        function = None
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):  # CDLL(None): the C library already loaded
                function = ctypes.CDLL(None, use_errno=True).renameat2
                function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                function.restype = ctypes.c_int
        _LIBC.append(function)
    return _LIBC[0]
