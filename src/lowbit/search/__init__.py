"""Mixed-precision search across format families on Optuna (``lowbit search --config FILE``).

A config's ``[search]`` table (MASE's layout, plus lowbit's seed tables and options) defines per-layer
choices (:mod:`lowbit.search.space`); each Optuna trial picks one choice per decision, the model is
evaluated on a fixed subset with every (layer, formats) module built once (:mod:`lowbit.search.evaluate`),
and the cost metrics come from shapes (:mod:`lowbit.search.measure`). The study lives in Optuna storage
(:mod:`lowbit.search.study`); the run writes ``front.json``, ``front/<trial>.toml``, ``trials.json`` and
``search.png`` (:mod:`lowbit.search.front`, :mod:`lowbit.search.chart`). See docs/search.md.
"""

from __future__ import annotations

from typing import Any


def run_search(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """See :func:`lowbit.search.run.run_search` (imported on call: Optuna loads only when searching)."""
    from lowbit.search.run import run_search as run

    return run(*args, **kwargs)


__all__ = ["run_search"]
