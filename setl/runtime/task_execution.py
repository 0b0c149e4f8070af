"""Runs many small `call()`-driven tasks on a few shared threads, adding threads when a call overruns.

This is SeaTunnel's dynamic thread sharing: a task whose calls are usually quick shares the
pool; one that keeps overrunning, or says it blocks, gets a thread of its own.
"""

from __future__ import annotations

import collections
import enum
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, runtime_checkable

import attrs

from setl.runtime.serial_executor import RejectedTask

log = logging.getLogger(__name__)

__all__ = [
    "ExecutionStats",
    "Progress",
    "Task",
    "TaskExecutionService",
    "TaskHandle",
]

# Longest an idle worker sleeps without looking at the clock again, so that an injected
# clock that jumps forward is noticed without anyone having to notify the workers.
_MAX_IDLE_WAIT = 0.05


class Progress(enum.Enum):
    """What one `Task.call()` achieved; tells the executor when to call again."""

    PROGRESS = "progress"  # did work: call again soon
    NO_PROGRESS = "no_progress"  # nothing to do: call again after a back-off, or when woken
    BLOCKED = "blocked"  # waiting for another task: call again only when woken
    DONE = "done"  # finished: never call again


@runtime_checkable
class Task(Protocol):
    """A unit of work driven by repeated calls.

    `call()` does a bounded slice of work and returns a `Progress`. It is never called
    concurrently with itself, but successive calls may run on different threads. It should
    return within milliseconds: a call that takes longer than the service's overrun
    threshold holds a thread, and a task that does so repeatedly is given its own thread.
    A task may also define `blocking` (a bool attribute, or a method returning one); a
    blocking task, such as one reading a socket, gets its own thread from the start.
    A task may also define `idle_for()`: after a NO_PROGRESS call, how long (seconds) to leave it
    parked unless woken, instead of the service's `idle_backoff` (None: `idle_backoff`). It is
    called under the service's lock, so it must be cheap and take no lock a task may hold while
    it calls `wake`.
    `call()` raising ends the task: it is not called again.
    """

    def call(self) -> Progress: ...


class _State(enum.Enum):
    QUEUED = "queued"
    PARKED = "parked"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


_FINAL = frozenset({_State.DONE, _State.FAILED, _State.CANCELLED})

ErrorCallback = Callable[["TaskHandle", BaseException], object]


class TaskHandle:
    """The service's record of one submitted task, and the caller's way to control it.

    `overruns` counts the task's calls on the shared pool that took longer than the
    threshold; `dedicated` tells whether it now runs on a thread of its own.
    """

    def __init__(
        self, service: "TaskExecutionService", task: Task, name: str, on_error: ErrorCallback | None
    ) -> None:
        self.task = task
        self.name = name
        self.overruns = 0
        self.calls = 0
        self.dedicated = False
        self.error: BaseException | None = None
        self._service = service
        self._on_error = on_error
        self._state = _State.QUEUED
        self._cancel_requested = False
        self._woken = False
        self._park_seq = 0
        self._done = threading.Event()
        self._wake_event = threading.Event()  # used only on a dedicated thread

    def cancel(self) -> bool:
        """Stop calling the task. A call in progress finishes first; it is not interrupted.

        Returns False if the task had already finished.
        """
        return self._service._cancel(self)

    def wake(self) -> None:
        """Call the task again soon, even if its last call returned NO_PROGRESS."""
        self._service.wake(self)

    def done(self) -> bool:
        """True once the task finished, failed or was cancelled, and no call is running."""
        return self._done.is_set()

    def cancelled(self) -> bool:
        return self._state is _State.CANCELLED

    def wait(self, timeout: float | None = None) -> bool:
        """Block until `done()`; False if `timeout` seconds pass first."""
        return self._done.wait(timeout)

    def __repr__(self) -> str:
        return f"<TaskHandle {self.name} {self._state.value} overruns={self.overruns}>"


@attrs.frozen
class ExecutionStats:
    """A snapshot of a `TaskExecutionService`, for tests, benchmarks and metrics."""

    workers: int  # threads serving the shared queue
    dedicated: int  # threads each owned by one task
    queued: int
    parked: int
    overrunning: int  # shared workers inside a call that has passed the threshold
    overruns: Mapping[str, int]  # task name -> overruns, for tasks not finished yet

    @property
    def threads(self) -> int:
        return self.workers + self.dedicated


@attrs.define(eq=False)
class _Worker:
    thread: threading.Thread | None = None
    handle: TaskHandle | None = None
    started: float = 0.0
    overrunning: bool = False
    idle_since: float = 0.0


class _RunQueue:
    """Which task a shared worker calls next: the urgent ones (woken, or submitted ``first``) in
    FIFO order, then the queue in FIFO order; a task parked with a deadline (a NO_PROGRESS back-off)
    joins the queue's tail once due, one parked without one (BLOCKED) only through `queue`. It owns
    the queues, the deadlines and the parking tickets (a ticket left behind by a task queued or
    finished since is skipped); the service calls it under its lock."""

    def __init__(self) -> None:
        self._queue: collections.deque[TaskHandle] = collections.deque()
        self._urgent: collections.deque[TaskHandle] = collections.deque()
        self._parked: list[tuple[float, int, TaskHandle]] = []
        self._tickets = itertools.count()

    def __len__(self) -> int:
        """Tasks queued (urgent ones included), parked ones not."""
        return len(self._queue) + len(self._urgent)

    def queue(self, handle: TaskHandle, *, urgent: bool = False) -> None:
        """`handle` waits for a worker: ahead of the queue when `urgent`."""
        handle._state = _State.QUEUED
        (self._urgent if urgent else self._queue).append(handle)

    def park(self, handle: TaskHandle, until: float | None) -> None:
        """`handle` waits until `until` (None: until it is queued again)."""
        handle._state = _State.PARKED
        handle._park_seq = next(self._tickets)
        if until is not None:
            heapq.heappush(self._parked, (until, handle._park_seq, handle))

    def take(self, now: float) -> TaskHandle | None:
        """The next task to call at `now` (the parked ones due first join the queue), if any."""
        while self._parked and self._parked[0][0] <= now:
            _, ticket, handle = heapq.heappop(self._parked)
            if handle._state is _State.PARKED and handle._park_seq == ticket:
                self.queue(handle)
        if self._urgent:
            return self._urgent.popleft()
        if self._queue:
            return self._queue.popleft()
        return None

    def due_in(self, now: float) -> float | None:
        """Seconds from `now` until the first parked task is due (None: none has a deadline)."""
        return max(0.0, self._parked[0][0] - now) if self._parked else None

    def remove(self, handle: TaskHandle) -> None:
        """Take the queued `handle` out (it is cancelled)."""
        (self._urgent if handle in self._urgent else self._queue).remove(handle)

    def clear(self) -> None:
        self._queue.clear()
        self._urgent.clear()
        self._parked.clear()


@attrs.define(eq=False)
class TaskExecutionService:
    """Drives `Task`s on `core_workers` shared threads, growing to `max_workers` when calls overrun.

    Contract:
    - Shared workers take tasks from one FIFO queue and put a task back at the tail after
      each call, so tasks take turns. A task returning NO_PROGRESS is parked for
      `idle_backoff` seconds, or until `wake()`, instead of being called in a tight loop;
      one returning BLOCKED is parked until `wake()` only (a wake that arrives during the
      call is not lost: the task is called again). A woken task, and one submitted with
      ``first=True``, is served before the tasks in the queue (in FIFO order among such
      tasks): what finishes work already started goes before what starts new work.
    - A monitor thread checks every `monitor_interval`; when calls have been running longer
      than `overrun_threshold`, it starts extra shared workers so that `core_workers` threads
      are still free to serve the queue, never more than `max_workers` shared threads in all.
      Extra workers exit after `idle_timeout` seconds without work.
    - A task whose calls overran more than `max_overruns` times, or that is `blocking`, gets a
      dedicated thread until it ends. Dedicated threads do not count against `max_workers`.
    - A task whose call raises is FAILED: `handle.error` holds the exception, and the
      `on_error` callbacks (the service's, then the submit's) are called on the worker. Their
      own exceptions are logged and swallowed; a worker never dies of a task.
    - Nothing interrupts a running call: cancel and shutdown take effect when it returns.
    - `clock` measures overruns, back-offs and idle time; the threads' sleeps are real time,
      so a fake clock is noticed within about 50 ms.
    """

    core_workers: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    max_workers: int = attrs.field(default=8)
    overrun_threshold: float = attrs.field(default=0.1, kw_only=True, validator=attrs.validators.gt(0))
    max_overruns: int = attrs.field(default=3, kw_only=True, validator=attrs.validators.ge(0))
    idle_timeout: float = attrs.field(default=5.0, kw_only=True, validator=attrs.validators.ge(0))
    idle_backoff: float = attrs.field(default=0.01, kw_only=True, validator=attrs.validators.ge(0))
    monitor_interval: float | None = attrs.field(default=None, kw_only=True)  # None: threshold / 4
    _on_error: ErrorCallback | None = attrs.field(default=None, kw_only=True, repr=False)
    _clock: Callable[[], float] = attrs.field(default=time.monotonic, kw_only=True, repr=False)
    name: str = attrs.field(default="setl-task", kw_only=True)

    _cond: threading.Condition = attrs.field(init=False, repr=False, factory=threading.Condition)
    _runs: _RunQueue = attrs.field(init=False, repr=False, factory=_RunQueue)
    _live: dict[TaskHandle, None] = attrs.field(init=False, repr=False, factory=dict)  # unfinished, in order
    _workers: list[_Worker] = attrs.field(init=False, repr=False, factory=list)
    _dedicated: dict[TaskHandle, threading.Thread] = attrs.field(init=False, repr=False, factory=dict)
    _threads: list[threading.Thread] = attrs.field(init=False, repr=False, factory=list)  # for shutdown to join
    _overrunning: int = attrs.field(init=False, repr=False, default=0)
    _started: bool = attrs.field(init=False, repr=False, default=False)
    _stopping: bool = attrs.field(init=False, repr=False, default=False)
    _stop: threading.Event = attrs.field(init=False, repr=False, factory=threading.Event)
    _task_ids: Iterator[int] = attrs.field(init=False, repr=False, factory=lambda: itertools.count(1))
    _worker_ids: Iterator[int] = attrs.field(init=False, repr=False, factory=lambda: itertools.count(1))
    _dedicated_ids: Iterator[int] = attrs.field(init=False, repr=False, factory=lambda: itertools.count(1))

    def __attrs_post_init__(self) -> None:
        if self.max_workers < self.core_workers:
            raise ValueError(f"max_workers ({self.max_workers}) must be >= core_workers ({self.core_workers})")
        if self.monitor_interval is None:
            self.monitor_interval = max(0.005, self.overrun_threshold / 4)

    # -- submission and control -------------------------------------------------------------

    def submit(
        self, task: Task, *, name: str | None = None, on_error: ErrorCallback | None = None, first: bool = False
    ) -> TaskHandle:
        """Start driving `task`; raises `RejectedTask` after shutdown.

        With `first`, its first call goes ahead of the tasks already queued: for work that
        finishes something already started, so that it is not queued behind new work.
        """
        blocking = getattr(task, "blocking", False)
        if callable(blocking):
            blocking = blocking()
        with self._cond:
            if self._stopping:
                raise RejectedTask("task execution service is shut down", executor=self.name)
            handle = TaskHandle(self, task, name or f"task-{next(self._task_ids)}", on_error)
            self._live[handle] = None
            if not self._started:
                self._start()
            if blocking:
                self._start_dedicated(handle)
            else:
                self._runs.queue(handle, urgent=first)
                self._cond.notify()
            return handle

    def wake(self, handle: TaskHandle) -> None:
        """Call `handle`'s task again soon, even if it last returned NO_PROGRESS."""
        with self._cond:
            if handle._state in _FINAL:
                return
            if handle.dedicated:
                handle._wake_event.set()
            elif handle._state is _State.PARKED:
                # Ahead of the rest: it waited for this event, and whoever sent it waits on it in turn.
                self._runs.queue(handle, urgent=True)
                self._cond.notify()
            else:
                # Queued or in a call: remember it, so a NO_PROGRESS answer does not park it.
                handle._woken = True

    def _cancel(self, handle: TaskHandle) -> bool:
        with self._cond:
            if handle._state in _FINAL:
                return False
            handle._cancel_requested = True
            if handle.dedicated:
                handle._wake_event.set()
            elif handle._state is _State.QUEUED:
                self._runs.remove(handle)
                self._finish(handle, _State.CANCELLED)
            elif handle._state is _State.PARKED:
                self._finish(handle, _State.CANCELLED)  # its heap entry is skipped later
            return True

    # -- counters ---------------------------------------------------------------------------

    @property
    def worker_count(self) -> int:
        """Threads serving the shared queue now."""
        with self._cond:
            return len(self._workers)

    @property
    def dedicated_count(self) -> int:
        """Threads each owned by one task now."""
        with self._cond:
            return len(self._dedicated)

    @property
    def thread_count(self) -> int:
        """Shared and dedicated threads now (the monitor thread not included)."""
        with self._cond:
            return len(self._workers) + len(self._dedicated)

    def stats(self) -> ExecutionStats:
        with self._cond:
            return ExecutionStats(
                workers=len(self._workers),
                dedicated=len(self._dedicated),
                queued=len(self._runs),
                parked=sum(1 for h in self._live if h._state is _State.PARKED and not h.dedicated),
                overrunning=self._overrunning,
                overruns={h.name: h.overruns for h in self._live},
            )

    # -- threads ----------------------------------------------------------------------------

    def _start(self) -> None:
        self._started = True
        for _ in range(self.core_workers):
            self._start_worker()
        self._spawn(self._monitor, f"{self.name}-monitor")

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()
        return thread

    def _start_worker(self) -> None:
        worker = _Worker(idle_since=self._clock())
        self._workers.append(worker)
        worker.thread = self._spawn(self._work, f"{self.name}-worker-{next(self._worker_ids)}", worker)

    def _start_dedicated(self, handle: TaskHandle) -> None:
        handle.dedicated = True
        handle._state = _State.RUNNING
        thread = self._spawn(self._run_dedicated, f"{self.name}-dedicated-{next(self._dedicated_ids)}", handle)
        self._dedicated[handle] = thread

    def _work(self, worker: _Worker) -> None:
        try:
            while True:
                with self._cond:
                    handle = self._next_task(worker)
                    if handle is None:
                        return
                    handle._state = _State.RUNNING
                    worker.handle, worker.started, worker.overrunning = handle, self._clock(), False
                error = self._call(handle)
                with self._cond:
                    now = self._clock()
                    if worker.overrunning:
                        self._overrunning -= 1
                    if worker.overrunning or now - worker.started > self.overrun_threshold:
                        handle.overruns += 1
                    worker.handle, worker.overrunning, worker.idle_since = None, False, now
                    self._settle(handle, error)
                self._report(handle, error)
        finally:
            with self._cond:
                if worker in self._workers:
                    self._workers.remove(worker)

    def _next_task(self, worker: _Worker) -> TaskHandle | None:
        """Under the lock: the next task for `worker`, or None when it should exit."""
        while not self._stopping:
            now = self._clock()
            handle = self._runs.take(now)
            if handle is not None:
                return handle
            timeout = None
            if len(self._workers) - self._overrunning > self.core_workers:
                idle_for = now - worker.idle_since
                if idle_for >= self.idle_timeout:
                    self._workers.remove(worker)  # retire: capacity is back without us
                    return None
                timeout = min(_MAX_IDLE_WAIT, self.idle_timeout - idle_for)
            due_in = self._runs.due_in(now)
            if due_in is not None:
                timeout = min(_MAX_IDLE_WAIT, due_in if timeout is None else min(timeout, due_in))
            self._cond.wait(timeout)
        return None

    def _run_dedicated(self, handle: TaskHandle) -> None:
        try:
            while True:
                with self._cond:
                    if self._stopping or handle._cancel_requested:
                        self._finish(handle, _State.CANCELLED)
                        return
                    handle._state = _State.RUNNING
                    handle._wake_event.clear()
                error = self._call(handle)
                with self._cond:
                    progress = self._settle(handle, error)
                    backoff = self._backoff(handle) if progress is Progress.NO_PROGRESS else 0.0
                self._report(handle, error)
                if handle._state in _FINAL:
                    return
                if progress is Progress.NO_PROGRESS:
                    handle._wake_event.wait(backoff)
                elif progress is Progress.BLOCKED:
                    handle._wake_event.wait()
        finally:
            with self._cond:
                self._dedicated.pop(handle, None)

    def _monitor(self) -> None:
        while not self._stop.wait(self.monitor_interval):
            with self._cond:
                if self._stopping:
                    return
                now = self._clock()
                for worker in self._workers:
                    if worker.handle is None or worker.overrunning:
                        continue
                    if now - worker.started > self.overrun_threshold:
                        worker.overrunning = True
                        self._overrunning += 1
                        log.debug("%s: a call of %s passed %.3fs", self.name, worker.handle.name,
                                  self.overrun_threshold)
                # Keep core_workers threads free for the queue while others are stuck in calls.
                free = len(self._workers) - self._overrunning
                while free < self.core_workers and len(self._workers) < self.max_workers:
                    self._start_worker()
                    free += 1

    # -- one call and its outcome -----------------------------------------------------------

    @staticmethod
    def _call(handle: TaskHandle) -> BaseException | Progress:
        try:
            progress = handle.task.call()
        except BaseException as exc:  # noqa: BLE001 - recorded on the handle; must not end the thread
            return exc
        if not isinstance(progress, Progress):
            return TypeError(f"{handle.name}: call() returned {progress!r}, not a Progress")
        return progress

    def _settle(self, handle: TaskHandle, outcome: BaseException | Progress) -> Progress | None:
        """Under the lock: record one call's outcome and decide where the task goes next."""
        handle.calls += 1
        woken, handle._woken = handle._woken, False
        if isinstance(outcome, BaseException):
            self._finish(handle, _State.FAILED, outcome)
            return None
        if outcome is Progress.DONE:
            self._finish(handle, _State.DONE)
        elif handle._cancel_requested or self._stopping:
            self._finish(handle, _State.CANCELLED)
        elif handle.dedicated:
            idle = outcome in (Progress.NO_PROGRESS, Progress.BLOCKED)
            handle._state = _State.PARKED if idle else _State.RUNNING
        elif handle.overruns > self.max_overruns:
            log.info("%s: %s overran %d times; giving it its own thread", self.name, handle.name, handle.overruns)
            self._start_dedicated(handle)
        elif outcome is Progress.BLOCKED and not woken:
            self._runs.park(handle, None)  # no deadline: only wake() queues it again
        elif outcome is Progress.NO_PROGRESS and not woken and (backoff := self._backoff(handle)) > 0:
            self._runs.park(handle, self._clock() + backoff)
            self._cond.notify()  # a waiting worker must shorten its wait to the new deadline
        else:
            # as in wake() when woken: the event came while it was in a call
            self._runs.queue(handle, urgent=woken and outcome is not Progress.PROGRESS)
            self._cond.notify()
        return outcome

    def _backoff(self, handle: TaskHandle) -> float:
        """How long a task that made no progress stays parked unless woken (`Task.idle_for`)."""
        idle_for = getattr(handle.task, "idle_for", None)
        wait = idle_for() if idle_for is not None else None
        return self.idle_backoff if wait is None else wait

    def _finish(self, handle: TaskHandle, state: _State, error: BaseException | None = None) -> None:
        handle._state = state
        handle.error = error
        self._live.pop(handle, None)
        handle._done.set()

    def _report(self, handle: TaskHandle, outcome: BaseException | Progress) -> None:
        """Outside the lock: tell the error callbacks about a failed call."""
        if not isinstance(outcome, BaseException):
            return
        callbacks = [cb for cb in (self._on_error, handle._on_error) if cb is not None]
        if not callbacks:
            log.error("%s: task %s failed", self.name, handle.name, exc_info=outcome)
        for callback in callbacks:
            try:
                callback(handle, outcome)
            except Exception:
                log.exception("%s: on_error callback for %s failed", self.name, handle.name)

    # -- shutdown ---------------------------------------------------------------------------

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop calling tasks, cancel those not finished, and join every thread.

        Calls in progress are waited for, not interrupted. Returns False if some thread was
        still alive after `timeout` seconds (it is a daemon thread, so it cannot keep the
        process alive).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._stopping = True
            self._runs.clear()
            for handle in list(self._live):
                if handle.dedicated:
                    handle._wake_event.set()
                elif handle._state is not _State.RUNNING:
                    self._finish(handle, _State.CANCELLED)
            self._cond.notify_all()
            threads = list(self._threads)
        self._stop.set()
        me = threading.current_thread()
        for thread in threads:
            if thread is not me:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads if t is not me)

    def __enter__(self) -> "TaskExecutionService":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
