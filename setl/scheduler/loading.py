"""Load dispatch: batches go to the target in id order, whole (ordered) or split by target table
onto the serial executor's slots (per_table), with a latch telling Termin when all are in."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from setl.errors import LeadershipLost, LoadError, SetlError
from setl.model import Batch, Change, DdlChange, TableName
from setl.runtime import (
    BatchLatch,
    Progress,
    SerialExecutorService,
    SerialTask,
    hash_slot,
)
from setl.scheduler.events import Listener, Outcome
from setl.scheduler.ledger import Slot, SlotState
from setl.stages import Load


class _Discarded(Exception):
    """A per-table part that was not run: its batch failed or was discarded before it started."""


class LoadDispatch:
    """The Load side of `Scheduler` (a mixin: its state lives in the scheduler, under its lock).

    State it owns: `_next_load` (the id to load next), `_load_blocked` (a failed batch stops
    loading until the rollback completes), `_load_barrier` (per_table: parts of this id and
    later must not run) and `_load_tasks` (per_table: part and EOF tasks not finished).
    """

    name: str
    load: Load
    per_table: bool
    serial: SerialExecutorService | None
    listener: Listener
    error: BaseException | None
    _cond: threading.Condition
    _inflight: dict[int, Slot]
    _epoch: int
    _halt: bool
    _next_load: int
    _load_blocked: bool
    _load_barrier: int | None
    _load_tasks: int

    # provided by Scheduler
    _wake: Callable[..., None]
    _wrap: Callable[[BaseException, str, Batch | None], BaseException]
    _retire: Callable[[Slot], None]
    _finish: Callable[[Outcome], None]

    # --- load --------------------------------------------------------------------------------

    def _load_step(self) -> Progress:
        """Load the next batch in id order: in this call (ordered), or hand its parts to the slots (per_table)."""
        with self._cond:
            if self._halt:
                return Progress.DONE
            slot = self._inflight.get(self._next_load)
            if slot is None or self._load_blocked or slot.state not in (SlotState.READY, SlotState.FAILED):
                return Progress.BLOCKED
            if slot.state is SlotState.FAILED:
                self._load_blocked = True
                self._cond.notify_all()
                self._wake("termin")
                return Progress.PROGRESS
            has_ddl = any(isinstance(c, DdlChange) for c in slot.batch.changes)
            if self.per_table and not has_ddl:
                slot.state = SlotState.LOADING
                slot.loading_since = time.perf_counter()
                self._next_load += 1
                self._dispatch_parts(slot)
                return Progress.PROGRESS
            if self.per_table and self._load_tasks:
                return Progress.BLOCKED  # a DDL batch waits for every earlier part
            slot.state = SlotState.LOADING
        error = None
        began = time.perf_counter()
        try:
            self.load.load(slot.batch)
        except LeadershipLost:
            raise
        except BaseException as exc:
            error = self._wrap(exc, "load", slot.batch)
        else:
            self.listener.on_stage("load", slot.batch, time.perf_counter() - began)
        with self._cond:
            if error is not None:
                slot.state, slot.error = SlotState.FAILED, error
                self._load_blocked = True
            else:
                slot.state = SlotState.LOADED
                self._next_load += 1
            if slot.discarded:
                self._retire(slot)
            self._cond.notify_all()
        self._wake("termin")
        return Progress.PROGRESS

    def _dispatch_parts(self, slot: Slot) -> None:
        """Under the lock: submit each target table's part, then its EOF, to the table's slot."""
        batch = slot.batch
        parts: dict[TableName, list[Change]] = {}
        for change in batch.changes:
            # a (schema, table) pair: either part may hold a dot
            parts.setdefault(TableName(change.schema, change.table or ""), []).append(change)
        if not parts:
            slot.state = SlotState.LOADED
            self._cond.notify_all()
            self._wake("termin")
            return
        latch = BatchLatch(parts)
        assert self.serial is not None
        for table, changes in parts.items():
            index = hash_slot((self.name, table.schema, table.table), self.serial.num_slots)
            part = batch.replace(tuple(changes))
            self._load_tasks += 2
            self.serial.submit(self._run_part, slot, part, slot=index,
                               callback=self._part_done(slot, latch, table, eof=False))
            self.serial.submit(self._run_eof, slot, part, slot=index,
                               callback=self._part_done(slot, latch, table, eof=True))

    def _runnable(self, slot: Slot, part: Batch) -> bool:
        """Under the lock: whether a part may still be written (its batch not failed nor discarded)."""
        if self._halt or slot.discarded or part.epoch != self._epoch:
            return False
        return self._load_barrier is None or part.id < self._load_barrier

    def _run_part(self, slot: Slot, part: Batch) -> None:
        with self._cond:
            if not self._runnable(slot, part):
                raise _Discarded()
        try:
            self.load.load_part(part)
        except BaseException as exc:
            with self._cond:
                # Before the slot's next task, and before any other slot's next part starts.
                if self._load_barrier is None or part.id < self._load_barrier:
                    self._load_barrier = part.id
            if isinstance(exc, LeadershipLost):
                self.error = exc
                self._finish(Outcome.LOST)
            raise

    def _run_eof(self, slot: Slot, part: Batch) -> None:
        with self._cond:
            if not self._runnable(slot, part):
                raise _Discarded()

    def _part_done(self, slot: Slot, latch: BatchLatch, table: TableName, *, eof: bool) -> Callable[[SerialTask], None]:
        def callback(handle: SerialTask) -> None:
            error = None if handle.cancelled() else handle.exception()
            if error is None:
                if eof:
                    latch.count_down(table)
            else:
                latch.fail(table, error)
            with self._cond:
                self._load_tasks -= 1
                if slot.state is SlotState.LOADING and latch.is_open:
                    if latch.error is None:
                        slot.state = SlotState.LOADED
                        self.listener.on_stage("load", slot.batch, time.perf_counter() - slot.loading_since)
                    else:
                        failure = latch.error
                        if isinstance(failure, _Discarded):
                            failure = LoadError("discarded: an earlier part of this batch or an earlier batch failed")
                        slot.state = SlotState.FAILED
                        slot.error = self._wrap(failure, "load", slot.batch)
                        if isinstance(slot.error, SetlError):
                            slot.error.with_context(table=latch.failed_channel)
                self._cond.notify_all()
            self._wake("termin", "load")

        return callback
