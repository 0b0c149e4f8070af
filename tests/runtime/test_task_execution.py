"""Tests for TaskExecutionService: sharing, parking, overrun handling, dedicated threads, shutdown."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
from runtime_helpers import FakeClock, live_threads, wait_until

from setl.runtime import Progress, RejectedTask, TaskExecutionService

_names = itertools.count()


@pytest.fixture
def make_service():
    """Build services with unique thread names; shut them down and check every thread was joined."""
    made = []

    def make(**kwargs) -> TaskExecutionService:
        kwargs.setdefault("name", f"tx{next(_names)}")
        svc = TaskExecutionService(**kwargs)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        assert svc.shutdown(timeout=10)
        assert live_threads(svc.name + "-") == []


class Steps:
    """Returns PROGRESS until it has been called `n` times, then DONE; records where it ran."""

    def __init__(self, n: int, log: list | None = None, tag: object = None) -> None:
        self.n = n
        self.calls = 0
        self.threads: list[str] = []
        self.log = log
        self.tag = tag

    def call(self) -> Progress:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        if self.log is not None:
            self.log.append(self.tag)
        return Progress.DONE if self.calls >= self.n else Progress.PROGRESS


class Idle:
    """Has nothing to do until `ready` is set, and says so with `waiting` (NO_PROGRESS, or BLOCKED
    to be parked until woken); then DONE. Counts its calls."""

    def __init__(self, waiting: Progress = Progress.NO_PROGRESS) -> None:
        self.calls = 0
        self.ready = threading.Event()
        self.waiting = waiting

    def call(self) -> Progress:
        self.calls += 1
        return Progress.DONE if self.ready.is_set() else self.waiting


class Gate:
    """Its first call blocks until released (a slow call); later calls finish the task."""

    def __init__(self, blocking: bool = False) -> None:
        self.blocking = blocking
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.threads: list[str] = []

    def call(self) -> Progress:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        self.started.set()
        self.release.wait(10)
        return Progress.DONE


class Note:
    """A task that appends its tag to `order` when it runs, once."""

    def __init__(self, tag: str, order: list[str]) -> None:
        self.tag = tag
        self.order = order

    def call(self) -> Progress:
        self.order.append(self.tag)
        return Progress.DONE


def test_many_tasks_share_the_core_workers(make_service):
    """Many tasks run to DONE on exactly core_workers shared threads."""
    svc = make_service(core_workers=2, max_workers=4, overrun_threshold=5.0)
    tasks = [Steps(30) for _ in range(40)]
    handles = [svc.submit(t) for t in tasks]
    assert all(h.wait(10) for h in handles)
    assert all(t.calls == 30 for t in tasks)
    assert {name for t in tasks for name in t.threads} <= {f"{svc.name}-worker-1", f"{svc.name}-worker-2"}
    assert svc.stats().threads == 2
    assert all(h.done() and not h.cancelled() and h.error is None for h in handles)


def test_tasks_take_turns_on_the_shared_queue(make_service):
    """A task goes back to the tail after each call, so tasks on one worker alternate."""
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0)
    order: list[str] = []
    gate = Gate()
    svc.submit(gate)  # hold the only worker while both tasks are queued
    gate.started.wait(10)
    a = svc.submit(Steps(4, order, "a"))
    b = svc.submit(Steps(4, order, "b"))
    gate.release.set()
    assert a.wait(10) and b.wait(10)
    assert order == ["a", "b"] * 4


def test_failing_task_records_error_and_worker_survives(make_service):
    """A call that raises ends its task with the error, calls on_error, and the worker goes on."""
    seen = []
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0,
                       on_error=lambda h, e: seen.append(("service", h, e)))

    class Breaks:
        calls = 0

        def call(self):
            self.calls += 1
            if self.calls == 3:
                raise ValueError("bad row in batch 7")
            return Progress.PROGRESS

    broken = Breaks()
    handle = svc.submit(broken, name="breaks", on_error=lambda h, e: seen.append(("submit", h, e)))
    other = svc.submit(Steps(20))
    assert handle.wait(10) and other.wait(10)
    assert isinstance(handle.error, ValueError) and not handle.cancelled()
    assert broken.calls == 3
    assert [(who, h) for who, h, _ in seen] == [("service", handle), ("submit", handle)]
    assert all(e is handle.error for _, _, e in seen)
    assert other.error is None
    assert svc.worker_count == 1


def test_on_error_callback_exception_is_logged(make_service, caplog):
    """An on_error callback that raises is logged with its traceback and does not kill the worker."""

    def bad_callback(handle, error):
        raise RuntimeError("callback broke")

    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, on_error=bad_callback)

    class Raises:
        def call(self):
            raise KeyError("x")

    with caplog.at_level(logging.ERROR, logger="setl.runtime.task_execution"):
        assert svc.submit(Raises()).wait(10)
        assert svc.submit(Steps(3)).wait(10)
    records = [r for r in caplog.records if "on_error" in r.getMessage()]
    assert records and records[0].exc_info is not None
    assert svc.worker_count == 1


def test_call_returning_no_progress_value_is_an_error(make_service):
    """A call() that returns something other than a Progress fails the task with TypeError."""
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, on_error=lambda h, e: None)

    class ReturnsNone:
        def call(self):
            return None

    handle = svc.submit(ReturnsNone())
    assert handle.wait(10)
    assert isinstance(handle.error, TypeError)


def test_no_progress_task_is_parked_until_backoff_or_wake(make_service):
    """A NO_PROGRESS task is not called again until its back-off passes on the clock or it is woken."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, idle_backoff=1.0, clock=clock)
    idle = Idle()
    handle = svc.submit(idle)
    wait_until(lambda: svc.stats().parked == 1)
    assert idle.calls == 1
    # Another task cycles through the queue 50 times meanwhile; the parked one is not called.
    assert svc.submit(Steps(50)).wait(10)
    assert idle.calls == 1
    handle.wake()
    wait_until(lambda: idle.calls == 2 and svc.stats().parked == 1)
    clock.advance(1.5)
    wait_until(lambda: idle.calls == 3)
    idle.ready.set()
    svc.wake(handle)
    assert handle.wait(10)
    assert not handle.cancelled()


def test_wake_during_a_call_is_not_lost(make_service):
    """A wake that arrives while the task is in a call keeps a NO_PROGRESS answer from parking it."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, idle_backoff=1.0, clock=clock)

    class WokenMidCall:
        def __init__(self):
            self.calls = 0
            self.handle = None
            self.in_call = threading.Event()
            self.go_on = threading.Event()

        def call(self):
            self.calls += 1
            if self.calls == 1:
                self.in_call.set()
                self.go_on.wait(10)
                return Progress.NO_PROGRESS
            return Progress.DONE

    task = WokenMidCall()
    handle = svc.submit(task)
    task.in_call.wait(10)
    handle.wake()
    task.go_on.set()
    assert handle.wait(10)  # the clock never moved, so only the wake can explain the second call
    assert task.calls == 2


def test_slow_call_does_not_delay_other_tasks(make_service):
    """While one call is stuck, an extra worker serves the queue within the threshold plus slack."""
    threshold = 0.05
    svc = make_service(core_workers=1, max_workers=3, overrun_threshold=threshold)
    slow = Gate()
    svc.submit(slow, name="slow")
    slow.started.wait(10)
    submitted = time.monotonic()
    fast = Steps(20)
    fast_handle = svc.submit(fast, name="fast")
    assert fast_handle.wait(10)
    latency = time.monotonic() - submitted
    assert not slow.release.is_set()
    assert latency < threshold + 2.0, f"fast task waited {latency:.3f}s behind a stuck call"
    # One extra worker, or two if a call of the fast task itself looked slow on a loaded machine.
    assert 2 <= svc.worker_count <= 3
    assert f"{svc.name}-worker-1" not in fast.threads  # worker-1 is the one stuck in the slow call
    assert svc.stats().overrunning == 1
    slow.release.set()
    wait_until(lambda: svc.stats().overrunning == 0)


def test_extra_workers_never_exceed_max_workers(make_service):
    """However many calls are stuck, the shared pool stops growing at max_workers."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=3, overrun_threshold=0.1, clock=clock)
    gates = [Gate() for _ in range(5)]
    for gate in gates:
        svc.submit(gate)
    for expected in (1, 2, 3):
        wait_until(lambda expected=expected: sum(g.started.is_set() for g in gates) == expected)
        clock.advance(1.0)
        wait_until(lambda expected=expected: svc.stats().overrunning == expected)
    assert svc.worker_count == 3
    assert len(live_threads(f"{svc.name}-worker-")) == 3
    assert sum(g.started.is_set() for g in gates) == 3
    for gate in gates:
        gate.release.set()


def test_repeat_offender_moves_to_a_dedicated_thread(make_service):
    """A task that overruns more than max_overruns times leaves the shared pool for its own thread."""
    clock = FakeClock()
    svc = make_service(core_workers=2, max_workers=4, overrun_threshold=0.1, max_overruns=2, clock=clock)

    class Heavy(Steps):
        def call(self):
            clock.advance(0.5)  # each call "takes" 0.5 s on the service's clock
            return super().call()

    heavy = Heavy(8)
    handle = svc.submit(heavy, name="heavy")
    assert handle.wait(10)
    assert handle.dedicated
    assert handle.overruns == 3
    assert all("-worker-" in name for name in heavy.threads[:3])
    assert set(heavy.threads[3:]) == {f"{svc.name}-dedicated-1"}
    wait_until(lambda: svc.dedicated_count == 0)


def test_quick_task_stays_shared(make_service):
    """A task whose calls stay under the threshold is never moved off the shared pool."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=2, overrun_threshold=0.1, max_overruns=0, clock=clock)
    steps = Steps(50)
    handle = svc.submit(steps)
    assert handle.wait(10)
    assert not handle.dedicated and handle.overruns == 0
    assert set(steps.threads) == {f"{svc.name}-worker-1"}


def test_blocking_task_gets_a_dedicated_thread_from_the_start(make_service):
    """A task marked blocking runs on its own thread at once and does not take a shared worker."""
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0)
    reader = Gate(blocking=True)
    handle = svc.submit(reader, name="socket-reader")
    reader.started.wait(10)
    assert handle.dedicated
    assert svc.dedicated_count == 1 and svc.worker_count == 1
    assert reader.threads == [f"{svc.name}-dedicated-1"]
    assert svc.submit(Steps(10)).wait(10)  # the shared worker is still free
    reader.release.set()
    assert handle.wait(10)
    wait_until(lambda: svc.dedicated_count == 0)


def test_blocking_may_be_a_method_and_dedicated_task_can_be_woken(make_service):
    """`blocking` may be a method; wake() cuts a dedicated task's NO_PROGRESS back-off short."""
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, idle_backoff=30.0)

    class Reader(Idle):
        def blocking(self):
            return True

    reader = Reader()
    handle = svc.submit(reader)
    wait_until(lambda: reader.calls == 1)
    assert handle.dedicated
    handle.wake()
    wait_until(lambda: reader.calls == 2)
    reader.ready.set()
    handle.wake()
    assert handle.wait(10) and not handle.cancelled()


def test_idle_extra_workers_retire(make_service):
    """Extra workers started for an overrun exit after idle_timeout; the core workers stay."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=3, overrun_threshold=0.1, idle_timeout=5.0, clock=clock)
    slow = Gate()
    svc.submit(slow)
    slow.started.wait(10)
    clock.advance(1.0)
    wait_until(lambda: svc.worker_count == 2)
    slow.release.set()
    wait_until(lambda: svc.stats().overrunning == 0 and svc.stats().queued == 0)
    assert svc.worker_count == 2  # the clock has not moved on yet
    clock.advance(6.0)
    wait_until(lambda: svc.worker_count == 1)
    wait_until(lambda: len(live_threads(f"{svc.name}-worker-")) == 1)
    assert svc.submit(Steps(5)).wait(10)


def test_cancel_stops_queued_parked_and_running_tasks(make_service):
    """cancel() ends a parked task at once and a running one after its current call."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, idle_backoff=1.0, clock=clock)
    idle = Idle()
    parked = svc.submit(idle)
    wait_until(lambda: svc.stats().parked == 1)
    assert parked.cancel()
    assert parked.done() and parked.cancelled()
    parked.wake()
    clock.advance(5.0)

    class Endless(Gate):
        def call(self):
            super().call()
            return Progress.PROGRESS

    endless = Endless()
    running = svc.submit(endless)
    endless.started.wait(10)
    assert running.cancel()
    assert not running.done()  # the call in progress is not interrupted
    endless.release.set()
    assert running.wait(10) and running.cancelled()
    assert endless.calls == 1
    assert svc.submit(Steps(3)).wait(10)
    assert idle.calls == 1
    assert not running.cancel()  # already finished


def test_shutdown_joins_every_thread_and_cancels_pending_tasks(make_service):
    """shutdown() cancels unfinished tasks, joins workers, extras, dedicated and monitor threads, refuses new tasks."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=2, overrun_threshold=0.1, idle_backoff=1.0, clock=clock)
    slow = Gate()
    slow_handle = svc.submit(slow)
    slow.started.wait(10)
    clock.advance(1.0)
    wait_until(lambda: svc.worker_count == 2)
    reader = Idle()
    reader.blocking = True
    reader_handle = svc.submit(reader)
    parked = svc.submit(Idle())
    wait_until(lambda: svc.stats().parked == 1 and reader.calls >= 1)
    assert len(live_threads(svc.name + "-")) == 4  # 2 workers, 1 dedicated, the monitor
    joined = []
    stopper = threading.Thread(target=lambda: joined.append(svc.shutdown(timeout=10)), name="stopper")
    stopper.start()
    wait_until(lambda: parked.done())
    slow.release.set()
    stopper.join(10)
    assert joined == [True]
    assert live_threads(svc.name + "-") == []
    assert parked.cancelled() and reader_handle.cancelled()
    assert slow_handle.done() and not slow_handle.cancelled()  # its call returned DONE
    with pytest.raises(RejectedTask):
        svc.submit(Steps(1))
    assert svc.thread_count == 0


def test_shutdown_reports_threads_it_could_not_join(make_service):
    """shutdown(timeout) returns False while a call is still stuck, and True once it returns."""
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0)
    gate = Gate()
    svc.submit(gate)
    gate.started.wait(10)
    assert svc.shutdown(timeout=0.05) is False
    gate.release.set()
    assert svc.shutdown(timeout=10) is True


def test_invalid_configuration_is_refused():
    """Sizes and durations that cannot work are refused with ValueError."""
    for kwargs in ({"core_workers": 0}, {"core_workers": 3, "max_workers": 2}, {"overrun_threshold": 0},
                   {"max_overruns": -1}):
        with pytest.raises(ValueError):
            TaskExecutionService(**kwargs)


@pytest.mark.parametrize("blocking", [False, True])
def test_blocked_task_waits_for_a_wake_however_far_the_clock_moves(make_service, blocking):
    """A BLOCKED task (shared or on its own thread) is called again only when woken, never by its back-off."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, idle_backoff=0.01, clock=clock)
    task = Idle(Progress.BLOCKED)
    task.blocking = blocking
    handle = svc.submit(task)
    wait_until(lambda: task.calls == 1)
    clock.advance(3600)
    assert svc.submit(Steps(50)).wait(10)  # the shared worker cycles meanwhile
    assert task.calls == 1 and not handle.done()
    handle.wake()
    wait_until(lambda: task.calls == 2)
    task.ready.set()
    handle.wake()
    assert handle.wait(10)


@pytest.mark.parametrize("blocking", [False, True])
def test_a_task_idle_for_says_how_long_it_stays_parked_unless_woken(make_service, blocking):
    """`idle_for` replaces the service's back-off for the task (shared or on its own thread): it is
    called again once that passes or when woken, not after `idle_backoff`; None keeps the back-off."""
    clock = FakeClock()
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0, idle_backoff=0.01, clock=clock)
    task = Idle()
    task.blocking = blocking
    waits: list[float | None] = [30.0]
    task.idle_for = lambda: waits[0]
    handle = svc.submit(task)
    wait_until(lambda: task.calls == 1)
    if blocking:
        time.sleep(0.3)  # a dedicated thread waits in real time: 30 of its back-offs
    else:
        clock.advance(1.0)  # a hundred back-offs on the service's clock
        assert svc.submit(Steps(50)).wait(10)  # the shared worker cycles meanwhile
    assert task.calls == 1 and not handle.done()
    waits[0] = None  # from the next call on, the service's back-off again
    handle.wake()
    wait_until(lambda: task.calls == 2)
    if not blocking:
        clock.advance(0.02)
    wait_until(lambda: task.calls >= 3)
    task.ready.set()
    if not blocking:
        clock.advance(0.02)
    assert handle.wait(10)


def test_a_woken_task_runs_before_tasks_already_queued(make_service):
    """wake() puts a parked task at the head of the queue, ahead of tasks queued before it."""
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0)
    order: list[str] = []
    gate = Gate()

    class NotedBlocked(Idle):
        def call(self):
            if self.calls:
                order.append("woken")
            return super().call()

    blocked = NotedBlocked(Progress.BLOCKED)
    blocked_handle = svc.submit(blocked, name="blocked")
    wait_until(lambda: blocked.calls == 1)
    svc.submit(gate, name="gate")  # holds the only worker while the queue fills
    gate.started.wait(10)

    queued = [svc.submit(Note(f"queued-{i}", order)) for i in range(3)]
    blocked.ready.set()
    blocked_handle.wake()
    gate.release.set()
    assert blocked_handle.wait(10) and all(h.wait(10) for h in queued)
    assert order == ["woken", "queued-0", "queued-1", "queued-2"]


def test_tasks_submitted_first_run_ahead_of_the_queue_in_their_own_order(make_service):
    """submit(first=True) tasks run before tasks queued earlier, and in the order they were submitted."""
    svc = make_service(core_workers=1, max_workers=1, overrun_threshold=5.0)
    order: list[str] = []
    gate = Gate()
    svc.submit(gate, name="gate")  # holds the only worker while the queue fills
    gate.started.wait(10)

    handles = [svc.submit(Note("queued-0", order)), svc.submit(Note("first-0", order), first=True),
               svc.submit(Note("queued-1", order)), svc.submit(Note("first-1", order), first=True)]
    gate.release.set()
    assert all(h.wait(10) for h in handles)
    assert order == ["first-0", "first-1", "queued-0", "queued-1"]
