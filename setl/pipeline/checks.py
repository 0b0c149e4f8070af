"""Start-up checks of a pipeline's source and table rules, before anything is created or written
(`setl start`, `setl schema`, `setl check`):

* the source server's settings that change what its binlog holds (`judge_source`, `check_source`):
  every refused one, with its fix, stops the start in one line; the others to look at warn;

* a rule that matches no source table is a warning, one line each (a typo in a regex would
  otherwise copy nothing and end with exit 0);
* a rule filter that names a column the table does not have is a configuration error (exit 2)
  naming the rule, the table and its columns. Rule filters are Python expressions over the source
  row's columns (unlike the Spark SQL of a ``filter`` transform step), so the names they read are
  known before the first row: without this check the mistake surfaced at the first batch, after
  retries, after the target table was created and emptied.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from setl.config import PipelineConfig
from setl.errors import ConfigError, PositionPurged, SetlError, SourceError
from setl.model import Position, TableSchema
from setl.routing import RoutingPlan
from setl.stages.extract import FILTER_BUILTINS


def filter_names(expression: str) -> frozenset[str]:
    """The names `expression` reads that it does not bind itself (comprehension and lambda
    variables are bound): the row columns and builtins it needs."""
    tree = ast.parse(expression, mode="eval")
    read: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return frozenset(read - bound)


def check_rules(config: PipelineConfig, tables: Sequence[TableSchema]) -> list[str]:
    """One warning line per rule of `config` that routes none of `tables` (the source's selected
    tables); raises `ConfigError` for a rule filter naming a column its table does not have."""
    plan = RoutingPlan.compile(config.tables, pipeline=config.name, file=config.file or None)
    matched: Counter[int] = Counter()
    for table in tables:
        route = plan.route(table.table.schema, table.table.table)
        if route is None:
            continue
        matched[route.rule_index] += 1
        expression = config.tables[route.rule_index].filter
        if not expression:
            continue
        unknown = sorted(filter_names(expression) - set(table.names) - FILTER_BUILTINS.keys())
        if unknown:
            raise ConfigError(
                f"the filter {expression!r} reads {', '.join(map(repr, unknown))}, which source table "
                f"{table.table} does not have (its columns: {', '.join(table.names)}); a rule filter is a "
                "Python expression over the source row's columns (a `filter` transform step is Spark SQL)",
                file=config.file or None, pipeline=config.name, key=f"tables[{route.rule_index}].filter")
    return [f"tables[{i}] (source {rule.source!r}) matches no source table: it copies and replicates nothing"
            for i, rule in enumerate(config.tables) if not rule.exclude and not matched[i]]


def judge_source(config: PipelineConfig, select: Any, position: Position | None) -> Any:
    """The source's verdicts on its server's settings (a ``SettingsReport``: `judge_settings` of
    `select` or of a layer it wraps, reading from `position`, else its configured start; the
    schema of the batch DDL tasks' signal table is read too), or None for a source that has no
    such check."""
    while select is not None and not hasattr(select, "judge_settings"):
        select = getattr(select, "inner", None)
    if select is None:
        return None
    signal = config.pipeline.ddl_tasks.signal_table
    return select.judge_settings(position, (signal.rpartition(".")[0],) if signal else ())


def check_source(config: PipelineConfig, select: Any, saved: Position | None, warn: Callable[[str], Any],
                 unreachable: Callable[[SetlError], Any] | None = None) -> None:
    """What `setl start` asks of the pipeline's source before the first row (`judge_source`):
    `warn` gets one line per setting to look at; raises `SourceError` (`PositionPurged` when the
    position's binlog is gone) naming every refused setting and its fix in one line. A source
    that cannot be asked (away, or refusing the credentials) raises its error, or with
    `unreachable` is handed to it: the reader judges the settings again when it opens, and its
    start is retried or refused as any start is."""
    try:
        report = judge_source(config, select, saved)
    except SetlError as exc:
        if unreachable is None:
            raise
        unreachable(exc)
        return
    if report is None:
        return
    for verdict in report.warnings:
        warn(verdict.line())
    refused = report.refusal()
    if refused is not None:
        purged = any(verdict.setting == "position" and "purged" in verdict.text for verdict in report.refused)
        raise (PositionPurged if purged else SourceError)(
            f"{refused} (`setl check --pipeline {config.name}` lists them one a line)",
            pipeline=config.name, stage="select", position=saved)


def rules_fingerprint(config: PipelineConfig) -> str:
    """A short digest of which tables the pipeline's rules select (each rule's `source` regex and
    `exclude`, in order): a running node publishes the one it runs with (in its liveness record's
    figures, ``rules``), so that `setl snapshot` can tell when the file's selection changed after
    the start and refuse a copy the running node could not serve. Other rule settings (targets,
    columns, transform parameters with their ``${ENV}`` values) do not enter it."""
    text = json.dumps([[rule.source, rule.exclude] for rule in config.tables])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = ["check_rules", "check_source", "filter_names", "judge_source", "rules_fingerprint"]
