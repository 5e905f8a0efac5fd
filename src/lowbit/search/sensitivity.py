"""Sensitivity-guided start: the first trials of a new study are chosen from per-layer sensitivity.

Each decision's choices are ranked by the bits they store (every active role's bits per element on a
64 x 64 tensor, scales included; a float role counts 32). A decision's sensitivity is how much the task
metric drops when only that decision takes its cheapest choice (everything else float) on the evaluation
subset. The enqueued trials give the most sensitive 0 %, 25 %, 50 %, 75 % and 100 % of the decisions their
most precise choice and the rest their cheapest, so the sampler starts from a ladder of sensible mixes.
"""

from __future__ import annotations

from typing import Any

from lowbit.report.metrics import storage_bits_per_element
from lowbit.search.space import Decision, SearchSpace

_SHAPE = (64, 64)
LADDER = (0.0, 0.25, 0.5, 0.75, 1.0)


def choice_bits(decision: Decision, suffix: str, choice: Any) -> float:
    first = {name: choices[0] for name, choices in decision.params.items()}
    formats = decision.build({**first, suffix: choice})
    if formats is None:
        return 32.0 * 2
    return sum(storage_bits_per_element(getattr(formats, role), _SHAPE) for role in ("data_in", "weight"))


def extremes(decision: Decision) -> tuple[dict[str, Any], dict[str, Any]]:
    """(cheapest, most precise) parameter values of a decision, each parameter ranked on its own."""
    cheap, precise = {}, {}
    for suffix, choices in decision.params.items():
        ranked = sorted(choices, key=lambda choice: choice_bits(decision, suffix, choice))
        cheap[suffix], precise[suffix] = ranked[0], ranked[-1]
    return cheap, precise


def task_score(metrics: dict[str, float]) -> float:
    for name, sign in (("accuracy", 1), ("mean_cosine", 1), ("loss", -1)):
        if name in metrics:
            return sign * metrics[name]
    raise KeyError("no task metric")


def enqueue_sensitivity_start(study: Any, space: SearchSpace, evaluator: Any) -> list[dict[str, Any]]:
    """Measure each decision's sensitivity and enqueue the ladder of trials; returns their parameters."""
    baseline = task_score(evaluator.evaluate({}))
    ends = {decision.key: extremes(decision) for decision in space.decisions}
    drops = {}
    for decision in space.decisions:
        formats = decision.build(ends[decision.key][0])
        drops[decision.key] = baseline - task_score(evaluator.evaluate({layer: formats for layer in decision.layers}))
    ranked = sorted(space.decisions, key=lambda d: -drops[d.key])
    enqueued = []
    for share in LADDER:
        precise = {d.key for d in ranked[: round(share * len(ranked))]}
        params = {d.param_name(s): v for d in space.decisions
                  for s, v in ends[d.key][1 if d.key in precise else 0].items()}  # fmt: skip
        if params not in enqueued:
            study.enqueue_trial(params, skip_if_exists=True)
            enqueued.append(params)
    return enqueued


__all__ = ["enqueue_sensitivity_start", "extremes"]
