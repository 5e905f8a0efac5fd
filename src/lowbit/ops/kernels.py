"""Fast CPU kernels behind the real-quantized modules, each with a probe and a fallback.

- **fbgemm** (``torch.ops.quantized``): prepacked per-channel int8 weights, uint8 activations, int32
  accumulation (VNNI), float32 output. ``linear_with_input_q_dq_qweight_dq_output_fp32(x, s, z, W)``
  quantizes x itself with ONE scale, as round_half_even(fma(x, 1 / s, z)) (measured: the fused multiply-add
  rounds once, so about 1 code in 10^5 differs from round(x * (1 / s)) + z). Dynamic per-token scales are
  obtained by feeding it each row's codes as integer-valued floats (s = 1, so the codes pass through
  exactly) and multiplying each output row by its scale afterwards. :func:`fbgemm_exact` checks once per
  process that the kernel's integer sums are exact (no int16 saturation, which non-VNNI AVX2 code can
  show) and that integer-valued input comes through unchanged; otherwise the callers use ``torch._int_mm``.
- **int4pack** (``aten._weight_int4pack_mm_for_cpu``): int4 weights packed by
  ``aten._convert_weight_to_int4pack_for_cpu`` (int32 [N, K] codes 0..15, inner k-tiles 2), per-group
  (scale, zero) pairs [K / g, N, 2] with value = (q - 8) * scale + zero; bfloat16 activations (float32 ones
  take a path 10-200x slower on CPU).
- **int8pack** (``aten._weight_int8pack_mm``): int8 [N, K] weights with per-channel scales, bfloat16
  activations.
"""

from __future__ import annotations

import functools
import threading
import warnings

import torch

from lowbit.ops.integer import dense
from lowbit.ops.quant import token_codes

FBGEMM_LINEAR = "linear_with_input_q_dq_qweight_dq_output_fp32"


@functools.lru_cache(maxsize=1)
def fbgemm_exact() -> bool:
    """True when fbgemm's int8 linear exists here and gives exact integer sums (codes passed as floats)."""
    try:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            return False
        codes = torch.full((24, 64), 127, dtype=torch.int8)
        codes[1] = -128
        packed = pack_int8_weight(codes, torch.ones(24))
        rows = torch.full((3, 64), 127.0)
        rows[1] = -128.0
        rows[2] = torch.tensor([3.0, -7.0, 0.0, 100.0] * 16)
        expected = rows.round().long() @ codes.long().t()
        got = getattr(torch.ops.quantized, FBGEMM_LINEAR)(rows, 1.0, 128, packed)
        return bool(torch.equal(got.long(), expected))
    except (RuntimeError, AttributeError):
        return False


def pack_int8_weight(codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
    """fbgemm packed params of int8 codes [N, K] with per-output-channel scales [N] (optionally a bias)."""
    with warnings.catch_warnings():  # torch 2.13 warns that quantized tensors are deprecated; fbgemm still packs them
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch._make_per_channel_quantized_tensor(
            codes, scale.double(), torch.zeros(codes.shape[0], dtype=torch.long), 0
        )
        return torch.ops.quantized.linear_prepack(quantized, bias)


@functools.lru_cache(maxsize=None)
def _overload(name: str):
    """The op's default overload (calling it directly skips the packet's per-call Python checks)."""
    return getattr(torch.ops.quantized, name).default


def fbgemm_linear(x: torch.Tensor, x_scale: float, x_zero_point: int, packed) -> torch.Tensor:
    """x [M, K] float32 quantized by fbgemm with (x_scale, x_zero_point) as uint8, times the packed weight."""
    return _overload(FBGEMM_LINEAR)(x, float(x_scale), int(x_zero_point), packed)


def fbgemm_dynamic_linear(x: torch.Tensor, packed) -> torch.Tensor:
    """fbgemm's dynamic int8 linear: one asymmetric uint8 scale / zero point for all of x (8-bit range)."""
    return _overload("linear_dynamic")(x, packed, False)


def token_quantize(x: torch.Tensor, symmetric: bool):
    """(codes int8 [M, K], row scales [M, 1], row offsets [M, 1] or None): ``quant.token_codes`` as a tuple,
    the part of the per-token linear that ``Int8DynamicLinear``'s "compiled" path fuses into one pass."""
    token = token_codes(x, symmetric)
    return token.codes, token.scale, token.offset


def token_rescale(acc: torch.Tensor, scale: torch.Tensor, weight_scale: torch.Tensor, offset: torch.Tensor | None,
                  weight_sums: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """float32 output of the per-token linear from its int32 sums: acc * row scale * weight scale
    (+ row offset * weight row sums) (+ bias); fused into one pass on the "compiled" path."""
    out = acc.float() * scale * weight_scale
    if offset is not None:
        out = out + offset * weight_sums
    return out if bias is None else out + bias


_workspace = threading.local()


def int_mm_workspace(codes: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm(codes, weight_t)`` written into this thread's reusable int32 buffer (grown when too
    small): no fresh multi-megabyte allocation, whose first-touch page faults cost as much as the rescaling
    pass (measured in MiniLM: 0.84x -> 0.73x fp32). The result is valid until the next call in the same
    thread, so it must be consumed at once."""
    rows, columns = codes.shape[0], weight_t.shape[1]
    buffer = getattr(_workspace, "buffer", None)
    if buffer is None or buffer.numel() < rows * columns:
        buffer = _workspace.buffer = torch.empty(rows * columns, dtype=torch.int32)
    out = buffer[: rows * columns].view(rows, columns)
    return torch._int_mm(dense(codes), dense(weight_t), out=out)


# ---- int4 ------------------------------------------------------------------------------------------------------
def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [N, K] (K even) -> [N, K / 2] bytes: element 2j in the low nibble, 2j + 1 high."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_nibbles`: [N, K / 2] bytes -> uint8 codes [N, K]."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


@functools.lru_cache(maxsize=1)
def int4pack_available() -> bool:
    try:
        codes = torch.randint(0, 16, (32, 64), dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
        pairs = torch.stack((torch.ones(2, 32), torch.zeros(2, 32)), dim=-1).bfloat16()
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(torch.eye(64, dtype=torch.bfloat16), packed, 32, pairs)
        return bool(torch.equal(got.float().t(), codes.float() - 8))
    except (RuntimeError, AttributeError):
        return False


def int4pack_weight(codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor):
    """(packed weight, bf16 scale-and-zero pairs [K / g, N, 2]) for codes [N, K], scale / zero point [N, K / g]:
    (q - zero_point) * scale = (q - 8) * scale + (8 - zero_point) * scale."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 2)
    scale = scale.float()
    zero = (8.0 - zero_point.float()) * scale
    pairs = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().bfloat16()
    return packed, pairs


def int4pack_linear(x: torch.Tensor, packed: torch.Tensor, group_size: int, pairs: torch.Tensor) -> torch.Tensor:
    """x [M, K] (computed in bfloat16) times the packed int4 weight -> float32 [M, N]."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, group_size, pairs).float()


@functools.lru_cache(maxsize=1)
def fast_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo's flags).

    Without it a bfloat16 matmul is 2-4x slower than float32 from 16 rows up (measured on Cascade Lake);
    with it, 0.3-0.4x (../shared/reference/baselines-cpu.md, Zen 4), so the weight-only modules rebuild
    their weights in bfloat16 for large batches there (path "dequantize_bf16")."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


@functools.lru_cache(maxsize=1)
def int8pack_available() -> bool:
    try:
        codes = torch.randint(-128, 128, (16, 32), dtype=torch.int8)
        got = torch.ops.aten._weight_int8pack_mm(torch.eye(32, dtype=torch.bfloat16), codes, torch.ones(16, dtype=torch.bfloat16))
        return bool(torch.equal(got.float().t(), codes.float()))
    except (RuntimeError, AttributeError):
        return False


def int8pack_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (computed in bfloat16) times int8 codes [N, K] with per-channel scales -> float32 [M, N]."""
    return torch.ops.aten._weight_int8pack_mm(x.bfloat16(), codes, scale.bfloat16()).float()
