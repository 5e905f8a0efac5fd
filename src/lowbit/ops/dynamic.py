"""``Int8DynamicLinear``: int8 weights x int8 activations quantized from each call's data (per token or per
tensor), on the fastest exact integer kernel the machine has (``lowbit.ops.routes.int8_dynamic``)."""

from __future__ import annotations

from typing import Any

import torch

from lowbit import backend
from lowbit.errors import ConfigError
from lowbit.native import token as native_token
from lowbit.ops import kernels, routes
from lowbit.ops.integer import accumulate_int_mm, accumulate_reference
from lowbit.ops.modules import _Int8WeightLinear, register
from lowbit.ops.quant import quantize, token_codes, token_scales


@register
class Int8DynamicLinear(_Int8WeightLinear):
    """int8 weights (symmetric, per channel) x int8 activations quantized at run time.

    ``act_granularity="token"`` (default): one scale per row of the input (per token), codes in
    [-127, 127] (``act_bits=8``) or [-63, 63] (``act_bits=7``: one bit coarser, but one fbgemm call is exact
    on CPUs without VNNI, where 8-bit codes need two); ``act_symmetric=True`` centres them on 0, False on the
    row's mid-range (a float-domain zero point: about one bit finer for one-sided rows such as GELU outputs).
    ``"tensor"``: one asymmetric uint8 scale / zero point for the whole input (torch.ao's rule, 8 bits
    rather than its 7). Paths (``lowbit.ops.routes`` picks): "fbgemm", "fbgemm_pairs", "int_mm", "compiled",
    "onednn", "float_codes", "reference"; integer sums are exact on every path, so they differ only in the
    float rounding of the rescaling ("int_mm", "compiled", "onednn", "fbgemm_pairs" and "float_codes" are
    bit-identical to each other).
    """

    paths = ("auto", "reference", "fbgemm", "int_mm", "compiled", "fbgemm_pairs", "float_codes", "onednn", "native")
    GRANULARITIES = ("token", "tensor")
    COMPILED_MIN_ROWS = routes.COMPILED_MIN_ROWS

    def __init__(self, in_features: int, out_features: int, bias: bool = True, act_symmetric: bool = True,
                 act_granularity: str = "token", act_bits: int = 8) -> None:  # fmt: skip
        super().__init__(in_features, out_features, bias)
        if not isinstance(act_symmetric, bool):
            raise ConfigError(f"act_symmetric={act_symmetric!r} must be a bool")
        if act_granularity not in self.GRANULARITIES:
            raise ConfigError(f"act_granularity={act_granularity!r}; legal: {', '.join(self.GRANULARITIES)}")
        if act_granularity == "tensor" and act_symmetric:
            raise ConfigError("act_granularity='tensor' is asymmetric (uint8 with a zero point): pass act_symmetric=False")
        if act_bits not in (7, 8) or isinstance(act_bits, bool) or (act_bits == 7 and act_granularity == "tensor"):
            raise ConfigError(f"act_bits={act_bits!r}; legal: 8, or 7 with act_granularity='token'")
        self.act_symmetric, self.act_granularity, self.act_bits = act_symmetric, act_granularity, act_bits
        if act_granularity == "tensor":  # the split and oneDNN routes are per token only
            self.paths = tuple(path for path in self.paths if path not in ("fbgemm_pairs", "onednn"))

    def config(self) -> dict[str, Any]:
        config = {**super().config(), "act_symmetric": self.act_symmetric, "act_granularity": self.act_granularity}
        return config if self.act_bits == 8 else {**config, "act_bits": self.act_bits}

    @property
    def q_max(self) -> int:
        return 2 ** (self.act_bits - 1) - 1

    def choose_path(self, rows: torch.Tensor) -> str:
        token = self.act_granularity == "token"
        compile_allowed = token and backend.compiling_allowed(rows.numel(), auto_min_elements=0)
        return routes.int8_dynamic(rows.device, rows.shape[0], self.in_features, self.out_features, token=token,
                                   act_bits=self.act_bits, compile_allowed=compile_allowed,
                                   native=backend.native_ready())  # fmt: skip

    # ---- reference: codes, exact int64 sums, float64 rescaling ----------------------------------------------
    def forward_reference(self, rows: torch.Tensor) -> torch.Tensor:
        zero = torch.zeros((), dtype=torch.int32, device=rows.device)
        if self.act_granularity == "tensor":
            codes, scale, zero_point = self._tensor_codes(rows)
            acc = accumulate_reference(codes, zero_point, self.weight_codes, zero)
            return self._rescale(acc, scale, None)
        token = token_codes(rows, self.act_symmetric, self.q_max)
        return self._rescale(accumulate_reference(token.codes, zero, self.weight_codes, zero), token.scale, token.offset)

    def _rescale(self, acc: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        """acc * scale * w_scale (+ offset * sum_k w) (+ bias), in float64."""
        real = acc.double() * (scale.double() * self.weight_scale.double())
        if offset is not None:
            real = real + offset.double() * self._weight_sums().double()
        return real.float() if self.bias is None else (real + self.bias.double()).float()

    def _tensor_codes(self, rows: torch.Tensor):
        from lowbit.calibrate.builders import scale_zero_point

        scale, zero_point = scale_zero_point(rows.amin(), rows.amax(), 8, signed=False)
        codes = quantize(rows, scale, zero_point, dtype=torch.uint8)
        return codes, scale, zero_point

    def _weight_sums(self) -> torch.Tensor:
        """[N] float32: w_scale * sum_k weight codes (the real row sums of the weight)."""
        return self.derived("sums", lambda: self.weight_codes.sum(1, dtype=torch.int64).float() * self.weight_scale)

    # ---- fast paths --------------------------------------------------------------------------------------------
    def run_path(self, path: str, rows: torch.Tensor) -> torch.Tensor:
        if self.act_granularity == "tensor":
            return self._tensor_path(path, rows)
        if path == "fbgemm":
            return self._fbgemm_path(rows)
        return self._sums_path(rows, path)

    def _fbgemm_path(self, rows: torch.Tensor) -> torch.Tensor:
        """Row codes as integer-valued floats, exact int32 sums by fbgemm's float-input kernel (prepacked weight
        with unit scales, zero point 128, or 64 for 7-bit codes so that no int16 pair sum saturates without
        VNNI), the shared rescaling: the same bits as the "int_mm" path, so choosing between them by row count
        never changes a result. One row takes fbgemm's own scaling instead (scale and bias applied inside)."""
        zero_point = 128 if self.act_bits == 8 else 64
        if self.act_symmetric and rows.shape[0] == 1:
            scale, inverse, _ = token_scales(rows, True, self.q_max)
            # Its scale is the tensor's, so fbgemm can apply it (and the bias) itself. It quantizes with
            # round(fma(x, 1 / s, zero point)); fed the row's codes times s it recovers exactly those codes.
            snapped = torch.round(rows * inverse).mul_(scale)
            return kernels.fbgemm_linear(snapped, scale.item(), zero_point, self._packed_with_bias())
        token = self._native_token(rows, float_codes=True)
        fused = token is None and self._fused(rows, "fbgemm")
        if token is not None:
            codes, scale, offset = token
        elif fused:
            key = ("token_float_quantize", self.act_symmetric, self.q_max, self.in_features)
            codes, scale, offset = backend.run_fused(key, kernels.token_float_quantize, rows, self.act_symmetric, self.q_max)
        else:
            codes, scale, offset = kernels.token_float_quantize_eager(rows, self.act_symmetric, self.q_max)
        # Integer-valued input with scale 1: fbgemm's round(x + zero point) gives exactly these codes.
        sums = kernels.fbgemm_linear(codes, 1.0, zero_point, self._packed_unit())
        return self._rescale_sums(sums, scale, offset, fused)

    def _native_token(self, rows: torch.Tensor, float_codes: bool):
        """(codes, scale, offset) by the native kernel (same values as the eager and compiled steps), or None
        where it does not run (backend, library not loaded yet, dtype, device)."""
        if not backend.native_ready():
            return None
        return native_token.quantize(rows, self.act_symmetric, self.q_max, float_codes)

    def _fused(self, rows: torch.Tensor, path: str) -> bool:
        """Whether the quantize and rescale steps run as torch.compile kernels: only under the "compiled"
        backend (``auto`` never waits on a compiler: native kernels once loaded, else eager steps), on the
        "compiled" path, or from FUSED_MIN_ROWS rows on the fbgemm and oneDNN paths."""
        if backend.get_backend() != "compiled" or not backend.compiling_allowed(rows.numel(), auto_min_elements=0):
            return False
        return path == "compiled" or (path in ("fbgemm", "onednn") and rows.shape[0] >= routes.FUSED_MIN_ROWS)

    def _sums_path(self, rows: torch.Tensor, path: str) -> torch.Tensor:
        """Row codes, exact int32 sums by ``path``, rescaling. The first and last steps run as native kernels
        when loaded; under the "compiled" backend the "compiled" path runs them as torch.compile kernels (one
        per (K, symmetric) and (N, symmetric, bias)); else eagerly. All bit-identical."""
        symmetric = self.act_symmetric
        token = self._native_token(rows, float_codes=False)
        fused = token is None and self._fused(rows, path)
        if token is not None:
            codes, scale, offset = token
        elif fused:
            quantize_key = ("token_quantize", symmetric, self.q_max, self.in_features)
            codes, scale, offset = backend.run_fused(quantize_key, kernels.token_quantize, rows, symmetric, self.q_max)
        else:
            codes, scale, offset = kernels.token_quantize(rows, symmetric, self.q_max)
        if token is not None and path in ("int_mm", "compiled", "native"):  # native steps: int32 sums in a buffer of
            acc = self._native_sums(codes) if path == "native" else kernels.int_mm_fresh(codes, self._weight_t())
            return self._rescale_sums(acc, scale, offset, fused, owned=True)  # their own, rescaled in place
        return self._rescale_sums(self._token_sums(codes, path), scale, offset, fused)

    def _rescale_sums(self, acc: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None, fused: bool,
                      owned: bool = False) -> torch.Tensor:  # fmt: skip
        """acc * row scale * weight scale (+ row offset * weight sums) (+ bias): one compiled pass, or eager
        steps (in place on float32 sums that are this call's own tensor; the native pass also in place on int32
        sums that are, ``owned``)."""
        sums = None if self.act_symmetric else self._weight_sums()
        arguments = (acc, scale, self.weight_scale, offset, sums, self.bias)
        if backend.native_ready():
            out = native_token.rescale(*arguments, owned=owned)
            if out is not None:
                return out
        # fbgemm and oneDNN return a fresh tensor of float sums: rescaled in place, no second output to fault in
        rescale = kernels.token_rescale_ if acc.dtype == torch.float32 else kernels.token_rescale
        if fused:
            rescale_key = (rescale.__name__, self.act_symmetric, self.bias is None, self.out_features, acc.dtype)
            return backend.run_fused(rescale_key, rescale, *arguments)
        return rescale(*arguments)

    def _token_sums(self, codes: torch.Tensor, path: str) -> torch.Tensor:
        """int32 sums [M, N] of int8 codes [M, K] and the weight codes (float32 from oneDNN: the same numbers)."""
        if path in ("int_mm", "compiled"):
            return kernels.int_mm_workspace(codes, self._weight_t())
        if path == "onednn":
            packed = self.derived("onednn", lambda: kernels.onednn_pack(self.weight_codes))
            return kernels.onednn_sums(codes, packed, self.out_features)
        if path == "native":
            return self._native_sums(codes)
        if path == "fbgemm_pairs" and self.in_features <= kernels.PAIRS_MAX_K:
            return kernels.fbgemm_pairs(codes.float(), self._packed_unit())
        return self._float_sums(codes)

    def _tensor_path(self, path: str, rows: torch.Tensor) -> torch.Tensor:
        if path == "fbgemm":
            return kernels.fbgemm_dynamic_linear(rows, self._packed_with_bias())
        codes, scale, zero_point = self._tensor_codes(rows)
        if path == "native":
            acc = self._native_sums(codes, zero_point)
        elif path in ("int_mm", "compiled"):
            zero = torch.zeros((), dtype=torch.int32, device=rows.device)
            acc = accumulate_int_mm(codes, zero_point, self.weight_codes, zero)
        else:  # float_codes
            acc = self._float_sums(codes, zero_point, 255)
        return self._add_bias(acc.float().mul_(scale * self.weight_scale))
