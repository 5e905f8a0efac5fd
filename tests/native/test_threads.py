"""How native kernels get their threads (csrc/parallel.c): torch's OpenMP pool where torch runs on GNU
OpenMP, threads of their own otherwise and in a forked child; the caller's floating-point state in every
worker."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lowbit import backend
from lowbit.formats import resolve
from lowbit.native import build, flags, kernels


def test_openmp_is_chosen_exactly_when_torch_runs_on_gnu_openmp(monkeypatch):
    monkeypatch.delenv("LOWBIT_NATIVE_MARCH", raising=False)  # the default targets (a CI job sets one)
    monkeypatch.delenv("LOWBIT_NATIVE_OPENMP", raising=False)  # the default choice, whatever this run was given
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    runtimes = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "omp" in line.rsplit("/", 1)[-1]}
    on_gnu = any(name.startswith("libgomp") for name in runtimes)
    other = any(name.startswith(("libiomp", "libomp")) for name in runtimes)
    assert flags.openmp_wanted() == (on_gnu and not other)
    assert all("-fopenmp" in chosen for chosen in flags.choices()[:2]) == flags.openmp_wanted()
    assert flags.choices()[-1] == flags.BASE_FLAGS  # the last resort: plain flags
    monkeypatch.setenv("LOWBIT_NATIVE_OPENMP", "0")
    assert not flags.openmp_wanted()
    assert not any("-fopenmp" in chosen for chosen in flags.choices())


def test_the_loaded_library_shares_torchs_openmp_runtime(several_threads):
    if not kernels.uses_openmp():
        pytest.skip("this library runs threads of its own (torch is not on GNU OpenMP here, or no -fopenmp)")
    maps = Path("/proc/self/maps").read_text().splitlines()
    # copies under other names (scikit-learn ships libgomp-<hash>.so) are other packages' own runtimes
    gomp = {line.split()[-1] for line in maps if line.split()[-1].rsplit("/", 1)[-1].startswith("libgomp.so")}
    assert len(gomp) == 1  # one runtime by that soname: the library found torch's, loaded no second one


def test_a_forked_child_runs_threaded_kernels_on_threads_of_its_own(several_threads):
    """GNU OpenMP's pool does not survive fork (a region waits forever in the child); the library switches
    to threads of its own there, and the threaded result is the parent's, bit for bit."""
    spec = resolve("block_fp", width=8, exponent_width=8, exponent_bias=127, block_size=(1, 16))
    x = torch.randn(64, 256) * 8  # 2^14 elements: torch's own ops stay on one thread (no pool in the child)
    backend.set_backend("native")
    try:
        want = spec.quantize(x)
        with kernels.threads_from(1 << 10):
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: answer through the pipe, never return into pytest
                try:
                    got = spec.quantize(x)
                    os.write(write_end, bytes([kernels.uses_openmp()]) + got.numpy().tobytes())
                finally:
                    os._exit(0)
            os.close(write_end)
            answer = _read_within(read_end, pid, want.numel() * 4 + 1, timeout_s=60)
    finally:
        backend.set_backend("eager")
    assert answer[0] == 0  # no OpenMP region in the child
    assert torch.equal(torch.frombuffer(bytearray(answer[1:]), dtype=torch.float32).reshape(x.shape), want)


def _read_within(descriptor: int, pid: int, size: int, timeout_s: float) -> bytes:
    data, deadline = b"", time.monotonic() + timeout_s
    try:
        while len(data) < size and time.monotonic() < deadline:
            if select.select([descriptor], [], [], 0.5)[0]:
                chunk = os.read(descriptor, size - len(data))
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(descriptor)
        if len(data) < size:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert len(data) == size, "the forked child did not answer (a thread pool that does not survive fork?)"
    return data


def test_every_worker_rounds_with_the_callers_flush_to_zero_state(several_threads):
    """block_fp keeps subnormal inputs (its steps reach 2^-149); with flush-to-zero / denormals-are-zero set
    on the calling thread every chunk must compute as the caller's thread does, whichever thread runs it."""
    spec = resolve("block_fp", width=8, exponent_width=8, exponent_bias=127, block_size=(1, 16))
    x = torch.rand(256, 256) * 1e-38  # subnormal float32 values
    backend.set_backend("native")
    try:
        kept = spec.quantize(x)
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU cannot flush denormals")
        try:
            with kernels.threads_from(1 << 10):
                threaded = spec.quantize(x)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                one_thread = spec.quantize(x)
            finally:
                torch.set_num_threads(threads)
        finally:
            torch.set_flush_denormal(False)
    finally:
        backend.set_backend("eager")
    assert kept.count_nonzero() > 0  # without the flush they survive
    flushed = one_thread.view(torch.int32)  # (subnormal steps read as zero: 0 / 0 gives NaN, bit for bit)
    assert torch.equal(threaded.view(torch.int32), flushed) and not torch.equal(flushed, kept.view(torch.int32))


def test_a_child_that_loads_the_library_after_a_fork_runs_threaded_kernels_too(tmp_path):
    """The parent ran torch's pool and never loaded the library; a forked child loads it and must not enter
    the pool (libgomp would wait forever there)."""
    if build.ensure() is None:
        pytest.skip(f"no native library: {build.error()}")
    answer = tmp_path / "answer.bin"
    script = f"""
import os, sys, torch
os.environ["LOWBIT_CACHE_DIR"] = {str(build.cache_dir())!r}
torch.set_num_threads(2)
(torch.randn(1 << 22) * 2).sum()            # torch's OpenMP pool has run
from lowbit import backend
from lowbit.formats import resolve
from lowbit.native import build, flags, kernels
assert build.library() is None
pid = os.fork()
if pid == 0:  # no torch op that may go parallel here: torch's own would wait forever
    assert build.ensure() is not None
    backend.set_backend("native")
    x = torch.linspace(-300, 300, 1 << 14).reshape(64, 256)
    with kernels.threads_from(1 << 10):
        got = resolve("e4m3").quantize(x)
    with open({str(answer)!r}, "wb") as file:
        file.write(bytes([kernels.uses_openmp()]) + got.numpy().tobytes())
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    data = answer.read_bytes()
    x = torch.linspace(-300, 300, 1 << 14).reshape(64, 256)
    assert data[0] == 0  # threads of its own
    got = torch.frombuffer(bytearray(data[1:]), dtype=torch.float32).reshape(x.shape)
    assert torch.equal(got, resolve("e4m3").quantize(x))
