"""The Select wrapper of batch DDL tasks: it reads the signal rows (`setl.ddltask.signal`) from the
source, declares their tasks (`setl.ddltask.tasks`) and hides the signal table from the pipeline."""

from __future__ import annotations

import logging

import attrs

from setl.ddltask.signal import Signal
from setl.ddltask.tasks import DdlTasks
from setl.errors import SourceError
from setl.meta.base import DdlTask
from setl.model import Change, DdlChange, Op, Position, RowChange, Transaction
from setl.stages.select import Select, SelectWrapper

log = logging.getLogger("setl.ddltask")


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

    forward_ready = True  # it hands on the inner's transactions (less the signal table), within the same poll

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


__all__ = ["DdlTaskSelect"]
