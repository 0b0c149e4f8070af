"""The target table each routed source table needs: its name, columns and key, from the source's
definition (`setl.model.TableSchema`) through the pipeline's routing plan (`setl.routing`) and its
transform chain's output columns."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from setl.errors import ConfigError, SetlError
from setl.model import ColumnSchema, TableName, TableSchema
from setl.routing import Route, RoutingPlan

log = logging.getLogger(__name__)


@attrs.frozen
class TargetColumn:
    """A column of a target table: its `name`, and either the `source` column whose values it
    holds (typed from the source's definition) or the Spark type (`spark_type`) of a column a
    transform chain adds or recomputes."""

    name: str
    source: ColumnSchema | None = None
    spark_type: str | None = None
    nullable: bool = True

    @property
    def described(self) -> str:
        """The column's type as the user wrote it: the source's ``COLUMN_TYPE`` or Spark's type."""
        if self.source is not None:
            return self.source.type
        return f"{self.spark_type} (from a transform)"


@attrs.frozen
class TargetTable:
    """What a target table must hold for the source tables routed into it: `columns` in order and
    the `primary_key` (target names); `sources` are the source tables routed into it."""

    table: TableName
    columns: tuple[TargetColumn, ...]
    primary_key: tuple[str, ...]
    sources: tuple[TableName, ...]
    partitioned: bool = False  # a source table routed into it is partitioned

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def merged(self, other: TargetTable) -> TargetTable:
        """This table with `other`'s columns it lacks appended (two source tables into one target)."""
        have = set(self.names)
        extra = tuple(c for c in other.columns if c.name not in have)
        return attrs.evolve(self, columns=self.columns + extra, sources=self.sources + other.sources,
                            partitioned=self.partitioned or other.partitioned)


OutputColumns = Callable[[TableSchema], "Sequence[Any] | None"]


def target_table(route: Route, described: TableSchema, output: Sequence[Any] | None = None) -> TargetTable:
    """The target table of `route` for source table `described`: its kept columns renamed, its key
    renamed, and, when the route has a transform chain, the chain's `output` columns instead (each
    with a ``name``, ``spark_type`` and ``input``: the target-named input column it carries, if any).

    Raises `setl.errors.ExtractError` when the column rules drop a key column.
    """
    kept = {route.rename.get(c.name, c.name): c for c in described.columns if route.keeps(c.name)}
    key = route.target_key(described.primary_key)
    if output is None:
        columns = tuple(TargetColumn(name, source, nullable=source.nullable and name not in key)
                        for name, source in kept.items())
    else:
        columns = tuple(TargetColumn(o.name, kept[o.input], nullable=kept[o.input].nullable and o.name not in key)
                        if o.input is not None and o.input in kept
                        else TargetColumn(o.name, spark_type=o.spark_type, nullable=o.name not in key)
                        for o in output)
        # A key column renamed by a step that declares it: the changes carry the new name.
        carried = {o.input: o.name for o in output if o.input is not None}
        names = {c.name for c in columns}
        renamed = tuple(carried.get(k, k) for k in key)
        key = renamed if all(k in names for k in renamed) else ()
    return TargetTable(route.target, columns, key, (described.table,), described.partitioned)


class SchemaPlanner:
    """The target tables a pipeline needs, planned from its source's table definitions.

    `describe()` returns the source's selected tables (`Select.describe`); it is called on first
    use and again when a table is asked for that it did not list (created since). `output`, when
    the pipeline has transforms, gives a table's chain output columns
    (`setl.transforms.stage.SparkTransform.output_columns`). Safe to call from several threads.
    """

    def __init__(self, pipeline: str, routing: RoutingPlan, describe: Callable[[], Sequence[TableSchema] | None],
                 output: OutputColumns | None = None) -> None:
        self.pipeline = pipeline
        self.routing = routing
        self._describe = describe
        self._output = output
        self._lock = threading.Lock()
        self._sources: dict[TableName, TableSchema] | None = None
        self._planned: dict[TableName, TargetTable] = {}

    def seed(self, described: Sequence[TableSchema]) -> None:
        """Take `described` as the source's tables (what the start-up already described)."""
        with self._lock:
            self._sources = {t.table: t for t in described if self.routing.route(t.table.schema, t.table.table)}

    def sources(self, refresh: bool = False) -> dict[TableName, TableSchema]:
        """The described source tables the routing plan selects, by name."""
        with self._lock:
            if self._sources is None or refresh:
                described = self._describe() or ()
                self._sources = {t.table: t for t in described if self.routing.route(t.table.schema, t.table.table)}
            return dict(self._sources)

    def for_source(self, source: TableName) -> TargetTable | None:
        """The target table that source table `source` is routed into (None: not routed, or the
        source cannot describe it). Errors (a chain Spark rejects, a type without mapping) name the
        pipeline and the table."""
        with self._lock:
            if source in self._planned:
                return self._planned[source]
        route = self.routing.route(source.schema, source.table)
        if route is None:
            return None
        tables = self.sources()
        if source not in tables:
            tables = self.sources(refresh=True)
        described = tables.get(source)
        if described is None:
            return None
        try:
            output = self._output(described) if self._output is not None and route.steps else None
            planned = target_table(route, described, output)
        except SetlError as exc:
            exc.with_context(pipeline=self.pipeline, table=str(route.target))
            raise
        with self._lock:
            return self._planned.setdefault(source, planned)

    def tables(self) -> list[TargetTable]:
        """Every target table the described source tables need, in target-name order (source
        tables routed into one target merged)."""
        by_target: dict[TableName, TargetTable] = {}
        for source in sorted(self.sources(), key=lambda t: (t.schema, t.table)):
            planned = self.for_source(source)
            if planned is None:
                continue
            if planned.table in by_target:
                by_target[planned.table] = by_target[planned.table].merged(planned)
            else:
                by_target[planned.table] = planned
        return [by_target[name] for name in sorted(by_target, key=lambda t: (t.schema, t.table))]


def unsupported(pipeline: str, table: TargetTable, column: TargetColumn, dialect: str, why: str) -> ConfigError:
    """A column with no type on the target: a configuration error naming pipeline, table and column."""
    return ConfigError(f"cannot create target table {table.table}: column {column.name!r} ({column.described}) "
                       f"{why} on {dialect}", pipeline=pipeline, stage="load", table=str(table.table))
