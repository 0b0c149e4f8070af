"""One pipeline's scheduler, after otter's SETL: a permit-bounded Select, concurrent Extract and
Transform, Load in batch order (whole batches, or per target table), and Termin, which acks in
order or rolls back.

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
from setl.model import Batch, Position
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
from setl.scheduler.events import Listener, Outcome
from setl.scheduler.ledger import Permits, Slot, SlotState
from setl.scheduler.loading import LoadDispatch
from setl.scheduler.termin import Termin
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

#: Extract and Transform of one batch run in one call when Extract took less than this.
ETL_SLICE = 0.005
#: Load and Termin go on to the next batch in the same call while they are within this (real time).
STEP_SLICE = 0.01


@attrs.define(eq=False)
class _Step:
    """A scheduler activity as a `Task`: each `call()` is one bounded slice of it."""

    step: Callable[[], Progress]
    blocking: bool = False

    def call(self) -> Progress:
        return self.step()


class Scheduler(LoadDispatch, Termin):
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
    ) -> None:
        self.name = name
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
        self._own_tasks = tasks is None
        self._own_serial = serial is None and self.per_table
        self.tasks = tasks if tasks is not None else TaskExecutionService(
            settings.parallelism + 4, settings.parallelism + 8, idle_backoff=0.002, name=f"setl-{name}")
        self.serial = serial if serial is not None or not self.per_table else SerialExecutorService(
            8, 4, name=f"setl-{name}-load")

        self._cond = threading.Condition()
        self.batch_cap = batch_cap
        self._permits = Permits(settings.parallelism, batch_cap, self._cond, self._wake_select,
                                lambda batch, live: self.listener.on_retire(batch, live))
        self._inflight: dict[int, Slot] = {}
        self._epoch = 0
        self._next_load = 1
        self._next_ack = 1
        self._load_blocked = False
        self._load_barrier: int | None = None  # per_table: parts of this batch id and later must not run
        self._load_tasks = 0  # per_table: part and EOF tasks submitted and not finished
        self._acked: Position | None = None
        self._attempt = 0
        # Where the last rollback rewound to: attempts start again only once an ack passes it
        # (pieces of a split transaction acked before its failing piece do not move the ack).
        self._retry_from: Position | None = None
        self._rewind: tuple[Position | None, int, float] | None = None
        self._rolling: tuple[int, BaseException, int] | None = None  # (failed id, error, new epoch)
        self._select_error: BaseException | None = None
        self._until: Position | None = None
        self._stopping = threading.Event()
        self._halt = False
        self._outcome: Outcome | None = None
        self._finished = threading.Event()
        self._result: Outcome | None = None
        self._handles: dict[str, TaskHandle] = {}
        self._workers: set[TaskHandle] = set()
        self._closer: TaskHandle | None = None
        self._drain_deadline: float | None = None
        self._halt_deadline: float | None = None
        # Select's own state, touched only by the Select task.
        self._cutter = BatchCutter(name, select, settings.batch, clock, self._permits.node_permit)
        self._sel_rewind: tuple[Position | None, int, float] | None = None
        self._permit_wait_since: float | None = None  # when Select found every permit taken
        self.error: BaseException | None = None
        self.acked_batches = 0
        self.acked_rows = 0

    # --- public ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop: no new batches; in-flight ones are loaded and acked."""
        self._finish(Outcome.STOPPED)

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
        start, next_id = self._starting_point()
        # Above any epoch the target already accepted: a rebuilt meta store starts again at 1.
        self._epoch = self.meta.next_epoch(self.name, at_least=(self.load.committed_epoch() or 0) + 1)
        self._acked = start
        self._next_load = self._next_ack = next_id
        self.meta.set_state(self.name, Status.RUNNING, node=self.node_id)
        self._event("select", None, f"starting at {start or 'the configured start'}, epoch {self._epoch}")
        try:
            self.select.open(start)
        except BaseException as exc:
            self._close_private()
            error = self._wrap(exc, "select", None)
            self._record_failed_start(error)
            if error is exc:  # `raise exc from exc` would replace its cause (setl.retry reads it) with itself
                raise
            raise error from exc
        if start is None:
            start = self._acked = self.select.tell()
        if until_caught_up:
            try:
                self._until = self.select.head()
                if self._until is None:
                    raise SourceError(
                        "the source cannot tell where its log ends; --until-caught-up needs it",
                        pipeline=self.name, stage="select",
                    )
            except BaseException as exc:
                self.select.close()
                self._close_private()
                self._record_failed_start(exc)
                raise
            if start is not None and start >= self._until and not self.select.backlog():
                self._event("termin", None, f"already caught up at {start}")
                self.meta.set_state(self.name, Status.STOPPED, node=self.node_id)
                self.select.close()
                self._result = Outcome.CAUGHT_UP
                self._finished.set()
                return
        self._cutter.reset(self._acked, next_id)
        # With private services every activity has a thread: Select's waits in the source's poll.
        self._cutter.blocking = self._own_tasks or bool(getattr(self.select, "blocking", False))
        steps = {
            "select": _Step(self._guard(self._select_step), blocking=self._cutter.blocking),
            "load": _Step(self._guard(self._repeat(self._load_step))),
            "termin": _Step(self._guard(self._repeat(self._termin_step))),
        }
        with self._cond:
            for role, step in steps.items():
                self._handles[role] = self.tasks.submit(step, name=f"{self.name}-{role}")
            stopped_early = self._stopping.is_set()
        if stopped_early:  # stop() came before the tasks existed: start the drain now
            self._finish(self._outcome or Outcome.STOPPED)

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Block until the pipeline has ended and been torn down; its outcome, or None on timeout."""
        if not self._finished.wait(timeout):
            return None
        self._close_private()
        return self._result

    # --- setup and guards --------------------------------------------------------------------

    def _starting_point(self) -> tuple[Position | None, int]:
        ack = self.meta.position(self.name)
        start = ack.position if ack else None
        next_id = (ack.batch_id if ack else 0) + 1
        committed = self.load.committed()
        if committed is not None and not self.meta.position_was_reset(self.name):
            if start is None or committed > start:
                self._event("load", None, f"target already holds {committed}, ahead of the ack {start}")
                start = committed
        return start, next_id

    def _guard(self, step: Callable[[], Progress]) -> Callable[[], Progress]:
        def call() -> Progress:
            try:
                return step()
            except LeadershipLost as exc:
                self.error = exc
                self._finish(Outcome.LOST)
            except BaseException as exc:  # a bug in the scheduler itself: stop, never hang
                log.exception("pipeline=%s task %s crashed", self.name, threading.current_thread().name)
                self.error = exc
                self._finish(Outcome.STOPPED)
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

    def _wake(self, *roles: str) -> None:
        for role in roles:
            handle = self._handles.get(role)
            if handle is not None:
                handle.wake()

    # --- select ------------------------------------------------------------------------------

    def _select_step(self) -> Progress:
        """One slice of Select: rewind if asked, take a permit, read, hand a batch on."""
        if self._stopping.is_set():
            self._drop_cut()
            return Progress.DONE
        with self._cond:
            rewind, self._rewind = self._rewind, None
            if rewind is not None:
                self._select_error = None
            elif self._select_error is not None and self._sel_rewind is None:
                return Progress.BLOCKED  # Termin rolls back, then wakes us
        if rewind is not None:
            self._drop_cut()
            self._sel_rewind = rewind
        if self._sel_rewind is not None:
            position, next_id, resume_at = self._sel_rewind
            if self.clock() < resume_at:
                return Progress.NO_PROGRESS
            self._sel_rewind = None
            self._cutter.reset(position, next_id)
            try:
                self.select.seek(position)
            except BaseException as exc:
                self._source_failed(exc)
                return Progress.PROGRESS
        if self._cutter.deferred_error is not None:
            error, self._cutter.deferred_error = self._cutter.deferred_error, None
            self._source_failed(error)
            return Progress.PROGRESS
        if not self._cutter.cutting:
            if not self._permits.take():
                if self._permit_wait_since is None:
                    self._permit_wait_since = time.perf_counter()
                return Progress.BLOCKED  # a retiring batch wakes us
            if self._permit_wait_since is not None:
                self.listener.on_permit_wait(time.perf_counter() - self._permit_wait_since)
                self._permit_wait_since = None
            with self._cond:
                epoch = self._epoch
            self._cutter.begin(epoch)
        try:
            batch = self._cutter.read()
        except BaseException as exc:
            self._drop_cut()
            self._source_failed(exc)
            return Progress.PROGRESS
        if isinstance(batch, Progress):
            return batch
        selected_in = self._cutter.age()
        self._cutter.drop()
        with self._cond:
            if batch.epoch != self._epoch or self._rewind is not None or self._stopping.is_set():
                self._permits.discard_cut()
                return Progress.PROGRESS
            assert batch.id not in self._inflight, f"batch {batch.id} is already in flight"
            slot = Slot(batch)
            self._inflight[batch.id] = slot
            live = self._permits.admit(slot)
        self.listener.on_handoff(batch, live)
        self.listener.on_stage("select", batch, selected_in)
        # First in the queue: finishing batches in flight comes before reading new ones.
        work = self.tasks.submit(_Step(self._guard(self._etl(slot))), name=f"{self.name}-etl-{batch.id}",
                                 first=True)
        with self._cond:
            self._workers = {h for h in self._workers if not h.done()}
            self._workers.add(work)
        self._cutter.handed_on(batch)
        return Progress.PROGRESS

    def _drop_cut(self) -> None:
        """Abandon the batch being read (a stop or a rewind) and give its permits back, or stop waiting for one."""
        self._cutter.drop()
        self._permits.abandon_cut()

    def _wake_select(self) -> None:
        self._wake("select")

    def _source_failed(self, exc: BaseException) -> None:
        if isinstance(exc, LeadershipLost):
            raise exc
        error = self._wrap(exc, "select", None)
        with self._cond:
            self._select_error = error
            self._cond.notify_all()
        self._wake("termin")

    # --- extract and transform ---------------------------------------------------------------

    def _etl(self, slot: Slot) -> Callable[[], Progress]:
        """Extract then Transform one batch, as one or two calls."""
        progress: dict[str, Batch] = {}  # the extracted batch, once Extract is done

        def step() -> Progress:
            batch = progress.get("extracted", slot.batch)
            stage = "transform" if "extracted" in progress else "extract"
            error: BaseException | None = None
            try:
                if stage == "extract":
                    began = time.perf_counter()
                    if not slot.discarded and not self._halt:
                        batch = self.extract.extract(batch)
                    took = time.perf_counter() - began
                    self.listener.on_stage("extract", batch, took)
                    progress["extracted"], stage = batch, "transform"
                    if took > ETL_SLICE:
                        return Progress.PROGRESS
                if not slot.discarded and not self._halt:
                    began = time.perf_counter()
                    batch = self.transform.transform(batch)
                    self.listener.on_stage("transform", batch, time.perf_counter() - began)
            except BaseException as exc:
                error = exc
            # per_table loads parts (other batch objects): nothing prepared would be used
            prepare = None if self.per_table else getattr(self.load, "prepare", None)
            if error is None and prepare is not None and not slot.discarded and not self._halt:
                try:  # off the ordered load's path: what the load can work out ahead
                    prepare(batch)
                except Exception:
                    log.debug("pipeline=%s batch=%d: preparing its load failed (the load works it out)",
                              self.name, batch.id, exc_info=True)
            with self._cond:
                slot.worker_done = True
                if slot.discarded:
                    self._retire(slot)
                    return Progress.DONE
                if error is not None:
                    slot.state, slot.error = SlotState.FAILED, self._wrap(error, stage, slot.batch)
                else:
                    slot.state, slot.batch = SlotState.READY, batch
                self._cond.notify_all()
            self._wake("load")
            return Progress.DONE

        return step

    def _retire(self, slot: Slot) -> None:
        """Give a batch's permits back, exactly once. Called with the lock held."""
        self._permits.retire(slot)

    def _finish(self, outcome: Outcome) -> None:
        with self._cond:
            # A pause or a lost leadership outranks a stop that was already draining.
            if self._outcome is None or outcome in (Outcome.PAUSED, Outcome.LOST):
                self._outcome = outcome
            self._stopping.set()
            self._cond.notify_all()
            start_closer = self._closer is None and bool(self._handles)
            if start_closer:
                self._drain_deadline = self.clock() + self.settings.drain_timeout_ms / 1000.0
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
            if not self._halt:
                if self._draining():
                    return Progress.NO_PROGRESS
                if self._inflight:
                    log.warning("pipeline=%s stopped with %d batches not acked; they will be replayed",
                                self.name, len(self._inflight))
        if not self._halt:
            self._halt_now()
        with self._cond:
            busy = self._load_tasks or any(not h.done() for h in [*self._handles.values(), *self._workers])
        if busy and self.clock() < (self._halt_deadline or 0.0):
            return Progress.NO_PROGRESS
        if busy:
            log.warning("pipeline=%s some tasks did not stop in time", self.name)
        self._teardown()
        return Progress.DONE

    def _draining(self) -> bool:
        """Under the lock: whether a stop should keep waiting for in-flight batches."""
        if self._outcome in (Outcome.PAUSED, Outcome.LOST) or not self._inflight:
            return False
        if self._rewind is not None or self._rolling is not None:
            return False  # a batch failed while draining: nothing after the ack survives
        return self.clock() < (self._drain_deadline or 0.0)

    def _halt_now(self) -> None:
        with self._cond:
            self._halt = True
            self._halt_deadline = self.clock() + self.settings.drain_timeout_ms / 1000.0
            self._cond.notify_all()
        self._wake("select", "load", "termin")

    def _teardown(self) -> None:
        try:
            self.select.close()
        except Exception:
            log.exception("pipeline=%s closing the source failed", self.name)
        self._permits.close()  # retire the batches it abandoned; give back Select's node permit
        outcome = self._outcome or Outcome.STOPPED
        try:
            # An operator's pause, written while we drained, must survive the stop.
            if outcome in (Outcome.STOPPED, Outcome.CAUGHT_UP) and (
                self.meta.state(self.name).status is Status.RUNNING
            ):
                self.meta.set_state(self.name, Status.STOPPED, node=self.node_id)
        except Exception as exc:
            log.error("pipeline=%s cannot record the stop: %s", self.name, exc)
        self._event("termin", None, f"finished: {outcome.value}")
        self._result = outcome
        self._finished.set()

    def _record_failed_start(self, error: BaseException) -> None:
        """A start that failed leaves the pipeline STOPPED with the error, not RUNNING with no process."""
        try:
            self.meta.set_state(self.name, Status.STOPPED, error=str(error), node=self.node_id)
        except Exception as exc:
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
            "position": batch.start if batch else self._acked,
        }
        if isinstance(exc, SetlError):
            return exc.with_context(**context)
        error = _STAGE_ERRORS[stage](f"{type(exc).__name__}: {exc}", **context)
        error.__cause__ = exc
        return error

    def _event(self, stage: str, batch: Batch | None, message: str, level: int = logging.INFO) -> None:
        where = f"pipeline={self.name} stage={stage}"
        if batch is not None:
            where += f" batch={batch.id}"
        log.log(level, "%s %s", where, message)


__all__ = ["Scheduler"]
