"""Termin: batches are acked strictly in id order, or a failure rolls back every later batch,
rewinds Select, and the pipeline retries or pauses."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from setl.errors import LeadershipLost
from setl.meta.base import MetaStore, Status
from setl.model import Batch, Position
from setl.retry import Backoff, record_retrying
from setl.runtime import Progress
from setl.scheduler.events import Listener, Outcome
from setl.scheduler.ledger import Slot, SlotState
from setl.stages import Load, Select

log = logging.getLogger("setl.scheduler")


class Termin:
    """The Termin side of `Scheduler` (a mixin: its state lives in the scheduler, under its lock).

    State it owns: `_next_ack` (the id to ack next), `_acked` (the last acked position),
    `_attempt` and `_retry_from` (failed attempts since the ack last moved past the rewind
    point), `_rolling` (a rollback waiting for running loads) and `_rewind` (where Select
    starts again, with which id, and when).
    """

    name: str
    node_id: str | None
    load: Load
    select: Select
    meta: MetaStore
    listener: Listener
    backoff: Backoff
    clock: Callable[[], float]
    per_table: bool
    error: BaseException | None
    acked_batches: int
    acked_rows: int
    _cond: threading.Condition
    _inflight: dict[int, Slot]
    _epoch: int
    _halt: bool
    _next_load: int
    _next_ack: int
    _load_blocked: bool
    _load_barrier: int | None
    _load_tasks: int
    _acked: Position | None
    _attempt: int
    _retry_from: Position | None
    _rewind: tuple[Position | None, int, float] | None
    _rolling: tuple[int, BaseException, int] | None
    _select_error: BaseException | None
    _until: Position | None

    # provided by Scheduler
    _wake: Callable[..., None]
    _wrap: Callable[[BaseException, str, Batch | None], BaseException]
    _retire: Callable[[Slot], None]
    _finish: Callable[[Outcome], None]
    _event: Callable[..., None]

    def _termin_step(self) -> Progress:
        """Ack the next batch in id order, or take one step of a rollback."""
        with self._cond:
            if self._halt:
                return Progress.DONE
            if self._rolling is not None:
                slot, error = None, None
            # A source failure leaves the batches handed on before it intact:
            # let them be acked first, then rewind from the newest ack.
            elif self._select_error is not None and self._rewind is None and not self._inflight:
                slot, error = None, self._select_error
            else:
                slot = self._inflight.get(self._next_ack)
                if slot is None or slot.state not in (SlotState.LOADED, SlotState.FAILED):
                    return Progress.BLOCKED
                error = slot.error
        if self._rolling is not None:
            return self._continue_rollback()
        if slot is None:
            return self._begin_rollback(self._next_ack, error)
        batch = slot.batch
        self.listener.on_termin(batch, slot.state is SlotState.LOADED)
        if slot.state is SlotState.FAILED:
            return self._begin_rollback(batch.id, error)
        try:
            if self.per_table:
                self.load.mark_loaded(batch)
        except LeadershipLost:
            raise
        except BaseException as exc:
            return self._begin_rollback(batch.id, self._wrap(exc, "load", batch))
        began = time.perf_counter()
        try:
            ack = self.meta.ack(self.name, batch.id, batch.epoch, batch.end, rows=len(batch))
        except LeadershipLost:
            raise
        except BaseException as exc:
            return self._begin_rollback(batch.id, self._wrap(exc, "termin", batch))
        acked_in = time.perf_counter() - began
        with self._cond:
            del self._inflight[batch.id]
            self._next_ack += 1
            self._acked = batch.end
            if self._retry_from is None or batch.end > self._retry_from:
                self._attempt, self._retry_from = 0, None
            self._retire(slot)
            self._cond.notify_all()
        self.acked_batches += 1
        self.acked_rows += len(batch)
        self.listener.on_ack(ack, batch)
        self.listener.on_stage("termin", batch, acked_in)
        if log.isEnabledFor(logging.DEBUG):
            self._event("termin", batch, f"acked {len(batch)} changes up to {batch.end}", logging.DEBUG)
        if self._until is not None and batch.end >= self._until and not self.select.backlog():
            self._finish(Outcome.CAUGHT_UP)
        return Progress.PROGRESS

    # --- rollback, retire, finish ------------------------------------------------------------

    def _begin_rollback(self, failed_id: int, error: BaseException | None) -> Progress:
        """Discard batch `failed_id` and every later one, then rewind Select to the ack.

        No load starts after this; the rollback completes once running loads have finished.
        """
        assert error is not None
        if isinstance(error, LeadershipLost):
            raise error
        epoch = self.meta.next_epoch(self.name)
        with self._cond:
            self._rolling = (failed_id, error, epoch)
            self._load_blocked = True
            if self._load_barrier is None or failed_id < self._load_barrier:
                self._load_barrier = failed_id
        return self._continue_rollback()

    def _continue_rollback(self) -> Progress:
        with self._cond:
            assert self._rolling is not None
            # A batch still being loaded must finish first, or its late write could
            # land after the replay of an earlier batch touching the same keys.
            if self._load_tasks or any(s.state is SlotState.LOADING for s in self._inflight.values()):
                return Progress.BLOCKED
            acked = self._acked
            failed_id, error, epoch = self._rolling
        # No load runs now (they are blocked until the rollback completes).
        resume = self._replay_from(acked)
        next_id = failed_id
        if resume is not None and resume != acked and self._ack_target_position(failed_id, epoch, acked, resume):
            next_id += 1  # that id is acked: the replay goes on with the next one
        else:
            resume = acked
        with self._cond:
            self._rolling = None
            for batch_id in [b for b in self._inflight if b >= failed_id]:
                slot = self._inflight.pop(batch_id)
                slot.discarded = True
                if slot.worker_done:
                    self._retire(slot)
            self._epoch = epoch
            self._next_load = self._next_ack = next_id
            self._load_blocked = False
            self._load_barrier = None
            self._attempt += 1
            attempt = self._attempt
            delay = self.backoff.delay(attempt)
            # Set in the same critical section as the new epoch: otherwise Select could
            # hand on a batch cut from its old cursor under the new epoch.
            self._rewind = (resume, next_id, self.clock() + delay)
            self._retry_from = resume
            self._cond.notify_all()
        self._wake("select", "load")
        self.listener.on_rollback(failed_id, epoch, error, attempt)
        self._pause_or_retry(failed_id, error, attempt, delay)
        return Progress.PROGRESS

    def _pause_or_retry(self, failed_id: int, error: BaseException, attempt: int, delay: float) -> None:
        """After a rollback: pause the pipeline when `self.backoff` says retrying is over (or cannot
        help), else let the replay go on after `delay` (Select waits for it)."""
        verdict = self.backoff.decide(error, attempt)  # setl/retry.py: transient, permanent or other
        if verdict.pause:
            self.error = error
            self.listener.on_pause(failed_id, error)
            log.error("pipeline=%s stage=termin batch=%d %s", self.name, failed_id, verdict.message)
            self.meta.set_state(self.name, Status.PAUSED, error=str(error), node=self.node_id)
            self._finish(Outcome.PAUSED)
            return
        self.listener.on_retry(failed_id, attempt, delay)
        record_retrying(self.meta, self.name, error, verdict.since, self.node_id)
        log.warning("pipeline=%s stage=termin batch=%d rolled back (%s, retry in %.1fs): %s",
                    self.name, failed_id, verdict.message, delay, error)

    def _replay_from(self, acked: Position | None) -> Position | None:
        """Where a rollback replays from: the ack, or the target's own position when the target
        committed more (a batch loaded whose ack failed), so that a keyless table does not get
        that batch twice. Falls back to the ack when the target or meta store cannot tell."""
        try:
            committed = self.load.committed()
            if committed is None or (acked is not None and committed <= acked):
                return acked
            if self.meta.position_was_reset(self.name):
                return acked
        except LeadershipLost:
            raise
        except Exception as exc:
            log.warning("pipeline=%s stage=termin cannot read the target's position (%s); replaying from the ack %s",
                        self.name, exc, acked)
            return acked
        self._event("termin", None, f"target already holds {committed}, ahead of the ack {acked}: replaying from it")
        return committed

    def _ack_target_position(self, batch_id: int, epoch: int, acked: Position | None,
                             position: Position) -> bool:
        """Ack `position`, which the target holds though its batch's ack failed, as batch `batch_id`
        (with no changes); False if the meta store refused it."""
        try:
            ack = self.meta.ack(self.name, batch_id, epoch, position, rows=0)
        except LeadershipLost:
            raise
        except Exception as exc:
            log.warning("pipeline=%s stage=termin cannot ack the target's position %s (%s); replaying from %s",
                        self.name, position, exc, acked)
            return False
        batch = Batch(self.name, batch_id, epoch, acked if acked is not None else position, position, ())
        with self._cond:
            self._acked = position
        self.listener.on_ack(ack, batch)
        if self._until is not None and position >= self._until and not self.select.backlog():
            self._finish(Outcome.CAUGHT_UP)
        return True
