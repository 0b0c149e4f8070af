"""`Select.behind` of the binlog source: True while its reader reads a backlog (transactions read
`LATE_SECONDS` after their commit), False once it reads at the log's end; the cutter fills batches
past `max_wait_ms` only then (tests/scheduler/test_cutter.py)."""

from __future__ import annotations

import time

from setl.sources.mysql_binlog.handoff import LATE_FRESH, LATE_SECONDS, ReaderFigures
from setl.testing.servers import wait_until
from tests.sources.binlog import execute, head, make_source, read


def test_figures_are_behind_only_shortly_after_a_late_read():
    """behind() holds for LATE_FRESH after a transaction read late, and never before one."""
    figures = ReaderFigures()
    assert not figures.behind(time.time())
    figures.late = 1000.0
    assert figures.behind(1000.0 + LATE_FRESH / 2) and not figures.behind(1000.0 + LATE_FRESH)


def test_a_reader_is_behind_on_a_backlog_and_not_at_the_logs_end(mariadb_source, source_db):
    """Reading transactions committed seconds ago says behind; once past them and reading new ones, not."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, *(f"INSERT INTO t VALUES ({i})" for i in range(1, 41)))
    time.sleep(LATE_SECONDS + 1.0)  # a backlog: every one of them is read at least LATE_SECONDS after its commit
    src = make_source(mariadb_source)
    try:
        assert not src.behind()
        opened = time.time()
        src.open(start)
        got = read(src, 1, source_db)
        # read late (`behind` held then: it holds for LATE_FRESH after, asserted below it ends)
        assert got and src.figures.late >= opened
        read(src, 39, source_db)
        wait_until(lambda: not src.behind(), timeout=LATE_FRESH + 1.0, interval=0.05, message="not behind")
        execute(mariadb_source, source_db, "INSERT INTO t VALUES (100)")  # live: read within its commit's second
        assert [c.after for c in read(src, 1, source_db)[0].changes] == [{"id": 100}]
        assert not src.behind()
    finally:
        src.close()
