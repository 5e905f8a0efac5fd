"""LogicNets (experimental): a sparse, integer-quantized linear layer evaluated as per-neuron truth tables.

Each output neuron reads only a few inputs (its fan-in). Because those inputs are quantized to a ``w``-bit
integer format, the neuron sees at most 2^(w * fan_in) distinct input combinations, so its whole quantized
behaviour (linear sum, activation, output quantization) fits in a truth table that is computed once. The
forward pass then never multiplies: it turns each input into its integer code, packs the codes of a
neuron's fan-in into a table index and reads the output code.

The neuron, computed identically when building the table and in :meth:`LogicNetsLinear.reference`:

1. ``x_q = input_format.quantize(x)``  (out-of-range inputs saturate to the extreme codes),
2. ``pre = bias[o]``, then ``pre = pre + weight[o, i] * x_q[fan_in[o, i]]`` for i = 0, 1, ... in order,
   all in float64 (a product of a float32 weight and a code of up to 29 bits is exact in float64, and a
   fixed summation order makes the sum the same float whatever the batch shape),
3. ``act = activation(pre)`` on a float64 ``[rows, out_features]`` tensor,
4. ``y = output_format.quantize(act)``; the table stores y's integer code ``y * 2^frac_width``.

See docs/experimental.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from lowbit.errors import ConfigError
from lowbit.formats._base import FormatSpec
from lowbit.formats._registry import resolve

INTEGER_FORMAT_NAMES = ("integer", "fixed")
DEFAULT_MAX_TABLE_ENTRIES = 2**20  # per neuron
DEFAULT_MAX_TABLE_BYTES = 2**28  # all neurons together (256 MiB)
_BUILD_CHUNK_ELEMENTS = 2**20  # rows x neurons evaluated at once while building the tables


def prune_to_fan_in(linear: nn.Linear, fan_in: int) -> torch.Tensor:
    """Zero all but the ``fan_in`` largest-magnitude weights of each row of ``linear`` (in place).

    Returns the boolean keep-mask, shaped like the weight. LogicNets needs a small fan-in per neuron; this is
    the simplest pruning that guarantees it (train further with the mask applied to recover accuracy).
    """
    if not isinstance(linear, nn.Linear):
        raise ConfigError(f"prune_to_fan_in expects an nn.Linear, got {type(linear).__name__}")
    if isinstance(fan_in, bool) or not isinstance(fan_in, int) or not 1 <= fan_in <= linear.in_features:
        raise ConfigError(f"prune_to_fan_in: fan_in={fan_in!r} must be an integer in [1, {linear.in_features}]")
    with torch.no_grad():
        kept = linear.weight.abs().topk(fan_in, dim=1).indices
        mask = torch.zeros_like(linear.weight, dtype=torch.bool).scatter_(1, kept, True)
        linear.weight.mul_(mask)
    return mask


def integer_spec(fmt: FormatSpec | Mapping[str, Any] | str, role: str) -> FormatSpec:
    """A deterministic integer / fixed format spec from a spec, ``{"name": ..., **params}`` or a name."""
    if isinstance(fmt, Mapping):
        params = dict(fmt)
        name = params.pop("name", None)
        if name is None:
            raise ConfigError(f"LogicNets: {role} {fmt!r} needs a 'name' key (integer or fixed)")
        spec = resolve(name, **params)
    else:
        spec = resolve(fmt)
    if spec.format_name not in INTEGER_FORMAT_NAMES:
        raise ConfigError(
            f"LogicNets: {role} must be an integer format ({' or '.join(INTEGER_FORMAT_NAMES)}), got "
            f"{spec.describe()}; a truth table needs a finite set of evenly spaced integer codes"
        )
    if spec.is_stochastic:
        raise ConfigError(f"LogicNets: {role} {spec.describe()} rounds stochastically; a truth table needs a "
                          "deterministic quantizer")  # fmt: skip
    return spec


def table_dtype(spec: FormatSpec) -> torch.dtype:
    """The narrowest signed integer dtype holding every code of ``spec``."""
    q_min, q_max = spec.code_range
    for dtype in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        if info.min <= q_min and q_max <= info.max:
            return dtype
    return torch.int64


class LogicNetsLinear(nn.Module):
    """Truth-table evaluation of a sparse linear layer + activation with integer inputs and outputs.

    Buffers: ``fan_in_indices`` [out, k] (long; :meth:`from_linear` lists a row's non-zero inputs in
    ascending order, then its zero-weight padding), ``weight`` [out, k] and ``bias``
    [out] (float64, for :meth:`reference`), ``table`` [out, 2^(input_width * k)] (output codes). Inference
    only: the output carries no gradient. Build it with :meth:`from_linear`.
    """

    def __init__(
        self,
        in_features: int,
        fan_in_indices: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: Callable[[torch.Tensor], torch.Tensor] | None,
        *,
        input_format: FormatSpec | Mapping[str, Any] | str,
        output_format: FormatSpec | Mapping[str, Any] | str,
        max_table_entries: int = DEFAULT_MAX_TABLE_ENTRIES,
        max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES,
    ) -> None:
        super().__init__()
        self.input_format = integer_spec(input_format, "input_format")
        self.output_format = integer_spec(output_format, "output_format")
        self.in_features = in_features
        self.activation = _float64_activation(activation)
        indices, weight, bias = _check_structure(in_features, fan_in_indices, weight, bias)
        self.out_features, self.fan_in = indices.shape
        self.register_buffer("fan_in_indices", indices)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self._check_table_size(max_table_entries, max_table_bytes)
        self.register_buffer("table", self._build_table())

    # ---- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
        *,
        input_format: FormatSpec | Mapping[str, Any] | str,
        output_format: FormatSpec | Mapping[str, Any] | str,
        max_fan_in: int | None = None,
        max_table_entries: int = DEFAULT_MAX_TABLE_ENTRIES,
        max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES,
    ) -> LogicNetsLinear:
        """Tabulate a pruned ``linear`` followed by ``activation`` (None = identity).

        Each neuron's fan-in is its set of non-zero weights (prune first, e.g. with :func:`prune_to_fan_in`).
        Neurons with fewer non-zero weights than the widest one are padded with unused inputs of weight 0,
        so every table has the same size.
        """
        if not isinstance(linear, nn.Linear):
            raise ConfigError(f"LogicNetsLinear.from_linear expects an nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach().to(torch.float64)
        nonzero = weight != 0
        counts = nonzero.sum(dim=1)
        fan_in = int(counts.max()) if counts.numel() else 0
        if max_fan_in is not None and fan_in > max_fan_in:
            neuron = int(counts.argmax())
            raise ConfigError(
                f"LogicNets: neuron {neuron} has fan-in {fan_in} (non-zero weights) but max_fan_in={max_fan_in}; "
                f"prune the layer first (prune_to_fan_in(linear, {max_fan_in}))"
            )
        # Stable sort on "is zero" puts the non-zero inputs first, each group in ascending input order.
        order = torch.sort((~nonzero).to(torch.int8), dim=1, stable=True).indices[:, :fan_in]
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(linear.in_features, order, weight.gather(1, order), bias, activation,
                   input_format=input_format, output_format=output_format,
                   max_table_entries=max_table_entries, max_table_bytes=max_table_bytes)  # fmt: skip

    def _check_table_size(self, max_entries: int, max_bytes: int) -> None:
        width = self.input_format.width
        entries = self.table_entries
        total_bytes = entries * self.out_features * torch.empty((), dtype=table_dtype(self.output_format)).itemsize
        size = (
            f"{self.out_features} neurons with fan-in {self.fan_in} at input width {width} bits need "
            f"2^({self.fan_in}*{width}) = {entries} table entries per neuron, {total_bytes} bytes in total"
        )
        hint = "prune to a smaller fan-in (prune_to_fan_in) or use a narrower input format"
        if entries > max_entries:
            raise ConfigError(f"LogicNets: {size}; the limit is max_table_entries={max_entries} per neuron; {hint}")
        if total_bytes > max_bytes:
            raise ConfigError(f"LogicNets: {size}; the limit is max_table_bytes={max_bytes}; {hint}")

    @property
    def table_entries(self) -> int:
        """Entries per neuron: every combination of the fan-in's input codes."""
        return 2 ** (self.input_format.width * self.fan_in)

    def _build_table(self) -> torch.Tensor:
        """Evaluate every neuron on every code combination of its fan-in, in chunks of combinations."""
        entries = self.table_entries
        table = torch.empty((self.out_features, entries), dtype=table_dtype(self.output_format))
        chunk = max(1, _BUILD_CHUNK_ELEMENTS // max(1, self.out_features))
        for start in range(0, entries, chunk):
            combination = torch.arange(start, min(entries, start + chunk), dtype=torch.int64)
            # Every neuron enumerates the same combinations, so one column per fan-in position serves all.
            columns = [value.unsqueeze(1) for value in self._combination_values(combination)]
            table[:, start : start + combination.numel()] = self._output_codes(columns, combination.numel()).T
        return table

    def _combination_values(self, combination: torch.Tensor) -> list[torch.Tensor]:
        """The input value at each fan-in position of each table index (position 0 = most significant)."""
        width = self.input_format.width
        q_min = self.input_format.code_range[0]
        digit_mask = 2**width - 1
        values = []
        for position in range(self.fan_in):
            offset = (combination >> (width * (self.fan_in - 1 - position))) & digit_mask
            values.append((offset + q_min).to(torch.float64) * self.input_format.step)
        return values

    # ---- the neuron -----------------------------------------------------------------------------------
    def _output_values(self, columns: list[torch.Tensor], rows: int) -> torch.Tensor:
        """Steps 2-4 of the module doc for ``rows`` rows; ``columns[i]`` broadcasts to [rows, out]."""
        pre = self.bias.expand(rows, self.out_features)
        for position, column in enumerate(columns):
            pre = pre + self.weight[:, position] * column  # fixed order: the same float sum everywhere
        act = self.activation(pre)
        if not isinstance(act, torch.Tensor) or act.shape != pre.shape:
            got = tuple(act.shape) if isinstance(act, torch.Tensor) else type(act).__name__
            raise ConfigError(
                f"LogicNets: the activation must keep the shape [rows, out] = {tuple(pre.shape)}, got {got}"
            )
        return self.output_format.quantize(act.to(torch.float64))

    def _output_codes(self, columns: list[torch.Tensor], rows: int) -> torch.Tensor:
        values = self._output_values(columns, rows)
        if torch.isnan(values).any():
            raise ConfigError("LogicNets: the activation produced NaN, which has no integer output code")
        codes = torch.round(values * 2.0**self.output_format.frac_width)  # exact: values lie on the grid
        return codes.to(table_dtype(self.output_format))

    # ---- evaluation -----------------------------------------------------------------------------------
    def _flat_input(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ConfigError(f"LogicNets: input must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ConfigError(f"LogicNets: input shape {tuple(x.shape)} does not end in in_features={self.in_features}")
        quantized = self.input_format.quantize(x.detach().reshape(-1, self.in_features))
        if torch.isnan(quantized).any():
            raise ConfigError("LogicNets: input contains NaN, which has no integer input code")
        return quantized

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Table lookup: input codes -> packed fan-in index per neuron -> output code -> value."""
        quantized = self._flat_input(x)
        width = self.input_format.width
        # float64: codes times a power of two are exact there, even for float16 input.
        codes = torch.round(quantized.to(torch.float64) * 2.0**self.input_format.frac_width).to(torch.int64)
        offsets = codes - self.input_format.code_range[0]  # 0 .. 2^width - 1
        gathered = offsets[:, self.fan_in_indices]  # [rows, out, k]
        shifts = width * torch.arange(self.fan_in - 1, -1, -1, dtype=torch.int64, device=x.device)
        index = (gathered << shifts).sum(dim=-1)  # integer arithmetic: exact
        flat = index + torch.arange(self.out_features, device=x.device) * self.table_entries
        out_codes = self.table.reshape(-1)[flat]
        out = out_codes.to(x.dtype) * 2.0 ** -self.output_format.frac_width
        return out.reshape(*x.shape[:-1], self.out_features)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The neuron computed directly (no table): what :meth:`forward` must reproduce bit for bit."""
        quantized = self._flat_input(x).to(torch.float64)
        gathered = quantized[:, self.fan_in_indices]  # [rows, out, k]
        columns = [gathered[:, :, position] for position in range(self.fan_in)]
        out = self._output_values(columns, gathered.shape[0]).to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fan_in={self.fan_in}, "
                f"input_format={self.input_format.describe()}, output_format={self.output_format.describe()}, "
                f"table_entries={self.table_entries}")  # fmt: skip


def _float64_activation(activation: Callable | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation as run on float64: a module is copied, put in eval mode (a table needs a fixed
    per-element function, not batch statistics) and converted to float64; None is the identity."""
    if activation is None:
        return nn.Identity()
    if isinstance(activation, nn.Module):
        return copy.deepcopy(activation).eval().to(torch.float64)
    if not callable(activation):
        raise ConfigError(f"LogicNets: activation must be callable or None, got {type(activation).__name__}")
    return activation


def _check_structure(in_features, indices, weight, bias) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate and normalise the sparse layer description (shapes, index range)."""
    if isinstance(in_features, bool) or not isinstance(in_features, int) or in_features < 1:
        raise ConfigError(f"LogicNets: in_features={in_features!r} must be a positive integer")
    indices = torch.as_tensor(indices)
    if indices.dim() != 2 or indices.dtype.is_floating_point or indices.dtype == torch.bool:
        raise ConfigError(f"LogicNets: fan_in_indices must be an integer tensor [out, fan_in], got shape "
                          f"{tuple(indices.shape)} and dtype {indices.dtype}")  # fmt: skip
    if indices.numel() and (indices.min() < 0 or indices.max() >= in_features):
        raise ConfigError(f"LogicNets: fan_in_indices must lie in [0, {in_features}), got "
                          f"[{int(indices.min())}, {int(indices.max())}]")  # fmt: skip
    weight = torch.as_tensor(weight).detach().to(torch.float64)
    if weight.shape != indices.shape:
        raise ConfigError(f"LogicNets: weight shape {tuple(weight.shape)} must equal fan_in_indices shape "
                          f"{tuple(indices.shape)}")  # fmt: skip
    out_features = indices.shape[0]
    bias = torch.zeros(out_features, dtype=torch.float64) if bias is None else torch.as_tensor(bias).detach()
    if bias.shape != (out_features,):
        raise ConfigError(f"LogicNets: bias shape {tuple(bias.shape)} must be ({out_features},)")
    return indices.to(torch.int64), weight.contiguous(), bias.to(torch.float64)
