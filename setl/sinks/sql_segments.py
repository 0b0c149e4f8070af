"""How an SQL target cuts a batch for applying: the merged row changes between its DDLs, and the
DDLs the ``pipeline.ddl`` policy lets through (`SegmentPlanner`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs

from setl.ddl import Statement
from setl.errors import RefusedLoadError
from setl.model import Batch, DdlChange, RowChange
from setl.sinks.merge import TableChanges, merge

log = logging.getLogger(__name__)


@attrs.frozen
class DdlStep:
    """A DDL to apply: the `index`-th change of its batch, and its parse."""

    index: int
    change: DdlChange
    statement: Statement


#: What `SqlLoad` applies in order: the merged row changes between DDLs, or one DDL.
Segment = list[TableChanges] | DdlStep


class SegmentPlanner:
    """Cuts a batch into segments under the pipeline's ``pipeline.ddl`` policy (`ddl`): ``apply``
    keeps each table DDL in its place among the rows; ``skip`` logs it and drops it; ``fail``
    refuses the batch with a `RefusedLoadError` naming the table, position and statement. A DDL
    its table's ``schema_changes`` policy refused (`DdlChange.refused`) raises `TableRefused`.
    Statements that are not table DDL are logged and dropped, and a snapshot's TRUNCATE and a
    copy's end marker (`DdlChange.copy_end`) are always kept. A table without a primary key is
    warned about once per planner. Pure but for that warning: safe to call from many threads (a
    warning may then be logged twice).
    """

    def __init__(self, pipeline: str, ddl: str, context: Callable[..., dict[str, Any]]) -> None:
        """`context(batch, table=...)` names a batch and table in an error."""
        self.pipeline = pipeline
        self.ddl = ddl
        self._context = context
        self._warned_unkeyed: set[tuple[str, str]] = set()

    def segments(self, batch: Batch) -> list[Segment]:
        """The merged row changes of each run between DDLs, and the DDLs to apply, in batch order."""
        try:
            if DdlChange in map(type, batch.changes):  # found at C speed; the common batch has none
                segments = self._split(batch)
            else:  # one run: no segment when it merges to nothing (a row inserted and deleted again)
                tables = merge(batch.changes)
                segments = [tables] if tables else []
        except RefusedLoadError as exc:  # a partial row image merge cannot apply exactly: name the batch
            exc.context = {**self._context(batch, table=exc.context.get("table")), **exc.context}
            raise
        for segment in segments:
            if isinstance(segment, list):
                for table in segment:
                    self._warn_unkeyed(table)
        return segments

    def _split(self, batch: Batch) -> list[Segment]:
        """`segments` of a batch holding DDL: each run of row changes merged, and the DDLs between."""
        segments: list[Segment] = []
        run: list[RowChange] = []
        for index, change in enumerate(batch.changes):
            if not isinstance(change, DdlChange):
                run.append(change)
                continue
            position = change.position or batch.end
            statement = change.ddl
            if change.copy_end or (change.snapshot and statement.kind == "truncate_table"):
                pass  # a snapshot's TRUNCATE and end come with the copy that replaces the table: always applied
            elif change.refused is not None:  # its table's schema_changes policy refuses it
                error = change.refusal(self.pipeline, batch.id, position)
                error.context = {**self._context(batch, table=change.qualified_table), **error.context}
                raise error
            elif self.ddl == "fail":
                raise RefusedLoadError(f"DDL refused (pipeline.ddl is fail): {change.statement}",
                                **{**self._context(batch, table=change.qualified_table), "position": position})
            elif self.ddl == "skip" or statement.kind == "other":
                log.warning("pipeline=%s stage=load table=%s position=%s DDL not applied (%s): %s",
                            self.pipeline, change.qualified_table, position,
                            "pipeline.ddl is skip" if self.ddl == "skip" else "not a table DDL",
                            change.statement)
                continue
            if run:
                segments.append(merge(run))
                run = []
            segments.append(DdlStep(index, change, statement))
        if run:
            segments.append(merge(run))
        return segments

    def _warn_unkeyed(self, table: TableChanges) -> None:
        ident = (table.schema, table.table)
        if table.sequence and table.sequence[0].sequence is not None:
            return  # a sequence's state rows: written as its whole state, never matched row by row
        if not table.primary_key and ident not in self._warned_unkeyed:
            self._warned_unkeyed.add(ident)
            log.warning("pipeline %s: table %s.%s has no primary key; an update or delete changes one row "
                        "equal to its before-image in every column (any one of identical rows). Each "
                        "change is applied once: the batch's position commits with its rows, and a "
                        "replay starts after what the target holds", self.pipeline, *ident)

