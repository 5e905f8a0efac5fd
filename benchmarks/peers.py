"""The same quantize-dequantize work done by the peers installed as packages (``make bench`` installs them).

Each function returns ``{label: zero-argument callable}`` for one lowbit format row, or ``{}`` when the
peer is missing or has no equivalent. Where a peer's format differs in a detail (qtorch's block floating
point shares one exponent per row, not per 16 elements), the label says so.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Peer = dict[str, Callable[[], torch.Tensor]]


def _qtorch():
    try:
        from qtorch import quant
    except Exception:  # not installed, or its C++ extension failed to build
        return None
    return quant


def _torchao_mx():
    try:
        from torchao.prototype.mx_formats import mx_tensor
    except Exception:
        return None
    return mx_tensor


def _torchao_affine():
    try:
        from torchao.quantization import quant_primitives
    except Exception:
        return None
    return quant_primitives


def peers_for(name: str, params: dict, x: torch.Tensor) -> Peer:
    """Peer implementations of lowbit's format ``name`` with ``params`` on ``x``."""
    out: Peer = {}
    for provider in (_torch_peers, _qtorch_peers, _torchao_peers):
        out.update(provider(name, params, x))
    return out


def _torch_peers(name: str, params: dict, x: torch.Tensor) -> Peer:
    if x.dtype != torch.float32:
        return {}
    if name == "affine" and params.get("scale") is not None:
        return {"torch fake_quantize_per_tensor_affine": lambda: torch.fake_quantize_per_tensor_affine(
            x, params["scale"], params.get("zero_point", 0), -128, 127)}
    if name == "affine" and params.get("axis") == 0 and params.get("symmetric"):
        scale = (x.abs().amax(dim=1) / 7).clamp(min=1e-12)
        zero = torch.zeros(x.shape[0], dtype=torch.int32)
        return {"torch fake_quantize_per_channel_affine (scales given)": lambda: torch.fake_quantize_per_channel_affine(
            x, scale, zero, 0, -8, 7)}
    casts = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    if name in casts:
        return {f"torch .to({casts[name]}).float()": lambda: x.to(casts[name]).float()}
    return {}


def _qtorch_peers(name: str, params: dict, x: torch.Tensor) -> Peer:
    quant = _qtorch()
    if quant is None or x.dtype != torch.float32:
        return {}
    if name == "integer":
        return {"qtorch fixed_point_quantize": lambda: quant.fixed_point_quantize(
            x, params["width"], params["frac_width"], rounding="nearest")}
    if name in ("minifloat_ieee", "e4m3"):
        return {"qtorch float_quantize(exp=4, man=3)": lambda: quant.float_quantize(x, 4, 3, rounding="nearest")}
    if name == "e5m2":
        return {"qtorch float_quantize(exp=5, man=2)": lambda: quant.float_quantize(x, 5, 2, rounding="nearest")}
    if name == "block_fp":
        return {"qtorch block_quantize (one exponent per row)": lambda: quant.block_quantize(
            x, params["width"], dim=0, rounding="nearest")}
    return {}


_MX_ELEMENTS = {
    "mxfp8_e4m3": "float8_e4m3fn",
    "mxfp8_e5m2": "float8_e5m2",
    "mxfp6_e3m2": "fp6_e3m2",
    "mxfp6_e2m3": "fp6_e2m3",
    "mxfp4_e2m1": "float4_e2m1fn_x2",
}


def _torchao_peers(name: str, params: dict, x: torch.Tensor) -> Peer:
    out: Peer = {}
    mx = _torchao_mx()
    if mx is not None and name in _MX_ELEMENTS:
        element = getattr(torch, _MX_ELEMENTS[name], _MX_ELEMENTS[name])  # fp6 elements are named by string

        def mx_round_trip() -> torch.Tensor:
            scale, data = mx.to_mx(x, element, 32)
            return mx.to_dtype(data, scale, element, 32, x.dtype)

        out["torchao to_mx + to_dtype"] = mx_round_trip
    primitives = _torchao_affine()
    if primitives is not None and name == "affine" and params.get("scale") is not None:
        scale = torch.tensor([params["scale"]], dtype=torch.float32)
        zero = torch.tensor([params.get("zero_point", 0)], dtype=torch.int32)
        block = tuple(x.shape)

        def round_trip() -> torch.Tensor:
            q = primitives.quantize_affine(x, block, scale, zero, torch.int8, -128, 127)
            return primitives.dequantize_affine(q, block, scale, zero, torch.int8, -128, 127, output_dtype=x.dtype)

        out["torchao quantize_affine + dequantize_affine"] = round_trip
    return out
