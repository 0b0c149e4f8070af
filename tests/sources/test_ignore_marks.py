"""`ignore_marks`: the binlog source drops whole every transaction holding a row of setl's mark
table with one of those marks, and every DDL carrying the mark's comment (a two-way channel's
marker-row loop guard, docs/bidirectional.md), as written by the loader's own connection class:
rows, DDL, a transaction big enough to be split; other marks and the users' writes pass."""

from __future__ import annotations

from typing import Any

import pytest

from setl.dial import mysql_connection
from setl.errors import SourceError
from setl.loop_marks import MARK_DDL
from setl.model import DdlChange, RowChange
from setl.sinks.mysql_loop_guard import MarkedConnection, start_marking
from setl.testing.servers import wait_until
from tests.sources.binlog import execute, head, read

THEIRS, OTHER = "ch:west-to-east", "other:a-to-b"  # the mark this reader drops; another channel's


def loader(server: Any, db: str, mark: str) -> MarkedConnection:
    """A connection as a marker-guarded loader opens it (autocommit off, several statements at once)."""
    conn = mysql_connection(host=server.host, port=server.port, user=server.user, password=server.password,
                            database=db, autocommit=False, connect_timeout=10, cls=MarkedConnection,
                            client_flag=1 << 16)  # CLIENT.MULTI_STATEMENTS
    start_marking(conn, mark)
    return conn


def run(conn: MarkedConnection, *statements: str) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def write_echoes(server: Any, db: str, count: int = 3) -> None:
    """`count` position writes of the other direction's loader (marked `THEIRS`): echoes, each its own transaction."""
    conn = loader(server, db, THEIRS)
    try:
        for n in range(count):
            run(conn, f"INSERT INTO setl.echo_pos VALUES (1, {n}) ON DUPLICATE KEY UPDATE n = {n}")
            conn.commit()
    finally:
        conn.close()


def test_marked_transactions_are_dropped_whole_and_others_pass(mariadb_source, source_db, sources):
    """Rows, DDL and a split transaction written under the ignored mark never come out; other marks' rows do."""
    execute(mariadb_source, source_db, "CREATE DATABASE IF NOT EXISTS setl", MARK_DDL,
            "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
    start = head(mariadb_source)
    src = sources(mariadb_source, start, ignore_marks=(THEIRS,), max_rows_in_memory=10)
    conn = loader(mariadb_source, source_db, THEIRS)
    try:
        big = ", ".join(f"({k}, 'm{k}')" for k in range(100, 135))  # 35 rows: 3 pieces and a rest if it were read
        run(conn, "INSERT INTO t VALUES (1, 'mine')")
        conn.commit()
        run(conn, f"INSERT INTO t VALUES {big}", "UPDATE t SET v = 'x' WHERE id = 1")
        conn.commit()
        run(conn, "CREATE TABLE marked (id INT PRIMARY KEY)", "ALTER TABLE t ADD COLUMN w INT NULL",
            "DROP TABLE marked")
        run(conn, "UPDATE t SET v = 'y' WHERE id = 100; COMMIT")  # a multi-statement ending in COMMIT
        run(conn, "UPDATE t SET v = 'z' WHERE id = 101")  # ... the next one is marked again
        conn.commit()
        marked_end = head(mariadb_source)
        # from this test's start: the shared server's binlog holds other tests' events, some unreadable here
        events = mariadb_source.query("SHOW BINLOG EVENTS IN %s FROM %s", (
            marked_end.log, start.offset if start.log == marked_end.log else 4))
        assert any("/* setl-channel:ch:west-to-east */ ALTER TABLE" in str(e[5]) for e in events), events[-20:]
    finally:
        conn.close()
    other = loader(mariadb_source, source_db, OTHER)
    try:
        run(other, "INSERT INTO t (id, v) VALUES (2, 'other')")
        other.commit()
    finally:
        other.close()
    execute(mariadb_source, source_db, "INSERT INTO t (id, v) VALUES (3, 'user')",  # a user's session
            "ALTER TABLE t ADD COLUMN z INT NULL")
    got = read(src, 3, source_db)
    changes = [c for tx in got for c in tx.changes]
    assert [(c.table, c.after) for c in changes[:2] if isinstance(c, RowChange)] == [
        ("t", {"id": 2, "v": "other", "w": None}), ("t", {"id": 3, "v": "user", "w": None})], changes
    assert isinstance(changes[2], DdlChange) and "ADD COLUMN z" in changes[2].statement
    assert len(changes) == 3  # no mark row comes out, of either mark
    assert all(tx.complete for tx in got)
    assert got[0].end.log == marked_end.log and got[0].end.offset > marked_end.offset


def test_an_echo_moves_no_position_until_a_transaction_passes(mariadb_source, source_db, sources):
    """A marked transaction writing only setl's tables (a loader's position) hands on no position mark: no echo."""
    execute(mariadb_source, source_db, "CREATE DATABASE IF NOT EXISTS setl", MARK_DDL,
            "CREATE TABLE IF NOT EXISTS setl.echo_pos (id INT PRIMARY KEY, n INT)",
            "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    src = sources(mariadb_source, start, ignore_marks=(THEIRS,))
    write_echoes(mariadb_source, source_db)
    echoes_end = head(mariadb_source)
    assert echoes_end.offset > start.offset
    for _ in range(15):  # three heartbeats' worth of polling: nothing may move past the echoes
        tx = src.poll(0.2)
        assert tx is None or tx.end <= start, tx
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (7)")
    got = read(src, 1, source_db)
    assert [c.after for c in got[0].changes] == [{"id": 7}] and got[0].end.offset > echoes_end.offset


def test_a_mark_after_handed_on_pieces_stops_the_reader(mariadb_source, source_db, sources):
    """A mark met after pieces of its transaction were handed on cannot drop it exactly: the reader stops, naming it."""
    execute(mariadb_source, source_db, "CREATE DATABASE IF NOT EXISTS setl", MARK_DDL,
            "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    src = sources(mariadb_source, start, ignore_marks=(THEIRS,), max_rows_in_memory=10)
    rows = ", ".join(f"({k})" for k in range(1, 26))
    mark = f"INSERT INTO setl.setl_channel_mark (mark, session, seq) VALUES ('{THEIRS}', 1, 1)"
    execute(mariadb_source, source_db, "BEGIN", "INSERT INTO t VALUES (500), (501)", mark, "COMMIT")  # held: dropped
    execute(mariadb_source, source_db, "BEGIN", f"INSERT INTO t VALUES {rows}", mark.replace(", 1, 1)", ", 2, 1)"),
            "COMMIT")
    got: list[Any] = []
    with pytest.raises(SourceError, match=r"after 20 row changes of its transaction .* were handed on in pieces"):
        for _ in range(100):
            tx = src.poll(0.2)
            if tx is not None:
                got.append(tx)
    handed = [c.after["id"] for tx in got for c in tx.changes if isinstance(c, RowChange)]
    assert handed == list(range(1, 21)), handed  # the two pieces before the mark; not 500, 501


def test_mark_rows_stay_bounded_and_their_pruning_never_crosses(mariadb_source, source_db, sources):
    """Loader connections that come and go leave a mark row per live session only, and nothing marked comes out."""
    mark = "prune:west-to-east"
    execute(mariadb_source, source_db, "CREATE DATABASE IF NOT EXISTS setl", MARK_DDL,
            "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
    start = head(mariadb_source)
    src = sources(mariadb_source, start, ignore_marks=(mark,), max_rows_in_memory=10)

    def marks() -> list[int]:
        return [r[0] for r in mariadb_source.query(
            "SELECT session FROM setl.setl_channel_mark WHERE mark = %s ORDER BY session", (mark,))]

    def live(sessions: list[int]) -> set[int]:  # those of `sessions` the server still lists
        ids = {r[0] for r in mariadb_source.query("SELECT ID FROM information_schema.PROCESSLIST")}
        return ids & set(sessions)

    kept = [loader(mariadb_source, source_db, mark) for _ in range(2)]  # live all along: their rows stay
    closed: list[int] = []
    try:
        for k, conn in enumerate(kept):  # a session's row appears with its first marked transaction
            run(conn, f"INSERT INTO t VALUES ({200 + k}, 'kept')")
            conn.commit()
        for n in range(25):  # connections that write once and go (a loader's reconnects, restarts)
            conn = loader(mariadb_source, source_db, mark)
            closed.append(conn.thread_id())
            run(conn, f"INSERT INTO t VALUES ({n}, 'c{n}') ON DUPLICATE KEY UPDATE v = 'again'")
            conn.commit()
            conn.close()
            # bounded: the kept two, this one, and at most the last two gone ones (still closing at the prune)
            assert len(marks()) <= 5, (n, marks(), closed)
        wait_until(lambda: not live(closed), timeout=10, message="closed sessions still listed")
        last = loader(mariadb_source, source_db, mark)
        try:
            run(last, "INSERT INTO t VALUES (100, 'last')")
            last.commit()
            assert marks() == sorted([c.thread_id() for c in kept] + [last.thread_id()])
            run(last, "CREATE TABLE pruned (id INT PRIMARY KEY)", "DROP TABLE pruned")  # DROP: known by session
            for k, conn in enumerate(kept):  # a kept session's row still carries its marks
                run(conn, f"UPDATE t SET v = 'kept again' WHERE id = {200 + k}")
                conn.commit()
        finally:
            last.close()
    finally:
        for conn in kept:
            conn.close()
    execute(mariadb_source, source_db, "INSERT INTO t (id, v) VALUES (999, 'user')")
    got = read(src, 1, source_db)
    changes = [c for tx in got for c in tx.changes]
    assert [(c.table, c.after) for c in changes] == [("t", {"id": 999, "v": "user"})], changes
    assert len(mariadb_source.query(f"SELECT * FROM {source_db}.t")) == 25 + 1 + 2 + 1
