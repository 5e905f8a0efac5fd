"""Statistics files (seed 002's TOML layout) and the scaled-ternary quantize config made from them.

Layout (what MASE's profiler run writes, so its files load here and ours load in MASE's script)::

    [<node>.common]                                  mase_type = "...", mase_op = "..."
    [<node>.software.args.<entry>.stat.<stat name>]  min = ..., max = ..., range = ..., count = ...
    [<node>.software.results.data_out_0.stat]

``<entry>`` is data_in_0, weight, bias, ...; values a stat could not compute are "NA".

Files lowbit writes begin with one comment line, ``# lowbit.statistics version 1 sha256 <seal>``: a
versioned header and a SHA-256 over every byte of the file (the schema :data:`STATISTICS_SCHEMA` over
:func:`lowbit._persist.comment_header`). Being a
comment, it leaves the layout MASE reads untouched. A file with the header that does not match it is
refused (ConfigError naming the file); a file without one (MASE's, or an older lowbit's) loads with a
warning that it was not verified. An empty file, one cut inside the header line (a prefix of it) and an
unsealed one with no table or key at all are refused as truncated: none of them is a set of statistics.

:func:`stats_to_config` is MASE's ``scripts/stat-to-conf.py`` without its bugs. For every node of a
quantizable op that has statistics it writes ``passes.quantize.<node>.config``: a ternary config
(``name = "ternary"``, ``<role>_scaling_factor = true``, ``<role>_width = 2``, only for the roles the op
has) plus, per profiled entry (data_in_0 -> data_in, weight, bias), ``<role>_median =
range_quantile.max`` (the median when profiled with quantile 0.5), ``<role>_max = range_min_max.max`` and
``<role>_mean = "NA"``. The ternary format then takes its threshold from the median (0.75 |median|), else
0.05 |max| (see :mod:`lowbit.formats.ternary`). Differences from the script:

- any node names (the script only looked at names containing "seq_blocks_");
- every node gets its own deep copy (the script shared one dict between ``default`` and all linear nodes,
  so they all ended up with the first linear's statistics);
- ``by`` is always "name" in the result: with a base, as the script; without one the script left "type",
  which made its per-node tables dead. The built-in base is ``by = "name"``, ``report = true`` and a
  float ``default`` (nodes without statistics stay float; pass a base to choose otherwise);
- keys the base already has are never overwritten, but a base value of "NA" counts as absent;
- the per-node template is the base's ``default`` config when that is a ternary config, else the
  built-in one; a node the base already configures with another format is left as the base has it;
- each config written is checked with :func:`lowbit.nn.parse_node_config`, so a bad base key fails here,
  naming the node and the key, not later at quantize time.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lowbit._io import atomic_write_text, read_regular_text
from lowbit._persist import Schema, comment_header, read_bytes, read_comment_header, register, seal
from lowbit.errors import ConfigError, LowbitError
from lowbit.formats import get_format
from lowbit.nn.config import OP_ROLES, is_none, parse_node_config

NA = "NA"
STATS_VERSION, HEADER_MARK = 1, "# lowbit.statistics "
STATISTICS_SCHEMA = register(Schema("lowbit.statistics", STATS_VERSION, "statistics file", ConfigError))
_SCALAR_FIELDS = {"min", "max", "range", "mean", "variance", "abs_mean"}
_COUNT_FIELDS = {"count", "size_in_bytes"}
# Fields each known stat must have (other stats are accepted with any well-typed fields).
_REQUIRED_FIELDS = {
    "range_min_max": ("min", "max", "range", "count"), "range_quantile": ("min", "max", "range", "count"),
    "range_n_sigma": ("min", "max", "range", "count"), "variance_online": ("mean", "variance", "count"),
    "variance_precise": ("mean", "variance", "count"), "abs_mean": ("abs_mean", "count"),
    "record": ("data", "count", "size_in_bytes"),
}  # fmt: skip
TERNARY_TEMPLATE = {"name": "ternary", **{f"{role}_{key}": value for role in ("data_in", "weight", "bias")
                                          for key, value in (("scaling_factor", True), ("width", 2))}}  # fmt: skip
_TOP_KEYS = ("name", "bypass", "floor")


# ---- saving -------------------------------------------------------------------------------------------------
def graph_statistics(graph: Any) -> dict[str, Any]:
    """The statistics table of a profiled QGraph, in the file layout (plain values, None -> "NA")."""
    table = {}
    for node in graph.model.graph.nodes:
        parameters = getattr(node.meta.get("mase"), "parameters", None)
        if not isinstance(parameters, dict):
            continue
        common, software = parameters.get("common", {}), parameters.get("software", {})
        table[node.name] = {
            "common": {key: common[key] for key in ("mase_type", "mase_op") if key in common},
            "software": {section: {entry: {"stat": _plain(data.get("stat", {}))} for entry, data in entries.items()}
                         for section, entries in software.items() if isinstance(entries, dict)},
        }  # fmt: skip
    return table


def save_statistics(graph: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Write the graph's statistics to ``path`` (atomically) and return the table written."""
    table = graph_statistics(graph)
    atomic_write_text(path, sealed_statistics_text(_tomli_w().dumps(table)))
    return table


def sealed_statistics_text(toml_text: str) -> str:
    """``toml_text`` behind the versioned header line whose seal covers the whole file."""
    return seal(STATISTICS_SCHEMA, (comment_header(STATISTICS_SCHEMA) + "\n" + toml_text).encode()).decode()


def _plain(value: Any) -> Any:
    """A TOML-writable copy: None -> "NA", tensors and NumPy values -> numbers / lists."""
    if value is None:
        return NA
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "tolist"):  # torch / NumPy tensors and scalars
        return _plain(value.tolist())
    return value


# ---- loading and checking -----------------------------------------------------------------------------------
def load_statistics(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a statistics file; ConfigError naming the file, node and key for anything wrong."""
    path = Path(path)
    try:
        text = read_bytes(STATISTICS_SCHEMA, path).decode("utf-8")  # bytes as written: the seal covers them exactly
    except UnicodeDecodeError as error:
        raise ConfigError(f"cannot read statistics file {path}: {error}") from None
    _check_header(path, text)
    try:
        table = _tomllib().loads(text)
    except ValueError as error:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"statistics file {path} is not valid TOML: {error}") from None
    check_statistics(table, str(path))
    return table


def _check_header(path: Path, text: str) -> None:
    """The header line's version and seal (see the module docstring)."""
    if not text.strip() or (len(text) < len(HEADER_MARK) and HEADER_MARK.startswith(text)):
        raise ConfigError(f"statistics file {path} is truncated ({len(text.encode())} bytes): it ends "
                          f"{'before anything' if not text.strip() else 'inside its header line'}")  # fmt: skip
    if read_comment_header(STATISTICS_SCHEMA, text, f"statistics file {path}") is not None:
        return
    if not _tables_in(text):  # MASE's files hold a table per node; text without any is no statistics file
        raise ConfigError(f"statistics file {path} holds no statistics (no [node] table and no lowbit header): "
                          "it is truncated or not a statistics file")  # fmt: skip
    logging.getLogger("lowbit").warning(f"statistics file {path} has no lowbit checksum (MASE or an older "
                                        f"lowbit wrote it): not verified")  # fmt: skip


def _tables_in(text: str) -> bool:
    """Whether any line of ``text`` opens a TOML table or sets a dotted key (a node's statistics)."""
    lines = (line.strip() for line in text.splitlines())
    return any(line.startswith("[") or ("=" in line and not line.startswith("#")) for line in lines)


def check_statistics(table: Any, where: str = "statistics") -> None:
    """Check a statistics table (as loaded from TOML) against the layout above."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a table of nodes, got {type(table).__name__}")
    for node, data in table.items():
        _check_node(where, node, data)


def _fail(where: str, node: str, key: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: node {node!r}, key {key!r}: {problem}")


def _table(where: str, node: str, key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, node, key, f"must be a table, got {value!r}")
    return value


def _check_node(where: str, node: str, data: Any) -> None:
    data = _table(where, node, "", data)
    if "common" not in data:
        raise _fail(where, node, "common", "missing (each node needs common.mase_type and common.mase_op)")
    common = _table(where, node, "common", data["common"])
    for key in ("mase_type", "mase_op"):
        if not isinstance(common.get(key), str):
            problem = "missing" if key not in common else f"must be a string, got {common[key]!r}"
            raise _fail(where, node, f"common.{key}", problem)
    software = _table(where, node, "software", data.get("software", {}))
    for section, entries in software.items():
        for entry, content in _table(where, node, f"software.{section}", entries).items():
            prefix = f"software.{section}.{entry}"
            content = _table(where, node, prefix, content)
            if "stat" not in content:
                raise _fail(where, node, f"{prefix}.stat", "missing")
            for stat, fields in _table(where, node, f"{prefix}.stat", content["stat"]).items():
                key = f"{prefix}.stat.{stat}"
                _check_stat(where, node, key, stat, _table(where, node, key, fields))


def _check_stat(where: str, node: str, key: str, stat: str, fields: Mapping[str, Any]) -> None:
    for name in _REQUIRED_FIELDS.get(stat, ()):
        if name not in fields:
            raise _fail(where, node, f"{key}.{name}", "missing")
    for name, value in fields.items():
        if name in _COUNT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _fail(where, node, f"{key}.{name}", f"must be a non-negative integer, got {value!r}")
        elif not _is_number_like(value):
            raise _fail(where, node, f"{key}.{name}", f"must be a number, \"NA\" or a list of numbers, got {value!r}")


def _is_number_like(value: Any) -> bool:
    if isinstance(value, list):
        return all(_is_number_like(item) for item in value)
    return value == NA or (isinstance(value, (int, float)) and not isinstance(value, bool))


# ---- statistics -> config -------------------------------------------------------------------------------
def stats_to_config(stats: Any, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A quantize config (``{"passes": {"quantize": ...}}`` plus whatever else ``base`` holds) that
    ternarises every profiled node with its own statistics. ``stats``: a table from
    :func:`load_statistics`, a path to a statistics file, or a profiled QGraph. Neither argument is changed."""
    stats = _statistics(stats)
    config = _default_base() if base is None else copy.deepcopy(dict(base))
    quantize = _quantize_table(config)
    _check_format_names(quantize)
    quantize["by"] = "name"
    template = _template(quantize)
    for node, data in stats.items():
        op = data["common"]["mase_op"]
        values = _stat_values(node, op, data)
        if op not in OP_ROLES or not values:
            continue  # only quantizable ops with statistics get a config
        entry = quantize.setdefault(node, {})
        if not isinstance(entry, dict):
            raise ConfigError(f"stats_to_config: base passes.quantize.{node} must be a table, got {entry!r}")
        node_config = entry.setdefault("config", _for_op(template, op))
        if str(node_config.get("name", "")).lower() != "ternary":
            if not is_none(node_config.get("name")):  # the base's own format for this node: kept, and checked
                parse_node_config(op, node_config, where=f"stats_to_config: base passes.quantize.{node}.config")
            continue  # the base gives this node another format (or float): keep it as it is
        for key, value in values.items():
            if key not in node_config or is_none(node_config[key]):
                node_config[key] = value
        parse_node_config(op, node_config, where=f"stats_to_config: passes.quantize.{node}.config")
    return config


def stats_to_config_file(stats_path: str | os.PathLike, dest_path: str | os.PathLike,
                         base_path: str | os.PathLike | None = None) -> dict[str, Any]:  # fmt: skip
    """The script's command line as a function: read the statistics (and base) TOML, write ``dest_path``."""
    base = None
    if base_path is not None:
        try:
            base = _tomllib().loads(read_regular_text(base_path))
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read base config {base_path}: {error}") from None
    config = stats_to_config(load_statistics(stats_path), base)
    atomic_write_text(dest_path, _tomli_w().dumps(config))
    return config


def _statistics(stats: Any) -> Mapping[str, Any]:
    if isinstance(stats, (str, os.PathLike)):
        return load_statistics(stats)
    if hasattr(stats, "model") and hasattr(stats.model, "graph"):
        stats = graph_statistics(stats)
    check_statistics(stats, "stats_to_config")
    return stats


def _check_format_names(quantize: Mapping[str, Any]) -> None:
    """Every format a base's quantize tables name (``name`` / ``<role>_name``) exists: ConfigError naming the
    table, the key and the nearest format otherwise (a node without statistics is never parsed further)."""
    for table, entry in quantize.items():
        node_config = entry.get("config") if isinstance(entry, Mapping) else None
        if not isinstance(node_config, Mapping):
            continue
        for key, value in node_config.items():
            if (key == "name" or key.endswith("_name")) and not is_none(value):
                try:
                    get_format(value if isinstance(value, str) else repr(value))
                except LowbitError as error:
                    raise ConfigError(f"stats_to_config: base passes.quantize.{table}.config.{key}: {error}") from None


def _default_base() -> dict[str, Any]:
    return {"passes": {"quantize": {"by": "name", "report": True, "default": {"config": {"name": NA}}}}}


def _quantize_table(config: dict[str, Any]) -> dict[str, Any]:
    passes = config.setdefault("passes", {})
    quantize = passes.setdefault("quantize", {}) if isinstance(passes, dict) else None
    if not isinstance(quantize, dict):
        raise ConfigError("stats_to_config: base passes / passes.quantize must be tables")
    return quantize


def _template(quantize: Mapping[str, Any]) -> dict[str, Any]:
    default = quantize.get("default", {})
    default = default.get("config") if isinstance(default, Mapping) else None
    if isinstance(default, Mapping) and str(default.get("name", "")).lower() == "ternary":
        return dict(default)
    return dict(TERNARY_TEMPLATE)


def _for_op(template: Mapping[str, Any], op: str) -> dict[str, Any]:
    """A deep copy of the template's keys that apply to ``op`` (its top-level keys and its roles)."""
    roles = [*OP_ROLES[op][0], *OP_ROLES[op][1]]
    return {key: copy.deepcopy(value) for key, value in template.items()
            if key in _TOP_KEYS or any(key.startswith(f"{role}_") for role in roles)}  # fmt: skip


def _stat_values(node: str, op: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """``{<role>_mean/median/max: value}`` for the node's profiled entries that are roles of ``op``."""
    roles = [*OP_ROLES[op][0], *OP_ROLES[op][1]] if op in OP_ROLES else []
    values = {}
    for entry, content in data.get("software", {}).get("args", {}).items():
        role = "data_in" if entry == "data_in_0" else entry  # data_in_1, ... have no key of their own
        stat = content.get("stat", {})
        if role not in roles or not stat:
            continue
        median = stat.get("range_quantile", {}).get("max", NA)
        maximum = stat.get("range_min_max", {}).get("max", NA)
        for name, value in (("median", median), ("max", maximum)):
            if isinstance(value, list):
                raise ConfigError(f"stats_to_config: node {node!r}, {entry} {name}: a per-element statistic "
                                  "cannot set a ternary threshold; profile with dims = \"all\"")  # fmt: skip
        values.update({f"{role}_mean": NA, f"{role}_median": median, f"{role}_max": maximum})
    return values


def _tomllib():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib


def _tomli_w():
    try:
        import tomli_w
    except ImportError:
        raise LowbitError("writing statistics / config TOML needs tomli-w: pip install 'lowbit[graph]'") from None
    return tomli_w


__all__ = ["TERNARY_TEMPLATE", "check_statistics", "graph_statistics", "load_statistics", "save_statistics",
           "stats_to_config", "stats_to_config_file"]  # fmt: skip
