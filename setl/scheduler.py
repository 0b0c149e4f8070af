"""One pipeline's scheduler, after otter's SETL: a permit-bounded Select loop, concurrent
Extract and Transform, Load in batch order, and a Termin thread that acks in order or rolls back.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import attrs

from setl.config import PipelineSettings
from setl.errors import (
    ExtractError,
    LeadershipLost,
    LoadError,
    MetaStoreError,
    SetlError,
    SourceError,
    TransformError,
)
from setl.meta.base import MetaStore, Status
from setl.model import Ack, Batch, Change, Position
from setl.retry import Backoff
from setl.stages import Extract, Load, Select, Transform

log = logging.getLogger("setl.scheduler")

_STAGE_ERRORS: dict[str, type[SetlError]] = {
    "select": SourceError,
    "extract": ExtractError,
    "transform": TransformError,
    "load": LoadError,
    "termin": MetaStoreError,
}


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


class Scheduler:
    """Runs one pipeline until it is stopped, catches up, pauses, or loses leadership.

    Threads: one Select thread (the only one touching the source), a pool of
    `parallelism` Extract/Transform workers, one Load thread (batch-id order),
    and one Termin thread (acks in batch-id order, or rolls back). A permit is
    taken before Select cuts a batch and given back only when the batch is
    acked, or discarded and its worker has finished, so at most `parallelism`
    batches exist between Select and Termin at any time.
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

        self._cond = threading.Condition()
        self._permits = threading.Semaphore(settings.parallelism)
        self._inflight: dict[int, _Slot] = {}
        self._live = 0
        self._epoch = 0
        self._next_load = 1
        self._next_ack = 1
        self._load_blocked = False
        self._acked: Position | None = None
        self._attempt = 0
        self._rewind: tuple[Position | None, int, float] | None = None
        self._select_error: BaseException | None = None
        self._deferred_error: BaseException | None = None
        self._until: Position | None = None
        self._stopping = threading.Event()
        self._halt = False
        self._outcome: Outcome | None = None
        self._done = threading.Event()
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
        start, next_id = self._starting_point()
        self._epoch = self.meta.next_epoch(self.name)
        self._acked = start
        self._next_load = self._next_ack = next_id
        self.meta.set_state(self.name, Status.RUNNING, node=self.node_id)
        self._event("select", None, f"starting at {start or 'the configured start'}, epoch {self._epoch}")
        try:
            self.select.open(start)
        except BaseException as exc:
            raise self._wrap(exc, "select", None) from exc
        if start is None:
            start = self._acked = self.select.tell()
        if until_caught_up:
            self._until = self.select.head()
            if self._until is None:
                raise SourceError(
                    "the source cannot tell where its log ends; --until-caught-up needs it",
                    pipeline=self.name, stage="select",
                )
            if start is not None and start >= self._until:
                self._event("termin", None, f"already caught up at {start}")
                self.meta.set_state(self.name, Status.STOPPED, node=self.node_id)
                return Outcome.CAUGHT_UP

        pool = ThreadPoolExecutor(self.settings.parallelism, thread_name_prefix=f"setl-{self.name}-etl")
        threads = [
            threading.Thread(target=self._guard(self._select_loop, pool), name=f"setl-{self.name}-select"),
            threading.Thread(target=self._guard(self._load_loop), name=f"setl-{self.name}-load"),
            threading.Thread(target=self._guard(self._termin_loop), name=f"setl-{self.name}-termin"),
        ]
        for thread in threads:
            thread.start()
        try:
            self._done.wait()
            self._drain()
        finally:
            with self._cond:
                self._halt = True
                self._cond.notify_all()
            for thread in threads:
                thread.join(timeout=self.settings.drain_timeout_ms / 1000.0)
                if thread.is_alive():
                    log.warning("pipeline=%s thread %s did not stop in time", self.name, thread.name)
            pool.shutdown(wait=False, cancel_futures=True)
            self.select.close()
        outcome = self._outcome or Outcome.STOPPED
        # An operator's pause, written while we drained, must survive the stop.
        if outcome in (Outcome.STOPPED, Outcome.CAUGHT_UP) and (
            self.meta.state(self.name).status is Status.RUNNING
        ):
            self.meta.set_state(self.name, Status.STOPPED, node=self.node_id)
        self._event("termin", None, f"finished: {outcome.value}")
        return outcome

    # --- threads -----------------------------------------------------------------------------

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

    def _guard(self, loop: Callable[..., None], *args: object) -> Callable[[], None]:
        def run() -> None:
            try:
                loop(*args)
            except LeadershipLost as exc:
                self.error = exc
                self._finish(Outcome.LOST)
            except BaseException as exc:  # a bug in the scheduler itself: stop, never hang
                log.exception("pipeline=%s thread %s crashed", self.name, threading.current_thread().name)
                self.error = exc
                self._finish(Outcome.STOPPED)

        return run

    def _select_loop(self, pool: ThreadPoolExecutor) -> None:
        next_id = self._next_ack
        cursor = self._acked
        end = self._acked
        pending: list = []
        while not self._stopping.is_set():
            with self._cond:
                rewind, self._rewind = self._rewind, None
                if rewind is not None:
                    self._select_error = None
                elif self._select_error is not None:
                    self._cond.wait(0.1)
                    continue
            if rewind is not None:
                position, next_id, resume_at = rewind
                while not self._stopping.is_set() and self.clock() < resume_at:
                    self._stopping.wait(min(0.1, max(0.0, resume_at - self.clock())))
                if self._stopping.is_set():
                    break
                cursor = end = position
                pending.clear()
                self._deferred_error = None
                try:
                    self.select.seek(position)
                except BaseException as exc:
                    self._source_failed(exc)
                    continue
            if self._deferred_error is not None:
                error, self._deferred_error = self._deferred_error, None
                self._source_failed(error)
                continue
            if not self._permits.acquire(timeout=0.1):
                continue
            with self._cond:
                epoch = self._epoch
            try:
                batch = self._cut(next_id, epoch, end, cursor, pending)
            except BaseException as exc:
                self._permits.release()
                self._source_failed(exc)
                continue
            if batch is None:
                self._permits.release()
                continue
            with self._cond:
                if epoch != self._epoch or self._rewind is not None or self._stopping.is_set():
                    self._permits.release()
                    continue
                assert batch.id not in self._inflight, f"batch {batch.id} is already in flight"
                slot = _Slot(batch)
                self._inflight[batch.id] = slot
                self._live += 1
                live = self._live
            self.listener.on_handoff(batch, live)
            pool.submit(self._work, slot)
            next_id += 1
            end = batch.end
            cursor = batch.cursor or batch.end

    def _cut(
        self, batch_id: int, epoch: int, end: Position | None, cursor: Position | None, pending: list
    ) -> Batch | None:
        """Read whole transactions into one batch; None if nothing arrived before a stop check."""
        limits = self.settings.batch
        changes: list[Change] = []
        start = end
        rows = size = 0
        taken = False  # a transaction was read, maybe one with no changes that only moves the position
        deadline: float | None = None
        while True:
            if pending:
                tx = pending.pop()
            else:
                if self._stopping.is_set() or self._rewind is not None:
                    return None
                now = self.clock()
                if deadline is not None and now >= deadline and taken and end == cursor:
                    break
                timeout = 0.1 if deadline is None else min(0.1, max(0.0, deadline - now))
                try:
                    tx = self.select.poll(timeout)
                except BaseException as exc:
                    if not (taken and end == cursor):
                        raise
                    # Hand on the whole transactions read so far; report the error next.
                    self._deferred_error = exc
                    break
                if tx is None:
                    if not taken:
                        return None
                    continue
            if tx.is_ddl and changes:
                pending.append(tx)
                break
            taken = True
            changes.extend(tx.changes)
            rows += len(tx.changes)
            size += tx.nbytes
            cursor = tx.end
            if tx.complete:
                end = tx.end
            if deadline is None:
                deadline = self.clock() + limits.max_wait_ms / 1000.0
            if tx.is_ddl:
                break
            if rows >= limits.max_rows or size >= limits.max_bytes:
                break
            if tx.complete and self.clock() >= deadline:
                break
        assert end is not None and cursor is not None
        return Batch(
            pipeline=self.name,
            id=batch_id,
            epoch=epoch,
            start=start if start is not None else end,
            end=end,
            changes=tuple(changes),
            cursor=cursor if cursor != end else None,
        )

    def _source_failed(self, exc: BaseException) -> None:
        if isinstance(exc, LeadershipLost):
            raise exc
        error = self._wrap(exc, "select", None)
        with self._cond:
            self._select_error = error
            self._cond.notify_all()

    def _work(self, slot: _Slot) -> None:
        batch, stage, error = slot.batch, "extract", None
        try:
            if not slot.discarded:
                batch = self.extract.extract(batch)
            stage = "transform"
            if not slot.discarded:
                batch = self.transform.transform(batch)
        except BaseException as exc:
            error = exc
        with self._cond:
            slot.worker_done = True
            if slot.discarded:
                self._retire(slot)
                return
            if error is not None:
                slot.state, slot.error = _State.FAILED, self._wrap(error, stage, slot.batch)
            else:
                slot.state, slot.batch = _State.READY, batch
            self._cond.notify_all()

    def _load_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._halt:
                        return
                    slot = self._inflight.get(self._next_load)
                    if slot is not None and not self._load_blocked and slot.state in (
                        _State.READY,
                        _State.FAILED,
                    ):
                        break
                    self._cond.wait(0.5)
                if slot.state is _State.FAILED:
                    self._load_blocked = True
                    self._cond.notify_all()
                    continue
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

    def _termin_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._halt:
                        return
                    # A source failure leaves the batches handed on before it intact:
                    # let them be acked first, then rewind from the newest ack.
                    if self._select_error is not None and self._rewind is None and not self._inflight:
                        slot, error = None, self._select_error
                        break
                    slot = self._inflight.get(self._next_ack)
                    if slot is not None and slot.state in (_State.LOADED, _State.FAILED):
                        error = slot.error
                        break
                    self._cond.wait(0.5)
            if slot is None:
                self._rollback(self._next_ack, error)
                continue
            batch = slot.batch
            self.listener.on_termin(batch, slot.state is _State.LOADED)
            if slot.state is _State.FAILED:
                self._rollback(batch.id, error)
                continue
            try:
                ack = self.meta.ack(self.name, batch.id, batch.epoch, batch.end, rows=len(batch))
            except LeadershipLost:
                raise
            except BaseException as exc:
                self._rollback(batch.id, self._wrap(exc, "termin", batch))
                continue
            with self._cond:
                del self._inflight[batch.id]
                self._next_ack += 1
                self._acked = batch.end
                self._attempt = 0
                self._retire(slot)
                self._cond.notify_all()
            self.acked_batches += 1
            self.acked_rows += len(batch)
            self.listener.on_ack(ack, batch)
            if log.isEnabledFor(logging.DEBUG):
                self._event("termin", batch, f"acked {len(batch)} changes up to {batch.end}", logging.DEBUG)
            if self._until is not None and batch.end >= self._until:
                self._finish(Outcome.CAUGHT_UP)

    # --- rollback, retire, finish ------------------------------------------------------------

    def _rollback(self, failed_id: int, error: BaseException | None) -> None:
        """Discard batch `failed_id` and every later one, then rewind Select to the ack."""
        assert error is not None
        if isinstance(error, LeadershipLost):
            raise error
        epoch = self.meta.next_epoch(self.name)
        with self._cond:
            # A batch still being loaded must finish first, or its late write could
            # land after the replay of an earlier batch touching the same keys.
            while any(s.state is _State.LOADING for s in self._inflight.values()):
                self._cond.wait(0.5)
            for batch_id in [b for b in self._inflight if b >= failed_id]:
                slot = self._inflight.pop(batch_id)
                slot.discarded = True
                if slot.worker_done:
                    self._retire(slot)
            self._epoch = epoch
            self._next_load = self._next_ack = failed_id
            self._load_blocked = False
            self._attempt += 1
            attempt = self._attempt
            delay = self.backoff.delay(attempt)
            # Set in the same critical section as the new epoch: otherwise Select could
            # hand on a batch cut from its old cursor under the new epoch.
            self._rewind = (self._acked, failed_id, self.clock() + delay)
            self._cond.notify_all()
        self.listener.on_rollback(failed_id, epoch, error, attempt)
        if attempt >= self.backoff.max_attempts:
            self.error = error
            message = f"paused after {attempt} failed attempts: {error}"
            log.error("pipeline=%s stage=termin batch=%d %s", self.name, failed_id, message)
            self.meta.set_state(self.name, Status.PAUSED, error=str(error), node=self.node_id)
            self._finish(Outcome.PAUSED)
            return
        log.warning(
            "pipeline=%s stage=termin batch=%d rolled back (attempt %d of %d, retry in %.1fs): %s",
            self.name, failed_id, attempt, self.backoff.max_attempts, delay, error,
        )

    def _retire(self, slot: _Slot) -> None:
        """Give a batch's permit back, exactly once. Called with the lock held."""
        if slot.retired:
            return
        slot.retired = True
        self._live -= 1
        self._permits.release()
        self.listener.on_retire(slot.batch, self._live)

    def _finish(self, outcome: Outcome) -> None:
        with self._cond:
            # A pause or a lost leadership outranks a stop that was already draining.
            if self._outcome is None or outcome in (Outcome.PAUSED, Outcome.LOST):
                self._outcome = outcome
            self._stopping.set()
            self._cond.notify_all()
        self._done.set()

    def _drain(self) -> None:
        """Let in-flight batches be acked (or fail) after a stop, within the drain timeout."""
        if self._outcome in (Outcome.PAUSED, Outcome.LOST):
            return
        deadline = self.clock() + self.settings.drain_timeout_ms / 1000.0
        with self._cond:
            while self._inflight and self.clock() < deadline and self._outcome is not Outcome.PAUSED:
                if self._rewind is not None:
                    break  # a batch failed while draining: nothing after the ack survives
                self._cond.wait(0.1)
            if self._inflight:
                log.warning(
                    "pipeline=%s stopped with %d batches not acked; they will be replayed",
                    self.name, len(self._inflight),
                )

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
