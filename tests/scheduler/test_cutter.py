"""Batch cutting (`setl.scheduler.cutter.BatchCutter`), driven without threads on a scripted source
and a hand-moved clock: the first batch after a start or a rewind is cut as soon as the source has
nothing ready; every later one waits up to `max_wait_ms` for more."""

from __future__ import annotations

from setl.config import BatchSettings
from setl.model import Batch, Position, Transaction
from setl.runtime import Progress
from setl.scheduler.cutter import (
    BEHIND_RECHECK,
    BEHIND_WAIT_SECONDS,
    IDLE_ACK_SECONDS,
    NOTIFIED_IDLE,
    BatchCutter,
)
from setl.testing.harness import ScriptedSource, insert


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rig(transactions: int, max_wait_ms: int = 1000) -> tuple[ScriptedSource, BatchCutter, Clock]:
    source = ScriptedSource([[insert("t", {"id": i})] for i in range(transactions)])
    source.open(None)
    clock = Clock()
    cutter = BatchCutter("p", source, BatchSettings(max_rows=100, max_wait_ms=max_wait_ms), clock, lambda: True)
    cutter.reset(None, 1)
    return source, cutter, clock


def cut(cutter: BatchCutter, epoch: int = 1) -> Batch | Progress:
    if not cutter.cutting:
        cutter.begin(epoch)
    return cutter.read()


def test_the_first_batch_after_a_start_is_cut_once_the_source_has_nothing_ready():
    """The first batch takes every transaction the source has ready and is cut at once, though
    its `max_wait_ms` (1 s on a clock that does not move) has not passed."""
    _, cutter, _ = rig(3)
    batch = cut(cutter)
    assert isinstance(batch, Batch)
    assert (batch.id, len(batch), batch.end) == (1, 3, Position("scripted", 3))


def test_a_later_batch_still_waits_max_wait_for_more():
    """After the first batch is handed on, a batch with the source drained waits: no batch until
    `max_wait_ms` has passed, then one holding what arrived meanwhile."""
    source, cutter, clock = rig(1)
    first = cut(cutter)
    assert isinstance(first, Batch)
    cutter.handed_on(first)
    source.append([insert("t", {"id": 10})])
    assert cut(cutter) is Progress.PROGRESS  # read one transaction, waits for more
    source.append([insert("t", {"id": 11})])
    assert cut(cutter) is Progress.PROGRESS
    assert cut(cutter) is Progress.NO_PROGRESS
    clock.now += 1.0
    second = cut(cutter)
    assert isinstance(second, Batch)
    assert (second.id, len(second), second.start, second.end) == (2, 2, first.end, Position("scripted", 3))


def test_a_rewind_makes_the_next_batch_a_first_one_again():
    """`reset` (a rollback's rewind) cuts its first batch without lingering too."""
    source, cutter, _ = rig(2)
    first = cut(cutter)
    assert isinstance(first, Batch)
    cutter.handed_on(first)
    source.seek(Position("scripted", 1))
    cutter.reset(Position("scripted", 1), 2)
    again = cut(cutter, epoch=2)
    assert isinstance(again, Batch)
    assert (again.id, again.epoch, len(again), again.end) == (2, 2, 1, Position("scripted", 2))


def test_a_first_batch_with_nothing_to_read_waits_for_its_first_transaction():
    """With nothing ready, the first batch is not cut empty: it waits for a transaction, then is cut
    as soon as the source has nothing more."""
    source, cutter, _ = rig(0)
    assert cut(cutter) is Progress.NO_PROGRESS
    source.append([insert("t", {"id": 1})])
    batch = cut(cutter)
    assert isinstance(batch, Batch)
    assert (batch.id, len(batch)) == (1, 1)


def test_a_batch_of_position_marks_only_waits_the_idle_interval_and_a_change_cuts_it_at_max_wait():
    """A batch holding only transactions with no change (an idle pipeline) is cut after
    `IDLE_ACK_SECONDS`, not `max_wait_ms`; its first change brings the cut back to `max_wait_ms`."""
    source, cutter, clock = rig(1, max_wait_ms=100)
    first = cut(cutter)
    assert isinstance(first, Batch)
    cutter.handed_on(first)
    for _ in range(3):
        source.append([])  # transactions of tables the pipeline does not read: position marks
    assert cut(cutter) is Progress.PROGRESS
    clock.now += 0.5  # past max_wait_ms, short of the idle interval
    assert cut(cutter) is Progress.NO_PROGRESS
    clock.now += IDLE_ACK_SECONDS - 0.5
    idle = cut(cutter)
    assert isinstance(idle, Batch)
    assert (idle.id, len(idle), idle.end) == (2, 0, Position("scripted", 4))
    cutter.handed_on(idle)
    source.append([])
    assert cut(cutter) is Progress.PROGRESS
    clock.now += 0.5
    source.append([insert("t", {"id": 20})])
    assert cut(cutter) is Progress.PROGRESS  # a change: max_wait_ms from now, not the idle interval
    clock.now += 0.05
    assert cut(cutter) is Progress.NO_PROGRESS
    clock.now += 0.05
    busy = cut(cutter)
    assert isinstance(busy, Batch)
    assert (busy.id, len(busy), busy.end) == (3, 1, Position("scripted", 6))


class BehindSource(ScriptedSource):
    """A scripted source that says it reads a backlog while `is_behind` is set (`Select.behind`)."""

    is_behind = False

    def behind(self) -> bool:
        return self.is_behind


def behind_rig(max_wait_ms: int = 100, max_rows: int = 100) -> tuple[BehindSource, BatchCutter, Clock, Batch]:
    """A cutter past its first batch on a `BehindSource` said to be behind."""
    source = BehindSource([[insert("t", {"id": 0})]])
    source.open(None)
    clock = Clock()
    cutter = BatchCutter("p", source, BatchSettings(max_rows=max_rows, max_wait_ms=max_wait_ms), clock, lambda: True)
    cutter.reset(None, 1)
    first = cut(cutter)
    assert isinstance(first, Batch)
    cutter.handed_on(first)
    source.is_behind = True
    return source, cutter, clock, first


def test_a_source_behind_fills_a_batch_past_max_wait_until_the_behind_wait():
    """While the source is behind, a batch past max_wait_ms keeps taking transactions, cut at BEHIND_WAIT_SECONDS."""
    source, cutter, clock, first = behind_rig(max_wait_ms=100)
    for k in range(1, 6):
        source.append([insert("t", {"id": k})])
        assert cut(cutter) is Progress.PROGRESS
        clock.now += 0.15  # each arrival is past the batch's max_wait_ms (0.1 s) after its first change
    assert cut(cutter) is Progress.NO_PROGRESS  # 0.75 s: still short of the behind wait, nothing ready
    clock.now += BEHIND_WAIT_SECONDS - 0.75
    batch = cut(cutter)
    assert isinstance(batch, Batch)
    assert (batch.id, len(batch), batch.start, batch.end) == (2, 5, first.end, Position("scripted", 6))


def test_a_batch_held_while_behind_is_cut_as_soon_as_the_source_is_no_longer_behind():
    """A batch held past max_wait_ms is cut at the next check once the source reaches its log's end."""
    source, cutter, clock, _ = behind_rig(max_wait_ms=100)
    source.append([insert("t", {"id": 1})])
    assert cut(cutter) is Progress.PROGRESS
    clock.now += 0.2
    source.append([insert("t", {"id": 2})])
    assert cut(cutter) is Progress.PROGRESS  # behind: past max_wait_ms, it takes the next one too
    source.is_behind = False
    clock.now += BEHIND_RECHECK
    batch = cut(cutter)
    assert isinstance(batch, Batch) and len(batch) == 2
    assert clock.now - 100.0 < BEHIND_WAIT_SECONDS / 2


def test_a_source_at_its_end_is_cut_at_max_wait_as_before():
    """Not behind, a later batch is cut at max_wait_ms, whatever BEHIND_WAIT_SECONDS says."""
    source, cutter, clock, _ = behind_rig(max_wait_ms=100)
    source.is_behind = False
    source.append([insert("t", {"id": 1})])
    assert cut(cutter) is Progress.PROGRESS
    clock.now += 0.1
    source.append([insert("t", {"id": 2})])
    batch = cut(cutter)
    assert isinstance(batch, Batch) and len(batch) == 1


def test_a_batch_held_while_behind_still_stops_at_max_rows_and_keeps_a_split_piece_exact():
    """Behind, a batch still ends at max_rows, and a transaction in pieces is cut at its pieces' checkpoints."""
    source = BehindSource([[insert("t", {"id": 0})]], max_rows=3)
    source.open(None)
    clock = Clock()
    cutter = BatchCutter("p", source, BatchSettings(max_rows=4, max_wait_ms=100), clock, lambda: True)
    cutter.reset(None, 1)
    first = cut(cutter)
    assert isinstance(first, Batch)
    cutter.handed_on(first)
    source.is_behind = True
    source.append([insert("t", {"id": k}) for k in range(10, 17)])  # 7 rows: pieces of 3, 3, 1
    clock.now += 0.5
    batches = []
    while len(batches) < 2:
        got = cut(cutter)
        if isinstance(got, Batch):
            batches.append(got)
            cutter.handed_on(got)
        else:
            clock.now += 0.5
    assert [len(b) for b in batches] == [6, 1]  # 3 + 3 reach max_rows 4; the rest waits for its own cut
    assert batches[0].end == Position("scripted", 1, row=6) and batches[1].end == Position("scripted", 2)
    assert [c.after["id"] for b in batches for c in b.changes] == list(range(10, 17))


def test_a_batch_of_position_marks_is_not_held_by_a_source_behind():
    """Position marks only (no change) are cut at their idle ack whether or not the source is behind."""
    source, cutter, clock, _ = behind_rig(max_wait_ms=100)
    source.append(Transaction((), Position("scripted", 2)))
    assert cut(cutter) is Progress.PROGRESS
    clock.now += IDLE_ACK_SECONDS
    batch = cut(cutter)
    assert isinstance(batch, Batch) and len(batch) == 0


def test_a_source_that_announces_rows_lets_select_wait_until_its_batch_falls_due():
    """`idle_for` after an empty read: None (the service's back-off) for a source that does not
    announce new rows or when Select's polls block; for one that does (`Select.notifies`),
    `NOTIFIED_IDLE` with no change in the batch, and the time left to the batch's deadline once it
    holds changes (never past it, never below 0)."""
    source, cutter, clock = rig(1, max_wait_ms=100)
    first = cut(cutter)
    assert isinstance(first, Batch)
    cutter.handed_on(first)
    assert cut(cutter) is Progress.NO_PROGRESS
    assert cutter.idle_for() is None  # a scripted source does not announce
    source.notifies = lambda: True  # type: ignore[method-assign]
    assert cutter.idle_for() == NOTIFIED_IDLE  # nothing taken: no deadline
    source.append([insert("t", {"id": 10})])
    assert cut(cutter) is Progress.PROGRESS
    assert cut(cutter) is Progress.NO_PROGRESS
    assert abs(cutter.idle_for() - 0.1) < 1e-9  # due in max_wait_ms
    clock.now += 0.07
    assert abs(cutter.idle_for() - 0.03) < 1e-9
    clock.now += 0.5
    assert cutter.idle_for() == 0.0
    cutter.blocking = True  # polls wait in the source: nothing to add
    assert cutter.idle_for() is None
    cutter.blocking = False
    assert isinstance(cut(cutter), Batch)
