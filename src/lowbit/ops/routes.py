"""Which kernel path a real module takes on the machine at hand: the decision tables and forced-path checks.

Every path declares the device types it runs on, the probe that says it is exact there and the probe that
says it is fast there (:mod:`lowbit.ops.capabilities`). ``path="auto"`` picks, per call, from the probes of
the input's device (cached), never a path whose exactness probe fails and never one slower than the plain
float route; a forced path that is inexact here raises :class:`~lowbit.errors.ConfigError`, a forced path
that is slow here warns once. The tables, per CPU class (docs/real-execution.md has the measurements):

======================= ============================================ =========================================
class                   int8 dynamic Linear, per token               weight-only Linear
======================= ============================================ =========================================
AMX                     >= 256 rows: ``onednn`` where faster          float32 model (every CPU): ``native`` up
                        fewer: ``fbgemm``                            to 128 rows once loaded, else
AVX-512 VNNI (+ BF16)   >= 256 rows: ``compiled`` / ``int_mm``;       ``dequantize``; bfloat16 model /
                        fewer: ``fbgemm``                            ``compute_dtype``: packed kernel up to 32
                                                                     rows, ``dequantize_bf16`` above
AVX2 / AVX-512 no VNNI  ``fbgemm_pairs`` (two exact 7-bit halves) or
                        ``float_codes``; with ``act_bits=7``: one
                        ``fbgemm`` call
CUDA                    ``int_mm`` (rows > 16, K and N multiples of   ``dequantize`` / ``dequantize_bf16``
                        8), else ``float_codes``
======================= ============================================ =========================================
"""

from __future__ import annotations

import warnings

import torch

from lowbit.errors import ConfigError
from lowbit.ops import capabilities
from lowbit.ops.kernels import PAIRS_MAX_K

CPU_ONLY = ("fbgemm", "fbgemm_pairs", "onednn", "int4pack", "int8pack", "native")
EXACTNESS = {"fbgemm_pairs": "fbgemm_half_exact", "onednn": "onednn_linear_exact", "int4pack": "int4pack",
             "int8pack": "int8pack", "int_mm": "int_mm_exact", "compiled": "int_mm_exact"}  # fmt: skip
SPEED = {"int_mm": "int_mm_fast", "compiled": "int_mm_fast", "dequantize_bf16": "bfloat16_fast"}
# Measured crossover on AVX-512 VNNI (Zen 5, docs/real-execution.md): below it fbgemm's prepacked kernel wins
# (1024² x 64 rows: 0.19x fp32 against 0.27x for compiled int_mm), at 256 rows they tie, from 1024 rows
# int_mm is 5-20 % faster. Both give the same bits, so the crossover changes speed only.
COMPILED_MIN_ROWS = 256
FUSED_MIN_ROWS = 256  # from here the per-token quantize / rescale steps run compiled (two compiled calls pay off)
# The native weight-only kernels (lowbit.native.linear: 4 x 2 register tiles, fused multiply-adds) beat the
# dequantize route up to 128 rows on Zen 5 (quiet, 2 threads, x fp32: int8 1024² 0.63 / 0.95 at 16 / 128 rows
# against 1.47 / 1.09, 4096² 0.47 / 0.98 against 1.92 / 1.02; int4 g32 0.81 / 0.98 against 2.39 / 1.27) and lose
# from 256 rows (int8 1024²: 1.06 against 1.00, 4096²: 1.35 against 0.95), where the sgemm of the rebuilt
# weight pulls ahead.
NATIVE_MAX_ROWS = 128
# Up to NATIVE_FEW_ROWS rows the native kernels beat the dequantize route on every class measured: one to four
# rows decode the codes in registers (csrc/linear_few.c), five to eight widen a weight row into 8- or 16-lane
# vectors. Zen 4, 2 threads, x fp32 (native / dequantize; 2026-12-07): int4 g64 576 -> 1536 at 1 / 4 / 8 rows
# 0.59 / 0.44 / 1.33 against 4.82 / 3.48 / 3.45, 576 -> 49152 0.08 / 0.14 / 0.36 against 1.32 / 1.02 / 1.31;
# the same with AVX2 code (emulated: x86-64-v3 build, ATen / oneDNN / fbgemm held to AVX2) 0.74 / 0.71 / 1.15
# against 5.11 / 2.61 / 4.18. Past it the kernel is taken only where the probe ``native_linear_rows_fast``
# finds it ahead at 64 rows on the machine at hand.
NATIVE_FEW_ROWS = 8
_warned: set[tuple[str, str, str]] = set()


def exactness_probe(path: str, act_bits: int = 8) -> str | None:
    if path == "fbgemm":
        return "fbgemm_exact" if act_bits == 8 else "fbgemm_half_exact"
    return EXACTNESS.get(path)


def runs_exactly(path: str, device: torch.device | str, act_bits: int = 8) -> bool:
    """Whether ``path`` can run exactly on ``device`` (what a forced path is checked against)."""
    device = torch.device(device)
    probe = exactness_probe(path, act_bits)
    return (path not in CPU_ONLY or device.type == "cpu") and (probe is None or capabilities.probe(probe, device))


def check_forced(owner: str, path: str, device: torch.device, act_bits: int = 8, probe: str | None = None) -> None:
    """Refuse a forced path that cannot run exactly on ``device``; warn once if it is slow there. ``probe``
    replaces the path's own exactness probe (a convolution's "onednn" is another kernel than a Linear's)."""
    if path in CPU_ONLY and device.type != "cpu":
        raise ConfigError(f"{owner}.path={path!r} runs on CPU only; this input is on {device} (use path='auto')")
    probe = probe or exactness_probe(path, act_bits)
    machine = capabilities.machine(device)
    if probe is not None and not capabilities.probe(probe, device):
        raise ConfigError(f"{owner}.path={path!r} is not exact on this machine ({machine.name}, class "
                          f"{machine.cpu_class}: probe {probe!r} failed); use path='auto'")  # fmt: skip
    speed = SPEED.get(path)
    if speed is not None and not capabilities.probe(speed, device) and (owner, path, str(device)) not in _warned:
        _warned.add((owner, path, str(device)))
        warnings.warn(f"{owner}.path={path!r} is slow on this machine ({machine.name}, class {machine.cpu_class}: "
                      f"probe {speed!r} failed); path='auto' picks a faster exact one", stacklevel=4)  # fmt: skip


def int_mm_fits(device: torch.device, rows: int, k: int, n: int) -> bool:
    """``torch._int_mm`` is fast here and takes this shape (CUDA wants rows > 16 and K, N multiples of 8)."""
    if not capabilities.probe("int_mm_fast", device):
        return False
    return device.type != "cuda" or (rows > 16 and k % 8 == 0 and n % 8 == 0)


def native_fits(device: torch.device, native: bool) -> bool:
    """lowbit's own exact int8 kernel (``lowbit.native.gemm``) can run: the library is loaded (``native``) and
    the tensors are on the CPU. Where fbgemm and oneDNN saturate (no VNNI) it is the fastest exact route: one
    pass of int16 pairs (``vpmaddwd``), against two fbgemm calls for ``fbgemm_pairs`` and a float32 matmul
    plus conversions for ``float_codes`` (Zen 3, MiniLM's block: 1.1x fp32 against 2.2x and 1.75x)."""
    return native and device.type == "cpu"


def int8_linear_problem(device: torch.device, native: bool) -> str | None:
    """One line saying that no exact int8 Linear route is faster than float32 on ``device`` (the recipes put
    it in their info and the CLI prints it), or None where one is: fbgemm's exact 8-bit kernel (VNNI), a fast
    ``torch._int_mm`` (oneDNN with VNNI / AMX, CUDA), or lowbit's native kernel measured faster than a float32
    Linear (probe ``native_int8_fast``)."""
    if device.type != "cpu":
        return None if capabilities.probe("int_mm_fast", device) else f"int8 runs on exact float routes on {device}"
    if capabilities.probe("fbgemm_exact", device) or capabilities.probe("int_mm_fast", device):
        return None
    if native and capabilities.probe("native_int8_fast", device):
        return None
    machine = capabilities.machine(device)
    kernel = "lowbit's native int8 kernel" if native else "the exact int8 routes (no native library loaded)"
    return (f"int8 Linear layers run slower than float32 on this machine ({machine.name}, class "
            f"{machine.cpu_class}: fbgemm and oneDNN saturate without VNNI; {kernel} measured slower than a "
            f"float32 Linear); act_bits=7 takes one exact fbgemm call")


def int8_dynamic(device: torch.device, rows: int, k: int, n: int, *, token: bool = True, act_bits: int = 8,
                 compile_allowed: bool = False, native: bool = False) -> str:  # fmt: skip
    """The path of ``Int8DynamicLinear`` for ``rows`` x K -> N on ``device`` (``native``: lowbit's native
    library is loaded)."""
    if device.type != "cpu":
        return "int_mm" if int_mm_fits(device, rows, k, n) else "float_codes"
    if not token:
        if capabilities.probe("fbgemm_exact", device):
            return "fbgemm"
        if int_mm_fits(device, rows, k, n):
            return "int_mm"
        return "native" if native_fits(device, native) else "float_codes"
    fast_int_mm = int_mm_fits(device, rows, k, n)
    if rows >= COMPILED_MIN_ROWS and fast_int_mm:
        if capabilities.probe("onednn_linear_fast", device):  # measured faster (expected with AMX tiles)
            return "onednn"
        return "compiled" if compile_allowed else "int_mm"
    if capabilities.probe(exactness_probe("fbgemm", act_bits), device):
        return "fbgemm"
    if fast_int_mm:
        return "int_mm"
    if native_fits(device, native):
        return "native"
    return "fbgemm_pairs" if pairs_fit(device, k) else "float_codes"


def pairs_fit(device: torch.device, k: int) -> bool:
    return device.type == "cpu" and k <= PAIRS_MAX_K and capabilities.probe("fbgemm_half_exact", device)


def w8a8_static(device: torch.device, rows: int, k: int, n: int, native: bool = False) -> str:
    """The path of ``W8A8StaticLinear`` (full 8-bit calibrated codes)."""
    if device.type == "cpu" and capabilities.probe("fbgemm_exact", device):
        return "fbgemm"
    if int_mm_fits(device, rows, k, n):
        return "int_mm"
    return "native" if native_fits(device, native) else "float_codes"


def int8_conv(device: torch.device) -> str:
    """The path of ``Int8Conv2d``: oneDNN's quantized convolution where its sums are exact, else
    ``torch._int_mm`` on im2col codes where it is fast, else the exact reference (float64 sums of codes)."""
    if device.type == "cpu" and capabilities.probe("onednn_conv_exact", device):
        return "onednn"
    return "int_mm" if capabilities.probe("int_mm_fast", device) else "reference"


def int8_conv_problem(device: torch.device) -> str | None:
    """Why an automatic ``Int8Conv2d`` would be slower than the float convolution it replaces on ``device``
    (the recipes then keep that layer in float and say so), or None where an exact fast route exists: oneDNN's
    quantized convolution on CPUs where its sums are exact (VNNI / AMX), ``torch._int_mm`` on CUDA. Without
    them the convolution runs im2col codes through ``torch._int_mm`` (13-46x fp32 on DigitsCNN shapes with
    VNNI) or the int64 reference (64x fp32 at 64 -> 128 channels, 56 x 56, on an AVX2 Zen 3)."""
    path = int8_conv(device)
    if path == "onednn" or device.type == "cuda":
        return None
    machine = capabilities.machine(device)
    return (f"kept in float: no exact int8 convolution is faster than float32 on this machine ({machine.name}, "
            f"class {machine.cpu_class}; its int8 convolution would take the {path!r} path)")


def weight_only(device: torch.device, rows: int, compute_dtype: torch.dtype, packed_path: str, packed_fits: bool,
                small_batch: int, native: bool = False) -> str:  # fmt: skip
    """The path of a weight-only Linear: float32 compute stays float32 (the "native" kernel on the CPU where the
    module has one and it is loaded, for up to NATIVE_FEW_ROWS rows, or NATIVE_MAX_ROWS where the probe
    ``native_linear_rows_fast`` says so; else "dequantize"); bfloat16
    compute (a bfloat16 model or an explicit ``compute_dtype``) takes the packed bfloat16 kernel for few rows."""
    if compute_dtype != torch.bfloat16:
        if not native or device.type != "cpu" or rows > NATIVE_MAX_ROWS:
            return "dequantize"
        many = rows > NATIVE_FEW_ROWS and not capabilities.probe("native_linear_rows_fast", device)
        return "dequantize" if many else "native"
    if device.type == "cpu" and rows <= small_batch and packed_fits and capabilities.probe(packed_path, device):
        return packed_path
    return "dequantize_bf16"
