"""Execution backends for format quantizers: native C kernels, plain eager PyTorch, or torch.compile.

Every decision reads the format's record (``lowbit.format_record``: its native binding, its eager function
and kernel hints) and the spec's public properties; this module never imports the formats.

``native`` runs a format's native kernel (``lowbit.native``: plain C compiled once per machine, one
pass over memory, bit-identical to eager) on CPU tensors of float32 / float16 / bfloat16, where the format has
one for its parameters; everything else runs eagerly. ``auto`` (the default) takes the native kernel as soon
as the library is loaded: the first call starts its build on a background thread (compiler subprocesses,
started once that call has answered; 35-55 s on 2 cores, cached on disk for later processes) and answers
eagerly meanwhile.

``eager`` runs a format's eager function (``FormatRecord.eager``) op by op: every op reads and writes the
whole tensor. ``compiled`` hands the same function to ``torch.compile`` (Inductor's C++ backend on CPU), which fuses it into one
or two passes over memory. Both give bit-identical results (the compiled kernel evaluates the same
float operations; tests/test_backend.py checks every format).

Kernels are cached per format spec, input dtype and rank, and compiled with dynamic shapes, so a new
shape does not trigger a recompile. Stochastic rounding always runs eagerly: torch.compile draws random
numbers from its own generator, and a seed must give the same result on either path.

Choose with ``lowbit.set_backend("auto" | "native" | "eager" | "compiled")`` or the environment variable
``LOWBIT_BACKEND``. ``compiled`` compiles on first use and waits for it; ``native`` builds the native library
on first use and waits for it. ``auto`` never makes a caller wait for a compiler: where no native kernel
applies, it answers eagerly until a kernel key (spec, input dtype, rank, output dtype)
has been called ``HOT_CALLS`` times on tensors of at least ``AUTO_MIN_ELEMENTS`` elements; then one
background thread compiles the kernel on a zero tensor of the caller's shape, and from the next call on
that (kernel key, device, shape, inference mode) runs the fused kernel. Both paths give the same bits, so
the swap cannot change a result. ``lowbit.warmup`` (``api.py``) builds kernels up front, with a progress
message. If compiling fails (no C++ compiler, an unsupported op), lowbit warns once and stays eager for the
rest of the process. Nothing is compiled, and no thread is started, at import.
"""

from __future__ import annotations

import atexit
import itertools
import os
import queue
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from lowbit import native
from lowbit.casting import saturating_cast
from lowbit.errors import ConfigError, did_you_mean
from lowbit.format_record import FormatRecord
from lowbit.native import kernels as native_kernels

FormatSpec = Any  # a format spec (lowbit.formats): its ``format_record`` and public properties are what is read

BACKENDS = ("auto", "native", "eager", "compiled")
_NATIVE_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16))
# auto: tensors smaller than this stay eager (a fused kernel saves little there); a kernel key becomes hot
# after HOT_CALLS calls on larger ones and is then compiled in the background.
AUTO_MIN_ELEMENTS = 1 << 14
HOT_CALLS = 2
_KernelKey = tuple  # (spec, dtype, rank, out dtype) for formats; (name, ...) for fused operator kernels

_state = {"backend": None, "broken": False}
_kernels: dict[_KernelKey, Callable[[torch.Tensor], torch.Tensor]] = {}
_lock = threading.Lock()
_serial = itertools.count()
# Tiered execution (auto): calls per kernel key, (kernel key, device, shape, inference mode) signatures whose
# kernel has run in the background (so calling it cannot compile), signatures queued, and the worker.
_tier_lock = threading.Lock()  # never held while compiling
_tiers: dict = {"calls": {}, "ready": set(), "queued": set(), "generation": 0, "worker": None, "jobs": None}
# Fused kernels skip float32 -> bf16 -> float32 round trips unless told to emulate them; scales stored in
# f16 / bf16 must be rounded exactly as eager rounds them.
_INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


def set_backend(name: str) -> None:
    """Select how format quantizers run: "auto" (default), "native", "eager" or "compiled"."""
    _state["backend"] = _checked(name, "set_backend")


def set_background_compile(enabled: bool | None) -> None:
    """Let ``auto`` compile hot kernels on a background thread (True), or not (False); None: back to
    $LOWBIT_BACKGROUND_COMPILE (off unless "1" / "true"). Off by default: compiling traces with torch.fx,
    which patches ``nn.Module.__call__`` process-wide while it runs, so a model called meanwhile on another
    thread (the caller's!) can fail ("module is not installed as a submodule"). Turn it on only where
    nothing else calls modules while kernels compile; ``lowbit.warmup`` compiles in the foreground, safely."""
    if enabled is not None and not isinstance(enabled, bool):
        raise ConfigError(f"set_background_compile: expected True, False or None, got {enabled!r}")
    _state["background"] = enabled


def background_compile() -> bool:
    """Whether ``auto`` queues hot kernels for the background thread (see :func:`set_background_compile`)."""
    if _state.get("background") is None:
        return os.environ.get("LOWBIT_BACKGROUND_COMPILE", "").strip().lower() in ("1", "true", "yes", "on")
    return bool(_state["background"])


def get_backend() -> str:
    """The backend in force: the one set, else $LOWBIT_BACKEND, else "auto"."""
    if _state["backend"] is None:
        _state["backend"] = _checked(os.environ.get("LOWBIT_BACKEND", "auto"), "LOWBIT_BACKEND")
    return _state["backend"]


def _checked(name: str, where: str) -> str:
    key = str(name).strip().lower()
    if key not in BACKENDS:
        suggestion = did_you_mean(key, BACKENDS)
        raise ConfigError(f"{where}: unknown backend {name!r}{suggestion}; legal: {', '.join(BACKENDS)}")
    return key


def wants_compiled(spec: FormatSpec, x: torch.Tensor) -> bool:
    """Whether ``spec`` should run on ``x`` through a compiled kernel under the current backend."""
    return not spec.is_stochastic and compiling_allowed(x.numel())


def run_native(spec: FormatSpec, x: torch.Tensor) -> torch.Tensor | None:
    """The native kernel's result where one runs under the backend in force, else None. No autograd graph
    is recorded either way (the kernel writes a new tensor)."""
    if not x.is_cpu or spec.is_stochastic:
        return None
    return _native_result(spec, x)


def run_without_native(spec: FormatSpec, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The quantized tensor once the native kernel has declined (or was never a candidate)."""
    result = _eager_or_fused(spec, x, generator)
    native.answered()  # a background build that this call started may start its compilers now
    return result


def _eager_or_fused(spec: FormatSpec, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    eager = spec.format_record.eager
    if not wants_compiled(spec, x) or _narrowed_directed(spec, x):
        return eager(spec, x, generator)
    upcast = _upcast(spec, x.dtype)
    dtype = torch.float32 if upcast else x.dtype
    key = (spec, dtype, x.dim(), dtype)
    if get_backend() == "auto" and not _ready_or_counted(key, x):
        return eager(spec, x, generator)  # eager until the background kernel is ready
    try:
        if upcast:
            wide = x.float()
            return _narrowed(kernel(*key)(_dynamic(wide)), x.dtype, spec, wide)
        return kernel(*key)(_dynamic(x))
    except Exception as error:  # a missing compiler or an Inductor failure: fall back once, loudly
        _give_up(error)
        return eager(spec, x, generator)


def _narrowed_directed(spec: FormatSpec, x: torch.Tensor) -> bool:
    """Directed rounding of a half / float8 tensor: eager (its narrowing, ``casting.narrow_toward``, and
    affine's settled parameters branch on the data; such inputs are rare enough not to need a kernel)."""
    return spec.narrows_directed and x.dtype not in (torch.float32, torch.float64)


def _native_result(spec: FormatSpec, x: torch.Tensor) -> torch.Tensor | None:
    """The native kernel's result, or None where none runs (other backend, dtype or layout; no kernel for
    these parameters; library not loaded yet: ``auto`` starts its build and answers eagerly meanwhile)."""
    dtype = x.dtype
    if dtype not in _NATIVE_DTYPES or not x.is_contiguous() or not native_ready():
        return None
    record: FormatRecord = spec.format_record
    native = record.native
    if native is None:
        return None
    if dtype is torch.float32:
        return native(spec, x, dtype)
    if record.native_takes_halves and not spec.narrows_directed:  # the kernels narrow to nearest
        result = native(spec, x, dtype)
        if result is not None:
            return result  # else the kernel takes halves in other layouts only: through float32 below
    wide = x.float()
    result = native(spec, wide, dtype)
    return None if result is None else _narrowed(result, dtype, spec, wide)


def native_ready() -> bool:
    """Whether native kernels may run now: backend "auto" or "native" and the library loaded ("auto" starts
    its background build and says False meanwhile; "native" builds it now, warning once if it cannot)."""
    name = get_backend()
    if name not in ("auto", "native"):
        return False
    if native.library() is not None:
        return True
    if name == "auto":
        native.start_background_build()
        return False
    if native.ensure() is None:
        _native_unavailable()
        return False
    return True


def _native_unavailable() -> None:
    if not _state.get("native_warned"):
        _state["native_warned"] = True
        warnings.warn(f"lowbit: native kernels are unavailable ({native.error()}); using the eager path",
                      RuntimeWarning, stacklevel=5)  # fmt: skip


def compiling_allowed(elements: int, auto_min_elements: int | None = None) -> bool:
    """Whether a fused kernel should run on an input of ``elements`` under the backend in force."""
    backend = get_backend()
    if backend in ("eager", "native") or _state["broken"]:
        return False
    threshold = AUTO_MIN_ELEMENTS if auto_min_elements is None else auto_min_elements
    return backend == "compiled" or elements >= threshold


# ---- tiered execution: eager first, kernels built on a background thread ----------------------------------
def _signature(key: _KernelKey, x: torch.Tensor) -> tuple:
    return (key, x.device, tuple(x.shape), torch.is_inference_mode_enabled())


def _ready_or_counted(key: _KernelKey, x: torch.Tensor) -> bool:
    """True when the kernel for x's signature has already run in the background; otherwise count the call
    and, once the key is hot, queue the signature for the background thread (never waits)."""
    signature = _signature(key, x)
    if signature in _tiers["ready"]:
        return True
    if not background_compile() or not x.is_contiguous() or x.device.type == "meta":
        return False  # off by default; the background sample is contiguous; meta tensors have nothing to run
    with _tier_lock:
        calls = _tiers["calls"][key] = _tiers["calls"].get(key, 0) + 1
        if calls >= HOT_CALLS and signature not in _tiers["queued"]:
            _tiers["queued"].add(signature)
            _job_queue().put((_tiers["generation"], signature))
    return False


def _job_queue() -> queue.Queue:
    """The background worker's queue; the daemon thread starts with the first job (caller holds _tier_lock)."""
    if _tiers["worker"] is None or not _tiers["worker"].is_alive():
        _tiers["jobs"] = _tiers["jobs"] or queue.Queue()
        _tiers["worker"] = threading.Thread(target=_work, args=(_tiers["jobs"],), name="lowbit-compile", daemon=True)
        _tiers["worker"].start()
        if not _tiers.get("exit_hook"):
            atexit.register(_stop_worker)
            _tiers["exit_hook"] = True
    return _tiers["jobs"]


def _stop_worker(timeout: float = 300.0) -> None:
    """At interpreter exit: drop the queued kernels and let the one being compiled finish. A daemon thread
    stopped inside the compiler's C++ code would abort the process ("terminate called ...")."""
    jobs, worker = _tiers["jobs"], _tiers["worker"]
    if jobs is None or worker is None or not worker.is_alive():
        return
    while True:
        try:
            jobs.get_nowait()
        except queue.Empty:
            break
        jobs.task_done()
    jobs.put(None)  # the worker's signal to return
    worker.join(timeout)


def _work(jobs: queue.Queue) -> None:
    while True:
        item = jobs.get()
        if item is None:
            jobs.task_done()
            return
        generation, signature = item
        try:
            if generation == _tiers["generation"] and not _state["broken"]:
                build(signature)
        finally:
            jobs.task_done()


def build(signature: tuple) -> bool:
    """Compile and run the kernel of ``signature`` on a zero tensor of its shape, then mark it ready.
    Returns False (after the one warning) when compiling fails."""
    key, device, shape, inference = signature
    generation = _tiers["generation"]
    sample = torch.zeros(shape, dtype=key[1], device=device)
    try:
        with torch.inference_mode() if inference else torch.no_grad():
            kernel(*key)(_dynamic(sample))
    except Exception as error:
        _give_up(error)
        return False
    with _tier_lock:
        if generation == _tiers["generation"]:
            _tiers["ready"].add(signature)
    return True


def kernel_signature(spec: FormatSpec, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu",
                     inference: bool = False) -> tuple:  # fmt: skip
    """The signature the backend looks up for a tensor of this shape, dtype and device (for warm-up)."""
    dtype = torch.float32 if _upcast(spec, dtype) else dtype
    return ((spec, dtype, len(shape), dtype), torch.device(device), tuple(shape), inference)


def is_ready(signature: tuple) -> bool:
    return signature in _tiers["ready"]


def wait_for_background(timeout: float | None = None) -> bool:
    """Block until the background thread has no queued kernel (True) or ``timeout`` seconds pass (False)."""
    jobs = _tiers["jobs"]
    if jobs is None:
        return True
    done = threading.Event()
    threading.Thread(target=lambda: (jobs.join(), done.set()), daemon=True).start()
    return done.wait(timeout)


def run_fused(key: tuple, function: Callable, *args, dynamic_rows: bool = True) -> torch.Tensor:
    """``function(*args)`` through a kernel compiled for ``key`` (one per key; static shapes except, with
    ``dynamic_rows``, the first dimension of the first argument and of every tensor argument with as many
    rows). Runs without autograd (the fused
    operator kernels are inference kernels). On a compile failure: warn once, run ``function`` eagerly."""
    try:
        compiled = _fused_kernel(key, function)
        rows = args[0].shape[0]
        for argument in args if dynamic_rows and rows > 1 else ():
            if isinstance(argument, torch.Tensor) and argument.dim() and argument.shape[0] == rows:
                torch._dynamo.maybe_mark_dynamic(argument, 0)
        with torch.no_grad():  # one grad mode, so a training loop does not recompile the kernel
            return compiled(*args)
    except Exception as error:
        _give_up(error)
        return function(*args)


def _fused_kernel(key: tuple, function: Callable) -> Callable:
    with _lock:
        compiled = _kernels.get(key)
        if compiled is None:
            renamed = _renamed(function, f"lowbit_fused_{next(_serial)}")
            compiled = torch.compile(renamed, dynamic=False, fullgraph=True, options=_INDUCTOR_OPTIONS)
            _kernels[key] = compiled
    return compiled


def _give_up(error: Exception) -> None:
    _state["broken"] = True
    warnings.warn(
        f"lowbit: compiled kernels are unavailable ({type(error).__name__}: {str(error)[:200]}); "
        "using the eager path from now on",
        RuntimeWarning,
        stacklevel=4,
    )


def _upcast(spec: FormatSpec, dtype: torch.dtype) -> bool:
    """Whether a compiled kernel takes x widened to float32 (and its result is narrowed outside it)."""
    return spec.format_record.upcast_before_kernel and dtype in (torch.float16, torch.bfloat16)


def _narrowed(values: torch.Tensor, dtype: torch.dtype, spec: FormatSpec, wide: torch.Tensor) -> torch.Tensor:
    """A float32 kernel result narrowed as the format's eager function narrows: directed rounding against
    its mode (``FormatSpec.narrowed``), else ``saturating_cast``, one native pass where the library is loaded."""
    if spec.narrows_directed:
        return spec.narrowed(values, dtype, wide)
    narrow = native_kernels.narrow(values, dtype)
    return saturating_cast(values, dtype) if narrow is None else narrow


def _dynamic(x: torch.Tensor) -> torch.Tensor:
    """Mark every dimension dynamic, so the first compile already serves every shape (format parameters
    stay constants: only the tensor's sizes are symbolic)."""
    for dim in range(x.dim()):
        torch._dynamo.maybe_mark_dynamic(x, dim)
    return x


def kernel(spec: FormatSpec, dtype: torch.dtype, rank: int, out_dtype: torch.dtype | None = None
           ) -> Callable[[torch.Tensor], torch.Tensor]:  # fmt: skip
    """The compiled quantizer for (spec, input dtype, rank, output dtype), built on first use; it does the
    up-cast of half types, the quantization and the saturating cast to ``out_dtype`` in one fused pass."""
    out_dtype = dtype if out_dtype is None else out_dtype
    key = (spec, dtype, rank, out_dtype)
    compiled = _kernels.get(key)
    if compiled is None:  # wrapped outside the lock: the first torch.compile imports Dynamo (seconds)
        fresh = torch.compile(_quantizer_function(spec, out_dtype), fullgraph=True, options=_INDUCTOR_OPTIONS)
        with _lock:
            compiled = _kernels.setdefault(key, fresh)
    return compiled


def clear_cache() -> None:
    """Forget every compiled kernel and call count (and re-enable compiling after a failure); kernels still
    being built in the background are dropped when they finish."""
    with _lock, _tier_lock:
        _kernels.clear()
        _state["broken"] = False
        _tiers["generation"] += 1
        for name in ("calls", "ready", "queued"):
            _tiers[name].clear()


def _quantizer_function(spec: FormatSpec, out_dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function quantizing with one spec, with a code object of its own.

    torch.compile keeps its compiled graphs per code object and recompiles (up to a small limit) when a
    guard fails; one shared function for every spec would exhaust that limit after a few formats. A fresh
    code object per kernel gives each spec its own cache entry.
    """

    eager = spec.format_record.eager

    def quantize(x: torch.Tensor) -> torch.Tensor:
        return eager(spec, x, None, out_dtype)

    return _renamed(quantize, f"lowbit_{spec.format_name}_{next(_serial)}")


def _renamed(function: Callable, name: str) -> Callable:
    """A copy of ``function`` with a code object of its own (its own torch.compile cache entry)."""
    code = function.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, function.__globals__, name, function.__defaults__, function.__closure__)
