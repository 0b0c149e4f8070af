"""One pipeline's scheduler, after otter's SETL: a permit-bounded Select, concurrent Extract and
Transform, Load in batch order (whole batches, or per target table), and Termin, which acks in
order or rolls back.

Its work runs as tasks on a `TaskExecutionService` that many pipelines of a node share; per-table
loads run on a shared `SerialExecutorService`, one slot per (pipeline, target table).
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from collections.abc import Callable, Hashable

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
from setl.model import Ack, Batch, Change, DdlChange, Position
from setl.retry import Backoff, record_retrying
from setl.runtime import (
    BatchLatch,
    Progress,
    RejectedTask,
    SerialExecutorService,
    SerialTask,
    TaskExecutionService,
    TaskHandle,
    hash_slot,
)
from setl.stages import Extract, Load, Select, Transform

log = logging.getLogger("setl.scheduler")

_STAGE_ERRORS: dict[str, type[SetlError]] = {
    "select": SourceError,
    "extract": ExtractError,
    "transform": TransformError,
    "load": LoadError,
    "termin": MetaStoreError,
}

#: Longest one Select call reads from a source before it gives the thread back (real time).
SELECT_SLICE = 0.02
#: Longest a blocking Select waits in one poll: bounds how long a stop waits for it.
BLOCKING_POLL = 0.02
#: Extract and Transform of one batch run in one call when Extract took less than this.
ETL_SLICE = 0.005
#: Load and Termin go on to the next batch in the same call while they are within this (real time).
STEP_SLICE = 0.01


class Outcome(str, enum.Enum):
    """Why `Scheduler.run` returned."""

    CAUGHT_UP = "caught_up"  # the acked position reached the `until` position
    STOPPED = "stopped"  # stop() was called; in-flight batches were drained
    PAUSED = "paused"  # retries ran out; the pause and its error are persisted
    LOST = "lost"  # leadership was lost; nothing after the last ack was acked


class Listener:
    """Hooks a test or a metrics exporter can override; they run on scheduler threads and must not block."""

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        """Select handed `batch` on; `in_flight` batches now hold permits."""

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        """`batch` gave its permit back (acked, or discarded and its worker done)."""

    def on_termin(self, batch: Batch, ok: bool) -> None:
        """Termin took `batch`'s result, in batch-id order."""

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        """The position after `batch` was persisted."""

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        """Batch `batch_id` failed; every later batch was discarded; `epoch` is the new epoch."""


class _State(enum.Enum):
    WORKING = "working"  # in Extract/Transform
    READY = "ready"  # transformed, waiting for its turn to load
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@attrs.define(eq=False)
class _Slot:
    batch: Batch
    state: _State = _State.WORKING
    error: BaseException | None = None
    discarded: bool = False
    worker_done: bool = False
    retired: bool = False


@attrs.define(eq=False)
class _Cut:
    """The batch Select is reading; it lives across Select calls."""

    batch_id: int
    epoch: int
    start: Position | None
    end: Position | None
    cursor: Position | None
    changes: list[Change] = attrs.Factory(list)
    rows: int = 0
    size: int = 0
    deadline: float | None = None
    taken: bool = False  # a transaction was read, maybe one with no changes that only moves the position


class _Discarded(Exception):
    """A per-table part that was not run: its batch failed or was discarded before it started."""


@attrs.define(eq=False)
class _Step:
    """A scheduler activity as a `Task`: each `call()` is one bounded slice of it."""

    step: Callable[[], Progress]
    blocking: bool = False

    def call(self) -> Progress:
        return self.step()


class BatchCap:
    """A node-wide cap on batches in flight, shared by the schedulers of a node's pipelines.

    Contract: at most `limit` permits are out at any time. `try_acquire` never blocks: when
    no permit is free it queues the caller (once, however often it asks) and returns False;
    `release` then hands the permit straight to the first caller in the queue and calls the
    `wake` it gave, so waiters are served in FIFO order and a newcomer never overtakes one.
    A granted permit is the waiter's until it takes it with `try_acquire`, or `cancel`s.
    `wake` is called without this object's lock held and must not block.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a batch cap must be at least 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._free = limit
        self._waiting: collections.OrderedDict[Hashable, Callable[[], None]] = collections.OrderedDict()
        self._granted: set[Hashable] = set()

    @property
    def available(self) -> int:
        """Permits neither held nor granted to a waiter."""
        with self._lock:
            return self._free

    def try_acquire(self, waiter: Hashable, wake: Callable[[], None]) -> bool:
        """Take a permit for `waiter`, or queue it to be woken with `wake` when one is handed to it."""
        with self._lock:
            if waiter in self._granted:
                self._granted.discard(waiter)
                return True
            if self._free:  # none is free while anyone waits: release hands it over
                self._free -= 1
                return True
            self._waiting.setdefault(waiter, wake)
            return False

    def release(self) -> None:
        """Give a permit back: to the first waiter if there is one."""
        with self._lock:
            if not self._waiting:
                if self._free >= self.limit:
                    raise RuntimeError("a batch cap permit was released more often than taken")
                self._free += 1
                return
            waiter, wake = self._waiting.popitem(last=False)
            self._granted.add(waiter)
        wake()

    def cancel(self, waiter: Hashable) -> None:
        """`waiter` no longer wants a permit: leave the queue, and pass on one granted and not taken."""
        with self._lock:
            self._waiting.pop(waiter, None)
            if waiter not in self._granted:
                return
            self._granted.discard(waiter)
        self.release()


def supports_per_table(load: Load) -> bool:
    """Whether `load` implements `load_part`, which `load.mode: per_table` needs."""
    return type(load).load_part is not Load.load_part


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
        self._permits = threading.Semaphore(settings.parallelism)
        self.batch_cap = batch_cap
        self._holding: set[_Slot] = set()  # batches not retired yet: each holds a permit (and a node permit)
        self._cap_cut = False  # Select's cut holds a node permit
        self._cap_closed = False  # the pipeline ended and gave its node permits back
        self._inflight: dict[int, _Slot] = {}
        self._live = 0
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
        self._deferred_error: BaseException | None = None
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
        self._sel_next_id = 1
        self._sel_cursor: Position | None = None
        self._sel_end: Position | None = None
        self._sel_pending: list = []
        self._sel_rewind: tuple[Position | None, int, float] | None = None
        self._sel_cut: _Cut | None = None
        self._sel_permit = False
        self._blocking_select = False
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
            return self._live

    def run(self, *, until_caught_up: bool = False) -> Outcome:
        """Run until stopped, caught up (if asked), paused or deposed. Blocks."""
        self.start(until_caught_up=until_caught_up)
        return self.wait()

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
            if start is not None and start >= self._until:
                self._event("termin", None, f"already caught up at {start}")
                self.meta.set_state(self.name, Status.STOPPED, node=self.node_id)
                self.select.close()
                self._result = Outcome.CAUGHT_UP
                self._finished.set()
                return
        self._sel_next_id = next_id
        self._sel_cursor = self._sel_end = self._acked
        # With private services every activity has a thread: Select's waits in the source's poll.
        self._blocking_select = self._own_tasks or bool(getattr(self.select, "blocking", False))
        steps = {
            "select": _Step(self._guard(self._select_step), blocking=self._blocking_select),
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
            self._sel_next_id = next_id
            self._sel_cursor = self._sel_end = position
            self._sel_pending.clear()
            self._deferred_error = None
            try:
                self.select.seek(position)
            except BaseException as exc:
                self._source_failed(exc)
                return Progress.PROGRESS
        if self._deferred_error is not None:
            error, self._deferred_error = self._deferred_error, None
            self._source_failed(error)
            return Progress.PROGRESS
        if not self._sel_permit:
            if not self._permits.acquire(blocking=False):
                return Progress.BLOCKED  # a retiring batch wakes us
            self._sel_permit = True
            with self._cond:
                epoch = self._epoch
            self._sel_cut = _Cut(self._sel_next_id, epoch, self._sel_end, self._sel_end, self._sel_cursor)
        try:
            batch = self._read()
        except BaseException as exc:
            self._drop_cut()
            self._source_failed(exc)
            return Progress.PROGRESS
        if isinstance(batch, Progress):
            return batch
        self._sel_cut, self._sel_permit = None, False
        with self._cond:
            cap_cut, self._cap_cut = self._cap_cut, False
            if batch.epoch != self._epoch or self._rewind is not None or self._stopping.is_set():
                self._permits.release()
                if cap_cut:
                    self._release_node_permit()
                return Progress.PROGRESS
            assert batch.id not in self._inflight, f"batch {batch.id} is already in flight"
            slot = _Slot(batch)
            self._inflight[batch.id] = slot
            self._holding.add(slot)
            self._live += 1
            live = self._live
        self.listener.on_handoff(batch, live)
        # First in the queue: finishing batches in flight comes before reading new ones.
        work = self.tasks.submit(_Step(self._guard(self._etl(slot))), name=f"{self.name}-etl-{batch.id}",
                                 first=True)
        with self._cond:
            self._workers = {h for h in self._workers if not h.done()}
            self._workers.add(work)
        self._sel_next_id += 1
        self._sel_end = batch.end
        self._sel_cursor = batch.cursor or batch.end
        return Progress.PROGRESS

    def _drop_cut(self) -> None:
        """Abandon the batch being read (a stop or a rewind) and give its permits back, or stop waiting for one."""
        self._sel_cut = None
        if self._sel_permit:
            self._sel_permit = False
            self._permits.release()
        if self.batch_cap is not None:
            with self._cond:
                if self._cap_cut:
                    self._cap_cut = False
                    self._release_node_permit()
                else:
                    self.batch_cap.cancel(self)

    def _take_node_permit(self) -> bool:
        """Whether Select now holds a node permit for its next cut (always, without a cap).

        Without one, Select is queued on the cap, which wakes it when it hands it one.
        """
        if self.batch_cap is None:
            return True
        with self._cond:
            if self._cap_closed or not self.batch_cap.try_acquire(self, self._wake_select):
                return False
            self._cap_cut = True
            return True

    def _release_node_permit(self) -> None:
        """Under the lock: give one node permit back, unless the ended pipeline already gave them all back."""
        if self.batch_cap is not None and not self._cap_closed:
            self.batch_cap.release()

    def _wake_select(self) -> None:
        self._wake("select")

    def _read(self) -> Batch | Progress:
        """Read whole transactions into the current cut: the batch if it is complete, else how the call went.

        The cut takes a node permit with its first transaction (BLOCKED until the cap hands
        one over, the transaction kept for then): an idle pipeline's empty cut holds none.
        """
        cut = self._sel_cut
        assert cut is not None
        limits = self.settings.batch
        pending = self._sel_pending
        blocking = self._blocking_select
        slice_end = time.perf_counter() + SELECT_SLICE
        progressed = False
        while True:
            if pending:
                tx = pending.pop()
            else:
                now = self.clock()
                if cut.deadline is not None and now >= cut.deadline and cut.taken and cut.end == cut.cursor:
                    break
                if time.perf_counter() >= slice_end:
                    return Progress.PROGRESS if progressed else Progress.NO_PROGRESS
                timeout = 0.0
                if blocking:
                    timeout = BLOCKING_POLL if cut.deadline is None else min(
                        BLOCKING_POLL, max(0.0, cut.deadline - now))
                try:
                    tx = self.select.poll(timeout)
                except BaseException as exc:
                    if not (cut.taken and cut.end == cut.cursor):
                        raise
                    # Hand on the whole transactions read so far; report the error next.
                    self._deferred_error = exc
                    break
                if tx is None:
                    return Progress.PROGRESS if progressed else Progress.NO_PROGRESS
            if not cut.taken and not self._cap_cut and not self._take_node_permit():
                pending.append(tx)
                return Progress.BLOCKED  # the node cap hands us a permit, in turn, and wakes us
            progressed = True
            if tx.is_ddl and cut.changes:
                pending.append(tx)
                break
            cut.taken = True
            cut.changes.extend(tx.changes)
            cut.rows += len(tx.changes)
            cut.size += tx.nbytes
            cut.cursor = tx.end
            if tx.complete:
                cut.end = tx.end
            if cut.deadline is None:
                cut.deadline = self.clock() + limits.max_wait_ms / 1000.0
            if tx.is_ddl:
                break
            if cut.rows >= limits.max_rows or cut.size >= limits.max_bytes:
                break
            if tx.complete and self.clock() >= cut.deadline:
                break
        assert cut.end is not None and cut.cursor is not None
        return Batch(
            pipeline=self.name,
            id=cut.batch_id,
            epoch=cut.epoch,
            start=cut.start if cut.start is not None else cut.end,
            end=cut.end,
            changes=tuple(cut.changes),
            cursor=cut.cursor if cut.cursor != cut.end else None,
        )

    def _source_failed(self, exc: BaseException) -> None:
        if isinstance(exc, LeadershipLost):
            raise exc
        error = self._wrap(exc, "select", None)
        with self._cond:
            self._select_error = error
            self._cond.notify_all()
        self._wake("termin")

    # --- extract and transform ---------------------------------------------------------------

    def _etl(self, slot: _Slot) -> Callable[[], Progress]:
        """Extract then Transform one batch, as one or two calls."""
        progress = {"stage": "extract", "batch": slot.batch}

        def step() -> Progress:
            stage, batch, error = progress["stage"], progress["batch"], None
            try:
                if stage == "extract":
                    began = time.perf_counter()
                    if not slot.discarded and not self._halt:
                        batch = self.extract.extract(batch)
                    progress["stage"], progress["batch"], stage = "transform", batch, "transform"
                    if time.perf_counter() - began > ETL_SLICE:
                        return Progress.PROGRESS
                if not slot.discarded and not self._halt:
                    batch = self.transform.transform(batch)
            except BaseException as exc:
                error = exc
            with self._cond:
                slot.worker_done = True
                if slot.discarded:
                    self._retire(slot)
                    return Progress.DONE
                if error is not None:
                    slot.state, slot.error = _State.FAILED, self._wrap(error, stage, slot.batch)
                else:
                    slot.state, slot.batch = _State.READY, batch
                self._cond.notify_all()
            self._wake("load")
            return Progress.DONE

        return step

    # --- load --------------------------------------------------------------------------------

    def _load_step(self) -> Progress:
        """Load the next batch in id order: in this call (ordered), or hand its parts to the slots (per_table)."""
        with self._cond:
            if self._halt:
                return Progress.DONE
            slot = self._inflight.get(self._next_load)
            if slot is None or self._load_blocked or slot.state not in (_State.READY, _State.FAILED):
                return Progress.BLOCKED
            if slot.state is _State.FAILED:
                self._load_blocked = True
                self._cond.notify_all()
                self._wake("termin")
                return Progress.PROGRESS
            has_ddl = any(isinstance(c, DdlChange) for c in slot.batch.changes)
            if self.per_table and not has_ddl:
                slot.state = _State.LOADING
                self._next_load += 1
                self._dispatch_parts(slot)
                return Progress.PROGRESS
            if self.per_table and self._load_tasks:
                return Progress.BLOCKED  # a DDL batch waits for every earlier part
            slot.state = _State.LOADING
        error = None
        try:
            self.load.load(slot.batch)
        except LeadershipLost:
            raise
        except BaseException as exc:
            error = self._wrap(exc, "load", slot.batch)
        with self._cond:
            if error is not None:
                slot.state, slot.error = _State.FAILED, error
                self._load_blocked = True
            else:
                slot.state = _State.LOADED
                self._next_load += 1
            if slot.discarded:
                self._retire(slot)
            self._cond.notify_all()
        self._wake("termin")
        return Progress.PROGRESS

    def _dispatch_parts(self, slot: _Slot) -> None:
        """Under the lock: submit each target table's part, then its EOF, to the table's slot."""
        batch = slot.batch
        parts: dict[str, list[Change]] = {}
        for change in batch.changes:
            parts.setdefault(change.qualified_table, []).append(change)
        if not parts:
            slot.state = _State.LOADED
            self._cond.notify_all()
            self._wake("termin")
            return
        latch = BatchLatch(parts)
        assert self.serial is not None
        for table, changes in parts.items():
            index = hash_slot((self.name, table), self.serial.num_slots)
            part = batch.replace(tuple(changes))
            self._load_tasks += 2
            self.serial.submit(self._run_part, slot, part, slot=index,
                               callback=self._part_done(slot, latch, table, eof=False))
            self.serial.submit(self._run_eof, slot, part, slot=index,
                               callback=self._part_done(slot, latch, table, eof=True))

    def _runnable(self, slot: _Slot, part: Batch) -> bool:
        """Under the lock: whether a part may still be written (its batch not failed nor discarded)."""
        if self._halt or slot.discarded or part.epoch != self._epoch:
            return False
        return self._load_barrier is None or part.id < self._load_barrier

    def _run_part(self, slot: _Slot, part: Batch) -> None:
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

    def _run_eof(self, slot: _Slot, part: Batch) -> None:
        with self._cond:
            if not self._runnable(slot, part):
                raise _Discarded()

    def _part_done(self, slot: _Slot, latch: BatchLatch, table: str, *, eof: bool) -> Callable[[SerialTask], None]:
        def callback(handle: SerialTask) -> None:
            error = None if handle.cancelled() else handle.exception()
            if error is None:
                if eof:
                    latch.count_down(table)
            else:
                latch.fail(table, error)
            with self._cond:
                self._load_tasks -= 1
                if slot.state is _State.LOADING and latch.is_open:
                    if latch.error is None:
                        slot.state = _State.LOADED
                    else:
                        failure = latch.error
                        if isinstance(failure, _Discarded):
                            failure = LoadError("discarded: an earlier part of this batch or an earlier batch failed")
                        slot.state = _State.FAILED
                        slot.error = self._wrap(failure, "load", slot.batch)
                        if isinstance(slot.error, SetlError):
                            slot.error.with_context(table=latch.failed_channel)
                self._cond.notify_all()
            self._wake("termin", "load")

        return callback

    # --- termin ------------------------------------------------------------------------------

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
                if slot is None or slot.state not in (_State.LOADED, _State.FAILED):
                    return Progress.BLOCKED
                error = slot.error
        if self._rolling is not None:
            return self._continue_rollback()
        if slot is None:
            return self._begin_rollback(self._next_ack, error)
        batch = slot.batch
        self.listener.on_termin(batch, slot.state is _State.LOADED)
        if slot.state is _State.FAILED:
            return self._begin_rollback(batch.id, error)
        try:
            if self.per_table:
                self.load.mark_loaded(batch)
        except LeadershipLost:
            raise
        except BaseException as exc:
            return self._begin_rollback(batch.id, self._wrap(exc, "load", batch))
        try:
            ack = self.meta.ack(self.name, batch.id, batch.epoch, batch.end, rows=len(batch))
        except LeadershipLost:
            raise
        except BaseException as exc:
            return self._begin_rollback(batch.id, self._wrap(exc, "termin", batch))
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
        if log.isEnabledFor(logging.DEBUG):
            self._event("termin", batch, f"acked {len(batch)} changes up to {batch.end}", logging.DEBUG)
        if self._until is not None and batch.end >= self._until:
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
            if self._load_tasks or any(s.state is _State.LOADING for s in self._inflight.values()):
                return Progress.BLOCKED
            failed_id, error, epoch = self._rolling
            self._rolling = None
            for batch_id in [b for b in self._inflight if b >= failed_id]:
                slot = self._inflight.pop(batch_id)
                slot.discarded = True
                if slot.worker_done:
                    self._retire(slot)
            self._epoch = epoch
            self._next_load = self._next_ack = failed_id
            self._load_blocked = False
            self._load_barrier = None
            self._attempt += 1
            attempt = self._attempt
            delay = self.backoff.delay(attempt)
            # Set in the same critical section as the new epoch: otherwise Select could
            # hand on a batch cut from its old cursor under the new epoch.
            self._rewind = (self._acked, failed_id, self.clock() + delay)
            self._retry_from = self._acked
            self._cond.notify_all()
        self._wake("select", "load")
        self.listener.on_rollback(failed_id, epoch, error, attempt)
        verdict = self.backoff.decide(error, attempt)  # setl/retry.py: transient, permanent or other
        if verdict.pause:
            self.error = error
            log.error("pipeline=%s stage=termin batch=%d %s", self.name, failed_id, verdict.message)
            self.meta.set_state(self.name, Status.PAUSED, error=str(error), node=self.node_id)
            self._finish(Outcome.PAUSED)
            return Progress.PROGRESS
        record_retrying(self.meta, self.name, error, verdict.since, self.node_id)
        log.warning("pipeline=%s stage=termin batch=%d rolled back (%s, retry in %.1fs): %s",
                    self.name, failed_id, verdict.message, delay, error)
        return Progress.PROGRESS

    def _retire(self, slot: _Slot) -> None:
        """Give a batch's permit back, exactly once. Called with the lock held."""
        if slot.retired:
            return
        slot.retired = True
        self._holding.discard(slot)
        self._live -= 1
        self._permits.release()
        self.listener.on_retire(slot.batch, self._live)
        # After the listener: a listener counting batches across pipelines never sees the cap exceeded.
        self._release_node_permit()
        self._wake("select")

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
        self._give_back_permits()
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

    def _give_back_permits(self) -> None:
        """The pipeline is over: retire the batches it abandoned, and give back Select's node permit."""
        with self._cond:
            for slot in list(self._holding):
                self._retire(slot)
            if self.batch_cap is not None:
                if self._cap_cut:
                    self._cap_cut = False
                    self.batch_cap.release()
                self.batch_cap.cancel(self)
                self._cap_closed = True

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
