"""A measured cost: ``latency_ms``, the sum over layers of each layer's measured forward time on its recorded
input shape, for the kernel that would run it: the real integer module where one computes the layer's
formats (``lowbit.ops.from_fake.convert_quant_linear``: int8 dynamic / static / weight-only, int4
weight-only), the float layer otherwise (a format without a kernel runs as float on a deployment; simulating
it is not a cost a device pays). Each (layer, formats) is timed once per process (median of a few calls
after a warm-up) and reused by every later trial. Timings are as noisy as the machine: use them to rank, on
an otherwise idle machine.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from lowbit.errors import LowbitError
from lowbit.nn.roles import RoleFormats
from lowbit.search.evaluate import Evaluator
from lowbit.search.measure import LayerGeometry

REPEATS = 5


class LatencyModel:
    """``measure(plan)`` -> {"latency_ms": ..., "real_layers": layers run by a real kernel}."""

    def __init__(self, evaluator: Evaluator, geometry: dict[str, LayerGeometry]) -> None:
        self.evaluator, self.geometry = evaluator, geometry
        self.times: dict[tuple[str, str], float] = {}
        self.kernels: dict[tuple[str, str], nn.Module | None] = {}

    def measure(self, plan: dict[str, RoleFormats | None]) -> dict[str, float]:
        total, real = 0.0, 0
        for name, geometry in self.geometry.items():
            if geometry.input_shape is None:
                continue
            module = self._kernel(name, plan.get(name), geometry)
            key = (name, "float" if module is None else plan[name].describe())
            if key not in self.times:  # every format without a kernel shares the layer's one float timing
                chosen = self.evaluator.float_modules[name] if module is None else module
                self.times[key] = _median_seconds(chosen, torch.randn(geometry.input_shape))
            total, real = total + self.times[key], real + int(module is not None)
        return {"latency_ms": total * 1e3, "real_layers": float(real)}

    def _kernel(self, name: str, formats: RoleFormats | None, geometry: LayerGeometry) -> nn.Module | None:
        """The real module computing ``formats`` for this layer, or None (no kernel: it runs as float)."""
        if formats is None or geometry.op != "linear":
            return None
        key = (name, formats.describe())
        if key not in self.kernels:
            from lowbit.ops.from_fake import convert_quant_linear

            try:
                real, _ = convert_quant_linear(self.evaluator.quantized_module(name, formats))
            except LowbitError:  # formats a kernel's constructor refuses: no kernel for them
                real = None
            self.kernels[key] = real.eval() if real is not None else None
        return self.kernels[key]


@torch.no_grad()
def _median_seconds(module: nn.Module, x: torch.Tensor) -> float:
    module(x)  # warm-up (kernel state, caches)
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        module(x)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


__all__ = ["LatencyModel"]
