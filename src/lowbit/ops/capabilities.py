"""What the machine under a tensor can do: ISA flags, a CPU class, and cached kernel probes.

Every fast path of the real modules declares what it needs (a device type and one or more probes below);
the automatic choice reads them here, once per (probe, device), never from what the machine the code was
written on could do. A probe is a measurement on the machine at hand:

- ``fbgemm_exact``: fbgemm's int8 linear gives exact integer sums for full 8-bit codes (VNNI; without it the
  AVX2 kernel adds pairs of u8 x s8 products in saturating int16 and gets them wrong);
- ``fbgemm_half_exact``: the same for activation codes of at most 7 bits (0..128), which cannot saturate;
- ``int_mm_exact``: ``torch._int_mm`` gives exact sums on worst-case pairs of products;
- ``int_mm_fast``: ``torch._int_mm`` is exact and faster than a float32 matmul of the same shape (on CPU
  it needs oneDNN with VNNI or AMX; elsewhere torch runs a scalar loop 20-40x slower than float32);
- ``int4pack`` / ``int8pack``: the bfloat16 weight-only kernels run and are exact;
- ``bfloat16_fast``: bfloat16 matmuls run in hardware (AVX512-BF16 / AMX-BF16 flags, or a GPU);
- ``onednn_linear_exact``: oneDNN's quantized linear gives exact sums; ``onednn_linear_fast``: and it is
  measured faster than ``torch._int_mm`` (AMX tiles);
- ``native_int8_fast``: lowbit's own exact int8 kernel (int16 pairs into int32, ``lowbit.native.gemm``) with its
  quantize and rescale passes is faster than a float32 Linear (asked only where fbgemm / oneDNN saturate);
- ``native_linear_rows_fast``: lowbit's native weight-only kernel beats rebuilding the float32 weight at 64
  rows (so it serves up to 128 rows; else only batches of 1-2 rows, as in decoding).

Tests replace the flags and probe outcomes with :func:`injected` (a whole CPU class at once, on one
machine), so the decision tables are tested for every class wherever the suite runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import platform
import threading
import time
from collections.abc import Callable, Iterator

import torch

CPU_CLASSES = ("amx", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512", "avx2", "baseline")
CLASS_LABELS = {"amx": "AMX", "avx512_bf16": "AVX-512 VNNI + BF16", "avx512_vnni": "AVX-512 VNNI",
                "avx_vnni": "AVX2 + AVX-VNNI", "avx512": "AVX-512 (no VNNI)", "avx2": "AVX2 (no VNNI)",
                "baseline": "x86 without AVX2"}  # fmt: skip

# Flags and probe outcomes each CPU class shows (measured on the four classes this project has run on).
CLASS_PRESETS: dict[str, tuple[frozenset[str], dict[str, bool]]] = {
    "amx": (frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}),
            {"fbgemm_exact": True, "fbgemm_half_exact": True, "int_mm_exact": True, "int_mm_fast": True, "bfloat16_fast": True,
             "onednn_linear_exact": True, "onednn_linear_fast": True, "onednn_conv_exact": True,
             "native_int8_fast": False, "native_linear_rows_fast": True}),
    "avx512_bf16": (frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}),
                    {"fbgemm_exact": True, "fbgemm_half_exact": True, "int_mm_exact": True, "int_mm_fast": True, "bfloat16_fast": True,
                    "onednn_linear_exact": True, "onednn_linear_fast": False, "onednn_conv_exact": True,
                    "native_int8_fast": False, "native_linear_rows_fast": True}),
    "avx512_vnni": (frozenset({"avx2", "avx512f", "avx512_vnni"}),
                    {"fbgemm_exact": True, "fbgemm_half_exact": True, "int_mm_exact": True, "int_mm_fast": True, "bfloat16_fast": False,
                    "onednn_linear_exact": True, "onednn_linear_fast": False, "onednn_conv_exact": True,
                    "native_int8_fast": False, "native_linear_rows_fast": True}),
    "avx2": (frozenset({"avx2", "fma"}),
             {"fbgemm_exact": False, "fbgemm_half_exact": True, "int_mm_exact": True, "int_mm_fast": False, "bfloat16_fast": False,
             "onednn_linear_exact": False, "onednn_linear_fast": False, "onednn_conv_exact": False,
             "native_int8_fast": True, "native_linear_rows_fast": False}),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Machine:
    """The device a tensor lives on, seen by the kernel choice."""

    device_type: str
    flags: frozenset[str] = frozenset()
    name: str = ""

    @property
    def cpu_class(self) -> str:
        """The most capable class in :data:`CPU_CLASSES` whose flags this CPU has."""
        f = self.flags
        if "amx_int8" in f and "amx_tile" in f:
            return "amx"
        if "avx512_vnni" in f:
            return "avx512_bf16" if "avx512_bf16" in f else "avx512_vnni"
        if "avx_vnni" in f:
            return "avx_vnni"
        if "avx512f" in f:
            return "avx512"  # Skylake-SP: AVX-512 without VNNI saturates like AVX2
        return "avx2" if "avx2" in f else "baseline"


_injected = threading.local()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """ISA flags of this CPU (/proc/cpuinfo on Linux; otherwise what torch's dispatcher reports)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    capability = torch.backends.cpu.get_cpu_capability().lower()  # "AVX2", "AVX512", "DEFAULT", ...
    return frozenset({"avx2"} | ({"avx512f"} if "avx512" in capability else set()))


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: torch.device | str = "cpu") -> Machine:
    """The machine of ``device`` (flags replaced inside :func:`injected` for CPU devices)."""
    device = torch.device(device)
    if device.type != "cpu":
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        return Machine(device.type, frozenset(), name)
    preset = getattr(_injected, "state", None)
    if preset is not None:
        return Machine("cpu", preset[0], f"injected {preset[2]}")
    return Machine("cpu", cpu_flags(), cpu_name())


@contextlib.contextmanager
def injected(cpu_class: str, **probes: bool) -> Iterator[Machine]:
    """Pretend (in this thread) to run on a CPU of ``cpu_class``: its flags and probe outcomes from
    :data:`CLASS_PRESETS`, individual probes overridden by keyword. For tests of the decision tables."""
    if cpu_class not in CLASS_PRESETS:
        raise ValueError(f"cpu_class={cpu_class!r}; legal: {', '.join(CLASS_PRESETS)}")
    flags, outcomes = CLASS_PRESETS[cpu_class]
    previous = getattr(_injected, "state", None)
    _injected.state = (flags, {**outcomes, **probes}, cpu_class)
    try:
        yield machine("cpu")
    finally:
        _injected.state = previous


PROBES: dict[str, Callable[[torch.device], bool]] = {}


def register_probe(name: str):
    def decorate(function: Callable[[torch.device], bool]):
        PROBES[name] = function
        return function

    return decorate


_probe_cache: dict[tuple[str, str], bool] = {}
_probe_lock = threading.RLock()  # a probe may ask another probe


def probe(name: str, device: torch.device | str = "cpu") -> bool:
    """The cached outcome of probe ``name`` on ``device`` (False where it cannot run or is not known)."""
    device = torch.device(device)
    state = getattr(_injected, "state", None)
    if state is not None and device.type == "cpu" and name in state[1]:
        return state[1][name]
    key = (name, str(device))
    if key not in _probe_cache:
        with _probe_lock, torch.inference_mode(False), torch.no_grad():
            if key not in _probe_cache:
                try:
                    _probe_cache[key] = bool(PROBES[name](device))
                except (RuntimeError, AttributeError, NotImplementedError, TypeError):
                    _probe_cache[key] = False
    return _probe_cache[key]


@register_probe("bfloat16_fast")
def _bfloat16_fast(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(machine(device).flags & {"avx512_bf16", "amx_bf16"})


def best_seconds(function: Callable[[], object], rounds: int = 7) -> float:
    """The fastest of ``rounds`` timed calls after one warm-up (the minimum is the least noisy estimate)."""
    function()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


@register_probe("int_mm_exact")
def _int_mm_exact(device: torch.device) -> bool:
    """``torch._int_mm`` gives exact int32 sums on the worst cases for pairs of products (oneDNN held to
    AVX2 by ONEDNN_MAX_CPU_ISA on a VNNI CPU saturates them in int16, measured)."""
    a = torch.full((32, 64), 127, dtype=torch.int8)
    a[1] = -128
    a[2, 1::2] = -128
    b = torch.full((64, 32), 127, dtype=torch.int8)
    b[:, 1] = -128
    b[1::2, 2] = -128
    got = torch._int_mm(a.to(device), b.to(device)).long().cpu()
    return bool(torch.equal(got, a.long() @ b.long()))


@register_probe("int_mm_fast")
def _int_mm_fast(device: torch.device) -> bool:
    """``torch._int_mm`` exact on a small case and, on CPU, faster than a float32 matmul of 256 x 512 x 512:
    the two outcomes measured are far apart (oneDNN with VNNI / AMX: 3-10x faster; torch's scalar fallback
    where oneDNN does not take it: 20-40x slower), so the best-of-7 comparison is stable under load."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (32, 64), generator=generator, dtype=torch.int16).to(torch.int8).to(device)
    b = torch.randint(-128, 128, (64, 32), generator=generator, dtype=torch.int16).to(torch.int8).to(device)
    if not probe("int_mm_exact", device) or not torch.equal(torch._int_mm(a, b).long().cpu(), a.long().cpu() @ b.long().cpu()):
        return False
    if device.type != "cpu":
        return device.type == "cuda"
    codes = torch.randint(-128, 128, (256, 512), generator=generator, dtype=torch.int16).to(torch.int8)
    weight = torch.randint(-128, 128, (512, 512), generator=generator, dtype=torch.int16).to(torch.int8)
    floats, weight_floats = codes.float(), weight.float()
    integer = best_seconds(lambda: torch._int_mm(codes, weight))
    return integer < best_seconds(lambda: floats @ weight_floats)
