"""One pipeline's scheduler, after otter's SETL: a permit-bounded Select, concurrent Extract and
Transform, Load in batch order (whole batches, or per target table), and Termin, which acks in
order or rolls back. `Scheduler` builds the parts (`Ledger`, `Selector`, `Worker`,
`LoadDispatcher`, `Termin`), runs them as tasks, and drains and tears down.

Its work runs as tasks on a `TaskExecutionService` that many pipelines of a node share; per-table
loads run on a shared `SerialExecutorService`, one slot per (pipeline, target table).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import attrs

from setl.config import PipelineSettings
from setl.errors import (
    ConfigError,
    ExtractError,
    LeadershipLost,
    LoadError,
    MetaStoreError,
    SetlError,
    SourceError,
    TransformError,
)
from setl.meta.base import MetaStore, Status
from setl.model import Ack, Batch, Position
from setl.retry import Backoff
from setl.runtime import (
    BatchCap,
    Progress,
    RejectedTask,
    SerialExecutorService,
    TaskExecutionService,
    TaskHandle,
)
from setl.scheduler.cutter import BatchCutter
from setl.scheduler.ending import RunEnd
from setl.scheduler.events import Listener, Outcome, log_event
from setl.scheduler.ledger import Ledger, Permits, Slot
from setl.scheduler.loading import LoadDispatcher
from setl.scheduler.opening import EarlyOpen
from setl.scheduler.selecting import Selector
from setl.scheduler.termin import Termin
from setl.scheduler.working import Worker
from setl.stages import Extract, Load, Select, Transform
from setl.stages.load import supports_per_table

log = logging.getLogger("setl.scheduler")

_STAGE_ERRORS: dict[str, type[SetlError]] = {
    "select": SourceError,
    "extract": ExtractError,
    "transform": TransformError,
    "load": LoadError,
    "termin": MetaStoreError,
}

#: Load and Termin go on to the next batch in the same call while they are within this (real time).
STEP_SLICE = 0.01


@attrs.define(eq=False)
class _Step:
    """A scheduler activity as a `Task`: each `call()` is one bounded slice of it."""

    step: Callable[[], Progress]
    blocking: bool = False
    idle: Callable[[], float | None] | None = None  # `Task.idle_for`: None, the service's back-off

    def call(self) -> Progress:
        return self.step()

    def idle_for(self) -> float | None:
        return None if self.idle is None else self.idle()


class Scheduler:
    """Runs one pipeline until it is stopped, catches up, pauses, or loses leadership.

    Work runs as tasks on `tasks` (a `TaskExecutionService`): Select (the only one touching
    the source; a source whose `blocking` is true gets a thread of its own), one
    Extract/Transform task per batch, Load (batch-id order), Termin (acks in batch-id order,
    or rolls back), and a closer that drains and tears down after a stop. In
    ``load.mode: per_table`` a batch's changes are split by target table and loaded on
    `serial` (a `SerialExecutorService`): each (pipeline, table) channel maps to a slot by
    hash, its part is followed by an EOF task, and a `BatchLatch` tells Termin when every
    channel is in or which one failed. Without `tasks` or `serial` the scheduler makes
    private ones, sized so that every activity has a thread (the thread-per-task layout).

    per_table keeps each key's changes in binlog order: a table's parts go to its slot (FIFO)
    in batch order; once a part fails, no part of that batch or a later one starts; a
    rollback waits for every submitted part to run or be skipped, and a part of an old epoch
    is skipped when its turn comes. Termin calls `Load.mark_loaded` (the target records the
    position) only when every channel of the batch is in, in batch order, before the ack.

    A permit is taken before Select cuts a batch and given back only when the batch is
    acked, or discarded and its work has finished, so at most `parallelism` batches exist
    between Select and Termin at any time. With a `batch_cap` (a `BatchCap` the node's
    pipelines share) a cut also needs one of the node's permits before it takes its first
    transaction (so an idle pipeline holds none): Select waits for one parked (BLOCKED,
    holding no thread), in FIFO order with the other pipelines, and the batch gives it back
    together with its own. When the pipeline ends, every permit its batches still hold is
    given back (the batches are abandoned, to be replayed; a worker still busy with one after
    the drain and halt timeouts no longer counts), as is the one Select held or waited for.

    Who owns what: the `ledger` (`Ledger`) owns the shared state (epoch, batches in flight,
    next ids to load and ack, acked position, rollback and rewind) and `Permits`; `selector`
    (`Selector`) owns the source's cursor; `worker` (`Worker`, Extract/Transform), `loader`
    (`LoadDispatcher`) and `termin` (`Termin`) hold the ledger and move it through its
    transitions; `end` (`RunEnd`) owns how the run ends: the outcome, `error`, the drain and halt
    deadlines and the result. The scheduler itself owns the tasks and drives the end through its
    transitions. One lock (`_cond`) guards all of it.
    """

    def __init__(
        self,
        name: str,
        settings: PipelineSettings,
        select: Select,
        extract: Extract,
        transform: Transform,
        load: Load,
        meta: MetaStore,
        *,
        node_id: str | None = None,
        listener: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
        tasks: TaskExecutionService | None = None,
        serial: SerialExecutorService | None = None,
        batch_cap: BatchCap | None = None,
        opening: EarlyOpen | None = None,
    ) -> None:
        """`opening`: `select` being opened already at the ack (`EarlyOpen`); `start` takes it over."""
        self.name = name
        self.opening = opening
        self.settings = settings
        self.select = select
        self.extract = extract
        self.transform = transform
        self.load = load
        self.meta = meta
        self.node_id = node_id
        self.listener = listener or Listener()
        self.clock = clock
        self.backoff = Backoff.from_settings(settings.retry)
        self.per_table = settings.load.mode == "per_table"
        if self.per_table and not supports_per_table(load):
            raise ConfigError(f"target {type(load).__name__} cannot load per table; use pipeline.load.mode: ordered",
                              pipeline=name, stage="load")
        # ordered mode with load.chunks per_table: a snapshot's chunks load per table (`LoadDispatcher`)
        chunk_parts = (not self.per_table and settings.load.chunks == "per_table"
                       and settings.on_table_error != "quarantine" and supports_per_table(load))
        self._own_tasks = tasks is None
        self._own_serial = serial is None and (self.per_table or chunk_parts)
        self.tasks = tasks if tasks is not None else TaskExecutionService(
            settings.parallelism + 4, settings.parallelism + 8, idle_backoff=0.002, name=f"setl-{name}")
        self.serial = serial if serial is not None or not self._own_serial else SerialExecutorService(
            8, 4, name=f"setl-{name}-load")

        self._cond = threading.Condition()
        self.batch_cap = batch_cap
        self._permits = Permits(settings.parallelism, batch_cap, self._cond, self._wake_select,
                                lambda batch, live: self.listener.on_retire(batch, live))
        self.ledger = Ledger(self._permits, self._cond, self.backoff, clock)
        #: how the run ends: outcome, error, drain and halt deadlines, result
        self.end = RunEnd(settings.drain_timeout_ms / 1000.0)
        self._handles: dict[str, TaskHandle] = {}
        self._etl_tasks: set[TaskHandle] = set()
        self._closer: TaskHandle | None = None
        cutter = BatchCutter(name, select, settings.batch, clock, self._permits.node_permit)
        self.selector = Selector(self.ledger, self._permits, select, cutter, lock=self._cond,
                                 listener=self.listener, clock=clock, stopping=self.end.stopping,
                                 hand_on=self._hand_on, wake=self._wake, wrap=self._wrap)
        self.loader = LoadDispatcher(self.ledger, load, name=name, lock=self._cond, listener=self.listener,
                                     per_table=self.per_table, serial=self.serial, chunk_parts=chunk_parts,
                                     wake=self._wake, wrap=self._wrap,
                                     lost=lambda exc: self._finish(Outcome.LOST, exc))
        # per_table loads parts (other batch objects): nothing prepared would be used
        prepare = None if self.per_table else self._prepare_whole(getattr(load, "prepare", None))
        self.worker = Worker(self.ledger, extract, transform, name=name, listener=self.listener, prepare=prepare,
                             wake=self._wake, wrap=self._wrap)
        self.termin = Termin(self.ledger, name=name, node_id=node_id, lock=self._cond, load=load, select=select,
                             meta=meta, listener=self.listener, backoff=self.backoff, per_table=self.per_table,
                             wake=self._wake, wrap=self._wrap, finish=self._finish)

    # --- public ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop: no new batches; in-flight ones are loaded and acked."""
        self._finish(Outcome.STOPPED)

    @property
    def acked_batches(self) -> int:
        """Batches acked since the start."""
        return self.termin.acked_batches

    @property
    def acked_rows(self) -> int:
        """Row changes acked since the start."""
        return self.termin.acked_rows

    @property
    def error(self) -> BaseException | None:
        """The error the run ended with, if any (`RunEnd.error`)."""
        return self.end.error

    @error.setter
    def error(self, error: BaseException | None) -> None:
        self.end.error = error  # the node records a leadership lost while starting

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._permits.live

    def run(self, *, until_caught_up: bool = False) -> Outcome:
        """Run until stopped, caught up (if asked), paused or deposed. Blocks."""
        self.start(until_caught_up=until_caught_up)
        outcome = self.wait()
        assert outcome is not None  # no timeout
        return outcome

    def start(self, *, until_caught_up: bool = False) -> None:
        """Open the source and start the pipeline's tasks; returns without waiting for them.

        Raises what opening the source raises. Call `wait` for the outcome.
        """
        early, self.opening = self.opening, None
        try:
            acked, start, next_id = self._starting_point(self.meta.position(self.name))
            # Above any epoch the target already accepted: a rebuilt meta store starts again at 1.
            epoch = self.meta.next_epoch(self.name, at_least=(self.load.committed_epoch() or 0) + 1)
            # The target holds more than the ack (its batch's ack never came): ack it now, so that the
            # position, lag and status are right before the source writes again.
            if start is not None and start != acked and self.termin.ack_target_position(next_id, epoch, acked, start):
                next_id += 1
            self.ledger.begin(epoch, start, next_id)
            self.meta.set_state(self.name, Status.RUNNING, node=self.node_id)
            self._event("select", None, f"starting at {start or 'the configured start'}, epoch {epoch}")
        except BaseException:
            if early is not None:
                early.abandon()
            raise
        try:
            if early is None:
                self.select.open(start)
            else:
                early.open_at(start)
        except BaseException as exc:
            self._close_private()
            error = self._wrap(exc, "select", None)
            self._record_failed_start(error)
            if error is exc:  # `raise exc from exc` would replace its cause (setl.retry reads it) with itself
                raise
            raise error from exc
        if start is None:
            start = self.select.tell()
            self.ledger.begin(epoch, start, next_id)
        if until_caught_up:
            try:
                self.termin.until = self.select.head()
                if self.termin.until is None:
                    raise SourceError(
                        "the source cannot tell where its log ends; --until-caught-up needs it",
                        pipeline=self.name, stage="select",
                    )
            except BaseException as exc:
                self.select.close()
                self._close_private()
                self._record_failed_start(exc)
                raise
            if start is not None and (start >= self.termin.until or self.termin.passed_until(start)) \
                    and not self.select.backlog():
                self._event("termin", None, f"already caught up at {start}")
                self.meta.set_state(self.name, Status.STOPPED, node=self.node_id)
                self.select.close()
                self.end.finished(Outcome.CAUGHT_UP)
                return
        cutter = self.selector.cutter
        cutter.reset(start, next_id)
        # With private services every activity has a thread: Select's waits in the source's poll.
        cutter.blocking = self._own_tasks or bool(getattr(self.select, "blocking", False))
        steps = {
            "select": _Step(self._guard(self.selector.step), blocking=cutter.blocking, idle=self.selector.idle_for),
            "load": _Step(self._guard(self._repeat(self.loader.step))),
            "termin": _Step(self._guard(self._repeat(self.termin.step))),
        }
        with self._cond:
            for role, step in steps.items():
                self._handles[role] = self.tasks.submit(step, name=f"{self.name}-{role}")
            stopped_early = self.end.stopping.is_set()
        if stopped_early:  # stop() came before the tasks existed: start the drain now
            self._finish(self.end.outcome or Outcome.STOPPED)

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Block until the pipeline has ended and been torn down; its outcome, or None on timeout."""
        if not self.end.wait(timeout):
            return None
        self._close_private()
        return self.end.result

    # --- setup and guards --------------------------------------------------------------------

    def _starting_point(self, ack: Ack | None) -> tuple[Position | None, Position | None, int]:
        """The ack's position, where to start (the ack, or the target's own position when it holds
        more and no operator reset the position since) and the next batch id."""
        acked = start = ack.position if ack else None
        next_id = (ack.batch_id if ack else 0) + 1
        committed = self.load.committed()
        if committed is not None and not self.meta.position_was_reset(self.name):
            if start is None or committed > start:
                self._event("load", None, f"target already holds {committed}, ahead of the ack {start}")
                start = committed
        return acked, start, next_id

    def _guard(self, step: Callable[[], Progress]) -> Callable[[], Progress]:
        def call() -> Progress:
            try:
                return step()
            except LeadershipLost as exc:
                self._finish(Outcome.LOST, exc)
            except BaseException as exc:  # a bug in the scheduler itself: stop, never hang
                log.exception("pipeline=%s task %s crashed", self.name, threading.current_thread().name)
                self._finish(Outcome.STOPPED, exc)
            return Progress.DONE

        return call

    @staticmethod
    def _repeat(step: Callable[[], Progress]) -> Callable[[], Progress]:
        """`step` again while it makes progress, within `STEP_SLICE`.

        So Load and Termin end a call with nothing left to do, parked (BLOCKED) until woken,
        and a wake serves them ahead of the queue; a call ending in PROGRESS would put them
        at its back, behind every other pipeline's tasks, with a batch ready for them.
        """

        def call() -> Progress:
            deadline = time.perf_counter() + STEP_SLICE
            while True:
                progress = step()
                if progress is not Progress.PROGRESS or time.perf_counter() >= deadline:
                    return progress

        return call

    def _prepare_whole(self, prepare: Callable[[Batch], object] | None) -> Callable[[Batch], object] | None:
        """The target's `prepare` for the batches a worker may prepare (`LoadDispatcher.prepared_whole`):
        parts of several tables are prepared on their loading threads (`Load.load_part`), not here."""
        if prepare is None or not self.loader.chunk_parts:
            return prepare
        prepared_whole = self.loader.prepared_whole

        def whole(batch: Batch) -> object:
            return prepare(batch) if prepared_whole(batch) else None

        return whole

    def _wake(self, *roles: str) -> None:
        for role in roles:
            handle = self._handles.get(role)
            if handle is not None:
                handle.wake()

    def _wake_select(self) -> None:
        self._wake("select")

    def _hand_on(self, slot: Slot) -> None:
        """Select handed `slot` on: start its Extract/Transform, first in the queue (finishing
        batches in flight comes before reading new ones)."""
        work = self.tasks.submit(_Step(self._guard(self.worker.task(slot))), name=f"{self.name}-etl-{slot.batch.id}",
                                 first=True)
        with self._cond:
            self._etl_tasks = {h for h in self._etl_tasks if not h.done()}
            self._etl_tasks.add(work)

    # --- extract and transform ---------------------------------------------------------------

    def _finish(self, outcome: Outcome, error: BaseException | None = None) -> None:
        """End the pipeline with `outcome` (recording `error`): stop Select, drain, tear down."""
        with self._cond:
            self.end.ask(outcome, error)  # a pause or a lost leadership outranks a stop already draining
            self._cond.notify_all()
            start_closer = self._closer is None and bool(self._handles)
            if start_closer:
                self.end.drain_from(self.clock())
                try:
                    self._closer = self.tasks.submit(_Step(self._close_step), name=f"{self.name}-closer")
                except RejectedTask:
                    self._closer = None
        if start_closer and self._closer is None:
            log.warning("pipeline=%s the task service is shut down; tearing down at once", self.name)
            self._halt_now()
            self._teardown()
        self._wake("select", "load", "termin")

    # --- drain and teardown ------------------------------------------------------------------

    def _close_step(self) -> Progress:
        """After a stop: let in-flight batches be acked, within the drain timeout; then tear down."""
        with self._cond:
            if not self.ledger.halted:
                if self.end.draining(self.clock(), len(self.ledger), self.ledger.rolling_back):
                    return Progress.NO_PROGRESS
                if len(self.ledger):
                    log.warning("pipeline=%s stopped with %d batches not acked; they will be replayed",
                                self.name, len(self.ledger))
        if not self.ledger.halted:
            self._halt_now()
        with self._cond:
            busy = self.ledger.load_tasks or any(not h.done() for h in [*self._handles.values(), *self._etl_tasks])
        if busy and not self.end.halt_over(self.clock()):
            return Progress.NO_PROGRESS
        if busy:
            log.warning("pipeline=%s some tasks did not stop in time", self.name)
        self._teardown()
        return Progress.DONE

    def _halt_now(self) -> None:
        with self._cond:
            self.ledger.halt()
            self.end.halt(self.clock())
            self._cond.notify_all()
        self._wake("select", "load", "termin")

    def _teardown(self) -> None:
        try:
            self.select.close()
        except Exception:
            log.exception("pipeline=%s closing the source failed", self.name)
        self._permits.close()  # retire the batches it abandoned; give back Select's node permit
        outcome = self.end.outcome or Outcome.STOPPED
        try:
            # An operator's pause, written while we drained, must survive the stop.
            if outcome in (Outcome.STOPPED, Outcome.CAUGHT_UP) and (
                self.meta.state(self.name).status is Status.RUNNING
            ):
                self.meta.set_state(self.name, Status.STOPPED, node=self.node_id)
        except Exception as exc:  # noqa: BLE001 - the outcome is already decided; recording it is best effort
            log.error("pipeline=%s cannot record the stop: %s", self.name, exc)
        self._event("termin", None, f"finished: {outcome.value}")
        self.end.finished(outcome)

    def _record_failed_start(self, error: BaseException) -> None:
        """A start that failed leaves the pipeline STOPPED with the error, not RUNNING with no process."""
        try:
            self.meta.set_state(self.name, Status.STOPPED, error=str(error), node=self.node_id)
        except Exception as exc:  # noqa: BLE001 - the failure is already being reported; recording it is best effort
            log.error("pipeline=%s cannot record the failed start: %s", self.name, exc)

    def _close_private(self) -> None:
        """Shut down the services this scheduler made for itself (never from one of their threads)."""
        if self._own_tasks:
            self.tasks.shutdown(timeout=self.settings.drain_timeout_ms / 1000.0)
        if self._own_serial and self.serial is not None:
            self.serial.shutdown_now()
            self.serial.await_termination(self.settings.drain_timeout_ms / 1000.0)

    # --- helpers -----------------------------------------------------------------------------

    def _wrap(self, exc: BaseException, stage: str, batch: Batch | None) -> BaseException:
        """A SetlError naming pipeline, stage, batch and position."""
        context = {
            "pipeline": self.name,
            "stage": stage,
            "batch": batch.id if batch else None,
            "position": batch.start if batch else self.ledger.acked,
        }
        if isinstance(exc, SetlError):
            return exc.with_context(**context)
        error = _STAGE_ERRORS[stage](f"{type(exc).__name__}: {exc}", **context)
        error.__cause__ = exc
        return error

    def _event(self, stage: str, batch: Batch | None, message: str, level: int = logging.INFO) -> None:
        log_event(self.name, stage, batch, message, level)


__all__ = ["Scheduler"]
