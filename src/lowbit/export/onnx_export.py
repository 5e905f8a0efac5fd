"""QDQ ONNX export of models fake-quantized with lowbit.nn modules (QuantLinear, QuantConv2d, ...), real-quantized
with lowbit.ops modules (Int8DynamicLinear, W8A8StaticLinear, Int8WeightOnlyLinear, Int4WeightOnlyLinear,
Int8Conv2d: exported with their own codes and scales by :mod:`lowbit.export.onnx_real`), or a mixture.

How: the model is copied and every quantized role of every ``lowbit.nn`` quantized module is replaced by one
of two marker ops (``torch.library`` custom ops, registered on first use):

- ``lowbit_onnx::qdq(x, scale, zero_point, axis, saturate)`` for activations (``data_in`` / ``data_out``),
  translated to QuantizeLinear -> DequantizeLinear;
- ``lowbit_onnx::dq(codes, scale, zero_point, axis, block_size)`` for parameters (``weight`` / ``bias``),
  whose codes are computed once with ``lowbit.encode`` (bit for bit lowbit's quantized weights) and stored
  as a uint8 / float8 initializer (integer codes always as uint8, see below), translated to DequantizeLinear.

The copy is then exported with ``torch.onnx.export(dynamo=True)`` (opset 21) and a custom translation table
for the two markers, so every other op is converted by PyTorch's own exporter. What ONNX can express:

- activations: ``affine`` / Burn presets of 8 bits with a *given* (calibrated, static) scale and zero point,
  per tensor or per channel, round-half-to-even, no narrow range; ``integer`` / ``fixed`` of width 8;
  ``e4m3`` / ``e5m2`` unscaled (float8 QuantizeLinear, scale 1) or with one given (calibrated) scale;
- parameters: ``affine`` / presets / ``integer`` of at most 8 bits with any scale source, per tensor, per
  channel or in blocks along one axis (DequantizeLinear ``block_size``); ``e4m3`` / ``e5m2``, unscaled or
  per tensor / channel.

Anything else (ternary, binary, log, minifloats, block formats, MX, FP6 / FP4, data-derived activation
scales, stochastic rounding, quantized ops inside an fx graph) raises :class:`ExportError` naming the layer,
the role and the format.

Integer parameters are written unsigned. A signed code c with zero point z is stored as the uint8 c + 128 with
zero point z + 128, so DequantizeLinear gives the same (c - z) * scale, bit for bit. The reason is ONNX Runtime's
CPU kernels: its optimizer fuses Q/DQ around Gemm / MatMul / Conv into QGemm / QLinearMatMul / QLinearConv and
runs them on MLAS integer GEMMs picked by the signedness of both operands (int8 activations are first rewritten
to uint8 on x86). With int8 weights that is the u8s8 kernel, which on AVX2 and on AVX-512 without VNNI (and in
the symmetric-weight convolution kernel) adds each pair of uint8 * int8 products into int16 with saturation
(vpmaddubsw): a pair beyond 32767 is clipped and the output drifts by many steps. With uint8 weights it is the
u8u8 kernel, which widens both operands to 16 bits before multiplying, so its pair sums fit in int32 (checked
natively on AVX-512 VNNI and on QEMU's AVX2-only Zen 3 model, where on the tests' saturating layers u8s8 is off
by 22 to 41 output steps and u8u8 stays within half a step). ONNX Runtime's own remedy, the session option
``session.x64quantprecision`` (the same +128 rewrite of int8 weights), is off by default and would be each
user's to set, so the file carries the exact flavour itself. Cost: on CPUs with VNNI or AMX the u8u8 kernels are
slower than their u8s8 ones; results are the same there.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lowbit._io import atomic_write_bytes
from lowbit.export import onnx_real
from lowbit.export._errors import ExportError
from lowbit.formats import FormatSpec
from lowbit.nn import weight_cache
from lowbit.nn.modules import QuantModule
from lowbit.qtensor import encode

OPSET = 21
_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_ACTIVATION_ROLES = ("data_in", "data_out")
_UNSIGNED_SHIFT = 128  # a signed parameter code c is stored as the uint8 c + 128, its zero point z as z + 128
_CAN_EXPRESS = ("8-bit affine / integer with a static scale, float8 e4m3 / e5m2 (activations); affine / "
                "integer of at most 8 bits, e4m3 / e5m2 (weights and biases)")  # fmt: skip


@dataclasses.dataclass
class RolePlan:
    """What replaces one quantized role: a QDQ pair (activations) or a DequantizeLinear (parameters)."""

    kind: str  # "qdq" or "dq"
    scale: torch.Tensor  # float32, scalar or 1-D (axis) or blocked
    zero_point: torch.Tensor  # int8 / uint8 / float8, shaped like scale
    axis: int = 0
    block_size: int = 0
    saturate: int = -1  # float8 QuantizeLinear only; -1: no attribute
    codes: torch.Tensor | None = None  # the parameter's codes (dq)


@dataclasses.dataclass
class OnnxExport:
    """Result of :func:`export_onnx`: the file, the opset and each layer's role -> format description."""

    path: str
    opset: int
    layers: dict[str, dict[str, str]]


def export_onnx(model: nn.Module, example_inputs: Any, path: str | os.PathLike, *, opset: int = OPSET,
                dynamic_batch: bool = False, input_names: Sequence[str] | None = None,
                output_names: Sequence[str] | None = None) -> OnnxExport:  # fmt: skip
    """Write a QDQ ONNX model of ``model`` (fake-quantized with lowbit.nn modules, real-quantized with lowbit.ops
    modules, or both) to ``path`` atomically.

    ``example_inputs``: a tensor or a tuple of positional inputs. ``dynamic_batch`` makes dimension 0 of
    every input dynamic. Raises ExportError for a role whose format ONNX cannot express (see the module doc).
    """
    if opset < OPSET:
        raise ExportError(f"opset={opset} is too old: float8, blocked and per-axis QDQ need opset {OPSET} or later")
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    _reject_functional_quantization(model)
    exported = copy.deepcopy(model).eval()
    translations = _ops()  # first: it reports missing onnx / onnxscript as an ExportError
    layers = onnx_real.replace_real_modules(exported)
    if layers:
        translations = {**translations, **onnx_real.real_ops()}
    for name, module in exported.named_modules():
        if isinstance(module, QuantModule) and not module.formats.bypass:
            layers[name or "<root>"] = _prepare(name or "<root>", module)
    exported = _without_cache(exported)
    dynamic = {0: torch.export.Dim.AUTO} if dynamic_batch else None
    shapes = tuple(dynamic if isinstance(a, torch.Tensor) else None for a in args) if dynamic_batch else None
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                exported, args, dynamo=True, opset_version=opset, custom_translation_table=translations,
                dynamic_shapes=shapes, input_names=input_names, output_names=output_names, verbose=False,
            )  # fmt: skip
    except Exception as error:  # the exporter's own failures (unsupported torch op, tracing problem)
        raise ExportError(f"torch.onnx.export failed: {type(error).__name__}: {str(error)[:500]}") from error
    atomic_write_bytes(path, program.model_proto.SerializeToString())
    return OnnxExport(str(path), opset, layers)


class _LogitsOnly(nn.Module):
    """A Hugging Face causal LM as ONNX can hold it: logits only, no key-value cache object in the output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model(*args, **kwargs, use_cache=False).logits


def _without_cache(model: nn.Module) -> nn.Module:
    """``model`` itself, or, for a Hugging Face model that returns a key-value cache (a causal LM), a wrapper
    returning its logits: the exporter cannot put a cache object into a graph's outputs."""
    if getattr(getattr(model, "config", None), "use_cache", None) is None or not hasattr(model, "generate"):
        return model
    return _LogitsOnly(model)


@contextlib.contextmanager
def _quiet_exporter():
    """Silence the exporter's progress logging and deprecation chatter (its errors still raise)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


# ---- planning each role -------------------------------------------------------------------------------------
def _prepare(name: str, module: QuantModule) -> dict[str, str]:
    accumulator = getattr(module.formats, "accumulator", None)
    if accumulator is not None:
        raise ExportError(f"layer {name!r}: a simulated accumulator ({accumulator.describe()}) has no ONNX form; "
                          "ONNX integer kernels accumulate in int32 / float32")  # fmt: skip
    weight_cache.clear(module)  # quantized parameters cached by eager calls must not stand in for the markers
    plans, described = {}, {}
    for role, spec in module.formats.active().items():
        where = f"layer {name!r}, role {role!r}, format {spec.describe()}"
        if role in _ACTIVATION_ROLES:
            plans[role] = _activation_plan(spec, where)
        else:
            value = getattr(module, role, None)
            if value is None:  # e.g. a bias format on a layer without bias: nothing to quantize
                continue
            plans[role] = _parameter_plan(spec, value.detach().float(), where)
        described[role] = spec.describe()
    for role, plan in plans.items():
        for part in ("codes", "scale", "zero_point"):
            if getattr(plan, part) is not None:
                module.register_buffer(f"_onnx_{role}_{part}", getattr(plan, part))
    module.formats = _ExportRoles(module, plans)
    return described


def _activation_plan(spec: FormatSpec, where: str) -> RolePlan:
    name = spec.format_name
    if spec.is_stochastic or spec.rounding != "nearest_even":
        raise ExportError(f"{where}: ONNX QuantizeLinear rounds half to even; rounding={spec.rounding!r} "
                          "cannot be exported")
    if name in _FP8:
        if spec.is_scaled and (spec.scale is None or len(spec.scale) != 1):
            raise ExportError(f"{where}: its scale is derived from each input (dynamic) or given per channel; "
                              "QDQ ONNX needs one static scale (quantize_static(activation_format=...))")  # fmt: skip
        scale = torch.tensor(spec.stored_scale[0] if spec.scale is not None else 1.0)  # the scale as stored
        return RolePlan("qdq", scale, torch.zeros((), dtype=_FP8[name]), saturate=int(spec.saturate))
    if name in ("integer", "fixed"):
        if spec.width != 8:
            raise ExportError(f"{where}: ONNX QuantizeLinear saturates at 8 bits; width={spec.width} "
                              "cannot be exported")
        zero = torch.zeros((), dtype=torch.int8 if spec.signed else torch.uint8)
        return RolePlan("qdq", torch.tensor(spec.step, dtype=torch.float32), zero)
    if not hasattr(spec, "parameters_from_block"):  # not an affine family format
        raise ExportError(f"{where}: ONNX cannot express this format; it can express {_CAN_EXPRESS}")
    if spec.scale is None:
        raise ExportError(f"{where}: its scale is derived from each input (dynamic); QDQ ONNX needs a static "
                          "scale and zero point: calibrate the model with lowbit.ptq.quantize_static")  # fmt: skip
    if spec.bits != 8 or spec.narrow_range:
        raise ExportError(f"{where}: ONNX QuantizeLinear saturates to the full 8-bit range; bits={spec.bits}, "
                          f"narrow_range={spec.narrow_range} cannot be exported")  # fmt: skip
    axis = spec.axis if spec.axis is not None else 0
    probe = [1] * (axis + 1 if axis >= 0 else -axis)  # a tensor whose axis has one index per given scale
    probe[axis] = max(len(spec.scale), len(spec.zero_point or ()))
    scale, zero_point = spec._given_parameters(torch.zeros(probe))
    shape = (-1,) if scale.numel() > 1 or zero_point.numel() > 1 else ()
    scale, zero_point = scale.expand(probe).reshape(shape), zero_point.expand(probe).reshape(shape)
    zero_dtype = torch.int8 if spec.signed else torch.uint8
    return RolePlan("qdq", scale.float().contiguous(), zero_point.to(zero_dtype).contiguous(), axis=axis)


def _parameter_plan(spec: FormatSpec, value: torch.Tensor, where: str) -> RolePlan:
    name = spec.format_name
    if spec.is_stochastic:
        raise ExportError(f"{where}: stochastic rounding draws new values each call; export a deterministic format")
    supported = name in _FP8 or name in ("integer", "fixed") or hasattr(spec, "parameters_from_block")
    if not supported or (name in ("integer", "fixed") and spec.width > 8) or getattr(spec, "bits", 8) > 8:
        raise ExportError(f"{where}: ONNX cannot express this format; it can express {_CAN_EXPRESS}")
    q = encode(value, spec)
    if name in _FP8:
        codes = q.codes.to(torch.uint8).view(_FP8[name])
        scale = q.params.get("scale", torch.ones([1] * value.dim())).float()
        zero = torch.zeros(scale.shape, dtype=_FP8[name])
    elif name in ("integer", "fixed"):
        codes, scale = q.codes, torch.full([1] * value.dim(), spec.step)
        zero = torch.zeros(scale.shape, dtype=torch.int64)
    else:
        codes, scale = q.codes, q.params["scale"].float()
        zero = q.params.get("zero_point", torch.zeros(scale.shape, dtype=torch.int64))
    if not codes.is_floating_point():  # stored as uint8, signed codes shifted by 128 (see the module doc)
        shift = _UNSIGNED_SHIFT if q.signed else 0
        codes, zero = (codes.to(torch.int16) + shift).to(torch.uint8), (zero.to(torch.int16) + shift).to(torch.uint8)
    axis, block_size = _dq_geometry(tuple(scale.shape), tuple(value.shape), q.block, where)
    if axis is None:  # per tensor: scalar scale and zero point
        scale, zero, axis = scale.reshape(()), zero.reshape(()), 0
    elif block_size == 0:  # per channel: 1-D along axis
        scale, zero = scale.reshape(-1), zero.reshape(-1)
    else:  # blocked: every other dimension at full size, as DequantizeLinear wants
        full = [n if d == axis else value.shape[d] for d, n in enumerate(scale.shape)]
        scale, zero = scale.expand(full), zero.expand(full)
    return RolePlan("dq", scale.contiguous(), zero.contiguous(), axis=axis, block_size=block_size,
                    codes=codes.contiguous())


def _dq_geometry(grid: tuple[int, ...], shape: tuple[int, ...], block: tuple[int, ...] | None,
                 where: str) -> tuple[int | None, int]:  # fmt: skip
    """(axis or None for per tensor, block size or 0) of a parameter grid; ExportError for ND blocks."""
    varying = [d for d, n in enumerate(grid) if n > 1]
    if not varying:
        return None, 0
    if len(varying) == 1 and grid[varying[0]] == shape[varying[0]]:
        return varying[0], 0  # one scale per index: per channel
    blocked = [d for d, n in enumerate(grid) if n != shape[d]]
    partial = [d for d in blocked if grid[d] > 1]
    if block is not None and len(partial) == 1 and all(grid[d] == 1 for d in blocked if d != partial[0]):
        return partial[0], block[partial[0]]
    raise ExportError(f"{where}: ONNX DequantizeLinear blocks run along one axis; scales of shape {list(grid)} for a "
                      f"tensor of shape {list(shape)} cannot be exported")  # fmt: skip


def _reject_functional_quantization(model: nn.Module) -> None:
    graph = getattr(model, "graph", None)
    if not isinstance(model, torch.fx.GraphModule) or graph is None:
        return
    found = [node.name for node in graph.nodes if node.op == "call_function"
             and getattr(node.target, "__module__", "") == "lowbit.nn.functional"]  # fmt: skip
    if found:
        raise ExportError(f"quantized functions {found} (fx call_function nodes) cannot be exported to ONNX; only "
                          "quantized modules (QuantLinear, QuantConv2d, ...) are")  # fmt: skip


class _ExportRoles:
    """Stands in for a module's RoleFormats during export: each planned role calls its marker op."""

    bypass = False
    accumulator = None  # a simulated accumulator is refused before (_prepare)
    stream = None

    def __init__(self, module: nn.Module, plans: dict[str, RolePlan]) -> None:
        self._module, self._plans = module, plans

    def apply(self, role: str, value: Any) -> Any:
        plan = self._plans.get(role)
        if plan is None or not isinstance(value, torch.Tensor):
            return value
        scale, zero_point = self._buffer(role, "scale"), self._buffer(role, "zero_point")
        if plan.kind == "dq":
            return torch.ops.lowbit_onnx.dq(self._buffer(role, "codes"), scale, zero_point, plan.axis, plan.block_size)
        return torch.ops.lowbit_onnx.qdq(value, scale, zero_point, plan.axis, plan.saturate)

    def describe(self) -> str:
        return "onnx " + ", ".join(f"{role}={plan.kind}" for role, plan in self._plans.items())

    def _buffer(self, role: str, part: str) -> torch.Tensor:
        return getattr(self._module, f"_onnx_{role}_{part}")


# ---- the marker ops and their ONNX translations (registered once, on first export) ------------------------
def _expand(t: torch.Tensor, like: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    if t.dim() == 0:
        return t
    if block_size:
        t = t.repeat_interleave(block_size, dim=axis).narrow(axis, 0, like.shape[axis])
        return t
    shape = [1] * like.dim()
    shape[axis] = -1
    return t.reshape(shape)


@functools.cache
def _ops() -> dict[Any, Any]:
    try:
        from onnxscript import opset21 as op
    except ImportError:
        raise ExportError("ONNX export needs onnx, onnxscript and onnxruntime: pip install 'lowbit[export]'") from None

    @torch.library.custom_op("lowbit_onnx::qdq", mutates_args=())
    def qdq(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int, saturate: int) -> torch.Tensor:
        s, z = _expand(scale, x, axis, 0), _expand(zero_point, x, axis, 0)
        if zero_point.is_floating_point():  # float8: a cast is the rounding
            return (x / s).to(zero_point.dtype).float() * s
        info = torch.iinfo(zero_point.dtype)
        return (torch.round(x / s) + z.float()).clamp(info.min, info.max).sub(z.float()) * s

    @qdq.register_fake
    def _(x, scale, zero_point, axis, saturate):
        return torch.empty_like(x)

    @torch.library.custom_op("lowbit_onnx::dq", mutates_args=())
    def dq(codes: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, axis: int,
           block_size: int) -> torch.Tensor:  # fmt: skip
        s, z = _expand(scale, codes, axis, block_size), _expand(zero_point, codes, axis, block_size)
        return (codes.float() - z.float()) * s

    @dq.register_fake
    def _(codes, scale, zero_point, axis, block_size):
        return torch.empty(codes.shape, dtype=torch.float32, device=codes.device)

    def qdq_onnx(x, scale, zero_point, axis: int, saturate: int):
        extra = {"saturate": saturate} if saturate >= 0 else {}
        q = op.QuantizeLinear(x, scale, zero_point, axis=axis, **extra)
        return op.DequantizeLinear(q, scale, zero_point, axis=axis)

    def dq_onnx(codes, scale, zero_point, axis: int, block_size: int):
        return op.DequantizeLinear(codes, scale, zero_point, axis=axis, block_size=block_size)

    return {torch.ops.lowbit_onnx.qdq.default: qdq_onnx, torch.ops.lowbit_onnx.dq.default: dq_onnx}
