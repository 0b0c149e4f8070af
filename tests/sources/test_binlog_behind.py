"""`Select.behind` of the binlog source: True while its reader reads a backlog (transactions read
`LATE_SECONDS` after their commit), False once it reads at the log's end; the cutter fills batches
past `max_wait_ms` only then (tests/scheduler/test_cutter.py)."""

from __future__ import annotations

import threading
import time

import pytest

from setl.model import Position, RowChange, Transaction
from setl.sources.mysql_binlog.handoff import LATE_FRESH, LATE_SECONDS, ReaderFigures
from setl.sources.mysql_binlog.process import _figures, _LateFigures, _LateHandoff
from setl.testing.servers import wait_until
from tests.sources.binlog import execute, head, make_source, read


def test_figures_are_behind_only_shortly_after_a_late_read():
    """behind() holds for LATE_FRESH after a transaction read late, and never before one."""
    figures = ReaderFigures()
    assert not figures.behind(time.time())
    figures.late = 1000.0
    assert figures.behind(1000.0 + LATE_FRESH / 2) and not figures.behind(1000.0 + LATE_FRESH)


def tx(n: int) -> Transaction:
    return Transaction((RowChange("insert", "s", "t", ("id",), None, {"id": n}, Position("b.000001", n), None),),
                       Position("b.000001", n))


def test_a_reader_process_numbers_the_transactions_its_reader_read_late():
    """The child's hand-off notes each item its reader put first after reading late (as the reader thread
    sets `late` once, then hands on what it read), even at the same clock reading; the frame's figures
    carry their indices: None when none, True when all."""
    figures = _LateFigures()
    handoff = _LateHandoff(100, figures)
    stop = threading.Event()
    handoff.put(tx(1), stop)  # read in time
    figures.late = 1000.0  # a read late of two transactions
    handoff.put(tx(2), stop)
    handoff.put(tx(3), stop)
    figures.late = 1000.0  # another at the same clock reading
    handoff.put(tx(4), stop)
    assert list(handoff.late) == [1, 3] and figures.late == 1000.0 and figures.late_reads == 2
    assert _figures(figures, [], 4)[-1] is None
    assert _figures(figures, [0, 1], 2)[-1] is True
    assert _figures(figures, [1, 3], 4)[-1] == (1, 3)


@pytest.mark.parametrize("process", [False, True], ids=["reader_thread", "reader_process"])
def test_a_reader_is_behind_on_a_backlog_and_not_at_the_logs_end(mariadb_source, source_db, process):
    """Reading transactions committed seconds ago says behind; once past them and reading new ones, or
    idle, not. The same through a reader process (`sources.reader_process`): its frames say which
    transactions its reader read late."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, *(f"INSERT INTO t VALUES ({i})" for i in range(1, 41)))
    time.sleep(LATE_SECONDS + 1.0)  # a backlog: every one of them is read at least LATE_SECONDS after its commit
    src = make_source(mariadb_source, reader_process=process)
    try:
        assert not src.behind()
        opened = time.time()
        src.open(start)
        got = read(src, 1, source_db)
        # read late (`behind` held then: it holds for LATE_FRESH after, asserted below it ends)
        assert got and src.figures.late >= opened
        read(src, 39, source_db)
        wait_until(lambda: not src.behind(), timeout=LATE_FRESH + 1.0, interval=0.05, message="not behind")
        idle_until = time.monotonic() + 1.5  # past a heartbeat (1 s): an idle reader is not behind
        while time.monotonic() < idle_until:
            src.poll(0.1)
            assert not src.behind()
        execute(mariadb_source, source_db, "INSERT INTO t VALUES (100)")  # live: read within its commit's second
        assert [c.after for c in read(src, 1, source_db)[0].changes] == [{"id": 100}]
        assert not src.behind()
    finally:
        src.close()
