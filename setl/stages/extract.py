"""The Extract contract, and the table-rule extract every pipeline uses: select, map and filter rows."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from setl.config import TableRule
from setl.ddl import parse, rewrite
from setl.ddl.policy import POLICIES, decide
from setl.errors import ExtractError, RefusedExtractError
from setl.model import (
    Batch,
    Change,
    DdlChange,
    Op,
    PartialImage,
    RowChange,
    TableName,
    partial_image_refusal,
    partial_like,
)
from setl.reads import mapped_reads, read_run_end
from setl.routing import Route, RoutingPlan

log = logging.getLogger(__name__)


class Extract:
    """Chooses and reshapes a batch's changes before Transform.

    Contract for implementations:

    * `extract` may be called concurrently for different batches, so it keeps
      no per-batch state on `self`. It should not block on I/O.
    * It keeps the order of the changes it returns, and the batch's id,
      epoch and positions.
    * Dropping a change is allowed only where the configuration says so
      (an excluded table or a filter); an exception fails the batch.

    The base class passes everything through.
    """

    def extract(self, batch: Batch) -> Batch:
        return batch


class TableExtract(Extract):
    """Applies a pipeline's routing plan (its `tables` rules, first match wins).

    * A table no rule matches, or whose rule says `exclude: true`, is skipped.
    * `columns.include`/`exclude` pick columns; primary-key columns may not be
      dropped, because the target could no longer apply the row idempotently.
    * `rename` maps column names; `target` is a ``{schema}.{table}`` template,
      split into a schema and a table template before substitution (names may
      hold dots).
    * `filter` is a Python expression over the row's columns. An update whose
      row leaves the filter becomes a delete, and one that enters it an insert,
      so the target holds exactly the rows that match.
    * A snapshot read (`Op.READ`, after image only) is routed, reshaped and filtered as an
      insert is (dropped when its row does not match) and stays a read, so that targets can
      show it; the update rules above do not apply to it.
    * A partial change (`RowChange.partial`) keeps its images partial; one of a rule with
      transforms, or whose filter reads a column an image lacks, is refused
      (`RefusedExtractError`: the pipeline pauses).

    Every row change it returns carries its `source` table, the key to its
    route for the stages after it. A sequence's state row (`RowChange.sequence`) is mapped as a
    table's row, and the CREATE SEQUENCE it carries as a DDL is.
    """

    def __init__(self, rules: Sequence[TableRule] = (), pipeline: str = "", *,
                 plan: RoutingPlan | None = None) -> None:
        self.pipeline = pipeline
        self.plan = plan if plan is not None else RoutingPlan.compile(rules, pipeline=pipeline)
        #: (source table, source key) -> target key, since every row of a table asks the same
        self._keys: dict[tuple[Any, tuple[str, ...]], tuple[str, ...]] = {}

    def route(self, schema: str, table: str) -> Route | None:
        return self.plan.route(schema, table)

    def extract(self, batch: Batch) -> Batch:
        out: list[Change] = []
        changes = batch.changes
        count = len(changes)
        index = 0
        while index < count:
            change = changes[index]
            index += 1
            if type(change) is RowChange and change.op is Op.READ:
                # A run of snapshot reads of one table (a chunk): routed once, mapped together.
                end = read_run_end(changes, index - 1)
                self._map_reads(batch, changes[index - 1:end], out)
                index = end
                continue
            try:
                plan = self.plan.route(change.schema, change.table or "")
            except ExtractError as exc:
                exc.with_context(
                    pipeline=self.pipeline, stage="extract", table=change.qualified_table,
                    batch=batch.id, position=change.position or batch.end,
                )
                raise
            if plan is None:
                if isinstance(change, DdlChange):
                    log.info("pipeline=%s stage=extract table=%s position=%s DDL skipped (no table rule selects "
                             "it): %s", self.pipeline, change.qualified_table, change.position,
                             " ".join(change.statement.split()))
                continue
            if isinstance(change, DdlChange):
                mapped_ddl = self._map_ddl(change, plan)
                if mapped_ddl is not None:
                    out.append(mapped_ddl)
                continue
            try:
                mapped = self._map(change, plan)
            except ExtractError as exc:
                exc.with_context(
                    pipeline=self.pipeline, stage="extract", table=change.qualified_table,
                    batch=batch.id, position=change.position or batch.end,
                )
                raise
            if mapped is not None:
                out.append(mapped)
        return batch.replace(tuple(out))

    def _map_reads(self, batch: Batch, reads: Sequence[Change], out: list[Change]) -> None:
        """Snapshot reads of one source table, mapped as `_map` maps each (same result), with the
        route looked up once and, when its rule has no filter, without a call per row."""
        first = reads[0]
        assert isinstance(first, RowChange)
        try:
            plan = self.plan.route(first.schema, first.table)
            if plan is None:
                return
            if plan.filter is not None:
                for read in reads:
                    assert isinstance(read, RowChange)
                    mapped = self._map(read, plan)
                    if mapped is not None:
                        out.append(mapped)
                return
            schema, table, source = plan.target.schema, plan.target.table, plan.source
            key = self._target_key(plan, first.primary_key)
        except ExtractError as exc:
            exc.with_context(pipeline=self.pipeline, stage="extract", table=first.qualified_table, batch=batch.id,
                             position=first.position or batch.end)
            raise
        read_op, make = Op.READ, RowChange
        if plan.reshapes:
            rename, include, exclude = plan.rename, plan.include, plan.exclude
            out.extend([make(read_op, schema, table, key, None, {
                rename.get(column, column): value for column, value in r.after.items()  # type: ignore[union-attr]
                if (include is None or column in include) and column not in exclude},
                r.position, r.commit_time, source) for r in reads])  # type: ignore[union-attr]
        else:
            out.extend(mapped_reads(schema, table, key, reads, source))  # type: ignore[arg-type]

    def _map_ddl(self, change: DdlChange, plan: Route) -> DdlChange | None:
        """The DDL with every table name mapped and qualified, the rule's column renames, and
        the columns its include/exclude lists leave out cut (see `setl.ddl.rewrite`); None when
        nothing is left (a DROP of tables no rule replicates, an ALTER of left-out columns). A copy's
        end marker (`DdlChange.copy_end`, no statement) is routed to its table's target, as its
        TRUNCATE is, and so is a row change logged as a statement (`DdlChange.logged_rows`: its
        target refuses it, quarantining the table)."""
        if change.copy_end or change.logged_rows:
            return attrs.evolve(change, schema=plan.target.schema, table=plan.target.table,
                                source=TableName(change.schema, change.table or ""))

        def target(schema: str, table: str) -> tuple[str, str] | None:
            found = self.plan.route(schema, table)
            return (found.target.schema, found.target.table) if found is not None else None

        include = {c.lower() for c in plan.include} if plan.include is not None else None
        exclude = {c.lower() for c in plan.exclude}

        def keep(column: str) -> bool:
            name = column.lower()
            return (include is None or name in include) and name not in exclude

        statement = rewrite(change.ddl, change.schema, target, plan.rename,
                            keep if include is not None or exclude else None)
        if statement is None:
            log.info("pipeline=%s stage=extract table=%s position=%s DDL skipped (it changes nothing a table "
                     "rule replicates): %s", self.pipeline, change.qualified_table, change.position,
                     " ".join(change.statement.split()))
            return None
        # A DDL on a schema only (no table) keeps the rule's target schema.
        where = {"schema": plan.target.schema, "table": plan.target.table if change.table else None,
                 "source": TableName(change.schema, change.table) if change.table else None}
        ruling = self._ruling(change, plan)
        decision = decide(ruling.schema_changes, statement)
        if decision.refused is not None:
            return change.with_ddl(statement, **where, refused=f"{decision.refused} (rule tables[{ruling.rule_index}])")
        if decision.kept:
            log.info("pipeline=%s stage=extract table=%s position=%s DROP of column(s) %s not applied: the target "
                     "keeps them (schema_changes is ignore_drops, rule tables[%d])", self.pipeline,
                     change.qualified_table, change.position, ", ".join(decision.kept), ruling.rule_index)
        if decision.statement is None:
            return None
        return change.with_ddl(decision.statement, **where)

    def _ruling(self, change: DdlChange, plan: Route) -> Route:
        """The route whose ``schema_changes`` decides `change`: of every replicated table the
        statement names (a RENAME or DROP of several, a CREATE ... LIKE), the strictest policy's,
        so that no table's policy is bypassed through another's statement."""
        ruling = plan
        for ref in change.ddl.tables:
            found = self.plan.route(ref.schema or change.schema, ref.table)
            if found is not None and POLICIES.index(found.schema_changes) > POLICIES.index(ruling.schema_changes):
                ruling = found
        return ruling

    def _map(self, change: RowChange, plan: Route) -> RowChange | None:
        op, before, after = change.op, change.before, change.after
        if plan.steps and change.partial:
            raise RefusedExtractError(partial_image_refusal(f"a partial {change.op.value}", change.qualified_table,
                                                            "its table rule has transforms, which need whole rows"))
        if plan.filter is None and change.sequence is None:  # most changes: built positionally, no keywords
            target = plan.target
            if plan.reshapes:
                before, after = self._columns(plan, before), self._columns(plan, after)
            return RowChange(op, target.schema, target.table, self._target_key(plan, change.primary_key), before,
                             after, change.position, change.commit_time, plan.source)
        if plan.filter is not None:
            keep_before = before is not None and self._matches(plan, before)
            keep_after = after is not None and self._matches(plan, after)
            if op is Op.UPDATE:  # an insert, read or delete has one image, kept or dropped below
                if keep_before and not keep_after:
                    op, after = Op.DELETE, None
                elif keep_after and not keep_before:
                    op, before = Op.INSERT, None
                elif not keep_before and not keep_after:
                    return None
            elif not (keep_before or keep_after):
                return None
        return RowChange(
            op=op,
            schema=plan.target.schema,
            table=plan.target.table,
            primary_key=self._target_key(plan, change.primary_key),
            before=self._columns(plan, before),
            after=self._columns(plan, after),
            position=change.position,
            commit_time=change.commit_time,
            source=plan.source,
            sequence=self._sequence_definition(change) if change.sequence is not None else None,
        )

    def _sequence_definition(self, change: RowChange) -> str:
        """A sequence state row's CREATE SEQUENCE with its name mapped and qualified as a DDL's
        (`setl.ddl.rewrite`); "" stays "" (the source could not show it)."""
        if not change.sequence:
            return ""

        def target(schema: str, table: str) -> tuple[str, str] | None:
            found = self.plan.route(schema, table)
            return (found.target.schema, found.target.table) if found is not None else None

        routed = rewrite(parse(change.sequence), change.schema, target)  # SHOW CREATE SEQUENCE's text, not a DDL event
        return routed.text if routed is not None else ""

    def _target_key(self, plan: Route, key: tuple[str, ...]) -> tuple[str, ...]:
        memo = (plan.source, key)
        found = self._keys.get(memo)
        if found is None:
            found = self._keys[memo] = plan.target_key(key)
        return found

    @staticmethod
    def _columns(plan: Route, image: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        if image is None:
            return None
        if not plan.reshapes:
            return image
        return partial_like(image, {
            plan.rename.get(column, column): value
            for column, value in image.items()
            if (plan.include is None or column in plan.include) and column not in plan.exclude
        })

    @staticmethod
    def _matches(plan: Route, image: Mapping[str, Any]) -> bool:
        assert plan.filter is not None
        try:
            return bool(eval(plan.filter, {"__builtins__": FILTER_BUILTINS}, dict(image)))
        except NameError as exc:
            if type(image) is PartialImage:  # the filter reads a column the source did not log
                raise RefusedExtractError(partial_image_refusal(
                    "a partial change", str(plan.source),
                    f"the filter of rule tables[{plan.rule_index}] reads a column the image lacks ({exc})")) from exc
            raise ExtractError(
                f"filter of rule tables[{plan.rule_index}] failed: {type(exc).__name__}: {exc}"
            ) from exc
        except Exception as exc:  # the expression is user input: any error is theirs to see
            raise ExtractError(
                f"filter of rule tables[{plan.rule_index}] failed: {type(exc).__name__}: {exc}"
            ) from exc


FILTER_BUILTINS = {
    name: __builtins__[name] if isinstance(__builtins__, dict) else getattr(__builtins__, name)
    for name in ("abs", "len", "min", "max", "round", "str", "int", "float", "bool", "any", "all")
}
