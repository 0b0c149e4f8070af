"""What a table's transform chain does to its columns, found at startup before any row
(`ChainAnalysis`): each chain run on an empty DataFrame of the columns a batch of the table would
have, for Spark SQL to analyse every step."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from setl.model import ColumnSchema, TableSchema
from setl.plugins import BoundStep, TransformContext
from setl.routing import Route
from setl.spark import brief, from_arrow
from setl.transforms.chains import (
    INFORMATIONAL_META,
    META_PREFIX,
    ChainPlans,
    StartupAnalysisError,
    TablePlan,
    is_analysis_error,
    sample_meta,
)
from setl.transforms.frames import TableTypes

log = logging.getLogger("setl.transforms.stage")


@attrs.frozen
class OutputColumn:
    """A column a transform chain returns (`SparkTransform.output_columns`): its name, its Spark
    type (``simpleString``: ``int``, ``string``, ``decimal(10,2)``) and the input column it carries
    unchanged, if it does."""

    name: str
    spark_type: str
    input: str | None = None


class ChainAnalysis:
    """Runs the chains of `plans` on empty DataFrames in the session `session` returns (only
    called when some table has a chain): `analyse` checks every chain at startup, `output_columns`
    tells what one chain writes. It keeps no state of its own."""

    def __init__(self, plans: ChainPlans, *, pipeline: str, session: Callable[[], Any]) -> None:
        self.plans = plans
        self.pipeline = pipeline
        self.session = session

    def _work(self, described: TableSchema) -> tuple[TablePlan, Route] | None:
        """The chain of source table `described` and its route, or None when it has no chain."""
        plan = self.plans.plan_for_source(described.table)
        if plan is None:
            return None
        route = self.plans.route(described.table)
        assert route is not None
        return plan, route

    def analyse(self, tables: Sequence[TableSchema]) -> int:
        """Analyse every chain against its source tables' columns now, before any row: an empty
        DataFrame with the columns a batch of the table would have (after Extract's column rules
        and renames, typed as `_Rows.table` types a batch), run through the chain with each
        step's result analysed. Raises the `StepAnalysisError` the first batch would raise.
        Returns how many (table, chain) pairs were analysed; no Spark session without one."""
        work = [(described, found) for described in tables if (found := self._work(described)) is not None]
        if not work:
            return 0
        spark = self.session()
        for described, (plan, route) in work:
            df, _ = _empty_frame(spark, route, described)
            for step in plan.steps:
                try:
                    df = self._step(spark, df, step, plan, described, results=True)
                except StartupAnalysisError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the first batch raises it with its context
                    # Not Spark SQL's verdict on the columns (a plugin that needs rows): the first batch tells.
                    log.debug("pipeline=%s table=%s step %s not analysed at startup: %s", self.pipeline,
                              plan.target, step.name, brief(exc))
                    break
        return len(work)

    def output_columns(self, described: TableSchema) -> tuple[OutputColumn, ...] | None:
        """The columns the chain of source table `described` writes to the target, in order, found
        by running the chain on an empty DataFrame of the columns a batch of the table would have
        (after Extract's column rules and renames); None when the table has no chain.

        Each column names its Spark type and the input column it carries unchanged (same type,
        same name or renamed by a step that declares its renames), or None for a column the
        chain adds or recomputes with another type. Raises `StepAnalysisError` for a chain
        Spark SQL rejects, and whatever a step raises otherwise.
        """
        found = self._work(described)
        if found is None:
            return None
        plan, route = found
        spark = self.session()
        df, sample = _empty_frame(spark, route, described)
        inputs = {field.name: field.dataType.simpleString() for field in df.schema.fields}
        origin = {name: name for name in sample}
        for step in plan.steps:
            df = self._step(spark, df, step, plan, described)
            renamed = step.renames()
            if renamed:
                origin = {renamed.get(name, name): source for name, source in origin.items()}
        out = []
        for field in df.schema.fields:
            if field.name.startswith(META_PREFIX):
                continue
            kind = field.dataType.simpleString()
            source = origin.get(field.name)
            out.append(OutputColumn(field.name, kind, source if source is not None and inputs.get(source) == kind
                                    else None))
        return tuple(out)

    def _step(self, spark: Any, df: Any, step: BoundStep, plan: TablePlan, described: TableSchema, *,
              results: bool = False) -> Any:
        """`df` through `step`, analysed by Spark (with `results`, its result without the
        informational columns too): a `StartupAnalysisError` when Spark rejects it, anything else
        the step raises as it is."""
        context = TransformContext(
            pipeline=self.pipeline, source_table=plan.source, target_table=plan.target, batch_id=0,
            epoch=0, params=step.params, spark=spark, step=step.name, may_drop_deletes=step.may_drop_deletes)
        try:
            df = step.plugin.func(df, step.params, context)
            df.schema  # noqa: B018 - forces Spark's analysis of the step
            if results:
                df.drop(*INFORMATIONAL_META).schema  # noqa: B018
        except Exception as exc:
            if not is_analysis_error(exc):
                raise
            raise StartupAnalysisError(
                f"step {step.index + 1} ({step.name}) cannot run on the columns of source table "
                f"{described.table}: {brief(exc)}",
                pipeline=self.pipeline, stage="transform", table=plan.target, plugin=step.name) from exc
        return df


def _empty_frame(spark: Any, route: Route, described: TableSchema) -> tuple[Any, dict[str, Any]]:
    """An empty DataFrame of the columns a batch of `described` has after its route's column rules
    and renames, and the sample row that typed it."""
    sample = {route.rename.get(c.name, c.name): _sample_value(c) for c in described.columns if route.keeps(c.name)}
    table, _ = TableTypes().table([sample], extra=sample_meta())
    return from_arrow(spark, table.slice(0, 0)), sample


def _sample_value(column: ColumnSchema) -> Any:
    """A value of a MySQL column type as the binlog source decodes it (what a batch's rows hold)."""
    kind = column.type.split("(")[0].split()[0].lower()
    if kind in ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year", "bit"):
        return 0
    if kind in ("decimal", "numeric", "dec", "fixed"):
        shape = re.search(r"\((\d+)(?:,(\d+))?\)", column.type)
        precision, scale = (int(shape[1]), int(shape[2] or 0)) if shape else (10, 0)
        digits = "9" * max(precision - scale, 1) + ("." + "9" * scale if scale else "")
        return decimal.Decimal(digits)
    if kind in ("float", "double", "real"):
        return 0.5
    if kind == "date":
        return dt.date(2000, 1, 1)
    if kind in ("datetime", "timestamp"):
        return dt.datetime(2000, 1, 1)
    if kind == "time":
        return dt.timedelta(0)
    if kind == "json":
        return {}
    if kind == "set":
        return {"a"}
    if kind in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point",
                "linestring", "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection"):
        return b""
    return ""  # char, varchar, text, enum, inet, uuid...
