"""Execution backends for format quantizers: plain eager PyTorch, or fused kernels from torch.compile.

``eager`` runs a format's ``_quantize`` op by op: every op reads and writes the whole tensor. ``compiled``
hands the same function to ``torch.compile`` (Inductor's C++ backend on CPU), which fuses it into one
or two passes over memory. Both give bit-identical results (the compiled kernel evaluates the same
float operations; tests/test_backend.py checks every format).

Kernels are cached per format spec, input dtype and rank, and compiled with dynamic shapes, so a new
shape does not trigger a recompile. Stochastic rounding always runs eagerly: torch.compile draws random
numbers from its own generator, and a seed must give the same result on either path.

Choose with ``lowbit.set_backend("eager" | "compiled" | "auto")`` or the environment variable
``LOWBIT_BACKEND``. ``auto`` (the default) compiles tensors of at least ``AUTO_MIN_ELEMENTS`` elements,
where a fused kernel pays for its one-off compile time, and runs smaller ones eagerly. If compiling fails
(no C++ compiler, an unsupported op), lowbit warns once and stays eager for the rest of the process.
"""

from __future__ import annotations

import itertools
import os
import threading
import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from lowbit.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from lowbit.formats._base import FormatSpec

BACKENDS = ("auto", "eager", "compiled")
AUTO_MIN_ELEMENTS = 1 << 18
_KernelKey = tuple  # (spec, dtype, rank, out dtype) for formats; (name, ...) for fused operator kernels

_state = {"backend": None, "broken": False}
_kernels: dict[_KernelKey, Callable[[torch.Tensor], torch.Tensor]] = {}
_lock = threading.Lock()
_serial = itertools.count()
# Fused kernels skip float32 -> bf16 -> float32 round trips unless told to emulate them; scales stored in
# f16 / bf16 must be rounded exactly as eager rounds them.
_INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


def set_backend(name: str) -> None:
    """Select how format quantizers run: "auto" (default), "eager" or "compiled"."""
    _state["backend"] = _checked(name, "set_backend")


def get_backend() -> str:
    """The backend in force: the one set, else $LOWBIT_BACKEND, else "auto"."""
    if _state["backend"] is None:
        _state["backend"] = _checked(os.environ.get("LOWBIT_BACKEND", "auto"), "LOWBIT_BACKEND")
    return _state["backend"]


def _checked(name: str, where: str) -> str:
    key = str(name).strip().lower()
    if key not in BACKENDS:
        raise ConfigError(f"{where}: unknown backend {name!r}{did_you_mean(key, BACKENDS)}; legal: {', '.join(BACKENDS)}")
    return key


def wants_compiled(spec: FormatSpec, x: torch.Tensor) -> bool:
    """Whether ``spec`` should run on ``x`` through a compiled kernel under the current backend."""
    return not spec.is_stochastic and compiling_allowed(x.numel())


def run(spec: FormatSpec, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``spec._quantize_in_dtype(x, generator)`` on the backend in force (x floating point, non-empty)."""
    if not wants_compiled(spec, x):
        return spec._quantize_in_dtype(x, generator)
    try:
        if spec.upcast_before_kernel and x.dtype in (torch.float16, torch.bfloat16):
            return _narrowed(kernel(spec, torch.float32, x.dim())(_dynamic(x.float())), x.dtype)
        return kernel(spec, x.dtype, x.dim())(_dynamic(x))
    except Exception as error:  # a missing compiler or an Inductor failure: fall back once, loudly
        _give_up(error)
        return spec._quantize_in_dtype(x, generator)


def compiling_allowed(elements: int, auto_min_elements: int = AUTO_MIN_ELEMENTS) -> bool:
    """Whether a fused kernel should run on an input of ``elements`` under the backend in force."""
    backend = get_backend()
    if backend == "eager" or _state["broken"]:
        return False
    return backend == "compiled" or elements >= auto_min_elements


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


def saturating_cast(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to a narrower float dtype; finite values beyond its range saturate instead of becoming inf."""
    limit = torch.finfo(dtype).max
    return torch.where(torch.isfinite(values), values.clamp(-limit, limit), values).to(dtype)


def _narrowed(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``saturating_cast`` for block formats' float32 kernel output. Inductor's dynamic-shape reduction
    kernels store half types slowly (block_fp bf16 4096^2: 460 ms vs 190 ms, measured), so the cast runs
    eagerly: a plain cast, redone with saturation only when it produced an infinity."""
    narrow = values.to(dtype)
    return saturating_cast(values, dtype) if torch.isinf(narrow).any() else narrow


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
    with _lock:
        compiled = _kernels.get(key)
        if compiled is None:
            compiled = torch.compile(_quantizer_function(spec, out_dtype), fullgraph=True, options=_INDUCTOR_OPTIONS)
            _kernels[key] = compiled
    return compiled


def clear_cache() -> None:
    """Forget every compiled kernel (and re-enable compiling after a failure)."""
    with _lock:
        _kernels.clear()
        _state["broken"] = False


def _quantizer_function(spec: FormatSpec, out_dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function quantizing with one spec, with a code object of its own.

    torch.compile keeps its compiled graphs per code object and recompiles (up to a small limit) when a
    guard fails; one shared function for every spec would exhaust that limit after a few formats. A fresh
    code object per kernel gives each spec its own cache entry.
    """

    def quantize(x: torch.Tensor) -> torch.Tensor:
        return spec._quantize_in_dtype(x, None, out_dtype)

    return _renamed(quantize, f"lowbit_{spec.format_name}_{next(_serial)}")


def _renamed(function: Callable, name: str) -> Callable:
    """A copy of ``function`` with a code object of its own (its own torch.compile cache entry)."""
    code = function.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, function.__globals__, name, function.__defaults__, function.__closure__)
