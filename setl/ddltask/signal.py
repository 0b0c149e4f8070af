"""Signal rows: how an upstream job declares a batch DDL task, and the Select wrapper that reads them.

The job inserts one row into the signal table (``pipeline.ddl_tasks.signal_table``) before its
data, or first in the same transaction::

    CREATE TABLE setl_signal (
        task_id      VARCHAR(191) NOT NULL PRIMARY KEY,
        op_type      VARCHAR(32)  NOT NULL,   -- see OP_TYPES
        op_db        VARCHAR(64)  NOT NULL,   -- the source table the job writes
        op_table     VARCHAR(64)  NOT NULL,
        op_partition VARCHAR(255) NOT NULL DEFAULT '',
        overwrite    BOOLEAN      NOT NULL DEFAULT FALSE
    );
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import attrs

from setl.ddltask.tasks import DdlTasks
from setl.errors import SourceError
from setl.meta.base import DdlTask
from setl.model import Change, DdlChange, Op, Position, RowChange, Transaction
from setl.stages.select import Select, SelectWrapper

log = logging.getLogger("setl.ddltask")

#: op_type → what op_partition holds ("" when it must be empty).
OP_TYPES: Mapping[str, str] = {
    "truncate_table": "",
    "drop_partition": "a partition name",
    "truncate_partition": "a partition name",
    "add_range_partition": "NAME:BOUND (VALUES LESS THAN BOUND)",
    "delete_where": "COLUMN=VALUE",
    "none": "anything (it only names the slice)",
}
_NAME = re.compile(r"^[A-Za-z0-9_$]{1,64}$")
_WHERE = re.compile(r"^\s*([A-Za-z0-9_$]{1,64})\s*=\s*(.*?)\s*$", re.S)


@attrs.frozen
class Signal:
    """One parsed signal row, in source names."""

    task_id: str
    op_type: str
    op_db: str
    op_table: str
    op_partition: str
    overwrite: bool
    position: Position

    @classmethod
    def from_row(cls, image: Mapping[str, Any], position: Position) -> "Signal":
        """Parse and check a signal row; a bad row raises ValueError saying what is wrong."""

        def text(column: str, required: bool = True) -> str:
            value = image.get(column)
            if isinstance(value, bytes):
                value = value.decode("utf-8")
            value = "" if value is None else str(value).strip()
            if required and not value:
                raise ValueError(f"column {column} is empty")
            return value

        task_id, op_type = text("task_id"), text("op_type").lower()
        op_db, op_table = text("op_db"), text("op_table")
        partition = text("op_partition", required=False)
        if op_type not in OP_TYPES:
            raise ValueError(f"op_type {op_type!r} is not one of {', '.join(OP_TYPES)}")
        check_partition(op_type, partition)
        overwrite = image.get("overwrite")
        if isinstance(overwrite, str):
            overwrite = overwrite.strip().lower() in ("1", "true", "yes", "y")
        return cls(task_id, op_type, op_db, op_table, partition, bool(overwrite), position)


def check_partition(op_type: str, partition: str) -> None:
    """Raise ValueError if `partition` is not what `op_type` needs (see `OP_TYPES`)."""
    if op_type == "truncate_table" and partition:
        raise ValueError("truncate_table takes no op_partition")
    if op_type in ("drop_partition", "truncate_partition") and not _NAME.match(partition):
        raise ValueError(f"{op_type} needs a partition name in op_partition, got {partition!r}")
    if op_type == "add_range_partition":
        name, sep, bound = partition.partition(":")
        if not sep or not _NAME.match(name) or not bound.strip():
            raise ValueError(f"add_range_partition needs NAME:BOUND in op_partition, got {partition!r}")
    if op_type == "delete_where" and not _WHERE.match(partition):
        raise ValueError(f"delete_where needs COLUMN=VALUE in op_partition, got {partition!r}")


def split_where(partition: str) -> tuple[str, str]:
    """``COLUMN=VALUE`` of a delete_where task as (column, value)."""
    match = _WHERE.match(partition)
    assert match is not None
    return match.group(1), match.group(2)


class DdlTaskSelect(SelectWrapper):
    """Wraps a pipeline's Select: declares the task of every signal row and hides the signal table.

    * An inserted signal row declares its task in the meta store (through `tasks.declare`) before
      `poll` returns its transaction, so the declaration exists before any change after it can
      reach a Load. Declaring is idempotent: replays after a rollback, crash or failover re-read
      the same rows and change nothing.
    * The signal table's own changes (rows and DDL) are removed from the transaction. A
      transaction left empty is dropped if another one is already there to follow it (whose
      end covers it), and returned empty otherwise, so its position is still acknowledged.
    * `blocking` is the wrapped source's.
    * A bad signal row, or two signals for one table in one transaction (unless rows name their
      task in `task_column`), raises `SourceError` naming the pipeline, table and position: the
      scheduler retries and then pauses, since loading the job's data without its task would be
      wrong.
    * Updates and deletes of signal rows are ignored (a job may clean its signal table).
    """

    def __init__(self, inner: Select, tasks: DdlTasks, signal_table: str, *, pipeline: str = "") -> None:
        schema, dot, table = signal_table.rpartition(".")
        if not dot or not schema or not table:
            raise ValueError(f"signal table {signal_table!r} is not schema.table")
        super().__init__(inner)
        self.tasks = tasks
        self.signal = (schema, table)
        self.pipeline = pipeline

    def open(self, start: Position | None) -> None:
        self.tasks.refresh()
        self.inner.open(start)

    def poll(self, timeout: float) -> Transaction | None:
        tx = self.inner.poll(timeout)
        held = None
        while tx is not None:
            stripped = self._strip(tx)
            if stripped.changes or not tx.changes or not tx.complete:
                return stripped  # it ends after `held`: acknowledging it covers that one too
            # Signal rows only: an empty transaction would end the batch being cut, so hand it
            # on only if no transaction follows it at once.
            held = stripped
            tx = self.inner.poll(0)
        return held

    def _strip(self, tx: Transaction) -> Transaction:
        kept: list[Change] = []
        declared: set[tuple[str, str]] = set()
        for change in tx.changes:
            if (change.schema, change.table) != self.signal:
                kept.append(change)
                continue
            if isinstance(change, DdlChange) or change.op is not Op.INSERT:
                continue
            self._declare(change, tx, declared)
        if len(kept) == len(tx.changes):
            return tx
        return attrs.evolve(tx, changes=tuple(kept))

    def _declare(self, change: RowChange, tx: Transaction, declared: set[tuple[str, str]]) -> None:
        position = change.position or tx.end
        where = {"pipeline": self.pipeline, "stage": "select",
                 "table": f"{self.signal[0]}.{self.signal[1]}", "position": position}
        try:
            signal = Signal.from_row(change.after or {}, position)
        except ValueError as exc:
            raise SourceError(f"bad signal row {dict(change.after or {})!r}: {exc}", **where) from exc
        table = (signal.op_db, signal.op_table)
        # Without a task column, changes are bound by position, which one transaction shares.
        if table in declared and self.tasks.task_column is None:
            raise SourceError(f"two signal rows for {signal.op_db}.{signal.op_table} in one transaction "
                              f"(task {signal.task_id}); a transaction declares at most one task per table",
                              **where)
        declared.add(table)
        task: DdlTask | None = self.tasks.declare(signal)
        if task is not None:
            log.info("pipeline=%s stage=select position=%s declared %s%s", self.pipeline, position,
                     task.describe(), " (overwrite)" if task.overwrite else "")



__all__ = ["OP_TYPES", "Signal", "DdlTaskSelect", "check_partition", "split_where"]
