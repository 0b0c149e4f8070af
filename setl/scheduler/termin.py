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
from setl.retry import Backoff, Verdict, record_retrying
from setl.runtime import Progress
from setl.scheduler.events import Listener, Outcome, log_event
from setl.scheduler.ledger import Ledger, SlotState
from setl.stages import Load, Select

log = logging.getLogger("setl.scheduler")


class Termin:
    """The Termin side of a `Scheduler`: acks the ledger's batches in id order, or rolls back.

    The state it moves (the next id to ack, the acked position, the attempts, the rollback
    under way and the rewind it asks of Select) is the `Ledger`'s; Termin decides, does the
    I/O (the ack and the new epoch in the meta store, the target's position, `mark_loaded`)
    outside the lock (an ack goes through `Select.acknowledge`, so that what the source must make
    durable with it, a table copy's progress, is in the same atomic meta-store write), and
    applies the outcome through the ledger's transitions. `step` is one slice of the Termin
    task and never waits on anything but that I/O, so a test can call it directly. It keeps the
    counts of acked batches and rows, and `until` (the position at which the pipeline has caught
    up, if asked).

    `wake(*roles)` wakes the scheduler's tasks ("select", "load"); `wrap(exc, stage, batch)`
    makes a failure a `SetlError`; `finish(outcome, error)` ends the pipeline (caught up, or
    paused with `error`).
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        name: str,
        node_id: str | None,
        lock: threading.Condition,
        load: Load,
        select: Select,
        meta: MetaStore,
        listener: Listener,
        backoff: Backoff,
        per_table: bool,
        wake: Callable[..., None],
        wrap: Callable[[BaseException, str, Batch | None], BaseException],
        finish: Callable[[Outcome, BaseException | None], None],
    ) -> None:
        self.ledger = ledger
        self.name = name
        self.node_id = node_id
        self.load = load
        self.select = select
        self.meta = meta
        self.listener = listener
        self.backoff = backoff
        self.per_table = per_table
        self.until: Position | None = None
        self.acked_batches = 0
        self.acked_rows = 0
        self._caught_up = False  # finished CAUGHT_UP past echoes (`passed_until`)
        self._lock = lock
        self._wake = wake
        self._wrap = wrap
        self._finish = finish

    def step(self) -> Progress:
        """Ack the next batch in id order, or take one step of a rollback.

        BLOCKED while the next batch's load has not ended (a later batch's result waits);
        DONE once the ledger is halted.
        """
        ledger = self.ledger
        with self._lock:
            if ledger.halted:
                return Progress.DONE
            rolling = ledger.rolling is not None
            if not rolling:
                # A source failure leaves the batches handed on before it intact:
                # let them be acked first, then rewind from the newest ack.
                error = ledger.source_failure()
                slot = None if error is not None else ledger.result()
                if error is None and slot is None:
                    if self.until is None or len(ledger) or self._caught_up:
                        return Progress.BLOCKED
                    acked = ledger.acked  # nothing in flight: caught up past echoes only?
                if slot is not None:
                    error = slot.error
        if rolling:
            return self._continue_rollback()
        if error is None and slot is None:
            if self.passed_until(acked):
                self._caught_up = True
                self._finish(Outcome.CAUGHT_UP, None)
            return Progress.BLOCKED
        if slot is None:
            return self._begin_rollback(ledger.next_ack, error)
        batch = slot.batch
        self.listener.on_termin(batch, slot.state is SlotState.LOADED)
        if slot.state is SlotState.FAILED:
            return self._begin_rollback(batch.id, error)
        try:
            if self.per_table or slot.parts:
                self.load.mark_loaded(batch)
        except LeadershipLost:
            raise
        except BaseException as exc:  # noqa: BLE001 - any load failure, wrapped with its stage and batch, starts a rollback
            return self._begin_rollback(batch.id, self._wrap(exc, "load", batch))
        began = time.perf_counter()
        try:
            # The source adds what this ack makes durable (table-copy progress) to the same atomic write.
            ack = self.select.acknowledge(batch, lambda progress: self.meta.ack(
                self.name, batch.id, batch.epoch, batch.end, rows=len(batch), progress=progress))
        except LeadershipLost:
            raise
        except BaseException as exc:  # noqa: BLE001 - any ack failure, wrapped with its stage and batch, starts a rollback
            return self._begin_rollback(batch.id, self._wrap(exc, "termin", batch))
        acked_in = time.perf_counter() - began
        ledger.ack(slot)
        if slot.parts and not self.per_table:
            self._wake("load")  # a whole batch may wait for this ack (`LoadDispatcher.step`)
        self.acked_batches += 1
        self.acked_rows += len(batch)
        self.listener.on_ack(ack, batch)
        self.listener.on_stage("termin", batch, acked_in)
        if log.isEnabledFor(logging.DEBUG):
            log_event(self.name, "termin", batch, f"acked {len(batch)} changes up to {batch.end}", logging.DEBUG)
        if self.until is not None and batch.end >= self.until and not self.select.backlog():
            self._finish(Outcome.CAUGHT_UP, None)
        return Progress.PROGRESS

    def passed_until(self, acked: Position | None) -> bool:
        """Whether, with no batch in flight and the ack at `acked`, only echoes lie between the ack
        and `until` (`Select.passed`): acked at or past the last end handed on before them, read
        past them to `until`, and no backlog. Such echoes hand on no position (docs/bidirectional.md,
        "Echoes"), so the ack itself never reaches `until`."""
        until = self.until
        passed = self.select.passed() if until is not None else None
        if until is None or passed is None or acked is None:
            return False
        after, through = passed
        if not (acked >= after and through >= until) or self.select.backlog():
            return False
        log_event(self.name, "termin", None, f"caught up: acked {acked}, only echoes of the channel's other "
                  f"direction up to {through} (the target {until})")
        return True

    # --- rollback ----------------------------------------------------------------------------

    def _begin_rollback(self, failed_id: int, error: BaseException | None) -> Progress:
        """Discard batch `failed_id` and every later one, then rewind Select to the ack.

        No load starts after this; the rollback completes once running loads have finished.
        """
        assert error is not None
        if isinstance(error, LeadershipLost):
            raise error
        self.ledger.begin_rollback(failed_id, error, self.meta.next_epoch(self.name))
        return self._continue_rollback()

    def _continue_rollback(self) -> Progress:
        ledger = self.ledger
        with self._lock:
            rolling = ledger.rolling
            assert rolling is not None
            if not ledger.rollback_ready():
                return Progress.BLOCKED
            acked = ledger.acked
        # No load runs now (they are blocked until the rollback completes).
        resume = self._replay_from(acked)
        next_id = rolling.failed_id
        if resume is not None and resume != acked and self.ack_target_position(next_id, rolling.epoch, acked, resume):
            next_id += 1  # that id is acked: the replay goes on with the next one
        else:
            resume = acked
        # Decided before the rollback completes: a pause asks Select for no rewind, so no batch is
        # handed on and loaded before the run ends. A pause does not drain: a batch it abandoned
        # mid-load (a per_table part applied, its mark not) would be applied again at the next start,
        # a keyless table's rows twice.
        verdict = self.backoff.decide(rolling.error, ledger.attempt + 1)  # setl/retry.py
        attempt, delay = ledger.complete_rollback(resume, next_id, rewind=not verdict.pause)
        self._wake("select", "load")
        self.listener.on_rollback(rolling.failed_id, rolling.epoch, rolling.error, attempt)
        self._pause_or_retry(rolling.failed_id, rolling.error, attempt, delay, verdict)
        return Progress.PROGRESS

    def _pause_or_retry(self, failed_id: int, error: BaseException, attempt: int, delay: float,
                        verdict: Verdict) -> None:
        """After a rollback: pause the pipeline when `verdict` (`self.backoff`'s) says retrying is
        over (or cannot help), else let the replay go on after `delay` (Select waits for it)."""
        if verdict.pause:
            self.listener.on_pause(failed_id, error)
            log.error("pipeline=%s stage=termin batch=%d %s", self.name, failed_id, verdict.message)
            self.meta.set_state(self.name, Status.PAUSED, error=str(error), node=self.node_id)
            self._finish(Outcome.PAUSED, error)
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
        except Exception as exc:  # noqa: BLE001 - any error reading the target's position: replay from the ack (safe)
            log.warning("pipeline=%s stage=termin cannot read the target's position (%s); replaying from the ack %s",
                        self.name, exc, acked)
            return acked
        log_event(self.name, "termin", None,
                  f"target already holds {committed}, ahead of the ack {acked}: replaying from it")
        return committed

    def ack_target_position(self, batch_id: int, epoch: int, acked: Position | None,
                             position: Position) -> bool:
        """Ack `position`, which the target holds though its batch's ack failed, as batch `batch_id`
        (with no changes) of `epoch`; False if the meta store refused it. Called by a rollback, and
        by the scheduler's start before any task runs. No table-copy progress is written:
        a copy resumes before the batch's chunks, and copies them again (harmless)."""
        try:
            ack = self.meta.ack(self.name, batch_id, epoch, position, rows=0)
        except LeadershipLost:
            raise
        except Exception as exc:  # noqa: BLE001 - any error acking the target's position: replay from the ack (safe)
            log.warning("pipeline=%s stage=termin cannot ack the target's position %s (%s); replaying from %s",
                        self.name, position, exc, acked)
            return False
        batch = Batch(self.name, batch_id, epoch, acked if acked is not None else position, position, ())
        self.ledger.ack_position(position)
        self.listener.on_ack(ack, batch)
        if self.until is not None and position >= self.until and not self.select.backlog():
            self._finish(Outcome.CAUGHT_UP, None)
        return True


__all__ = ["Termin"]
