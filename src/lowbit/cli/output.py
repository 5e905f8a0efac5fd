"""Tables the commands print (rich when installed, plain text otherwise)."""

from __future__ import annotations

from typing import Any


def show_table(title: str, rows: list[dict[str, Any]]) -> None:
    from lowbit.graph.report import show

    show(title, rows)


def show_effective_options(options: Any) -> None:
    rows = [{key: ("" if value is None else value) for key, value in row.items()} for row in options.rows()]
    show_table("Effective configuration (default < config < command line)", rows)


def show_metrics(title: str, metrics: dict[str, Any]) -> None:
    rows = [{"metric": key, "value": f"{value:.4f}" if isinstance(value, float) else value} for key, value in metrics.items()]
    show_table(title, rows)


__all__ = ["show_effective_options", "show_metrics", "show_table"]
