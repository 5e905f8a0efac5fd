"""Building, caching and loading the native library (lowbit.native.build)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

import lowbit
from lowbit import backend
from lowbit.native import build

needs_compiler = pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")


# The builds here test caching, sealing, locking and forks, not kernel speed: at -O0 all sources compile in
# about a third of -O1's time (4 against 13 s, 2 cores) and give the same bits, exactness coming from the other
# flags (test_an_unoptimised_build_gives_the_eager_bits); tests/native's other files run the -O3 library.
QUICK_BUILD = {"LOWBIT_NATIVE_OPT": "0"}


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LOWBIT_NATIVE_OPT", QUICK_BUILD["LOWBIT_NATIVE_OPT"])
    build.reset()
    yield tmp_path
    build.reset()


@needs_compiler
def test_a_build_leaves_a_sealed_library_and_a_second_process_loads_it(fresh_cache):
    assert build.ensure() is not None and build.error() is None
    assert build.fallback() is None  # built with the first choice of flags (-march=native)
    libraries = sorted(fresh_cache.glob("native-*.so"))
    assert len(libraries) == 1 and libraries[0].with_name(libraries[0].name + ".sha256").exists()
    assert not list(fresh_cache.glob(".native-*"))  # no temporary left behind
    stamp = libraries[0].stat().st_mtime_ns
    build.reset()
    assert build.ensure() is not None
    assert libraries[0].stat().st_mtime_ns == stamp  # loaded from the cache, not rebuilt


@needs_compiler
def test_a_library_that_fails_its_checksum_is_rebuilt_not_loaded(fresh_cache):
    build.ensure()
    (library,) = fresh_cache.glob("native-*.so")
    library.unlink()  # a new file, as another writer would leave it: truncating the mapped one would crash
    library.write_bytes(b"not a shared library")  # this process (SIGBUS on its next use of the library)
    build.reset()
    assert build.ensure() is not None  # rebuilt: loading the bytes above would raise OSError
    assert library.read_bytes()[:4] == b"\x7fELF"


def test_no_compiler_means_no_library_and_a_reason(fresh_cache, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert build.ensure() is None
    assert "no C compiler" in build.error()


def test_a_failing_compiler_is_reported_and_the_eager_path_answers(fresh_cache, monkeypatch, tmp_path):
    fake = tmp_path / "fakecc"
    fake.write_text("#!/bin/sh\necho 'fakecc: broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    assert build.ensure() is None and "broken" in build.error()
    backend.set_backend("native")
    try:
        x = torch.randn(64)
        backend._state.pop("native_warned", None)
        with pytest.warns(RuntimeWarning, match="native kernels are unavailable"):
            result = lowbit.quantize(x, "e4m3")
        backend.set_backend("eager")
        assert torch.equal(result, lowbit.quantize(x, "e4m3"))
    finally:
        backend.set_backend("eager")


def counting_compiler(folder, refuse: str) -> tuple[str, object]:
    """A compiler that refuses every call whose flags contain ``refuse`` and counts those calls in a file."""
    calls = folder / "refused-calls"
    fake = folder / "countingcc"
    refusal = f"echo x >> {calls}; echo 'countingcc: refused' >&2; exit 1;;"
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *{refuse}*) {refusal} esac\nexec {build.compiler()} \"$@\"\n")
    fake.chmod(0o755)
    return str(fake), lambda: len(calls.read_text().splitlines()) if calls.exists() else 0


@needs_compiler
def test_a_refused_flag_set_is_not_tried_again_until_its_marker_is_old(fresh_cache, monkeypatch, tmp_path):
    """Where -march=native fails, every later process paid for the attempt (all sources compiled first); the
    refusal is remembered beside the cache for a day, and the first source's failure stops the rest."""
    fake, refused = counting_compiler(tmp_path, "-march=native")
    monkeypatch.setenv("CC", fake)
    monkeypatch.delenv("LOWBIT_NATIVE_MARCH", raising=False)
    with pytest.warns(RuntimeWarning, match="built without -march=native"):
        assert build.ensure() is not None
    first = refused()
    assert 1 <= first <= (os.cpu_count() or 1)  # the sources running when the first one failed, no more
    markers = list(fresh_cache.glob("native-*.failed"))
    assert len(markers) == 1 and "countingcc: refused" in markers[0].read_text()
    build.reset()
    with pytest.warns(RuntimeWarning, match="built without -march=native.*countingcc: refused"):
        assert build.ensure() is not None  # the marker's reason, said again
    assert refused() == first  # not tried again
    old = markers[0].stat().st_mtime - build.RETRY_FAILED_S - 60
    os.utime(markers[0], (old, old))
    build.reset()
    with pytest.warns(RuntimeWarning, match="built without -march=native"):
        assert build.ensure() is not None
    assert refused() > first  # a day later: tried again


def test_a_timed_out_or_killed_compile_leaves_no_marker(tmp_path):
    library = tmp_path / "native-abc.so"
    build._remember_failure(library, "gcc -march=native failed: timed out")
    build._remember_failure(library, "gcc -march=native failed: killed by signal 9")
    assert not list(tmp_path.iterdir())
    build._remember_failure(library, "gcc -march=native failed: unknown target")
    assert build._failed_before(library) == "gcc -march=native failed: unknown target"


@needs_compiler
def test_a_build_without_march_native_is_said_once_and_still_loads(fresh_cache, monkeypatch, tmp_path):
    """A compiler that refuses -march=native: the next flag set builds the library (same bits, slower), and
    the fallback is reported instead of passing unnoticed."""
    fake = tmp_path / "fakecc"
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *-march=native*) echo 'fakecc: no native target' >&2; exit 1;; esac\n"
                    f"exec {build.compiler()} \"$@\"\n")  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.delenv("LOWBIT_NATIVE_MARCH", raising=False)  # the default choices (CI names a target here)
    with pytest.warns(RuntimeWarning, match="built without -march=native.*no native target"):
        assert build.ensure() is not None
    assert "-march=native" in build.fallback() and build.error() is None
    build.reset()
    assert build.fallback() is None
    with pytest.warns(RuntimeWarning, match="built without -march=native"):  # loaded from the cache: said again
        assert build.ensure() is not None


def test_a_named_target_replaces_march_native(fresh_cache, monkeypatch, tmp_path):
    """LOWBIT_NATIVE_MARCH builds another CPU class's code (the CI job for AVX2-only machines): the compiler
    is asked for that target only, and a malformed name is refused before any compiler runs."""
    log = tmp_path / "arguments"
    fake = tmp_path / "fakecc"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\necho 'fakecc: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("LOWBIT_NATIVE_MARCH", "x86-64-v3")
    assert build.ensure() is None
    calls = [line for line in log.read_text().splitlines() if " -c " in f" {line} " or "-shared" in line]
    assert calls and all("-march=x86-64-v3" in line and "-march=native" not in line for line in calls)
    build.reset()
    log.unlink()
    monkeypatch.setenv("LOWBIT_NATIVE_MARCH", "native; rm -rf ~")
    assert build.ensure() is None
    assert "LOWBIT_NATIVE_MARCH" in build.error() and not log.exists()


def test_the_optimisation_level_reaches_the_compiler_and_a_bad_one_is_refused(fresh_cache, monkeypatch, tmp_path):
    log = tmp_path / "arguments"
    fake = tmp_path / "fakecc"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\necho 'fakecc: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    assert build.ensure() is None
    calls = [line for line in log.read_text().splitlines() if " -c " in f" {line} " or "-shared" in line]
    assert calls and all(" -O0 " in f" {line} " and "-O3" not in line for line in calls)
    build.reset()
    log.unlink()
    monkeypatch.setenv("LOWBIT_NATIVE_OPT", "fast")
    assert build.ensure() is None
    assert "LOWBIT_NATIVE_OPT" in build.error() and not log.exists()


@pytest.mark.parametrize("value,off", [("0", True), (" Off ", True), ("false", True), ("NO", True), ("1", False),
                                       ("", False), ("on", False)])  # fmt: skip
def test_lowbit_native_is_read_at_every_call(monkeypatch, value, off):
    monkeypatch.delenv("LOWBIT_NATIVE", raising=False)
    assert not build.disabled()
    monkeypatch.setenv("LOWBIT_NATIVE", value)
    assert build.disabled() is off
    os.environ["LOWBIT_NATIVE"] = "0"  # a plain assignment, as a user's script would make
    assert build.disabled()
    del os.environ["LOWBIT_NATIVE"]
    assert not build.disabled()


def test_lowbit_native_off_builds_nothing(fresh_cache, monkeypatch):
    monkeypatch.setenv("LOWBIT_NATIVE", "0")
    assert build.ensure() is None and build.error() is None
    build.start_background_build()
    assert build._state["thread"] is None and not list(fresh_cache.iterdir())


@needs_compiler
def test_auto_builds_in_the_background_and_answers_eagerly_meanwhile(tmp_path):
    script = f"""
import os, time, torch
os.environ["LOWBIT_CACHE_DIR"] = {str(tmp_path)!r}
import lowbit
from lowbit.native import build
assert build.library() is None                      # nothing built at import
x = torch.randn(256, 256)
first = lowbit.quantize(x, "e4m3")                  # answers at once, starts the build
assert build._state["thread"] is not None
build._state["thread"].join(60)
assert build.library() is not None, build.error()
assert torch.equal(lowbit.quantize(x, "e4m3"), first)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **QUICK_BUILD, "HOME": str(tmp_path), "LOWBIT_BACKEND": "auto"})  # fmt: skip
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


def test_calls_while_the_background_build_runs_never_wait_for_it(fresh_cache, monkeypatch):
    """Every call of the auto backend before the library is loaded asks for the background build; none may wait
    for it (the second call once waited for the whole build, held by the build's lock). The build here waits
    until the test lets it go, after the calls have answered."""
    release = threading.Event()

    def held_build():
        release.wait(120)
        raise RuntimeError("released by the test")

    monkeypatch.setattr(build, "_load_or_build", held_build)
    backend.set_backend("auto")
    x, answers = torch.randn(64), []
    caller = threading.Thread(target=lambda: answers.extend(lowbit.quantize(x, "e4m3") for _ in range(3)))
    try:
        caller.start()
        caller.join(60)
        assert not caller.is_alive() and len(answers) == 3, "a call waited for the build"
        assert build._state["thread"].is_alive() and not release.is_set()  # the build was still under way
    finally:
        release.set()
        caller.join(60)
        if build._state["thread"] is not None:
            build._state["thread"].join(60)
        backend.set_backend("eager")
    assert all(torch.equal(answer, answers[0]) for answer in answers) and "released" in build.error()


def compile_spy(monkeypatch) -> list[bool]:
    """Replaces the compiler step: notes whether the call that started the build had answered, builds nothing."""
    seen = []

    def spy(cc, flags, path):
        event = build._state["answered"]
        seen.append(event is None or event.is_set())
        return "spy: nothing built"

    monkeypatch.setattr(build, "_compile", spy)
    return seen


@needs_compiler
def test_the_background_build_compiles_once_the_first_call_has_answered(fresh_cache, monkeypatch):
    seen = compile_spy(monkeypatch)
    monkeypatch.setattr(build, "ANSWER_WAIT_S", 120.0)  # only the answer can release it within the join below
    backend.set_backend("auto")
    try:
        x = torch.randn(64, 64)
        assert torch.equal(lowbit.quantize(x, "e4m3"), lowbit.get_format("e4m3")()._quantize_in_dtype(x, None))
        build._state["thread"].join(60)
        assert not build._state["thread"].is_alive(), "the build still waited after the call had answered"
    finally:
        backend.set_backend("eager")
    assert seen and all(seen) and "spy" in build.error()


@needs_compiler
def test_a_background_build_that_no_call_answers_for_compiles_after_the_wait(fresh_cache, monkeypatch):
    seen = compile_spy(monkeypatch)
    monkeypatch.setattr(build, "ANSWER_WAIT_S", 0.05)
    build.start_background_build()  # as a caller that never reaches backend.run_without_native would
    build._state["thread"].join(60)
    assert seen and not any(seen)


@needs_compiler
def test_a_caller_who_waits_for_the_library_releases_a_build_waiting_for_an_answer(fresh_cache, monkeypatch):
    seen = compile_spy(monkeypatch)
    monkeypatch.setattr(build, "ANSWER_WAIT_S", 120.0)
    build.start_background_build()
    caller = threading.Thread(target=build.ensure)  # the "native" backend or warmup, on another thread
    caller.start()
    caller.join(60)
    assert not caller.is_alive(), "ensure() waited for an answer"
    build._state["thread"].join(60)
    assert seen and all(seen)


def test_import_starts_no_build():
    result = subprocess.run([sys.executable, "-c", "import lowbit, threading; print(threading.active_count())"],
                            check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.stdout.strip() == "1", result.stderr[-2000:]


@needs_compiler
def test_warmup_builds_the_library_and_compiles_nothing_a_native_kernel_covers(fresh_cache, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("torch.compile called for a format with a native kernel")

    monkeypatch.setattr(torch, "compile", no_compile)
    spec = lowbit.get_format("minifloat_ieee")(width=8, exponent_width=4)
    lines = []
    backend.set_backend("auto")
    try:
        assert lowbit.warmup([spec], [(64, 300)], dtypes=(torch.float32, torch.bfloat16), progress=lines.append) == 2
        assert build.library() is not None
        x = torch.randn(64, 300)
        assert torch.equal(lowbit.quantize(x, spec), spec._native(x, torch.float32))
    finally:
        backend.set_backend("eager")
    assert lines[0] == "lowbit warmup: building the native kernels (once per machine) ..."
    assert lines[1].startswith("lowbit warmup: native kernels ready in")
    assert lines[2] == "lowbit warmup [1/2] minifloat_ieee(width=8, exponent_width=4, exponent_bias=7) [64, 300]: native kernel"


@needs_compiler
def test_a_child_forked_while_the_lock_is_held_can_still_load_the_library(fresh_cache):
    build.ensure()  # built and cached
    build.reset()
    with build._lock:  # as if the parent's build thread held it at the fork
        pid = os.fork()
        if pid == 0:  # the child: loads from the cache instead of waiting forever on the copied lock
            signal.alarm(60)  # a deadlock ends the child (exit by SIGALRM) instead of hanging the suite
            os._exit(0 if build.ensure() is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@needs_compiler
def test_a_process_that_exits_during_the_background_build_finishes_it_first(tmp_path):
    script = f"""
import os, torch
os.environ["LOWBIT_CACHE_DIR"] = {str(tmp_path)!r}
import lowbit
lowbit.quantize(torch.randn(64, 64), "e4m3")  # starts the build, then the process ends at once
"""
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300,
                            env={**os.environ, **QUICK_BUILD, "LOWBIT_BACKEND": "auto"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (library,) = tmp_path.glob("native-*.so")  # the next process finds it cached
    assert library.with_name(library.name + ".sha256").exists()
    assert not list(tmp_path.glob(".native-*"))


def test_stale_temporaries_of_killed_builds_are_removed(tmp_path):
    stale, fresh = tmp_path / ".native-abc.so", tmp_path / ".native-objects-def"
    stale.write_bytes(b"half a library")
    fresh.mkdir()
    old = os.stat(stale).st_mtime - 7200
    os.utime(stale, (old, old))
    build._remove_stale_temporaries(tmp_path)
    assert not stale.exists() and fresh.exists()  # a recent one may belong to a build in flight


UNOPTIMISED_CHECKS = [  # a format for each kernel source, as the -O3 library's own tests run them
    ("ternary", {"scaling_factor": True}), ("binary", {"scaling_factor": True}), ("affine", {"bits": 8}),
    ("affine", {"bits": 4, "power_of_two": True, "block_size": (1, 32)}), ("e4m3", {"axis": -1}),
    ("mxfp4_e2m1", {}), ("block_fp", {"width": 8, "exponent_width": 8, "exponent_bias": 127, "block_size": (1, 16)}),
    ("block_log", {"width": 8, "exponent_bias_width": 4, "block_size": (1, 16)}), ("binary_residual", {"levels": 2}),
    ("integer", {"width": 8, "frac_width": 4}), ("log", {"width": 8, "exponent_bias": 63}), ("e5m2", {}),
]  # fmt: skip


@needs_compiler
def test_an_unoptimised_build_gives_the_eager_bits(fresh_cache):
    """The quick builds above are -O0: every kernel source's code must give the eager path's bits there too."""
    assert build.ensure() is not None, build.error()
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(64, 320, generator=generator) * 4
    x[0, :5] = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 3.0e38])
    x[1, :64] = torch.randn(64, generator=generator) * 1e-39  # subnormals
    for name, params in UNOPTIMISED_CHECKS:
        spec = lowbit.get_format(name)(**params)
        want, got = spec._quantize_in_dtype(x, None), spec._native(x, torch.float32)
        assert got is not None, f"{name} did not run natively"
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan), name
        assert torch.equal(got.view(torch.int32)[~nan], want.view(torch.int32)[~nan]), name
