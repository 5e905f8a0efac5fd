"""The Optuna study: storage (journal file, SQLite file or database URL), sampler, objective.

``n_trials`` is what one run adds (MASE's meaning): the same command on the same storage adds that many
more, and several processes on one storage cooperate on one study (Optuna hands out trial numbers through
the storage, so none is lost or given twice).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from lowbit.errors import ConfigError, LowbitError
from lowbit.search.config import SearchConfig
from lowbit.search.space import SearchSpace

log = logging.getLogger("lowbit")
TASK_METRICS = ("accuracy", "loss", "mean_cosine", "min_cosine")


def optuna():
    try:
        import optuna as module
    except ImportError:
        raise LowbitError("lowbit search needs Optuna: pip install 'lowbit[search]'") from None
    module.logging.set_verbosity(module.logging.WARNING)
    return module


def make_storage(storage: str | None, folder: Path) -> Any:
    """None -> a journal file in ``folder``; ``*.db`` / ``*.sqlite`` path -> SQLite; ``*.journal`` / ``*.log``
    path -> journal file; anything with ``://`` -> a database URL (sqlite:///, postgresql://, mysql://)."""
    module = optuna()
    if storage is None:
        storage = str(folder / "study.journal")
    if "://" in storage:
        return _database(storage)
    path = Path(storage)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return _database(f"sqlite:///{path.resolve()}")
    from optuna.storages.journal import JournalFileBackend

    return module.storages.JournalStorage(JournalFileBackend(str(path)))


def _database(url: str, attempts: int = 20) -> Any:
    """An RDB storage; processes that start together race to create the schema (the loser's insert of the
    schema version fails), so a failed first connection is retried after a short wait."""
    import random
    import time

    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            return optuna().storages.RDBStorage(url, engine_kwargs=_engine_arguments(url))
        except ImportError:
            raise LowbitError(f"no database driver for the storage URL {url.split('@')[-1]!r}: install "
                              "'lowbit[search]' (psycopg, for postgresql://) or the driver its dialect names") from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as error:
            if attempt == attempts - 1:
                raise LowbitError(f"cannot open the study storage {url}: {error.orig}") from None
            time.sleep(0.2 + random.random() * 0.5)
    raise AssertionError("unreachable")


def _engine_arguments(url: str) -> dict[str, Any]:
    # SQLite under several writers: wait for the lock instead of failing at once
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


def make_sampler(config: SearchConfig, space: SearchSpace, seed: int) -> Any:
    samplers = optuna().samplers
    if config.sampler == "grid":
        return samplers.GridSampler(space.grid(), seed=seed)
    if config.sampler == "random":
        return samplers.RandomSampler(seed=seed)
    if config.sampler == "nsga2":
        return samplers.NSGAIISampler(seed=seed)
    return samplers.TPESampler(seed=seed, multivariate=True)


def directions(config: SearchConfig) -> list[str]:
    if config.sum_scaled_metrics:
        return ["maximize"]
    return [direction for _, direction in config.metrics.values()]


def open_study(config: SearchConfig, storage: Any, sampler: Any) -> Any:
    """Create the study or load it (another process may create it at the same moment)."""
    module = optuna()
    try:
        study = module.create_study(storage=storage, sampler=sampler, study_name=config.study_name,
                                    directions=directions(config), load_if_exists=True)  # fmt: skip
    except module.exceptions.DuplicatedStudyError:
        study = module.load_study(study_name=config.study_name, storage=storage, sampler=sampler)
    if [d.name.lower() for d in study.directions] != directions(config):
        raise ConfigError(f"study {config.study_name!r} in this storage optimises "
                          f"{[d.name.lower() for d in study.directions]}, the config asks for {directions(config)} "
                          "(other metrics or sum_scaled_metrics): use another storage or study_name")  # fmt: skip
    return study


def objective_values(config: SearchConfig, metrics: dict[str, float]) -> list[float]:
    """One value per metric, or MASE's sum of scaled metrics (minimised metrics count negatively)."""
    missing = [name for name in config.metrics if name not in metrics]
    if missing:
        raise ConfigError(f"search metric {missing[0]!r} is not measured for this task "
                          f"(measured: {', '.join(metrics)})")  # fmt: skip
    if config.sum_scaled_metrics:
        total = sum(scale * metrics[name] * (1 if direction == "maximize" else -1)
                    for name, (scale, direction) in config.metrics.items())  # fmt: skip
        return [total]
    return [metrics[name] for name in config.metrics]


def plan_key(plan: dict[str, Any]) -> str:
    return json.dumps({layer: formats.to_dict() if formats is not None else None for layer, formats in plan.items()},
                      sort_keys=True)  # fmt: skip


def make_objective(config: SearchConfig, space: SearchSpace, measure: Any) -> Any:
    """The Optuna objective; ``measure(plan) -> metrics``; identical plans are measured once per process."""
    seen: dict[str, dict[str, float]] = {}

    def objective(trial: Any) -> Any:
        plan = space.sample(trial)
        key = plan_key(plan)
        if key not in seen:
            seen[key] = measure(plan)
        metrics = seen[key]
        trial.set_user_attr("metrics", metrics)
        trial.set_user_attr("plan", json.loads(key))
        values = objective_values(config, metrics)
        return values[0] if len(values) == 1 else values

    return objective


def completed_records(study: Any) -> list[dict[str, Any]]:
    """Every complete trial as {number, metrics, plan, params}."""
    state = optuna().trial.TrialState.COMPLETE
    return [{"number": t.number, "metrics": t.user_attrs["metrics"], "plan": t.user_attrs["plan"], "params": t.params}
            for t in study.get_trials(deepcopy=False, states=(state,)) if "metrics" in t.user_attrs]  # fmt: skip


__all__ = ["TASK_METRICS", "completed_records", "directions", "make_objective", "make_sampler", "make_storage",
           "objective_values", "open_study", "optuna", "plan_key"]  # fmt: skip
