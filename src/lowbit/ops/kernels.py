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

from lowbit.ops import capabilities
from lowbit.ops.integer import dense
from lowbit.ops.quant import token_codes, token_float_codes, token_scales
from lowbit.qtensor.packing import pack_codes

FBGEMM_LINEAR = "linear_with_input_q_dq_qweight_dq_output_fp32"


def _fbgemm_sums_exact(low: int, high: int, zero_point: int) -> bool:
    """Whether fbgemm's int8 linear returns exact sums for integer-valued float input in [low, high] with
    scale 1 and ``zero_point`` (fbgemm multiplies the uint8 codes input + zero_point) and weight codes in
    [-127, 127], lowbit's weight range, on the worst cases for a pair of adjacent products."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    weight = torch.full((24, 64), 127, dtype=torch.int8)
    weight[1] = -127
    rows = torch.full((3, 64), float(high))
    rows[1, 1::2] = float(low)
    rows[2] = torch.tensor([3.0, float(high) - 7, float(low), float(high)] * 16)
    expected = rows.long() @ weight.long().t()
    got = getattr(torch.ops.quantized, FBGEMM_LINEAR)(rows, 1.0, zero_point, pack_int8_weight(weight, torch.ones(24)))
    return bool(torch.equal(got.long(), expected))


@capabilities.register_probe("fbgemm_exact")
def _fbgemm_exact(device: torch.device) -> bool:
    """Full 8-bit activation codes (0..255): exact with VNNI; AVX2 code adds pairs in saturating int16."""
    return device.type == "cpu" and _fbgemm_sums_exact(-128, 127, 128)


@capabilities.register_probe("fbgemm_half_exact")
def _fbgemm_half_exact(device: torch.device) -> bool:
    """Activation codes 0..128: a pair of products stays within 2 * 128 * 127 < 2^15, exact on any x86 CPU."""
    return device.type == "cpu" and _fbgemm_sums_exact(-64, 64, 64)


def fbgemm_exact() -> bool:
    """Whether fbgemm's int8 linear gives exact sums for 8-bit codes on this CPU (cached probe)."""
    return capabilities.probe("fbgemm_exact", "cpu")


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


def token_quantize(x: torch.Tensor, symmetric: bool, q_max: int = 127):
    """(codes int8 [M, K], row scales [M, 1], row offsets [M, 1] or None): ``quant.token_codes`` as a tuple,
    the part of the per-token linear that ``Int8DynamicLinear``'s "compiled" path fuses into one pass."""
    token = token_codes(x, symmetric, q_max)
    return token.codes, token.scale, token.offset


def token_float_quantize(x: torch.Tensor, symmetric: bool, q_max: int = 127):
    """:func:`token_quantize` with integer-valued float32 codes: the input of fbgemm's float kernel (which
    adds its zero point and rounds, exact for integers), fused into one pass on the "fbgemm" path."""
    token = token_float_codes(x, symmetric, q_max)
    return token.codes, token.scale, token.offset


def token_float_quantize_eager(x: torch.Tensor, symmetric: bool, q_max: int = 127):
    """:func:`token_float_quantize` in the fewest eager operations (each costs a dispatch, which is most of the
    time at a few rows): the same values, since |round((x - offset) / scale)| cannot pass q_max (scale is at
    least the row's half range / q_max, rounding moves the quotient by a few ulps) and NaN codes become 0."""
    scale, inverse, offset = token_scales(x.float(), symmetric, q_max)
    centred = x * inverse if offset is None else (x - offset).mul_(inverse)
    return centred.round_().nan_to_num_(0.0), scale, offset


def token_rescale(acc: torch.Tensor, scale: torch.Tensor, weight_scale: torch.Tensor, offset: torch.Tensor | None,
                  weight_sums: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """float32 output of the per-token linear from its int32 sums: acc * row scale * weight scale
    (+ row offset * weight row sums) (+ bias); fused into one pass on the "compiled" path."""
    out = acc.float() * scale * weight_scale
    if offset is not None:
        out = out + offset * weight_sums
    return out if bias is None else out + bias


def token_rescale_(sums: torch.Tensor, scale: torch.Tensor, weight_scale: torch.Tensor, offset: torch.Tensor | None,
                   weight_sums: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """:func:`token_rescale` of float32 sums, written in place: the same operations in the same order, so the
    same bits, without an output allocation per step."""
    sums.mul_(scale).mul_(weight_scale)
    if offset is not None:
        sums.add_(offset * weight_sums)
    return sums if bias is None else sums.add_(bias)


_workspace = threading.local()


def int_mm_workspace(codes: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm(codes, weight_t)`` written into this thread's reusable int32 buffer for the device
    (grown when too small): no fresh multi-megabyte allocation, whose first-touch page faults cost as much
    as the rescaling pass (measured in MiniLM: 0.84x -> 0.73x fp32). The buffer is an ordinary tensor even
    when first made under ``torch.inference_mode()``, so later calls outside it may write into it. The
    result is valid until the next call in the same thread, so it must be consumed at once."""
    rows, columns = codes.shape[0], weight_t.shape[1]
    buffers = getattr(_workspace, "buffers", None)
    if buffers is None:
        buffers = _workspace.buffers = {}
    buffer = buffers.get(codes.device)
    if buffer is None or buffer.numel() < rows * columns:
        with torch.inference_mode(False):
            buffer = buffers[codes.device] = torch.empty(rows * columns, dtype=torch.int32, device=codes.device)
    out = buffer[: rows * columns].view(rows, columns)
    return torch._int_mm(dense(codes), dense(weight_t), out=out)


def int_mm_fresh(codes: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm(codes, weight_t)`` into a new int32 tensor that the caller owns: the native rescale
    turns it into the float32 result in place, one pass over one buffer (the workspace above would need a
    second, fresh output: 0.35-0.5 ms more for 2112 x 384 -> 1536 on a Zen 4)."""
    return torch._int_mm(dense(codes), dense(weight_t))


FLOAT_EXACT = 1 << 24  # every integer up to 2^24 is a float32


def float_chunk(max_product: int) -> int:
    """The largest K whose float32 sums of products of magnitude <= ``max_product`` are all integers below
    2^24, so that a float32 matmul of integer codes is exact in any summation order."""
    return max(1, (FLOAT_EXACT - 1) // max_product)


def float_codes_mm(codes: torch.Tensor, weight_t: torch.Tensor, max_product: int) -> torch.Tensor:
    """Exact int32 sums of integer-valued float32 ``codes`` [M, K] @ ``weight_t`` [K, N], on any device:
    a float32 matmul per chunk of K (each exact, see :func:`float_chunk`), chunks added in int32."""
    step = float_chunk(max_product)
    k = codes.shape[1]
    acc = None
    for start in range(0, k, step):
        part = (codes[:, start:start + step] @ weight_t[start:start + step]).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    return acc


PAIRS_MAX_K = FLOAT_EXACT // (64 * 127)  # the float32 outputs of each half stay exact integers up to this K


def fbgemm_pairs(codes: torch.Tensor, packed) -> torch.Tensor:
    """Exact int32 sums of signed codes [M, K] in [-127, 127] (float32) times fbgemm weight codes packed with
    unit scales, on CPUs whose fbgemm saturates 8-bit codes (no VNNI): c = ceil(c / 2) + floor(c / 2), each
    half summed by one fbgemm call with zero point 64, so its uint8 codes stay in 0..128 and no pair of
    products reaches 2^15 (probe ``fbgemm_half_exact``); each float32 result is an exact integer for
    K <= PAIRS_MAX_K."""
    low = torch.floor(codes * 0.5)
    out = fbgemm_linear(codes - low, 1.0, 64, packed).to(torch.int32)
    return out.add_(fbgemm_linear(low, 1.0, 64, packed).to(torch.int32))


# ---- lowbit's own exact int8 GEMM (CPUs without VNNI) --------------------------------------------------------
@capabilities.register_probe("native_int8_fast")
def _native_int8_fast(device: torch.device) -> bool:
    """lowbit's native int8 kernel (``lowbit.native.gemm``), with the native per-token quantize and rescale
    passes around it, exact on worst-case codes and faster than a float32 Linear of 256 x 1024 -> 1024 (best
    of 7 each) on this CPU. Decides only what ``routes.int8_linear_problem`` says: where
    fbgemm and oneDNN saturate, the native kernel is the fastest exact route either way."""
    from lowbit.native import gemm, token

    if device.type != "cpu":
        return False
    generator = torch.Generator().manual_seed(0)
    worst = torch.full((6, 64), -128, dtype=torch.int8)
    worst[1::2] = 127
    weight_worst = torch.full((17, 64), 127, dtype=torch.int8)
    weight_worst[1::2] = -127
    packed = gemm.pack(weight_worst)
    sums = None if packed is None else gemm.sums(worst, packed)
    if sums is None or not torch.equal(sums.long(), worst.long() @ weight_worst.long().t()):
        return False
    x, weight = torch.randn(256, 1024, generator=generator), torch.randn(1024, 1024, generator=generator)
    packed = gemm.pack(torch.randint(-127, 128, (1024, 1024), generator=generator, dtype=torch.int16).to(torch.int8))
    unit = torch.ones(1024)

    def integer():
        codes, scale, _ = token.quantize(x, True, 127, False)
        return token.rescale(gemm.sums(codes, packed), scale, unit, None, None, None, owned=True)

    if token.quantize(x, True, 127, False) is None or integer() is None:
        return False
    return capabilities.best_seconds(integer) < capabilities.best_seconds(lambda: torch.nn.functional.linear(x, weight))


@capabilities.register_probe("native_linear_rows_fast")
def _native_linear_rows_fast(device: torch.device) -> bool:
    """lowbit's native weight-only kernel (``lowbit.native.linear``, int8 codes) against the dequantize route
    (the float32 weight rebuilt, then a float32 Linear) at 64 rows of 1024 -> 1024, best of 7 each: whether
    the kernel is the faster route past a couple of rows here (Zen 5: up to 128 rows; Zen 3: not from 4-8)."""
    from lowbit.native import linear as native_linear

    if device.type != "cpu":
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1024, generator=generator)
    codes = torch.randint(-127, 128, (1024, 1024), generator=generator, dtype=torch.int16).to(torch.int8)
    scale = torch.rand(1024, generator=generator) + 0.5
    if native_linear.int8_linear(x, codes, scale, None) is None:
        return False
    kernel = capabilities.best_seconds(lambda: native_linear.int8_linear(x, codes, scale, None))
    rebuilt = capabilities.best_seconds(lambda: torch.nn.functional.linear(x, codes.float().mul_(scale.reshape(-1, 1))))
    return kernel < rebuilt


# ---- oneDNN (AMX) ------------------------------------------------------------------------------------------
def onednn_pack(codes: torch.Tensor):
    """oneDNN's packed int8 weight for :func:`onednn_sums` (codes [N, K])."""
    return torch.ops.onednn.qlinear_prepack(codes, None)


def onednn_sums(codes: torch.Tensor, packed, out_features: int) -> torch.Tensor:
    """float32 sums of signed codes [M, K] (int8, in [-127, 127]) times the packed weight, through oneDNN's
    quantized linear (AMX tiles where the CPU has them): uint8 codes c + 128 with zero point 128 and unit
    scales, so the output is the exact int32 sum converted to float32 (the conversion ``acc.float()`` does)."""
    unsigned = (codes.to(torch.int16) + 128).to(torch.uint8)
    ones, zeros = _unit_parameters(out_features, codes.device)
    return torch.ops.onednn.qlinear_pointwise(unsigned, 1.0, 128, packed, ones, zeros, None, 1.0, 0, torch.float32,
                                              "none", [None], "")  # fmt: skip


@functools.lru_cache(maxsize=64)
def _unit_parameters(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit weight scales and zero weight zero points [n] (made once per size, not per call)."""
    with torch.inference_mode(False):
        return torch.ones(n, device=device), torch.zeros(n, dtype=torch.long, device=device)


@capabilities.register_probe("onednn_linear_fast")
def _onednn_linear_fast(device: torch.device) -> bool:
    """oneDNN's int8 linear (with AMX tiles where the CPU has them) at least 10 % faster than ``torch._int_mm``
    on 512 x 1024 x 1024 codes, best of 7 each (measured on the machine at hand: on AVX-512 VNNI they tie)."""
    if device.type != "cpu" or not capabilities.probe("onednn_linear_exact", device):
        return False
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(-127, 128, (512, 1024), generator=generator, dtype=torch.int16).to(torch.int8)
    weight = torch.randint(-127, 128, (1024, 1024), generator=generator, dtype=torch.int16).to(torch.int8)
    packed, weight_t = onednn_pack(weight), weight.t().contiguous()
    onednn = capabilities.best_seconds(lambda: onednn_sums(codes, packed, 1024))
    return onednn * 1.1 < capabilities.best_seconds(lambda: torch._int_mm(codes, weight_t))


@capabilities.register_probe("onednn_linear_exact")
def _onednn_linear_exact(device: torch.device) -> bool:
    if device.type != "cpu":
        return False
    weight = torch.full((24, 64), 127, dtype=torch.int8)
    weight[1] = -127
    codes = torch.full((3, 64), 127, dtype=torch.int8)
    codes[1, 1::2] = -127
    codes[2] = torch.tensor([3, -7, 0, 100] * 16, dtype=torch.int8)
    got = onednn_sums(codes, onednn_pack(weight), 24)
    return bool(torch.equal(got.double(), (codes.long() @ weight.long().t()).double()))


# ---- int4 ------------------------------------------------------------------------------------------------------
def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [N, K] (K even) -> [N, K / 2] bytes: lowbit's one packed layout (``qtensor.packing``,
    "uint8": a little-endian bit stream, element 2j in the low nibble, 2j + 1 in the high one)."""
    n, k = codes.shape
    return pack_codes(codes, 4, signed=False, layout="uint8").words.reshape(n, k // 2)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_nibbles`: [N, K / 2] bytes -> uint8 codes [N, K] (the same layout read back
    with two shifts, fast enough for every forward of the reference path)."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


@capabilities.register_probe("int4pack")
def _int4pack_exact(device: torch.device) -> bool:
    if device.type != "cpu":
        return False
    codes = torch.randint(0, 16, (32, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
    pairs = torch.stack((torch.ones(2, 32), torch.zeros(2, 32)), dim=-1).bfloat16()
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(torch.eye(64, dtype=torch.bfloat16), packed, 32, pairs)
    return bool(torch.equal(got.float().t(), codes.float() - 8))


def int4pack_available() -> bool:
    return capabilities.probe("int4pack", "cpu")


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


def fast_bfloat16(device: torch.device | str = "cpu") -> bool:
    """Whether bfloat16 matmuls run in hardware on ``device`` (AVX512-BF16 / AMX-BF16 on CPU): there a
    bfloat16 Linear is 0.2-0.4x float32, without them 2-4x slower from 16 rows up (Cascade Lake)."""
    return capabilities.probe("bfloat16_fast", device)


@capabilities.register_probe("int8pack")
def _int8pack_exact(device: torch.device) -> bool:
    if device.type != "cpu":
        return False
    codes = torch.randint(-128, 128, (16, 32), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    got = torch.ops.aten._weight_int8pack_mm(torch.eye(32, dtype=torch.bfloat16), codes, torch.ones(16, dtype=torch.bfloat16))
    return bool(torch.equal(got.float().t(), codes.float()))


def int8pack_available() -> bool:
    return capabilities.probe("int8pack", "cpu")


def int8pack_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (computed in bfloat16) times int8 codes [N, K] with per-channel scales -> float32 [M, N]."""
    return torch.ops.aten._weight_int8pack_mm(x.bfloat16(), codes, scale.bfloat16()).float()
