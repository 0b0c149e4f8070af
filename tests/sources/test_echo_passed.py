"""`Select.passed` of the binlog source: where the reader read past a marker loop guard's echoes,
which hand on no position (docs/bidirectional.md, "Echoes"), with the reader thread and process."""

from __future__ import annotations

import pytest

from setl.loop_marks import MARK_DDL
from setl.testing.servers import wait_until
from tests.sources.binlog import execute, head, read
from tests.sources.test_ignore_marks import THEIRS, write_echoes


@pytest.mark.parametrize("process", [False, True], ids=["reader_thread", "reader_process"])
def test_passed_spans_the_echoes_from_the_last_end_handed_on(mariadb_source, source_db, sources, process):
    """After echoes only, passed is (the last end handed on, at least the echoes' end); a transaction moves it on."""
    execute(mariadb_source, source_db, "CREATE DATABASE IF NOT EXISTS setl", MARK_DDL,
            "CREATE TABLE IF NOT EXISTS setl.echo_pos (id INT PRIMARY KEY, n INT)",
            "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    src = sources(mariadb_source, start, ignore_marks=(THEIRS,), reader_process=process)
    assert src.passed() is None
    write_echoes(mariadb_source, source_db)
    echoes_end = head(mariadb_source)

    def polled_past_echoes() -> bool:
        tx = src.poll(0.1)
        assert tx is None or tx.end <= start, tx  # no position for an echo
        passed = src.passed()
        return passed is not None and passed[1] >= echoes_end

    wait_until(polled_past_echoes, timeout=10, interval=0.05, message=lambda: f"passed: {src.passed()}")
    after, through = src.passed()
    assert (after.log, after.offset) == (start.log, start.offset) and through.log == echoes_end.log
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (7)")
    got = read(src, 1, source_db)
    assert [c.after for c in got[0].changes] == [{"id": 7}] and got[0].end.offset > echoes_end.offset
    # a transaction handed on past the echoes: a later pair, if any, starts at or after its end
    now = src.passed()
    assert now is not None and (now == (after, through) or now[0] >= got[0].end)
