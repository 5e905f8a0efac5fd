"""The public quantize function, and warmup (compile the fused kernels up front)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from lowbit import backend, native
from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import resolve


def quantize(
    x: torch.Tensor,
    fmt: str | FormatSpec,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    **params: Any,
) -> torch.Tensor:
    """Fake-quantize ``x`` to the format ``fmt`` (a registered name or a spec object).

    ``params`` are the format's parameters (they override those of a spec object). Returns a tensor of the
    same shape and dtype holding representable values; the gradient is straight-through. ``seed`` or
    ``generator`` make stochastic rounding reproducible.

    >>> import torch, lowbit
    >>> lowbit.quantize(torch.tensor([0.30, -1.7]), "integer", width=4, frac_width=2)
    tensor([ 0.2500, -1.7500])
    """
    return resolve(fmt, **params)(x, seed=seed, generator=generator)


def warmup(
    formats: str | FormatSpec | Iterable[str | FormatSpec],
    shapes: Iterable[Sequence[int]],
    *,
    dtypes: Iterable[torch.dtype] = (torch.float32,),
    device: torch.device | str = "cpu",
    inference: bool = False,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Build, now, the kernels the ``auto``, ``native`` and ``compiled`` backends would use for these formats
    on tensors of these shapes and dtypes, so that no later call waits and the fast path runs from the first
    call on: the native library (a few seconds, once per machine), then, under ``auto`` / ``compiled``, a
    torch.compile kernel for each (format, shape, dtype) that has no native kernel. Prints one progress line
    per step to stderr (or calls ``progress`` with it). Returns how many kernels are ready. Nothing to do (0)
    under the eager backend or for stochastic rounding, which always runs eagerly; set ``inference=True``
    for calls made under ``torch.inference_mode``.

    >>> lowbit.warmup(["e4m3", "mxfp4_e2m1"], [(2112, 384)])  # doctest: +SKIP
    """
    report = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    specs = [resolve(f) for f in ([formats] if isinstance(formats, (str, FormatSpec)) else formats)]
    jobs = [(spec, tuple(int(d) for d in shape), dtype) for spec in specs for shape in shapes for dtype in dtypes]
    if backend.get_backend() == "eager":
        report("lowbit warmup: the eager backend compiles nothing")
        return 0
    library = _native_library(report) if backend.get_backend() in ("auto", "native") else None
    ready = 0
    for index, (spec, shape, dtype) in enumerate(jobs, 1):
        if spec.is_stochastic or math.prod(shape) == 0:
            continue
        if library is not None and str(device) == "cpu" and _has_native(spec, shape, dtype):
            report(f"lowbit warmup [{index}/{len(jobs)}] {spec.describe()} {list(shape)}: native kernel")
            ready += 1
            continue
        if backend.get_backend() == "native":
            continue  # eager wherever no native kernel applies
        start = time.perf_counter()
        report(f"lowbit warmup [{index}/{len(jobs)}] compiling {spec.describe()} {str(dtype).removeprefix('torch.')} "
               f"{list(shape)} ...")  # fmt: skip
        if not backend.build(backend.kernel_signature(spec, shape, dtype, device, inference)):
            report("lowbit warmup: compiling failed; the eager path will be used")
            return ready
        ready += 1
        report(f"lowbit warmup [{index}/{len(jobs)}] ready in {time.perf_counter() - start:.1f} s")
    return ready


def _native_library(report: Callable[[str], None]):
    """Build or load the native library now, with a progress line (None, said once, if it cannot be;
    None, silently, under LOWBIT_NATIVE=0)."""
    if native.disabled():
        return None
    if native.library() is None:
        start = time.perf_counter()
        report("lowbit warmup: building the native kernels (once per machine) ...")
        if native.ensure() is None:
            report(f"lowbit warmup: no native kernels ({native.error()})")
            return None
        report(f"lowbit warmup: native kernels ready in {time.perf_counter() - start:.1f} s")
    return native.library()


def _has_native(spec: FormatSpec, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether ``auto`` / ``native`` would run this format natively on such a tensor (tried on zeros)."""
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    native = spec.format_record.native
    return native is not None and native(spec, torch.zeros(shape), dtype) is not None
