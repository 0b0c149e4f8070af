"""The binlog source's hand-off to `poll` and its reader figures, driven without a server or a thread."""

from __future__ import annotations

import threading

import pytest

from setl.model import Op, Position, RowChange, Transaction
from setl.sources.mysql_binlog.handoff import Failure, Handoff, ReaderFigures, Stopped, weight


def tx(rows: int, offset: int) -> Transaction:
    """A transaction of `rows` inserts ending at offset `offset`."""
    end = Position("b.000001", offset)
    return Transaction(tuple(RowChange(Op.INSERT, "s", "t", ("id",), None, {"id": i}, end) for i in range(rows)), end)


def test_weight_counts_rows_and_at_least_one():
    """An item weighs its rows; a mark without rows and a failure weigh one."""
    assert weight(tx(3, 10)) == 3
    assert weight(tx(0, 10)) == 1
    assert weight(Failure(RuntimeError("x"), None)) == 1


def test_take_returns_in_order_and_frees_room():
    """Items come out in the order put; taking one frees its rows for the next put."""
    handoff, stop = Handoff(max_rows=5), threading.Event()
    handoff.put(tx(2, 10), stop)
    handoff.put(tx(3, 20), stop)
    assert handoff.queued_with(0) == 5 and handoff.queued_with(4) == 9
    assert [t.end.offset for t in (handoff.take(None), handoff.take(0.01))] == [10, 20]  # type: ignore[union-attr]
    assert handoff.take(None) is None and handoff.take(0.01) is None
    assert handoff.queued_with(0) == 0


def test_put_past_the_bound_waits_and_gives_up_when_stopped():
    """A put that would pass the row bound on a non-empty queue waits, and raises Stopped once stop is set."""
    handoff, stop = Handoff(max_rows=3), threading.Event()
    handoff.put(tx(2, 10), stop)
    stop.set()
    with pytest.raises(Stopped):
        handoff.put(tx(2, 20), stop)
    assert handoff.queued_with(0) == 2  # the refused item was not counted


def test_an_item_bigger_than_the_bound_enters_an_empty_queue():
    """A transaction over the bound is queued once the queue is empty (it never waits forever)."""
    handoff, stop = Handoff(max_rows=3), threading.Event()
    stop.set()  # it must not even wait
    handoff.put(tx(7, 10), stop)
    assert handoff.queued_with(0) == 7


def test_put_all_queues_in_order_and_marks_each_late_one_before_it_is_queued():
    """A frame put whole: in order, `mark` called (under the lock: it must not take it) just before each
    item of `late` is queued."""
    handoff, stop = Handoff(max_rows=100), threading.Event()
    marked: list[int] = []
    handoff.put_all([tx(2, 10), tx(2, 20), tx(0, 30), tx(1, 40)], stop, {1, 3},
                    lambda: marked.append(len(handoff._items)))
    assert marked == [1, 3] and handoff.queued_with(0) == 6
    assert [handoff.take(None).end.offset for _ in range(4)] == [10, 20, 30, 40]  # type: ignore[union-attr]


def test_put_all_waits_for_room_item_by_item_and_gives_up_when_stopped():
    """Past the bound a frame waits item by item while what it queued is taken (a taker waiting for
    an item is woken meanwhile), and gives up with Stopped once stop is set, the refused items not
    counted."""
    handoff, stop = Handoff(max_rows=4), threading.Event()
    frame = [tx(2, 10), tx(2, 20), tx(2, 30), tx(1, 40)]
    putter = threading.Thread(target=handoff.put_all, args=(frame, stop))
    putter.start()
    taken = [handoff.take(5.0) for _ in frame]  # each take frees room for the next item
    putter.join(5.0)
    assert not putter.is_alive()
    assert [t.end.offset for t in taken] == [10, 20, 30, 40]  # type: ignore[union-attr]
    assert handoff.queued_with(0) == 0
    handoff.put_all([tx(3, 50)], stop)
    stop.set()
    with pytest.raises(Stopped):
        handoff.put_all([tx(1, 60), tx(2, 70)], stop)
    assert handoff.queued_with(0) == 4  # the first fit, the second was refused
    assert [handoff.take(None).end.offset, handoff.take(None).end.offset] == [50, 60]  # type: ignore[union-attr]


def test_figures_keep_the_peak_and_the_latest_hearing():
    """The figures keep the largest buffered count, count reconnects and keep the last heard position."""
    figures = ReaderFigures()
    for rows in (3, 9, 4):
        figures.buffered(rows)
    figures.reconnected()
    figures.hear(Position("b.000001", 10), 1.0)
    figures.hear(Position("b.000001", 20), 2.0)
    figures.arrived(Position("b.000001", 20), 2.5)
    assert figures.peak_buffered_rows == 9 and figures.reconnects == 1
    assert figures.heard == (Position("b.000001", 20), 2.0)
    assert list(figures.arrivals) == [(Position("b.000001", 20), 2.5)]
