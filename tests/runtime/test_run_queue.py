"""The shared workers' run queue (`_RunQueue`) driven step by step, without threads: urgent tasks
first, then FIFO, parked tasks joining the tail when due, stale parking tickets skipped."""

from __future__ import annotations

from setl.runtime.task_execution import Progress, TaskExecutionService, TaskHandle, _RunQueue, _State


class _Idle:
    def call(self) -> Progress:
        return Progress.NO_PROGRESS


def handles(*names: str) -> list[TaskHandle]:
    """Handles of idle tasks named `names` (never called: the queue only orders them)."""
    service = TaskExecutionService()
    return [TaskHandle(service, _Idle(), name, None) for name in names]


def drain(runs: _RunQueue, now: float) -> list[str]:
    """The names `runs` hands out at `now`, until it has none."""
    out = []
    while (handle := runs.take(now)) is not None:
        out.append(handle.name)
    return out


def test_urgent_tasks_go_first_then_the_queue_in_fifo_order():
    """Woken or `first` tasks are taken before the queue, each group in the order it came."""
    a, b, c, d = handles("a", "b", "c", "d")
    runs = _RunQueue()
    runs.queue(a)
    runs.queue(b, urgent=True)
    runs.queue(c)
    runs.queue(d, urgent=True)
    assert len(runs) == 4
    assert drain(runs, 0.0) == ["b", "d", "a", "c"] and len(runs) == 0


def test_parked_task_joins_the_tail_once_due():
    """A task parked until 5 is not taken at 4; at 5 it comes after the tasks queued before it."""
    a, b = handles("a", "b")
    runs = _RunQueue()
    runs.park(a, 5.0)
    assert a._state is _State.PARKED and runs.due_in(4.0) == 1.0
    assert runs.take(4.0) is None
    runs.queue(b)
    assert drain(runs, 5.0) == ["b", "a"] and a._state is _State.QUEUED
    assert runs.due_in(5.0) is None


def test_stale_ticket_of_a_task_woken_or_cancelled_is_skipped():
    """A task parked with a deadline and queued (woken) before it is taken once only; a cancelled one never."""
    a, b = handles("a", "b")
    runs = _RunQueue()
    runs.park(a, 1.0)
    runs.queue(a, urgent=True)  # woken before its deadline
    runs.park(b, 1.0)
    b._state = _State.CANCELLED
    assert drain(runs, 2.0) == ["a"]


def test_blocked_task_waits_only_for_a_queue_and_remove_takes_it_out():
    """A task parked without a deadline is never due; a queued task removed (cancelled) is not taken."""
    a, b = handles("a", "b")
    runs = _RunQueue()
    runs.park(a, None)
    assert runs.due_in(0.0) is None and runs.take(1e9) is None
    runs.queue(b)
    runs.remove(b)
    runs.queue(a)
    assert drain(runs, 0.0) == ["a"]
