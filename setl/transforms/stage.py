"""The Spark Transform stage: per table, a batch's rows go through Arrow into a DataFrame,
through the table's transform chain, and back into row changes.

What a transform sees. One row per row image, with the table's columns and:

* ``_setl_op``: insert, update or delete (of the change the image belongs to);
* ``_setl_image``: ``after`` for inserts and updates, ``before`` for deletes and
  for the old image of updates (so renames, casts and hashes apply to the keys
  a delete or a key change must find in the target);
* ``_setl_seq``: the change's index in the batch (its order);
* ``_setl_commit_time`` (UTC timestamp) and ``_setl_position`` (text).

A transform must keep ``_setl_seq`` and ``_setl_image``; other ``_setl_*``
columns are informational and are never written to the target.

How rows come back. Rows are matched to their change by ``_setl_seq``:

* an insert becomes one insert per surviving after-image;
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
import re
import string
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc

from setl.config import NodeSettings, PipelineConfig, SparkConfig, TableRule
from setl.errors import PluginError, SetlError, TransformError
from setl.model import Batch, Change, Op, RowChange
from setl.plugins import BoundStep, Registry, TransformContext, load_registry
from setl.spark import brief, find_java, from_arrow, get_session, to_arrow
from setl.stages.transform import Transform
from setl.transforms.frames import SchemaCache, TableTypes, table_columns, table_to_rows

log = logging.getLogger(__name__)

META_PREFIX = "_setl_"
OP, IMAGE, SEQ, COMMIT_TIME, POSITION = "_setl_op", "_setl_image", "_setl_seq", "_setl_commit_time", "_setl_position"
BEFORE, AFTER = "before", "after"
REQUIRED_META = (SEQ, IMAGE)
INFORMATIONAL_META = (OP, COMMIT_TIME, POSITION)
_UNKNOWN: Any = object()


@attrs.frozen
class TablePlan:
    """The validated transform chain of one target table."""

    target: str
    steps: tuple[BoundStep, ...]
    source: str | None = None

    @property
    def may_drop_deletes(self) -> bool:
        return any(step.may_drop_deletes for step in self.steps)

    @property
    def names(self) -> str:
        return ",".join(step.name for step in self.steps)


@attrs.frozen
class _RulePlan:
    """A table rule, with its target template as a regex that recovers the source name."""

    rule_index: int
    source: re.Pattern[str]
    target: re.Pattern[str]
    steps: tuple[BoundStep, ...]
    exclude: bool = False


def _template_pattern(template: str) -> re.Pattern[str]:
    """A regex that recovers ``schema`` and ``table`` from a name made by `template`."""
    parts, seen = [], set()
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is None:
            continue
        if field in seen:
            parts.append(f"(?P={field})")
        else:
            seen.add(field)
            parts.append(f"(?P<{field}>[^.]+?)" if field == "schema" else f"(?P<{field}>.+?)")
    return re.compile("".join(parts))


class SparkTransform(Transform):
    """Runs each table's validated transform chain on Spark.

    `tables` maps a target table's qualified name (``schema.table``, as Extract
    produced it) to its steps. `session` returns the SparkSession and is only
    called for a batch that has rows of a table with transforms; by default it
    is `setl.spark.get_session(spark)`. Safe to call from several threads at
    once: it keeps no per-batch state, only each table's column types
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
        rules: Sequence[_RulePlan] = (),
    ) -> None:
        self.pipeline = pipeline
        self._spark_settings = spark
        self._session_factory = session
        self._plans: dict[str, TablePlan | None] = {
            name: TablePlan(name, tuple(steps), (sources or {}).get(name))
            for name, steps in (tables or {}).items()
            if steps
        }
        self._rules = tuple(rules)
        self._lock = threading.Lock()
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
    ) -> "SparkTransform":
        """Validate every rule's steps against `registry` (raising `PluginError`) and build the stage.

        A rule with a fixed target name applies to that name; a templated
        target (``dw.{table}``) applies to every name the template can produce
        from a source table its `source` regex matches. Excluded rules are
        skipped; the first matching rule wins, as in Extract.
        """
        plans: list[_RulePlan] = []
        for i, rule in enumerate(rules):
            steps = []
            for j, step in enumerate(() if rule.exclude else rule.transforms):
                try:
                    steps.append(registry.validate(step, index=j))
                except PluginError as exc:
                    raise exc.with_context(file=file, pipeline=pipeline or None,
                                           key=f"tables[{i}].transforms[{j}]")
            # Extract puts a target without a schema into the source's schema.
            template = rule.target if "." in rule.target else "{schema}." + rule.target
            plans.append(_RulePlan(i, re.compile(rule.source), _template_pattern(template), tuple(steps),
                                   rule.exclude))
        return cls(pipeline=pipeline, spark=spark, session=session, rules=plans)

    # --- planning -------------------------------------------------------------------------

    def plan_for(self, table: str) -> TablePlan | None:
        """The chain for a target table, or None when it has no transforms."""
        try:
            return self._plans[table]
        except KeyError:
            pass
        plan = self._resolve(table)
        with self._lock:
            self._plans.setdefault(table, plan)
        return plan

    def _resolve(self, table: str) -> TablePlan | None:
        # Invert Extract's first-match: find the rule whose target template makes this
        # name from a source table that no earlier rule claims.
        for rule in self._rules:
            if rule.exclude:
                continue
            match = rule.target.fullmatch(table)
            if not match:
                continue
            fields = match.groupdict()
            source = None
            if "schema" in fields and "table" in fields:
                source = f"{fields['schema']}.{fields['table']}"
                first = next((r for r in self._rules if r.source.fullmatch(source)), None)
                if first is not rule:
                    continue
            if not rule.steps:
                return None
            return TablePlan(table, rule.steps, source or rule.source.pattern)
        return None

    def session(self) -> Any:
        if self._session_factory is not None:
            return self._session_factory()
        return get_session(self._spark_settings)

    # --- running --------------------------------------------------------------------------

    def transform(self, batch: Batch) -> Batch:
        plans: dict[tuple[str, str], TablePlan | None] = {}
        groups: dict[tuple[str, str], list[int]] = {}
        last_schema = last_table = None
        indices: list[int] | None = None
        for index, change in enumerate(batch.changes):
            if type(change) is not RowChange:
                continue
            if change.table != last_table or change.schema != last_schema:  # runs of one table are common
                last_schema, last_table = change.schema, change.table
                key = (last_schema, last_table)
                plan = plans.get(key, _UNKNOWN)
                if plan is _UNKNOWN:
                    plan = plans[key] = self.plan_for(change.qualified_table)
                indices = None if plan is None else groups.setdefault(key, [])
            if indices is not None:
                indices.append(index)
        if not groups:
            return batch
        try:
            spark = self.session()
        except SetlError as exc:
            raise exc.with_context(pipeline=self.pipeline or batch.pipeline, stage="transform", batch=batch.id)
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

    def _run_table(
        self, spark: Any, batch: Batch, plan: TablePlan, indices: list[int],
    ) -> list[RowChange | list[RowChange]]:
        """What replaces each of the changes at `indices`: one change, or a list of 0 or more."""
        changes: list[RowChange] = [batch.changes[i] for i in indices]  # type: ignore[misc]
        rows = _Rows.of(indices, changes)
        table, codecs = rows.table(self._types[plan.target])
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
                raise exc.with_context(pipeline=self.pipeline or batch.pipeline, stage="transform",
                                       table=plan.target, batch=batch.id, plugin=step.name)
            except Exception as exc:
                raise self._error(batch, plan, f"step {step.index + 1} ({step.name}) failed: {brief(exc)}",
                                  step.name) from exc
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
            culprit = self._culprit(frames, plan)
            raise self._error(batch, plan, f"step {culprit.index + 1} ({culprit.name}) failed: {brief(exc)}",
                              culprit.name) from exc
        return self._changes(batch, plan, rows, table, result_table, codecs, tuple(primary_key))

    @staticmethod
    def _culprit(frames: list[Any], plan: TablePlan) -> BoundStep:
        """The first step whose result cannot be computed (only run after the chain failed)."""
        for frame, step in zip(frames[:-1], plan.steps):
            try:
                to_arrow(frame)
            except Exception:
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
        schema, table = changes[0].schema, changes[0].table
        insert, update, delete = Op.INSERT, Op.UPDATE, Op.DELETE
        out: list[RowChange | list[RowChange]] = []
        if in_order:
            # Every row came back, in order (no filter, join or reordering): pair them up directly.
            image = iter(images).__next__
            for change in changes:
                op = change.op
                if op is update:
                    before = image()
                    out.append(RowChange(update, schema, table, primary_key, before, image(), change.position,
                                         change.commit_time))
                elif op is insert:
                    out.append(RowChange(insert, schema, table, primary_key, None, image(), change.position,
                                         change.commit_time))
                else:
                    out.append(RowChange(delete, schema, table, primary_key, image(), None, change.position,
                                         change.commit_time))
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
            if change.op is insert:
                out.append([RowChange(insert, schema, table, primary_key, None, a, pos, ts) for a in after])
            elif change.op is delete:
                if not before and not plan.may_drop_deletes:
                    lost_deletes.append(change)
                out.append([RowChange(delete, schema, table, primary_key, b, None, pos, ts) for b in before])
            elif len(before) == len(after):
                out.append([RowChange(update, schema, table, primary_key, b, a, pos, ts)
                            for b, a in zip(before, after)])
            else:  # rows left or entered a filter, or a transform multiplied them
                out.append([RowChange(delete, schema, table, primary_key, b, None, pos, ts) for b in before]
                           + [RowChange(insert, schema, table, primary_key, None, a, pos, ts) for a in after])
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


def build_transform(node: NodeSettings, config: PipelineConfig) -> Transform:
    """The Transform stage of a pipeline: plugins discovered and every step validated now, at startup."""
    if not any(rule.transforms for rule in config.tables):
        return Transform()
    try:
        find_java()  # Spark itself starts with the first batch that needs it
    except SetlError as exc:
        raise exc.with_context(file=config.file or None, pipeline=config.name, stage="transform")
    registry = load_registry(node.plugins.dirs, base=node.conf_dir)
    return SparkTransform.from_rules(config.tables, registry, pipeline=config.name, spark=node.spark,
                                     file=config.file or None)
