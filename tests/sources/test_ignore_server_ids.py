"""`ignore_server_ids`: the binlog source drops whole every transaction that sessions with those
server_ids wrote (a two-way channel's other direction, docs/bidirectional.md): rows, DDL, a
transaction big enough to be split in pieces, and a DDL inside a transaction; the others pass."""

from __future__ import annotations

from setl.model import DdlChange, RowChange
from tests.sources.binlog import execute, head, read

MARK = 4101  # the server_id the "other direction" writes with


def test_marked_transactions_are_dropped_whole_and_others_pass(mariadb_source, source_db, sources):
    """Rows, DDL and a split transaction written with a marked server_id never come out; the end moves past them."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
    src = sources(mariadb_source, head(mariadb_source), ignore_server_ids=(MARK,), max_rows_in_memory=10)
    big = ", ".join(f"({k}, 'm{k}')" for k in range(100, 135))  # 35 rows: 3 pieces and a rest if it were read
    execute(mariadb_source, source_db, f"SET SESSION server_id = {MARK}",
            "CREATE TABLE marked (id INT PRIMARY KEY)",  # a DDL on its own
            "INSERT INTO t VALUES (1, 'mine')",
            f"INSERT INTO t VALUES {big}",
            "BEGIN", "INSERT INTO t VALUES (2, 'in tx')", "SAVEPOINT s1", "UPDATE t SET v = 'x' WHERE id = 2",
            "ROLLBACK TO SAVEPOINT s1", "COMMIT",
            "ALTER TABLE t ADD COLUMN w INT NULL", "DROP TABLE marked")
    marked_end = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t (id, v) VALUES (3, 'user')",  # a user's session
            "ALTER TABLE t ADD COLUMN z INT NULL")
    got = read(src, 2, source_db)
    changes = [c for tx in got for c in tx.changes]
    assert [(type(c), getattr(c, "after", None)) for c in changes[:1]] == [(RowChange, {"id": 3, "v": "user",
                                                                                        "w": None})]
    assert isinstance(changes[1], DdlChange) and "ADD COLUMN z" in changes[1].statement
    assert len(changes) == 2
    assert all(tx.complete for tx in got)
    assert got[0].end.offset > marked_end.offset and got[0].end.log == marked_end.log
    assert src.tell() is not None and src.tell().offset >= got[1].end.offset


def test_without_the_option_every_transaction_passes(mariadb_source, source_db, sources):
    """The same marked writes come out when the source does not ignore their server_id."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))")
    src = sources(mariadb_source, head(mariadb_source), ignore_server_ids=(MARK + 1,))
    execute(mariadb_source, source_db, f"SET SESSION server_id = {MARK}", "INSERT INTO t VALUES (1, 'mine')",
            "ALTER TABLE t ADD COLUMN w INT NULL")
    got = read(src, 2, source_db)
    kinds = [type(c) for tx in got for c in tx.changes]
    assert kinds == [RowChange, DdlChange]
