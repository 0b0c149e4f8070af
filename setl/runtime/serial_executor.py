"""A bounded thread pool whose tasks can be pinned to slots that run one at a time, in order.

Load uses it for per-table parallelism: one slot per target table, so a table's writes keep
their order while different tables share a few threads (the Doris SyncJob design).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

import attrs

from setl.errors import SetlError

log = logging.getLogger(__name__)

__all__ = [
    "BatchLatch",
    "RejectedTask",
    "SerialExecutorService",
    "SerialTask",
    "hash_slot",
]


class RejectedTask(SetlError, RuntimeError):
    """A task was submitted to an executor that has been shut down."""


def hash_slot(key: Hashable, num_slots: int) -> int:
    """Map `key` to a slot in ``range(num_slots)``, the same in every process and run.

    Python's ``hash()`` of a str is salted per process, so CRC-32 of the key's text is used.
    `key` is a str, bytes, or anything whose ``str()`` is stable (an int, a tuple of those).
    """
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    if isinstance(key, bytes):
        data = key
    else:
        data = (key if isinstance(key, str) else repr(key)).encode("utf-8")
    return zlib.crc32(data) % num_slots


class SerialTask(concurrent.futures.Future):
    """The handle `SerialExecutorService.submit` returns: a `concurrent.futures.Future`.

    It also carries what was submitted (`fn`, `args`, `slot`) and `seq`, the order in which
    the executor accepted it, so a task returned by `shutdown_now` can be resubmitted.
    `cancel()` succeeds only while the task is still queued.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        slot: int | None,
        callback: Callable[["SerialTask"], object] | None,
        seq: int,
    ) -> None:
        super().__init__()
        self.fn = fn
        self.args = args
        self.slot = slot
        self.seq = seq
        self._callback = callback

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"<SerialTask #{self.seq} {name} slot={self.slot} {self._state}>"


class _Slot:
    __slots__ = ("pending", "scheduled")

    def __init__(self) -> None:
        self.pending: collections.deque[SerialTask] = collections.deque()
        # True while the slot is in the ready queue or one of its tasks is running: this
        # flag is what keeps a slot on at most one worker at a time.
        self.scheduled = False


@attrs.define(eq=False)
class SerialExecutorService:
    """Runs tasks on at most `max_workers` threads; tasks given the same slot run serially.

    Contract:
    - Tasks submitted with the same `slot` run one at a time, in the order the executor
      accepted them (`handle.seq`), even when several threads submit concurrently. Which worker thread runs a
      slot's task is not fixed: a slot's queue is drained by whichever worker is free, one
      task per turn, so busy slots take turns fairly.
    - Tasks without a slot run as soon as a worker is free; no order among them is promised.
    - Worker threads are started lazily, never more than `max_workers`, and live until
      shutdown. Nothing bounds the queues: `submit` never blocks.
    - A task that raises sets the exception on its handle and calls its callback; the slot
      goes on with its next task. The callback runs on the worker after the handle is
      resolved and before the slot's next task; its exceptions are logged and swallowed.
    - A task cancelled before it starts (`handle.cancel()` or `shutdown_now`) never runs and
      its callback is not called; done-callbacks added to the handle are.
    - A running task is never interrupted, not even by `shutdown_now`.
    """

    num_slots: int = attrs.field(validator=attrs.validators.ge(1))
    max_workers: int | None = attrs.field(default=None)  # None: one per slot
    name: str = attrs.field(default="setl-serial", kw_only=True)

    _cond: threading.Condition = attrs.field(init=False, repr=False, factory=threading.Condition)
    _slots: list[_Slot] = attrs.field(init=False, repr=False, factory=list)
    # Items are a SerialTask (free task) or an int (a slot with a pending task).
    _ready: collections.deque[SerialTask | int] = attrs.field(init=False, repr=False, factory=collections.deque)
    _workers: list[threading.Thread] = attrs.field(init=False, repr=False, factory=list)
    _idle: int = attrs.field(init=False, repr=False, default=0)
    _outstanding: int = attrs.field(init=False, repr=False, default=0)  # accepted, not finished nor dropped
    _shutdown: bool = attrs.field(init=False, repr=False, default=False)
    _seq: Iterator[int] = attrs.field(init=False, repr=False, factory=itertools.count)
    _worker_ids: Iterator[int] = attrs.field(init=False, repr=False, factory=lambda: itertools.count(1))
    _key_slots: dict[Hashable, int] = attrs.field(init=False, repr=False, factory=dict)
    _next_slot: int = attrs.field(init=False, repr=False, default=0)
    _worker_limit: int = attrs.field(init=False, repr=False, default=0)  # max_workers resolved

    def __attrs_post_init__(self) -> None:
        if self.max_workers is None:
            self.max_workers = self.num_slots
        if self.max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {self.max_workers}")
        self._worker_limit = self.max_workers
        self._slots = [_Slot() for _ in range(self.num_slots)]

    # -- slot assignment --------------------------------------------------------------------

    def slot_for(self, key: Hashable) -> int:
        """The slot for `key`: new keys get slots round-robin, a known key keeps its slot.

        With no more keys than slots every key gets a slot of its own, which a stable hash
        does not promise. The assignment lives in this executor only; use `hash_slot` when
        another process must agree on it.
        """
        with self._cond:
            slot = self._key_slots.get(key)
            if slot is None:
                slot = self._key_slots[key] = self._next_slot
                self._next_slot = (self._next_slot + 1) % self.num_slots
            return slot

    # -- submission -------------------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        slot: int | None = None,
        callback: Callable[[SerialTask], object] | None = None,
    ) -> SerialTask:
        """Queue ``fn(*args)``; with `slot`, behind every task already queued for that slot.

        `callback(handle)` is called once the task has run, whether it returned or raised.
        Keyword arguments for `fn` go through `functools.partial`. Raises `RejectedTask` after shutdown,
        `ValueError` for a slot out of range.
        """
        if slot is not None and not (0 <= slot < self.num_slots):
            raise ValueError(f"slot must be in [0, {self.num_slots}), got {slot}")
        with self._cond:
            if self._shutdown:
                raise RejectedTask("executor is shut down", executor=self.name)
            task = SerialTask(fn, args, slot, callback, next(self._seq))
            self._outstanding += 1
            if slot is None:
                self._ready.append(task)
            else:
                state = self._slots[slot]
                state.pending.append(task)
                if not state.scheduled:
                    state.scheduled = True
                    self._ready.append(slot)
            self._cond.notify()
            # Start a thread only for work that the idle ones cannot take.
            if len(self._ready) > self._idle and len(self._workers) < self._worker_limit:
                self._start_worker()
            return task

    def _start_worker(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self.name}-worker-{next(self._worker_ids)}", daemon=True
        )
        self._workers.append(thread)
        # Counted idle until it takes work, so the next submit does not start one more.
        self._idle += 1
        thread.start()

    # -- workers ----------------------------------------------------------------------------

    def _work(self) -> None:
        with self._cond:
            self._idle -= 1
        while True:
            with self._cond:
                while not self._ready and not (self._shutdown and self._outstanding == 0):
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._ready:
                    return
                item = self._ready.popleft()
                if isinstance(item, int):
                    slot: int | None = item
                    task = self._slots[item].pending.popleft()
                else:
                    slot, task = None, item
            try:
                self._run(task)
            finally:
                with self._cond:
                    if slot is not None:
                        state = self._slots[slot]
                        if state.pending:
                            self._ready.append(slot)
                            self._cond.notify()
                        else:
                            state.scheduled = False
                    self._outstanding -= 1
                    if self._shutdown and self._outstanding == 0:
                        self._cond.notify_all()

    @staticmethod
    def _run(task: SerialTask) -> None:
        if not task.set_running_or_notify_cancel():
            return
        try:
            result = task.fn(*task.args)
        except BaseException as exc:  # noqa: BLE001 - the handle owns the outcome; a worker never dies of it
            task.set_exception(exc)
        else:
            task.set_result(result)
        if task._callback is not None:
            try:
                task._callback(task)
            except Exception:
                log.exception("callback of %r failed", task)

    # -- shutdown ---------------------------------------------------------------------------

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Refuse new tasks; queued tasks still run. With `wait`, join the workers.

        Returns whether the executor has terminated (always True after an unbounded wait).
        A task may shut down its own executor only with ``wait=False``.
        """
        if wait:
            self._check_not_worker()
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
        if not wait:
            return self.is_terminated()
        return self.await_termination(timeout)

    def shutdown_now(self) -> list[SerialTask]:
        """Refuse new tasks and cancel every queued one; return those, in submission order.

        Running tasks finish; call `await_termination` to wait for them.
        """
        with self._cond:
            self._shutdown = True
            dropped: list[SerialTask] = []
            for item in self._ready:
                if isinstance(item, int):
                    state = self._slots[item]
                    dropped.extend(state.pending)
                    state.pending.clear()
                    state.scheduled = False
                else:
                    dropped.append(item)
            self._ready.clear()
            # A running slot is not in the ready queue but may still have tasks behind it.
            for state in self._slots:
                dropped.extend(state.pending)
                state.pending.clear()
            self._outstanding -= len(dropped)
            self._cond.notify_all()
        dropped.sort(key=lambda task: task.seq)
        # Tasks the caller had already cancelled are not work it may want to resubmit.
        return [task for task in dropped if not task.cancelled() and task.cancel()]

    def is_shutdown(self) -> bool:
        with self._cond:
            return self._shutdown

    def is_terminated(self) -> bool:
        """True once shut down, with no task left and every worker thread exited."""
        with self._cond:
            if not (self._shutdown and self._outstanding == 0):
                return False
            workers = list(self._workers)
        return not any(thread.is_alive() for thread in workers)

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until shut down, every task run or dropped, and every worker joined.

        Returns False if that did not happen within `timeout` seconds. Waiting before
        `shutdown` is allowed: it returns when some other thread's shutdown completes.
        """
        self._check_not_worker()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._shutdown and self._outstanding == 0,
                None if deadline is None else max(0.0, deadline - time.monotonic()),
            )
            workers = list(self._workers)
        if not done:
            return False
        for thread in workers:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        return True

    def _check_not_worker(self) -> None:
        # A task waiting for its own executor to terminate would wait for itself forever.
        with self._cond:
            workers = list(self._workers)
        if threading.current_thread() in workers:
            raise RuntimeError(f"{self.name}: a task cannot wait for its own executor to terminate")

    # -- introspection ----------------------------------------------------------------------

    @property
    def worker_count(self) -> int:
        """Worker threads started so far (they live until shutdown)."""
        with self._cond:
            return len(self._workers)

    def __enter__(self) -> "SerialExecutorService":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown(wait=True)


class BatchLatch:
    """Waits for every channel of a batch to report, or for the first to fail.

    The pattern from the Doris SyncJob: after a batch's sends, an EOF task per channel is
    submitted to that channel's slot; it runs after the channel's sends and counts the
    channel down. The latch opens when every channel has counted down, or at once when any
    channel fails (the batch will be rolled back, so there is nothing left to wait for).
    Counting a channel down twice counts once; only the first failure is recorded.
    """

    def __init__(self, channels: Iterable[Hashable]) -> None:
        self._cond = threading.Condition()
        self._channels = frozenset(channels)
        self._remaining = set(self._channels)
        self.failed_channel: Hashable | None = None
        self.error: BaseException | None = None

    def count_down(self, channel: Hashable) -> None:
        """Record that `channel` finished its part of the batch."""
        self._check(channel)
        with self._cond:
            self._remaining.discard(channel)
            if not self._remaining:
                self._cond.notify_all()

    def fail(self, channel: Hashable, error: BaseException) -> None:
        """Record that `channel` failed with `error`, and open the latch."""
        self._check(channel)
        with self._cond:
            self._remaining.discard(channel)
            if self.error is None:
                self.failed_channel, self.error = channel, error
            self._cond.notify_all()

    def on_done(self, channel: Hashable) -> Callable[[concurrent.futures.Future], None]:
        """A callback for a channel's EOF task: counts down, or fails if the task raised."""

        def callback(handle: concurrent.futures.Future) -> None:
            error = None if handle.cancelled() else handle.exception()
            if error is None:
                self.count_down(channel)
            else:
                self.fail(channel, error)

        return callback

    def on_error(self, channel: Hashable) -> Callable[[concurrent.futures.Future], None]:
        """A callback for a channel's other tasks: fails the latch if the task raised."""

        def callback(handle: concurrent.futures.Future) -> None:
            error = None if handle.cancelled() else handle.exception()
            if error is not None:
                self.fail(channel, error)

        return callback

    def _check(self, channel: Hashable) -> None:
        if channel not in self._channels:
            raise ValueError(f"unknown channel {channel!r}")

    @property
    def remaining(self) -> frozenset:
        """Channels that have not reported yet."""
        with self._cond:
            return frozenset(self._remaining)

    @property
    def is_open(self) -> bool:
        with self._cond:
            return self.error is not None or not self._remaining

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the latch opens; False if `timeout` seconds pass first.

        Opening is not success: check `error` (and `failed_channel`) afterwards.
        """
        with self._cond:
            return self._cond.wait_for(lambda: self.error is not None or not self._remaining, timeout)
