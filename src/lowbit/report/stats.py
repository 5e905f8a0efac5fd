"""Per-layer statistics, accumulated batch by batch from the recorded calls of both models.

For every call of a layer: the error of its output in the quantized model against the float model
(everything upstream quantized too), the error of the layer alone (its quantized op on the float model's
inputs), the clamped share of each role, the shapes it saw, the parameters behind its stored roles, and a
bounded sample of its weights and input activations for the histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from lowbit.errors import ReportError
from lowbit.report import real
from lowbit.report.collect import Call, main_tensor
from lowbit.report.layers import Layer
from lowbit.report.metrics import ClampCounts, ErrorSums, clamped_count

SAMPLE_LIMIT = 20_000  # values kept per layer and role for the histograms
PARAMETER_ROLES = ("weight", "bias")


@dataclass
class LayerStats:
    layer: Layer
    output: ErrorSums = field(default_factory=ErrorSums)  # quantized model vs float model at this layer
    local: ErrorSums = field(default_factory=ErrorSums)  # this layer alone vs float
    clamps: ClampCounts = field(default_factory=ClampCounts)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # role -> first shape seen
    parameters: dict[str, nn.Parameter] = field(default_factory=dict)  # stored role -> its parameter
    samples: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # role -> sampled values
    grids: dict[str, torch.Tensor | None] = field(default_factory=dict)  # role -> values produced (first call)
    calls: int = 0
    first_call: Call | None = None  # a real layer's first call in the quantized model (timed against fp32)

    def update(self, float_call: Call, quantized_call: Call) -> None:
        """Add one call of the layer in each model (same batch, same position)."""
        name = self.layer.name
        float_out = main_tensor(float_call.output, f"the float output of layer {name!r}")
        quantized_out = main_tensor(quantized_call.output, f"the quantized output of layer {name!r}")
        if float_out.shape != quantized_out.shape:
            raise ReportError(f"layer {name!r}: the float model's output has shape {tuple(float_out.shape)}, the "
                              f"quantized model's {tuple(quantized_out.shape)}; the models do not match")  # fmt: skip
        self.output.add(float_out, quantized_out)
        alone = main_tensor(self.layer.call(float_call.args, float_call.kwargs), f"layer {name!r}")
        self.local.add(float_out, alone)
        self.shapes.setdefault("data_out", tuple(quantized_out.shape))
        for role in ("data_in", *PARAMETER_ROLES):
            self._add_role(role, self.layer.role_tensors(role, quantized_call.args, quantized_call.kwargs))
        if self.layer.formats.data_out is not None:
            raw = self.layer.call(quantized_call.args, quantized_call.kwargs, self.layer.without("data_out"))
            self._count_clamped("data_out", [main_tensor(raw, f"layer {name!r}")])
        if self.first_call is None and self.layer.kind == "real":
            self.first_call = quantized_call
        self.calls += 1

    def _add_role(self, role: str, tensors: list[torch.Tensor]) -> None:
        if not tensors:
            return
        self.shapes.setdefault(role, tuple(tensors[0].shape))
        stored = [t for t in tensors if isinstance(t, nn.Parameter)]
        if stored and role in self.parameters:
            return  # a parameter is counted once, not once per batch
        if stored:
            self.parameters[role] = stored[0]
        self._count_clamped(role, tensors)
        self._sample(role, tensors)
        self._observe_grid(role, tensors[0])

    def _count_clamped(self, role: str, tensors: list[torch.Tensor]) -> None:
        if self.layer.kind == "real":
            self._count_clamped_real(role, tensors)
            return
        spec = getattr(self.layer.formats, role)
        if spec is None:
            return
        for tensor in tensors:
            self.clamps.add(role, clamped_count(spec, tensor), tensor.numel())

    def _count_clamped_real(self, role: str, tensors: list[torch.Tensor]) -> None:
        module = self.layer.module
        for tensor in tensors:
            if role == "weight":
                self.clamps.add(role, real.weight_clamped(module, tensor), tensor.numel())
            elif role == "data_in" and real.input_format(module) is not None:
                self.clamps.add(role, real.input_clamped(module, tensor), tensor.numel())

    def _observe_grid(self, role: str, tensor: torch.Tensor) -> None:
        """The distinct values the role's format produced on its first tensor, for formats whose grid
        follows the data (a fixed grid is read from the format itself when the histogram is drawn)."""
        if self.layer.kind == "real":
            grids = {"weight": real.weight_grid, "data_in": real.input_grid}
            self.grids.setdefault(role, grids[role](self.layer.module) if role in grids else None)
            return
        spec = getattr(self.layer.formats, role)
        if spec is None or role in self.grids:
            return
        if spec.value_set() is not None:
            self.grids[role] = None
            return
        quantized = spec.quantize(tensor.detach().float())
        self.grids[role] = torch.unique(quantized[torch.isfinite(quantized)]).double()

    def _sample(self, role: str, tensors: list[torch.Tensor]) -> None:
        kept = self.samples.setdefault(role, [])
        room = SAMPLE_LIMIT - sum(t.numel() for t in kept)
        for tensor in tensors:
            if room <= 0:
                return
            values = tensor.detach().reshape(-1).double()
            if values.numel() > room:  # an even stride keeps the spread of the whole tensor
                values = values[torch.linspace(0, values.numel() - 1, room).long()]
            kept.append(values)
            room -= values.numel()

    def sample(self, role: str) -> torch.Tensor | None:
        kept = self.samples.get(role)
        return torch.cat(kept) if kept else None


def update_all(stats: dict[str, LayerStats], float_calls: dict, quantized_calls: dict, batch_index: int) -> None:
    """Pair each layer's calls in the two models and add them; ReportError when they do not pair up."""
    for name, layer_stats in stats.items():
        floats, quantized = float_calls.get(name, []), quantized_calls.get(name, [])
        if len(floats) != len(quantized):
            raise ReportError(f"layer {name!r} ran {len(quantized)} time(s) in the quantized model but "
                              f"{len(floats)} in the float model on batch {batch_index}; "
                              "the models do not match")  # fmt: skip
        for float_call, quantized_call in zip(floats, quantized, strict=True):
            layer_stats.update(float_call, quantized_call)
