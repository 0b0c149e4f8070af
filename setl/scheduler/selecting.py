"""Select's side of the scheduler: the one task that reads the source, cuts batches under the
permits, hands them to the ledger, and rewinds when a rollback asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from setl.errors import LeadershipLost
from setl.model import Batch, Position
from setl.runtime import Progress
from setl.scheduler.cutter import BatchCutter
from setl.scheduler.events import Listener
from setl.scheduler.ledger import Ledger, Permits, Rewind, Slot
from setl.stages import Select


class Selector:
    """The Select side of a `Scheduler`: the only code that touches the source.

    State of its own (touched only by the Select task): the `cutter` reading transactions
    into a batch, the rewind it took from the ledger and is waiting to apply (the backoff's
    delay), and since when it has been waiting for a permit. Everything shared (the epoch,
    the batches in flight, a pending rewind, a source failure) is the `Ledger`'s.

    `step` is one slice of the Select task: rewind if asked, take a permit, read, and hand a
    batch on through `ledger.admit` and `hand_on(slot)` (which starts its Extract/Transform).
    A source failure goes to the ledger and wakes Termin (`wake("termin")`), which rolls back
    once the batches handed on before it are acked; Select stays BLOCKED until then.
    """

    def __init__(
        self,
        ledger: Ledger,
        permits: Permits,
        select: Select,
        cutter: BatchCutter,
        *,
        lock: threading.Condition,
        listener: Listener,
        clock: Callable[[], float],
        stopping: threading.Event,
        hand_on: Callable[[Slot], None],
        wake: Callable[..., None],
        wrap: Callable[[BaseException, str, Batch | None], BaseException],
    ) -> None:
        self.ledger = ledger
        self.permits = permits
        self.select = select
        self.cutter = cutter
        self.listener = listener
        self._lock = lock
        self._clock = clock
        self._stopping = stopping
        self._hand_on = hand_on
        self._wake = wake
        self._wrap = wrap
        self._rewind: Rewind | None = None  # taken from the ledger, applied once its delay is over
        self._permit_wait_since: float | None = None  # when Select found every permit taken
        self._passed: tuple[Position, Position] | None = None  # the source's `passed` Termin was last woken for
        select.listen(self._ready)  # a source that announces new rows wakes the Select task (`Select.notifies`)

    def _ready(self) -> None:
        self._wake("select")

    def idle_for(self) -> float | None:
        """How long the Select task may stay parked after a slice that read nothing, unless woken
        (`BatchCutter.idle_for`); None (the service's back-off) while a rewind waits for its time."""
        if self._rewind is not None:
            return None
        return self.cutter.idle_for()

    def step(self) -> Progress:
        """One slice of Select: rewind if asked, take a permit, read, hand a batch on."""
        if self._stopping.is_set():
            self.drop_cut()
            return Progress.DONE
        with self._lock:
            rewind = self.ledger.take_rewind()
            if rewind is None and self.ledger.select_failed and self._rewind is None:
                return Progress.BLOCKED  # Termin rolls back, then wakes us
        if rewind is not None:
            self.drop_cut()
            self._rewind = rewind
        if self._rewind is not None:
            if self._clock() < self._rewind.resume_at:
                return Progress.NO_PROGRESS
            rewind, self._rewind = self._rewind, None
            self.cutter.reset(rewind.position, rewind.next_id)
            try:
                self.select.seek(rewind.position)
            except BaseException as exc:  # noqa: BLE001 - any source failure, wrapped with its stage, starts a rollback
                self._source_failed(exc)
                return Progress.PROGRESS
        if self.cutter.deferred_error is not None:
            error, self.cutter.deferred_error = self.cutter.deferred_error, None
            self._source_failed(error)
            return Progress.PROGRESS
        if not self.cutter.cutting:
            if not self.permits.take():
                if self._permit_wait_since is None:
                    self._permit_wait_since = time.perf_counter()
                return Progress.BLOCKED  # a retiring batch wakes us
            if self._permit_wait_since is not None:
                self.listener.on_permit_wait(time.perf_counter() - self._permit_wait_since)
                self._permit_wait_since = None
            with self._lock:
                epoch = self.ledger.epoch
            self.cutter.begin(epoch)
        try:
            batch = self.cutter.read()
        except BaseException as exc:  # noqa: BLE001 - any source failure, wrapped with its stage, starts a rollback
            self.drop_cut()
            self._source_failed(exc)
            return Progress.PROGRESS
        if isinstance(batch, Progress):
            passed = self.select.passed()
            if passed is not None and passed != self._passed:  # read past echoes: Termin may be caught up
                self._passed = passed
                self._wake("termin")
            return batch
        selected_in = self.cutter.age()
        self.cutter.drop()
        admitted = self.ledger.admit(batch, closing=self._stopping.is_set())
        if admitted is None:
            return Progress.PROGRESS
        slot, live = admitted
        self.select.handed_on(batch)  # before its Extract: the source knows which batch holds what
        self.listener.on_handoff(batch, live)
        self.listener.on_stage("select", batch, selected_in)
        self._hand_on(slot)
        self.cutter.handed_on(batch)
        return Progress.PROGRESS

    def drop_cut(self) -> None:
        """Abandon the batch being read (a stop or a rewind) and give its permits back, or stop waiting for one."""
        self.cutter.drop()
        self.permits.abandon_cut()

    def _source_failed(self, exc: BaseException) -> None:
        if isinstance(exc, LeadershipLost):
            raise exc
        self.ledger.source_failed(self._wrap(exc, "select", None))
        self._wake("termin")


__all__ = ["Selector"]
