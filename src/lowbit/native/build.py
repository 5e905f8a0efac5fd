"""Build, cache and load lowbit's native quantizer library (plain C, no torch headers).

The C sources in ``csrc/`` are compiled once per machine into a shared library, with the machine's own
instruction set (``-march=native``: the compiler probes the CPU) and IEEE arithmetic kept exact (no fast-math,
no contraction of a*b+c into a fused multiply-add, so every kernel rounds exactly as the eager torch ops do).
A build takes 35-55 s on 2 cores (one compiler process per source file, in parallel); it never runs at import,
and ``auto`` starts it on a background thread (a compiler subprocess: nothing in this process is patched or
traced), answering eagerly until it is loaded. That thread starts its compilers once the call that started it
has its answer (``answered``; at most ANSWER_WAIT_S later): on a small machine they would take every core
while that first call runs.

Cache: ``$LOWBIT_CACHE_DIR`` (else ``$XDG_CACHE_HOME/lowbit``, else ``~/.cache/lowbit``) holds
``native-<key>.so`` and its sealed checksum ``native-<key>.so.sha256``; the key covers the sources, the
compiler and its version, the flags and the CPU (model and ISA flags), so a cache shared between machines
never loads a library built for another CPU. Both files appear whole or not at all (written to a temporary
name, then renamed), and a library whose bytes do not match its checksum is rebuilt, never loaded. A flag
set the compiler refused leaves ``native-<key>.failed`` (its message), which later processes read instead of
compiling again, for a day.
``LOWBIT_NATIVE=0`` turns the native path off; ``$CC`` picks the compiler; ``$LOWBIT_NATIVE_OPT`` (0-3) the
optimisation level (default 3; same bits at every level).

Threads: when this process's torch runs on GNU OpenMP, the library is built with ``-fopenmp`` and links the
libgomp torch already loaded (the loader matches its soname), so the kernels' parallel regions run on torch's
own worker pool; otherwise (another OpenMP runtime, no OpenMP in the compiler, ``LOWBIT_NATIVE_OPENMP=0``)
they start threads of their own (csrc/parallel.c).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from lowbit.native import flags as compiler_flags

SOURCE_DIR = Path(__file__).parent / "csrc"
BUILD_TIMEOUT_S = 120  # how long a finishing process waits at exit for a build in flight
# How long one compiler call may take before its flag set counts as failed. 35-55 s on 2 quiet cores, but 13-21
# minutes were seen on 2 cores shared with a dozen other jobs: at 120 s every such build timed out, fell back to
# the next flag set (no OpenMP, then no -march=native: slower kernels) and was tried again by every process.
COMPILE_TIMEOUT_S = 1800
# A flag set the compiler refused (it exited with an error: not a time-out or a kill) is not tried again for
# this long in later processes: its marker (``native-<key>.failed``) holds the message. The key covers the
# sources, the compiler and its version, the flags and the CPU, so any change of those tries it again.
RETRY_FAILED_S = 24 * 3600

# How long the background build's compilers wait, at most, for the call that started it to answer (on 2 cores
# TWN's first eager call took 57-401 ms beside them, 22-26 ms alone: benchmarks/RESULTS.md, sixteenth session).
ANSWER_WAIT_S = 1.0

_state: dict = {"library": None, "error": None, "thread": None, "fallback": None, "answered": None}
_lock = threading.Lock()  # held by ensure() for the whole build
_start_lock = threading.Lock()  # only around starting the background thread: never held for long


def _after_fork_in_child() -> None:
    """A forked child (DataLoader workers, multiprocessing) gets a fresh lock (the parent's build thread may
    have held it at the fork and does not exist in the child) and, if that build had not finished, may start
    its own."""
    global _lock, _start_lock
    _lock, _start_lock = threading.Lock(), threading.Lock()
    _state["forked"] = True  # a library loaded from now on must not enter libgomp's pool (csrc/parallel.c)
    if _state["library"] is None and _state["error"] is None:
        _state["thread"] = None
    _state["answered"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# $LOWBIT_NATIVE is read on every kernel call (a test or a user may set it at any time). os.environ.get
# encodes the key and decodes the value each time (0.7 us, a tenth of a small tensor's call); CPython's
# os.environ keeps the encoded mapping it updates in `_data`, read directly where it is there.
_ENVIRONMENT = getattr(os.environ, "_data", None)
_NATIVE_KEY = os.environ.encodekey("LOWBIT_NATIVE") if hasattr(os.environ, "encodekey") else None
_OFF = ("0", "false", "no", "off")


def disabled() -> bool:
    if isinstance(_ENVIRONMENT, dict) and _NATIVE_KEY is not None:
        raw = _ENVIRONMENT.get(_NATIVE_KEY)
        return raw is not None and os.environ.decodevalue(raw).strip().lower() in _OFF
    value = os.environ.get("LOWBIT_NATIVE")
    return value is not None and value.strip().lower() in _OFF


def cache_dir() -> Path:
    if os.environ.get("LOWBIT_CACHE_DIR"):
        return Path(os.environ["LOWBIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lowbit"


def compiler() -> str | None:
    """The C compiler: $CC if set, else the first of cc, gcc, clang on PATH (None: no native path)."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"].split()[0])
    return next((found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)


def library() -> ctypes.CDLL | None:
    """The loaded library, or None while it is not (yet) available or LOWBIT_NATIVE=0. Never blocks and
    never builds."""
    return None if disabled() else _state["library"]


def loaded() -> ctypes.CDLL | None:
    """The loaded library whatever $LOWBIT_NATIVE says now (``kernels.function``: its callers have asked
    ``library()`` / ``ensure()`` already, which read it)."""
    return _state["library"]


def error() -> str | None:
    """Why the library could not be built or loaded (None: no failure so far)."""
    return _state["error"]


def fallback() -> str | None:
    """Which flags the loaded library was built without, and why, where the first choice (-march=native, with
    OpenMP where wanted) did not build (None: it did, or nothing is loaded). Same results, slower kernels."""
    return _state["fallback"]


def start_background_build() -> None:
    """Build or load the library on a daemon thread, once per process (no-op when disabled, done or under way).
    Never waits for a build: every call of the ``auto`` backend before the library is loaded comes here."""
    if _state["library"] is not None or _state["error"] is not None or _state["thread"] is not None or disabled():
        return
    with _start_lock:
        if _state["thread"] is None:
            _state["answered"] = threading.Event()
            _state["thread"] = threading.Thread(target=ensure, name="lowbit-native-build", daemon=True)
            _state["thread"].start()
            atexit.register(_finish_build)


def answered() -> None:
    """The call that started the background build has its answer (backend.run_without_native): the build's
    compilers may take the cores now. A caller of ``ensure`` says it too (it waits for the library)."""
    event = _state["answered"]
    if event is not None:
        _state["answered"] = None
        event.set()


def _wait_for_answer() -> None:
    """On the background build's thread only: wait (at most ANSWER_WAIT_S) for ``answered``."""
    event = _state["answered"]
    if event is not None and threading.current_thread() is _state["thread"]:
        event.wait(ANSWER_WAIT_S)


def _finish_build() -> None:
    """At exit, let a build in flight finish (once per machine, a few seconds): a short process (a CLI call)
    would otherwise stop it every time, and no later process would ever find the library cached."""
    thread = _state["thread"]
    if thread is not None and thread.is_alive():
        thread.join(BUILD_TIMEOUT_S)


def ensure() -> ctypes.CDLL | None:
    """Build (if needed) and load the library now; None (and ``error()`` says why) when it cannot be."""
    if disabled():
        return None
    if threading.current_thread() is not _state["thread"]:
        answered()  # a caller waiting for the library: a build in flight need not wait for an answer
    with _lock:
        if _state["library"] is None and _state["error"] is None:
            try:
                _state["library"] = _load_or_build()
                if _state.get("forked"):
                    _state["library"].lb_note_fork()
            except Exception as failure:  # no compiler, a failed build, an unwritable cache: stay eager
                _state["error"] = f"{type(failure).__name__}: {failure}"
    return _state["library"]


def reset() -> None:
    """Forget the loaded library and any failure (tests; the next ``ensure`` loads from the cache again)."""
    with _lock:
        _state.update(library=None, error=None, thread=None, fallback=None, answered=None)  # a fork stays noted


def _sources() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.c"))


def _cpu_description() -> str:
    """Model name and ISA flags of this CPU (the part of the key that -march=native depends on)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part", "CPU implementer")
    lines = [line for line in text.splitlines() if line.split(":")[0].strip() in wanted]
    return "\n".join(dict.fromkeys(lines))  # the first CPU's lines (every CPU repeats them)


def _key(cc: str, flags: list[str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".c", ".h"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    version = subprocess.run([cc, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    for part in (cc, version, " ".join(flags), platform.machine(), sys.platform, _cpu_description()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:24]


def _load_or_build() -> ctypes.CDLL:
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC, or install gcc or clang)")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(folder)
    failures = []
    choices = compiler_flags.choices()
    for flags in choices:
        path = folder / f"native-{_key(cc, flags)}.so"
        sealed = _sealed(path)
        if not sealed and (message := _failed_before(path)) is not None:
            failures.append(message)
            continue
        if not sealed:
            _wait_for_answer()
        if sealed or (message := _compile(cc, flags, path)) is None:
            if failures:
                _note_fallback([flag for flag in choices[0] if flag not in flags], failures[0])
            return ctypes.CDLL(str(path))
        _remember_failure(path, message)
        failures.append(message)
    raise RuntimeError("; ".join(failures))


def _failure_marker(path: Path) -> Path:
    return path.with_name(path.name[: -len(".so")] + ".failed")


def _failed_before(path: Path) -> str | None:
    """The compiler's message for this library's flag set if it refused them less than RETRY_FAILED_S ago."""
    marker = _failure_marker(path)
    try:
        if time.time() - marker.stat().st_mtime < RETRY_FAILED_S:
            return marker.read_text(errors="replace")[:2000] or "failed before"
    except OSError:
        pass
    return None


def _remember_failure(path: Path, message: str) -> None:
    """Write the marker for a refusal (not for a time-out or a killed compiler: those may pass next time)."""
    if "timed out" in message or "killed by signal" in message:
        return
    marker = _failure_marker(path)
    try:  # whole or not at all, as the library and its seal (native sits beside lowbit._io, not above it)
        handle, temporary = tempfile.mkstemp(prefix=".native-", suffix=".failed", dir=path.parent)
        with os.fdopen(handle, "w") as file:
            file.write(message)
        os.replace(temporary, marker)
    except OSError:  # an unwritable cache: the next process tries again, as before
        pass


def _note_fallback(dropped: list[str], failure: str) -> None:
    """A library built with fewer flags than the first choice computes the same bits more slowly: say so once
    (a compiler that cannot target this CPU, or a broken source, would otherwise pass unnoticed)."""
    reason = failure.strip().splitlines()[0][:300] if failure.strip() else "no message"
    _state["fallback"] = f"built without {' '.join(dropped)} ({reason})"
    warnings.warn(f"lowbit: the native kernels were {_state['fallback']}; they give the same results, more slowly",
                  RuntimeWarning, stacklevel=2)  # fmt: skip


def _remove_stale_temporaries(folder: Path, age_s: float = 3600.0) -> None:
    """Temporary files and folders of builds that were killed (older than ``age_s``: never one in flight)."""
    for entry in folder.glob(".native-*"):
        try:
            if time.time() - entry.stat().st_mtime > age_s:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        except OSError:
            pass


def _sealed(path: Path) -> bool:
    """Whether ``path`` exists and matches its checksum file (a library is loaded only then)."""
    seal = path.with_name(path.name + ".sha256")
    try:
        expected = seal.read_text().split()[0]
        return hashlib.sha256(path.read_bytes()).hexdigest() == expected
    except (OSError, IndexError):
        return False


def _compile(cc: str, flags: list[str], path: Path) -> str | None:
    """Compile into a temporary file beside ``path``, then rename it and its checksum into place (whole or
    not at all). Returns None on success, else the compiler's message."""
    handle, temporary = tempfile.mkstemp(prefix=".native-", suffix=".so", dir=path.parent)
    os.close(handle)
    objects = tempfile.mkdtemp(prefix=".native-objects-", dir=path.parent)
    try:
        failure = _compile_objects(cc, flags, objects) or _run([cc, *flags, "-o", temporary, *sorted(
            str(o) for o in Path(objects).glob("*.o")), "-lm"])  # fmt: skip
        if failure is not None:
            return f"{Path(cc).name} {' '.join(flags[-1:])} failed: {failure}"
        data = Path(temporary).read_bytes()
        seal_handle, seal_temporary = tempfile.mkstemp(prefix=".native-", suffix=".sha256", dir=path.parent)
        with os.fdopen(seal_handle, "w") as seal:
            seal.write(hashlib.sha256(data).hexdigest() + "\n")
        os.replace(temporary, path)
        os.replace(seal_temporary, path.with_name(path.name + ".sha256"))
        return None
    finally:
        shutil.rmtree(objects, ignore_errors=True)
        if os.path.exists(temporary):
            os.unlink(temporary)


def _compile_objects(cc: str, flags: list[str], folder: str) -> str | None:
    """One compiler process per source file, as many at once as there are CPUs (a build of every source in
    one process takes several seconds); None on success, else the first failure's message."""
    compile_flags = [flag for flag in flags if flag != "-shared"] + ["-c"]
    pending = sorted(_sources(), key=lambda source: -source.stat().st_size)  # the longest builds first
    running: list[subprocess.Popen] = []
    failure = None
    while pending or running:
        while pending and len(running) < max(1, os.cpu_count() or 1):
            source = pending.pop(0)
            command = [cc, *compile_flags, "-o", os.path.join(folder, source.stem + ".o"), str(source)]
            running.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        process = running.pop(0)
        try:
            _, errors = process.communicate(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            errors, process.returncode = "timed out", 1
        if process.returncode < 0:
            errors = f"killed by signal {-process.returncode}"
        if process.returncode != 0 and failure is None:
            failure = errors.strip()[-300:]
            pending.clear()  # one failure fails the build: start no more sources
    return failure


def _run(command: list[str]) -> str | None:
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    return None if result.returncode == 0 else result.stderr.strip()[-300:]
