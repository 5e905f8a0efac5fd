"""Typed entry points into the native library: each takes float32 contiguous CPU tensors, returns a float32
result, or None where the kernel does not apply (library not loaded, parameters outside its exact range),
so the caller falls back to the eager path."""

from __future__ import annotations

import contextlib

import torch

from lowbit.native import build
from lowbit.native.interface import ENTRY_POINTS, ROUNDING_CODES, STORAGE_CODES

_FLOAT32_MIN_NORMAL_EXPONENT = -126
# The kernels' storage argument: float32, or bfloat16 / float16 (csrc/stream.h, cast.c).
HALF_CODES = {getattr(torch, name): code for name, code in STORAGE_CODES.items()}
_bound: dict[str, tuple] = {}


def function(name: str):
    """The C function ``name`` of the loaded library, typed as ``interface.ENTRY_POINTS`` lists it (a name
    missing there raises KeyError), or None when no library is loaded. Bound once per library. Callers are
    gated by ``build.library()`` / ``build.ensure()`` (``backend.native_ready``, a forced native path), which
    honour $LOWBIT_NATIVE."""
    library = build.loaded()
    if library is None:
        return None
    bound = _bound.get(name)
    if bound is None or bound[0] is not library:
        result_type, argument_types = ENTRY_POINTS[name]
        entry = getattr(library, name)
        entry.argtypes = list(argument_types)
        entry.restype = result_type
        bound = _bound[name] = (library, entry)
    return bound[1]


@contextlib.contextmanager
def _override(setter: str, value: int):
    """Set one of the library's test overrides (``setter(value)``), and its own rule again (0) on exit."""
    entry = function(setter)
    if entry is None:
        raise RuntimeError("the native library is not loaded")
    entry(value)
    try:
        yield
    finally:
        entry(0)


def threads_from(elements: int):
    """Run every kernel's threaded split from ``elements`` elements on (tests: the threaded code on small
    tensors); the kernels' own thresholds again on exit. Needs the library loaded."""
    return _override("lb_set_threads_from", elements)


def stream_from(size_bytes: int):
    """Write every kernel's output with non-temporal stores from outputs of ``size_bytes`` on, on any number
    of threads (1: always; tests run the streamed code on small tensors; csrc/stream.h), the library's own
    rule again on exit. Needs the library loaded."""
    return _override("lb_set_stream_from", size_bytes)


def window_from(elements: int):
    """Take TWN's two means per tensor from one pass (csrc/sign_window.c) from ``elements`` elements on, on
    any build (tests run the window on small tensors), the library's own rule again on exit. Needs the
    library loaded."""
    return _override("lb_set_window_from", elements)


def chunks(count: int):
    """Hand each pass of a kernel on torch's OpenMP pool out in ``count`` chunks a thread (1: one share each,
    a static split; csrc/parallel.c), the library's own rule again on exit. Needs the library loaded."""
    return _override("lb_set_chunks", count)


def prefetch(floats: int):
    """The block kernels' software prefetch distance past the cache (csrc/stream.h) in floats, -1 for none
    (benchmarks compare them), the library's own again on exit. Needs the library loaded."""
    return _override("lb_set_prefetch", floats)


def chunks_run() -> int:
    """How many chunks the loaded library's passes on torch's OpenMP pool have run (0: no library)."""
    entry = function("lb_chunks_run_count")
    return 0 if entry is None else int(entry())


def window_served() -> int:
    """How many TWN scales the loaded library's window has given since it was loaded (0: no library)."""
    entry = function("lb_window_served_count")
    return 0 if entry is None else int(entry())


def window_wanted(elements: int) -> bool:
    """Whether TWN per tensor over ``elements`` elements tries the window on the loaded library's rule."""
    entry = function("lb_window_wanted")
    if entry is None:
        raise RuntimeError("the native library is not loaded")
    return bool(entry(elements))


def stream_threshold() -> int | None:
    """The output size in bytes from which the loaded library streams its outputs on two threads or more
    (None: no library)."""
    entry = function("lb_stream_from")
    return None if entry is None else int(entry())


def streams(elements: int, threads: int) -> bool:
    """Whether a kernel call writing ``elements`` float32 outputs on ``threads`` threads streams them."""
    entry = function("lb_streams")
    if entry is None:
        raise RuntimeError("the native library is not loaded")
    return bool(entry(elements, threads))


def uses_openmp() -> bool:
    """Whether the loaded library's parallel regions run on torch's OpenMP pool (False: threads of its own,
    or no library)."""
    entry = function("lb_uses_openmp")
    return bool(entry is not None and entry())


def threads() -> int:
    return max(1, torch.get_num_threads())


def float_grid(x: torch.Tensor, mantissa_bits: int, min_exponent: int, max_value: float, rounding: str,
               saturate: bool = True) -> torch.Tensor | None:  # fmt: skip
    """round_to_float_grid on its bit path (the smallest step a normal float32), deterministic modes."""
    entry = function("lb_float_grid_f32")
    half = HALF_CODES.get(x.dtype)
    if entry is None or half is None or rounding not in ROUNDING_CODES or mantissa_bits < 1:
        return None
    if min_exponent - mantissa_bits < _FLOAT32_MIN_NORMAL_EXPONENT or not max_value <= torch.finfo(torch.float32).max:
        return None
    out = torch.empty_like(x)
    entry(x.data_ptr(), out.data_ptr(), x.numel(), mantissa_bits, min_exponent, max_value, int(saturate),
          ROUNDING_CODES[rounding], half, threads())  # fmt: skip
    return out



def narrow(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """A contiguous float32 CPU tensor as bfloat16 / float16 by casting.saturating_cast's rule (nearest
    even; finite values past the range to its largest finite value), or None (other dtype, no library)."""
    entry = function("lb_narrow_f32")
    half = HALF_CODES.get(dtype)
    if entry is None or not half or x.dtype is not torch.float32 or not x.is_contiguous():
        return None
    out = torch.empty(x.shape, dtype=dtype)
    entry(x.data_ptr(), out.data_ptr(), x.numel(), half, threads())
    return out
