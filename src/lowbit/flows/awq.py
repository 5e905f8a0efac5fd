"""AWQ (activation-aware weight quantization) for int4 weight-only recipes and the format recipe's weights
(``method="awq"`` / ``"awq+gptq"``: the search measures the weight format's own rounding): per-input-channel
scales searched on calibration data, folded into the op before each group of Linears
(:mod:`lowbit.flows.smoothing`), then, for int4, an input-weighted range (clip) search per group of weights
when the codes are made.

For each foldable group (input norm -> q / k / v, v_proj -> o_proj, MLP norm -> gate / up, up_proj -> down_proj),
with X the group's inputs (a sample of the calibration tokens taken from the float model: folding keeps the
float function, so each group's inputs are what the model computes until that group's own fold) and m_j the
mean |X_j| per input channel: s = m^a (divided by its geometric mean), for a in 0, 0.05, ..., 0.95, keeping the
a whose rounded weights give the group's Linears the least output error ``sum ||X W^T - (X / s) Q(W s)^T||^2``
(Q: min-max int4 in groups of ``group_size`` with the recipe's scale dtype, or the format's rounding); a = 0
(s = 1) is plain rounding, so a group's measured error never grows. The clip search is
:func:`lowbit.ops.int4.quantize_groups`' range search (each end of each group shrunk in 5 % steps) weighted by
the scaled inputs' mean x^2 (``search=True``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lowbit._model import run_batches
from lowbit.flows.smoothing import SmoothGroup, fold_scale, smoothing_groups
from lowbit.ops.int4 import quantize_groups

GRID = tuple(step / 20 for step in range(20))  # the exponents a tried: 0 .. 0.95
SAMPLE_ROWS = 2048  # tokens per group kept for the output error


class _Inputs:
    """Per watched Linear: sum |x|, sum x^2 per input channel, row count, and a strided sample of rows."""

    def __init__(self, batches: int, sampled: set[str]) -> None:
        self.batches, self.sampled = batches, sampled
        self.abs: dict[str, torch.Tensor] = {}
        self.square: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}
        self.samples: dict[str, list[torch.Tensor]] = {}

    def hook(self, name: str):
        def watch(module, inputs):
            rows = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
            self.abs[name] = self.abs.get(name, 0) + rows.abs().sum(0)
            self.square[name] = self.square.get(name, 0) + rows.square().sum(0)
            self.rows[name] = self.rows.get(name, 0) + rows.shape[0]
            if name in self.sampled:
                step = max(1, math.ceil(rows.shape[0] * self.batches / SAMPLE_ROWS))
                self.samples.setdefault(name, []).append(rows[::step].clone())

        return watch

    def mean_abs(self, name: str) -> torch.Tensor:
        return self.abs[name] / self.rows[name]

    def power(self, name: str) -> torch.Tensor:
        return self.square[name] / self.rows[name]


def awq_scale(root: nn.Module, targets: dict[str, nn.Module], batches: list,
              round_weight: Callable[[torch.Tensor], torch.Tensor],
              progress=None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:  # fmt: skip
    """Search and fold every group's scale; ``round_weight`` (a float weight [N, K] -> its rounded values, each
    Linear's weight on its own) is the rounding the search measures; returns (info, name -> mean x^2 per input
    channel of the scaled model, for int4's clip search)."""
    say = progress or logging.getLogger("lowbit").info
    groups, skipped = smoothing_groups(root)
    kept = [group for group in groups if all(name in targets for name in group.consumers)]
    skipped.update({group.producer: "a consumer is not quantized" for group in groups if group not in kept})
    leaders = {next(iter(group.consumers)) for group in kept}
    inputs = _Inputs(len(batches), leaders)
    run_batches(root, batches, {module: inputs.hook(name) for name, module in targets.items()})
    power = {name: inputs.power(name) for name in inputs.rows}
    chosen, start = {}, time.perf_counter()
    for index, group in enumerate(kept):
        leader = next(iter(group.consumers))
        if leader not in inputs.rows:
            skipped[group.producer] = "the calibration batches never reach it"
            continue
        sample = torch.cat(inputs.samples.pop(leader))
        scale, alpha, ratio = _search(group, sample, group.reduce(inputs.mean_abs(leader), "mean"), round_weight)
        fold_scale(group, scale)
        expanded = group.expand(scale).float()
        for name in group.consumers:
            power[name] = power[name] / expanded.square().to(power[name].device)
        chosen[group.producer] = {"alpha": alpha, "error_ratio": round(ratio, 4), "layers": sorted(group.consumers),
                                  "scale_range": [round(float(scale.min()), 4), round(float(scale.max()), 4)]}
        if (index + 1) % 10 == 0:
            say(f"AWQ {index + 1}/{len(kept)} groups, {time.perf_counter() - start:.0f} s")
    return {"awq": chosen, "awq_skipped": skipped}, power


@torch.no_grad()
def _search(group: SmoothGroup, sample: torch.Tensor, mean_abs: torch.Tensor,
            round_weight: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, float, float]:  # fmt: skip
    """(scale, its exponent a, its error / the error at a = 0) for one group."""
    weights = [module.weight.detach().float() for module in group.consumers.values()]
    weight = torch.cat(weights)  # [sum N, K]
    sample = sample.to(weight.device)
    reference = sample @ weight.T
    base = mean_abs.double().clamp_min(1e-8)
    best = (None, 0.0, math.inf)
    first_error = None
    for alpha in GRID:
        scale = base.pow(alpha)
        scale = (scale / scale.log().mean().exp()).clamp(1e-4, 1e4)
        expanded = group.expand(scale).float().to(weight.device)
        rounded = torch.cat([round_weight(part * expanded) for part in weights]) / expanded
        error = float((sample @ rounded.T - reference).square().sum())
        first_error = error if first_error is None else first_error
        if error < best[2]:
            best = (scale, alpha, error)
    return best[0], best[1], best[2] / max(first_error, 1e-30)


def int4_rounded(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype) -> torch.Tensor:
    """``weight`` through plain min-max int4 rounding in groups of ``group_size`` (float values)."""
    codes, scale, zero_point = quantize_groups(weight, group_size, scale_dtype, search=False)
    n, k = weight.shape
    groups = codes.reshape(n, k // group_size, group_size).float() - zero_point.unsqueeze(-1).float()
    return (groups * scale.unsqueeze(-1).float()).reshape(n, k)
