"""The Spark Transform stage: per table, a batch's rows go through Arrow into a DataFrame,
through the table's transform chain, and back into row changes.

What a transform sees. One row per row image, with the table's columns and:

* ``_setl_op``: insert, update, delete or read (of the change the image belongs
  to; ``read`` is a row copied by a snapshot, which has only an after image);
* ``_setl_image``: ``after`` for inserts, reads and updates, ``before`` for deletes and
  for the old image of updates (so renames, casts and hashes apply to the keys
  a delete or a key change must find in the target);
* ``_setl_seq``: the change's index in the batch (its order);
* ``_setl_commit_time`` (UTC timestamp) and ``_setl_position`` (text).

A transform must keep ``_setl_seq`` and ``_setl_image``; other ``_setl_*``
columns are informational and are never written to the target.

How rows come back. Rows are matched to their change by ``_setl_seq``:

* an insert becomes one insert per surviving after-image, a read one read per
  surviving after-image (a read a filter removes is dropped, like an insert);
* an update whose old and new images both survive stays an update; if only
  the new one survives it becomes an insert, if only the old one a delete (the
  row left a filter), if neither it is dropped;
* a delete whose image was removed is an error, unless some step of the chain
  is declared ``may_drop_deletes`` (a delete of a row the target never had is
  harmless, a delete lost is not).

Values come back from Arrow only for the columns the chain changed: a column it
left as it was (same name, type and values, compared in Arrow) keeps the
change's own Python values, exactly as with no transform, and costs no
conversion.

Primary keys. The result must still hold every primary-key column. A step may
rename key columns only when its plugin declares the renames (the built-in
`rename` does); the changes then carry the renamed key. Any other loss of a
key column fails the batch with a `TransformError`.

Tables without transforms never reach Spark: no session is even created.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc

from setl.config import NodeSettings, PipelineConfig, SparkConfig, TableRule
from setl.errors import SetlError, TransformError
from setl.model import Batch, Change, Op, RowChange, TableName, TableSchema, partial_image_refusal
from setl.plugins import BoundStep, Registry, TransformContext
from setl.routing import RoutingPlan, build_plan
from setl.spark import brief, find_java, from_arrow, get_session, to_arrow
from setl.stages.transform import Transform
from setl.transforms.analysis import ChainAnalysis, OutputColumn
from setl.transforms.chains import (
    AFTER,
    BEFORE,
    COMMIT_TIME,
    IMAGE,
    INFORMATIONAL_META,
    META_PREFIX,
    OP,
    POSITION,
    REQUIRED_META,
    SEQ,
    ChainPlans,
    PartialRowRefused,
    StartupAnalysisError,
    StepAnalysisError,
    TablePlan,
    is_analysis_error,
)
from setl.transforms.frames import SchemaCache, TableTypes, table_columns, table_to_rows

log = logging.getLogger(__name__)
_UNKNOWN: Any = object()

__all__ = ["OutputColumn", "PartialRowRefused", "SparkTransform", "StartupAnalysisError", "StepAnalysisError",
           "TablePlan", "build_transform"]

class SparkTransform(Transform):
    """Runs each table's validated transform chain on Spark.

    A row change's chain is found by `plans` (`setl.transforms.chains.ChainPlans`: its route's in
    `routing`, or one named in `tables` for changes that carry no `source`); `analysis`
    (`setl.transforms.analysis.ChainAnalysis`) runs the chains at startup. `session` returns the
    SparkSession and is only called for a batch that has rows of a table with transforms; by
    default it is `setl.spark.get_session(spark)`. Safe to call from several threads at once: it
    keeps no per-batch state, only each table's column types
    (`setl.transforms.frames.SchemaCache`), derived from its first batch.
    """

    def __init__(
        self,
        tables: Mapping[str, Sequence[BoundStep]] | None = None,
        *,
        pipeline: str = "",
        spark: SparkConfig | None = None,
        session: Callable[[], Any] | None = None,
        sources: Mapping[str, str] | None = None,
        routing: RoutingPlan | None = None,
    ) -> None:
        self.pipeline = pipeline
        self._spark_settings = spark
        self._session_factory = session
        self.plans = ChainPlans(tables, sources=sources, routing=routing)
        self.analysis = ChainAnalysis(self.plans, pipeline=pipeline, session=self.session)
        self._types = SchemaCache()

    @classmethod
    def from_rules(
        cls,
        rules: Sequence[TableRule],
        registry: Registry,
        *,
        pipeline: str = "",
        spark: SparkConfig | None = None,
        session: Callable[[], Any] | None = None,
        file: str | None = None,
    ) -> SparkTransform:
        """Compile `rules` into a routing plan, validating every step against `registry` (raising
        `PluginError`), and build the stage on it."""
        plan = RoutingPlan.compile(rules, pipeline=pipeline, registry=registry, file=file)
        return cls(pipeline=pipeline, spark=spark, session=session, routing=plan)

    @property
    def routing(self) -> RoutingPlan | None:
        """The pipeline's routing plan, if the stage was given one."""
        return self.plans.routing

    def plan_for(self, table: str) -> TablePlan | None:
        """The chain given for a target table by name (`ChainPlans.plan_for`)."""
        return self.plans.plan_for(table)

    def plan_for_source(self, source: TableName) -> TablePlan | None:
        """The chain of a source table's route (`ChainPlans.plan_for_source`)."""
        return self.plans.plan_for_source(source)

    def analyse(self, tables: Sequence[TableSchema]) -> int:
        """Analyse every chain against its source tables' columns now (`ChainAnalysis.analyse`)."""
        return self.analysis.analyse(tables)

    def output_columns(self, described: TableSchema) -> tuple[OutputColumn, ...] | None:
        """The columns the chain of `described` writes (`ChainAnalysis.output_columns`)."""
        return self.analysis.output_columns(described)

    def session(self) -> Any:
        if self._session_factory is not None:
            return self._session_factory()
        return get_session(self._spark_settings)

    # --- running --------------------------------------------------------------------------

    def transform(self, batch: Batch) -> Batch:
        # Rows group by their route (source table), never by their target name: two source
        # tables routed into one target table keep their own chains.
        plans: dict[tuple[str, str, TableName | None], TablePlan | None] = {}
        groups: dict[tuple[str, str, TableName | None], list[int]] = {}
        last: tuple[str, str, TableName | None] | None = None
        indices: list[int] | None = None
        for index, change in enumerate(batch.changes):
            if type(change) is not RowChange or change.sequence is not None:
                continue  # a DDL, or a sequence's state row: the target applies them as they are
            key = (change.schema, change.table, change.source)
            if key != last:  # runs of one table are common
                last = key
                plan = plans.get(key, _UNKNOWN)
                if plan is _UNKNOWN:
                    plan = plans[key] = self.plans.plan_of(change)
                indices = None if plan is None else groups.setdefault(key, [])
            if indices is not None:
                if change.partial:  # Extract refuses it first when its routing plan knows the steps
                    assert plan is not None
                    raise PartialRowRefused(partial_image_refusal(
                        f"a partial {change.op.value}", str(change.source or change.qualified_table),
                        "the table has transforms, which need whole rows"),
                        pipeline=self.pipeline or batch.pipeline, stage="transform", table=plan.target,
                        batch=batch.id, position=change.position or batch.end)
                indices.append(index)
        if not groups:
            return batch
        try:
            spark = self.session()
        except SetlError as exc:
            exc.with_context(pipeline=self.pipeline or batch.pipeline, stage="transform", batch=batch.id)
            raise
        # Each slot holds the change, or what replaced it: one RowChange (the usual case) or a list of 0 or 2+.
        slots: list[Any] = list(batch.changes)
        for key, indices in groups.items():
            plan = plans[key]
            assert plan is not None
            for index, replacement in zip(indices, self._run_table(spark, batch, plan, indices)):
                slots[index] = replacement
        out: list[Change] = []
        append, extend = out.append, out.extend
        for slot in slots:
            if type(slot) is list:
                extend(slot)
            else:
                append(slot)
        return batch.replace(tuple(out))

    def _error(self, batch: Batch, plan: TablePlan, message: str, plugin: str | None = None) -> TransformError:
        return TransformError(message, pipeline=self.pipeline or batch.pipeline, stage="transform",
                              table=plan.target, batch=batch.id, plugin=plugin or plan.names,
                              position=batch.start)

    def _step_error(self, batch: Batch, plan: TablePlan, step: BoundStep, exc: Exception) -> TransformError:
        """The error to raise (``from`` `exc`) for `step` failing with `exc` on a batch."""
        if is_analysis_error(exc):
            # Spark rejected the step's SQL against the table's columns: no retry can change that.
            return StepAnalysisError(
                f"step {step.index + 1} ({step.name}) cannot run on the table's columns: {brief(exc)}",
                pipeline=self.pipeline or batch.pipeline, stage="transform", table=plan.target,
                batch=batch.id, plugin=step.name, position=batch.start)
        return self._error(batch, plan, f"step {step.index + 1} ({step.name}) failed: {brief(exc)}", step.name)

    def _run_table(
        self, spark: Any, batch: Batch, plan: TablePlan, indices: list[int],
    ) -> list[RowChange | list[RowChange]]:
        """What replaces each of the changes at `indices`: one change, or a list of 0 or more."""
        changes: list[RowChange] = [batch.changes[i] for i in indices]  # type: ignore[misc]
        rows = _Rows.of(indices, changes)
        table, codecs = rows.table(self._types[plan.types_key or plan.target])
        primary_key = list(changes[0].primary_key)
        try:
            df = from_arrow(spark, table)
        except Exception as exc:
            raise self._error(batch, plan, f"rows cannot become a Spark DataFrame: {brief(exc)}") from exc
        frames = []
        for step in plan.steps:
            context = TransformContext(
                pipeline=self.pipeline or batch.pipeline, source_table=plan.source, target_table=plan.target,
                batch_id=batch.id, epoch=batch.epoch, params=step.params, spark=spark,
                step=step.name, may_drop_deletes=step.may_drop_deletes,
            )
            try:
                result = step.plugin.func(df, step.params, context)
                columns = result.columns
            except TransformError as exc:
                exc.with_context(pipeline=self.pipeline or batch.pipeline, stage="transform",
                                 table=plan.target, batch=batch.id, plugin=step.name)
                raise
            except Exception as exc:
                raise self._step_error(batch, plan, step, exc) from exc
            renames = step.renames()
            primary_key = [renames.get(c, c) for c in primary_key]
            missing = [c for c in primary_key if c not in columns]
            if missing:
                raise self._error(batch, plan, f"step {step.index + 1} ({step.name}) returned no primary-key "
                                  f"column {', '.join(missing)} (columns: {', '.join(columns)})", step.name)
            lost = [c for c in REQUIRED_META if c not in columns]
            if lost:
                raise self._error(batch, plan, f"step {step.index + 1} ({step.name}) dropped setl's column "
                                  f"{', '.join(lost)}", step.name)
            df = result
            frames.append(df)
        try:
            # The informational columns are not needed back; leaving them in Spark saves converting them.
            result_table = to_arrow(df.drop(*INFORMATIONAL_META))
        except Exception as exc:
            raise self._step_error(batch, plan, self._culprit(frames, plan), exc) from exc
        return self._changes(batch, plan, rows, table, result_table, codecs, tuple(primary_key))

    @staticmethod
    def _culprit(frames: list[Any], plan: TablePlan) -> BoundStep:
        """The first step whose result cannot be computed (only run after the chain failed)."""
        for frame, step in zip(frames[:-1], plan.steps):
            try:
                to_arrow(frame)
            except Exception:  # noqa: BLE001 - an analysis failure only means the step is not named in the message
                return step
        return plan.steps[len(frames) - 1]

    def _changes(
        self,
        batch: Batch,
        plan: TablePlan,
        rows: "_Rows",
        source: pa.Table,
        result: pa.Table,
        codecs: Mapping[str, str],
        primary_key: tuple[str, ...],
    ) -> list[RowChange | list[RowChange]]:
        seqs = result.column(SEQ).to_pylist()
        kinds = result.column(IMAGE).to_pylist()
        data = result.drop_columns([c for c in result.column_names if c.startswith(META_PREFIX)])
        in_order = rows.complete and seqs == rows.seqs and kinds == rows.kinds
        if in_order:
            images = _images(rows.images, source, data, codecs)
        else:
            origins = _origins(rows, seqs, kinds)
            images = (table_to_rows(data, codecs) if origins is None else
                      _images([rows.images[i] for i in origins], source.take(pa.array(origins, pa.int64())), data,
                              codecs))
        changes = rows.changes
        schema, table, src = changes[0].schema, changes[0].table, changes[0].source
        insert, update, delete, read = Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ
        out: list[RowChange | list[RowChange]] = []
        if in_order:
            # Every row came back, in order (no filter, join or reordering): pair them up directly.
            next_image = iter(images).__next__
            for change in changes:
                op = change.op
                if op is update:
                    old = next_image()
                    out.append(RowChange(update, schema, table, primary_key, old, next_image(), change.position,
                                         change.commit_time, src))
                elif op is insert or op is read:
                    out.append(RowChange(op, schema, table, primary_key, None, next_image(), change.position,
                                         change.commit_time, src))
                else:
                    out.append(RowChange(delete, schema, table, primary_key, next_image(), None, change.position,
                                         change.commit_time, src))
            return out
        by_seq: dict[int, tuple[list[dict], list[dict]]] = {}
        for seq, kind, image in zip(seqs, kinds, images):
            if seq is None:
                raise self._error(batch, plan, "the transforms returned a row without _setl_seq")
            pair = by_seq.get(seq)
            if pair is None:
                pair = by_seq[seq] = ([], [])
            pair[0 if kind == BEFORE else 1].append(image)
        lost_deletes = []
        nothing: tuple[list[dict], list[dict]] = ([], [])
        for index, change in zip(rows.indices, changes):
            before, after = by_seq.pop(index, nothing)
            pos, ts = change.position, change.commit_time
            if change.op is insert or change.op is read:
                out.append([RowChange(change.op, schema, table, primary_key, None, a, pos, ts, src) for a in after])
            elif change.op is delete:
                if not before and not plan.may_drop_deletes:
                    lost_deletes.append(change)
                out.append([RowChange(delete, schema, table, primary_key, b, None, pos, ts, src) for b in before])
            elif len(before) == len(after):
                out.append([RowChange(update, schema, table, primary_key, b, a, pos, ts, src)
                            for b, a in zip(before, after)])
            else:  # rows left or entered a filter, or a transform multiplied them
                out.append([RowChange(delete, schema, table, primary_key, b, None, pos, ts, src) for b in before]
                           + [RowChange(insert, schema, table, primary_key, None, a, pos, ts, src) for a in after])
        if by_seq:
            raise self._error(batch, plan, f"the transforms returned rows for unknown _setl_seq {sorted(by_seq)[:5]}")
        if lost_deletes:
            raise self._error(
                batch, plan,
                f"the transforms removed {len(lost_deletes)} delete(s) (first key {lost_deletes[0].key}); "
                "a step that may drop deletes must say may_drop_deletes: true",
            )
        return out


@attrs.frozen
class _Rows:
    """A table's changes as the rows a transform sees: one per image, with setl's metadata, column-wise."""

    indices: Sequence[int]  # the changes' indices in the batch
    changes: Sequence[RowChange]
    images: list[Mapping[str, Any]]
    sources: list[RowChange]  # the change each row's image comes from
    seqs: list[int]
    kinds: list[str]
    complete: bool  # every insert has its after image, every delete its before, every update both

    @classmethod
    def of(cls, indices: Sequence[int], changes: Sequence[RowChange]) -> "_Rows":
        images: list[Mapping[str, Any]] = []
        sources: list[RowChange] = []
        seqs: list[int] = []
        kinds: list[str] = []
        # Four appends per row, no tuple per row: fewer objects for the garbage collector to track.
        image, source, seq, kind = images.append, sources.append, seqs.append, kinds.append
        insert, delete = Op.INSERT, Op.DELETE
        for index, change in zip(indices, changes):
            op = change.op
            if op is not insert and change.before is not None:
                image(change.before)
                source(change)
                seq(index)
                kind(BEFORE)
            if op is not delete and change.after is not None:
                image(change.after)
                source(change)
                seq(index)
                kind(AFTER)
        updates = sum(1 for c in changes if c.op is Op.UPDATE)
        return cls(indices, changes, images, sources, seqs, kinds, len(images) == len(changes) + updates)

    def table(self, types: TableTypes) -> tuple[pa.Table, dict[str, str]]:
        """The Arrow table of the rows (column types from `types`), and the codecs of its text columns."""
        # A transaction's changes share one Position object: format it once (by identity, hashing is slower).
        texts: dict[int, str | None] = {id(None): None}
        positions = []
        for change in self.sources:
            position = change.position
            text = texts.get(id(position))
            if text is None and position is not None:
                text = texts[id(position)] = str(position)
            positions.append(text)
        seconds = pa.array([c.commit_time for c in self.sources], pa.float64())
        micros = pc.cast(pc.trunc(pc.multiply(seconds, 1_000_000)), pa.int64())
        extra = {
            OP: pa.array([c.op for c in self.sources], pa.string()),  # Op is a str enum
            IMAGE: pa.array(self.kinds, pa.string()),
            SEQ: pa.array(self.seqs, pa.int64()),
            COMMIT_TIME: micros.cast(pa.timestamp("us", tz="UTC")),
            POSITION: pa.array(positions, pa.string()),
        }
        return types.table(self.images, extra=extra)


def _origins(rows: "_Rows", seqs: list[Any], kinds: list[Any]) -> list[int] | None:
    """For each result row, the index of the row image it came from (by seq and image); None if one is unknown."""
    where = {(seq, kind): i for i, (seq, kind) in enumerate(zip(rows.seqs, rows.kinds))}
    origins = [where.get(key, -1) for key in zip(seqs, kinds)]
    return None if -1 in origins else origins


def _images(
    images: Sequence[Mapping[str, Any]], source: pa.Table, data: pa.Table, codecs: Mapping[str, str],
) -> list[dict[str, Any]]:
    """The result rows as dicts: changed columns converted from Arrow, unchanged ones taken from `images`.

    `images` and `source` are the row images the result rows came from, one
    per row of `data`, as dicts and as the Arrow table Spark got. A column
    the chain left exactly as it went in (same name, type and values, compared
    in Arrow) keeps the images' own Python values: it is not converted back,
    and comes out as it would with no transform.
    """
    names = data.column_names
    known = set(source.column_names)
    same = {
        name for name in names
        if name in known and source.schema.field(name).type == data.schema.field(name).type
        and source.column(name).equals(data.column(name))
    }
    if not same:
        return table_to_rows(data, codecs)
    changed = [name for name in names if name not in same]
    values = table_columns(data.select(changed), codecs) if changed else []
    inputs = [c for c in source.column_names if not c.startswith(META_PREFIX)]
    if names[:len(inputs)] == inputs:
        # The chain kept every column in place (and maybe changed or added some): copy each image, then
        # set the changed columns, one column at a time; a row keeps the keys its change had.
        rows = [dict(image) for image in images]
        for name, column in zip(changed, values):
            for row, value in zip(rows, column):
                row[name] = value
        return rows
    # Columns dropped, renamed or reordered: build each row in the result's column order.
    converted = dict(zip(changed, values))
    columns = [converted[name] if name in converted else [image.get(name) for image in images] for name in names]
    return [dict(zip(names, row)) for row in zip(*columns)]


def build_transform(node: NodeSettings, config: PipelineConfig, plan: RoutingPlan | None = None) -> Transform:
    """The Transform stage of a pipeline: plugins discovered and every step validated now, at startup.

    `plan` is the pipeline's routing plan (`setl.routing.build_plan`), built here when not given.
    """
    if not any(rule.transforms for rule in config.tables):
        return Transform()
    try:
        find_java()  # Spark itself starts with the first batch that needs it
    except SetlError as exc:
        exc.with_context(file=config.file or None, pipeline=config.name, stage="transform")
        raise
    if plan is None:
        plan = build_plan(node, config)
    return SparkTransform(pipeline=config.name, spark=node.spark, routing=plan)
