"""Load dispatch: batches go to the target in id order, whole (ordered) or split by target table
onto the serial executor's slots (per_table, and a snapshot's chunks in ordered mode), with a
latch telling Termin when all are in."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable

from setl.errors import LeadershipLost, LoadError, SetlError
from setl.model import Batch, Change, DdlChange, Op, RowChange, TableName
from setl.runtime import (
    BatchLatch,
    Progress,
    SerialExecutorService,
    SerialTask,
    hash_slot,
)
from setl.scheduler.events import Listener
from setl.scheduler.ledger import Ledger, Slot, SlotState
from setl.stages import Load

_SCHEMA_TABLE = operator.attrgetter("schema", "table")


def chunks_only(batch: Batch) -> bool:
    """Whether `batch` holds snapshot reads (`Op.READ`) only, at least one: chunks, which
    `chunk_parts` loads as per-table parts in ordered mode."""
    read = Op.READ
    return bool(batch.changes) and all(type(c) is RowChange and c.op is read for c in batch.changes)


def _split_by_table(batch: Batch) -> dict[TableName, Batch]:
    """`batch`'s changes split by (schema, table), each part in binlog order: the batch itself
    when it holds one table (a chunk's), found without a Python step per change."""
    tables = dict.fromkeys(map(_SCHEMA_TABLE, batch.changes))
    if len(tables) == 1:
        schema, table = next(iter(tables))
        return {TableName(schema, table or ""): batch}
    changes: dict[tuple[str, str | None], list[Change]] = {key: [] for key in tables}
    for change in batch.changes:
        changes[(change.schema, change.table)].append(change)
    # a (schema, table) pair: either part may hold a dot
    return {TableName(schema, table or ""): batch.replace(tuple(part)) for (schema, table), part in changes.items()}


class _Discarded(Exception):
    """A per-table part that was not run: its batch failed or was discarded before it started."""


class LoadDispatcher:
    """The Load side of a `Scheduler`: takes the ledger's batches in id order and loads them.

    Holds no state of its own beyond its collaborators: which batch loads next, whether a
    failure blocks loading, the per_table barrier and the count of running part tasks are the
    `Ledger`'s, changed through its transitions under the scheduler's `lock`. `step` is one
    slice of the Load task (it may block in the target's `load`, outside the lock); per_table
    parts run on `serial` and report through callbacks on its threads.

    `wake(*roles)` wakes the scheduler's tasks ("termin", "load"); `wrap(exc, stage, batch)`
    makes a failure a `SetlError` naming pipeline, stage and batch; `lost(exc)` ends the
    pipeline when a part finds the leadership gone.

    `chunk_parts` (ordered mode, a target that loads per table): a batch of snapshot reads only
    (`chunks_only`) is loaded as per_table parts too, so that chunks of different tables load on
    their own connections while the next batches are read. A whole batch then waits until every
    part has run (a key's changes stay in binlog order) and every batch that went by parts is
    acked (Termin records such a batch's position at its ack: `mark_loaded` must not move the
    target's position back past a whole batch's).
    """

    def __init__(
        self,
        ledger: Ledger,
        load: Load,
        *,
        name: str,
        lock: threading.Condition,
        listener: Listener,
        per_table: bool,
        serial: SerialExecutorService | None,
        chunk_parts: bool = False,
        wake: Callable[..., None],
        wrap: Callable[[BaseException, str, Batch | None], BaseException],
        lost: Callable[[BaseException], None],
    ) -> None:
        self.ledger = ledger
        self.load = load
        self.name = name
        self.listener = listener
        self.per_table = per_table
        self.chunk_parts = chunk_parts and not per_table and serial is not None
        self.serial = serial
        self._lock = lock
        self._wake = wake
        self._wrap = wrap
        self._lost = lost

    def step(self) -> Progress:
        """Load the next batch in id order: in this call (ordered), or hand its parts to the slots (per_table)."""
        ledger = self.ledger
        with self._lock:
            if ledger.halted:
                return Progress.DONE
            slot = ledger.loadable()
            if slot is None:
                return Progress.BLOCKED
            if slot.state is SlotState.FAILED:
                ledger.block_load()
                self._wake("termin")
                return Progress.PROGRESS
            if self.by_parts(slot.batch):
                ledger.begin_load(slot, parts=True)
                self._dispatch_parts(slot)
                return Progress.PROGRESS
            if (self.per_table or self.chunk_parts) and ledger.load_tasks:
                return Progress.BLOCKED  # a DDL batch (a whole one, chunk_parts) waits for every earlier part
            if self.chunk_parts and ledger.parts_unacked(slot.batch.id):
                return Progress.BLOCKED  # woken by Termin's ack of it
            ledger.begin_load(slot)
        error = None
        began = time.perf_counter()
        try:
            self.load.load(slot.batch)
        except LeadershipLost:
            raise
        except BaseException as exc:  # noqa: BLE001 - any load failure, wrapped with its stage and batch, starts a rollback
            error = self._wrap(exc, "load", slot.batch)
        else:
            self.listener.on_stage("load", slot.batch, time.perf_counter() - began)
        ledger.loaded(slot, error)
        self._wake("termin")
        return Progress.PROGRESS

    def by_parts(self, batch: Batch) -> bool:
        """Whether `batch` loads as per-table parts on the load slots (otherwise whole, here)."""
        if self.per_table:
            return not any(isinstance(c, DdlChange) for c in batch.changes)
        return self.chunk_parts and chunks_only(batch)

    def prepared_whole(self, batch: Batch) -> bool:
        """Whether a worker may prepare `batch`'s load: a whole batch, or a batch of parts that is its
        own one part (one table: a chunk's); other parts are prepared on their loading threads."""
        return not self.by_parts(batch) or len(dict.fromkeys(map(_SCHEMA_TABLE, batch.changes))) == 1

    def _dispatch_parts(self, slot: Slot) -> None:
        """Under the lock: submit each target table's part, then its EOF, to the table's slot."""
        batch = slot.batch
        parts = _split_by_table(batch)
        if not parts:
            self.ledger.parts_settled(slot)
            self._wake("termin")
            return
        latch = BatchLatch(parts)
        assert self.serial is not None
        for table, part in parts.items():
            index = hash_slot((self.name, table.schema, table.table), self.serial.num_slots)
            self.ledger.parts_submitted(2)
            self.serial.submit(self._run_part, slot, part, slot=index,
                               callback=self._part_done(slot, latch, table, eof=False))
            self.serial.submit(self._run_eof, slot, part, slot=index,
                               callback=self._part_done(slot, latch, table, eof=True))

    def _run_part(self, slot: Slot, part: Batch) -> None:
        if not self.ledger.runnable(slot, part):
            raise _Discarded()
        try:
            self.load.load_part(part)
        except BaseException as exc:
            # Before the slot's next task, and before any other slot's next part starts.
            self.ledger.bar_from(part.id)
            if isinstance(exc, LeadershipLost):
                self._lost(exc)
            raise

    def _run_eof(self, slot: Slot, part: Batch) -> None:
        if not self.ledger.runnable(slot, part):
            raise _Discarded()

    def _part_done(self, slot: Slot, latch: BatchLatch, table: TableName, *, eof: bool) -> Callable[[SerialTask], None]:
        def callback(handle: SerialTask) -> None:
            error = None if handle.cancelled() else handle.exception()
            if error is None:
                if eof:
                    latch.count_down(table)
            else:
                latch.fail(table, error)
            with self._lock:
                self.ledger.part_finished()
                if slot.state is SlotState.LOADING and latch.is_open:
                    if latch.error is None:
                        self.ledger.parts_settled(slot)
                        self.listener.on_stage("load", slot.batch, time.perf_counter() - slot.loading_since)
                    else:
                        failure = latch.error
                        if isinstance(failure, _Discarded):
                            failure = LoadError("discarded: an earlier part of this batch or an earlier batch failed")
                        wrapped = self._wrap(failure, "load", slot.batch)
                        if isinstance(wrapped, SetlError):
                            wrapped.with_context(table=latch.failed_channel)
                        self.ledger.parts_settled(slot, wrapped)
            self._wake("termin", "load")

        return callback


__all__ = ["LoadDispatcher", "chunks_only"]
