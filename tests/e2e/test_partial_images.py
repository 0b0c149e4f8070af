"""Partial row images (issue 33.2): sessions with binlog_row_image NOBLOB or MINIMAL, read from a real
MariaDB binlog, leave a MariaDB or PostgreSQL target equal to the source in every column, or pause the
pipeline with one line naming table, position, cause and fix."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from setl.model import Batch, Op, Position, RowChange, TableName
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(300)

ROWS = 1200
COLUMNS = "id, n, s, body, data, d, m"


def _target(kind: str, request: pytest.FixtureRequest, tables: dict[str, str], name: str) -> tuple[Any, str, Any]:
    """A load into a fresh database of `kind` holding `tables` (name -> column list), its schema, and a
    function returning a table's rows (every column, by key)."""
    if kind == "mariadb":
        server, db = request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db")
        for table, columns in tables.items():
            server.query(f"CREATE TABLE `{db}`.`{table}` ({columns})")
        load = MysqlLoad(server.target_config(), pipeline=name, position_schema=db)
        return load, db, lambda table: [tuple(r) for r in server.query(
            f"SELECT {COLUMNS} FROM `{db}`.`{table}` ORDER BY id")]
    server, db = request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db")
    server.query('CREATE SCHEMA "s"', dbname=db)
    for table, columns in tables.items():
        pg_columns = columns.replace("BLOB", "bytea").replace("TEXT", "text").replace("DATETIME", "timestamp")
        server.query(f'CREATE TABLE "s"."{table}" ({pg_columns})', dbname=db)
    load = PostgresqlLoad(server.target_config(db), pipeline=name)
    return load, "s", lambda table: [
        tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
        for r in server.query(f'SELECT {COLUMNS} FROM "s"."{table}" ORDER BY id', dbname=db)]


TABLE = "id INT PRIMARY KEY, n INT NOT NULL, s VARCHAR(20), body TEXT, data BLOB, d DATETIME(6), m DECIMAL(10,2)"


def _source_rows(source: Any, db: str, table: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in source.query(f"SELECT {COLUMNS} FROM `{db}`.`{table}` ORDER BY id")]


@pytest.mark.parametrize("kind", ["mariadb", "postgresql"])
def test_noblob_and_minimal_updates_leave_the_target_equal(kind, request, mariadb_source, source_db, tmp_path):
    """The issue's case: 1,200 rows with TEXT/BLOB copied by a snapshot (reads), then NOBLOB and MINIMAL
    updates (non-blob columns, blob columns, two of one row in one transaction, inserts updated in their
    own batch, deletes): every column of every row ends equal."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t ({TABLE})")
    load, schema, rows = _target(kind, request, {"t": TABLE}, f"partial_{kind}")
    rule = [table_rule(rf"{source_db}\.t", f"{schema}.t")]
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        values = ", ".join(f"({i}, {i}, 's{i}', 'body {i}', x'{i:04x}', '2024-01-02 03:04:05.{i:06d}', {i}.25)"
                           for i in range(ROWS))
        cur.execute(f"INSERT INTO t VALUES {values}")
        conn.commit()
    names = [c.strip() for c in COLUMNS.split(",")]
    reads = tuple(RowChange(Op.READ, schema, "t", ("id",), None, dict(zip(names, row)), Position("snapshot", 1),
                            source=TableName(source_db, "t")) for row in _source_rows(mariadb_source, source_db, "t"))
    try:  # the copy a snapshot makes: one chunk of reads, through the targets' bulk paths
        load.load(Batch(f"partial_{kind}", 1, 1, Position("snapshot", 0), Position("snapshot", 1), reads))
    finally:
        load.close()
    assert rows("t") == _source_rows(mariadb_source, source_db, "t")
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db, autocommit=False)) as conn, \
            conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_image = NOBLOB")
        cur.execute("UPDATE t SET n = n * 7 WHERE id % 9 = 0")  # the update: 134 rows, body untouched
        conn.commit()
        cur.execute("UPDATE t SET body = CONCAT(body, ' it''s \\\\ \"é\" 100%'), data = x'ff00' WHERE id % 50 = 1")
        cur.execute("UPDATE t SET d = d + INTERVAL 1 DAY, m = m * 3, s = 'a''b\\\\c' WHERE id % 13 = 0")
        conn.commit()
        cur.execute("SET SESSION binlog_row_image = MINIMAL")
        cur.execute("UPDATE t SET s = 'min' WHERE id % 11 = 0")
        cur.execute("UPDATE t SET n = -1 WHERE id = 22")  # two partial updates of one row in one batch
        cur.execute("UPDATE t SET body = NULL WHERE id = 22")
        cur.execute("DELETE FROM t WHERE id % 100 = 5")
        conn.commit()
        cur.execute("SET SESSION binlog_row_image = FULL")
        cur.execute("INSERT INTO t VALUES (2000, 1, 'new', 'bd', x'01', NULL, 1), (2001, 2, 'n', 'b', x'02', NULL, 2)")
        cur.execute("SET SESSION binlog_row_image = NOBLOB")
        cur.execute("UPDATE t SET n = n + 100 WHERE id >= 2000")  # onto the whole rows inserted in this batch
        conn.commit()
    load, _, _ = _target_again(kind, request, f"partial_{kind}_stream")
    replicate(mariadb_source, start, rule, load, tmp_path, name=f"partial_{kind}_stream")
    expected = _source_rows(mariadb_source, source_db, "t")
    assert len(expected) == ROWS - 12 + 2 and rows("t") == expected


def _target_again(kind: str, request: pytest.FixtureRequest, name: str) -> tuple[Any, str, None]:
    """A second load into the database `_target` made (its tables exist already)."""
    if kind == "mariadb":
        server, db = request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db")
        return MysqlLoad(server.target_config(), pipeline=name, position_schema=db), db, None
    server, db = request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db")
    return PostgresqlLoad(server.target_config(db), pipeline=name), "s", None


@pytest.mark.parametrize(("kind", "image", "statement", "cause"), [
    ("mariadb", "MINIMAL", "INSERT INTO t (id, s) VALUES (5000, 'x')", "the insert's image lacks the columns"),
    ("postgresql", "NOBLOB", "INSERT INTO t (id, n) VALUES (5000, 1)", "the insert's image lacks the columns"),
    ("mariadb", "MINIMAL", "UPDATE t SET id = 5000 WHERE id = 3", "changes the row's key"),
], ids=["minimal-insert", "noblob-insert", "minimal-key-change"])
def test_partial_changes_that_cannot_be_exact_pause_in_one_line(kind, image, statement, cause, request,
                                                               mariadb_source, source_db, tmp_path):
    """An insert lacking columns (their defaults are not in the binlog) or a MINIMAL key change of a row
    the batch does not hold whole pauses at once, target untouched, with one line naming it all."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t ({TABLE.replace('n INT NOT NULL', 'n INT DEFAULT 7')})")
    mariadb_source.query(f"INSERT INTO `{source_db}`.t VALUES (3, 3, 'a', 'b', x'01', NULL, NULL)")
    load, schema, rows = _target(kind, request, {"t": TABLE}, f"refuse_{kind}")
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute(f"SET SESSION binlog_row_image = {image}")
        cur.execute(statement)
        conn.commit()
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\.t", f"{schema}.t")], load, tmp_path,
                          name=f"refuse_{kind}", outcome=Outcome.PAUSED)
    error = str(scheduler.error)
    assert "\n" not in error and cause in error, error
    assert f"table={schema}.t" in error and "position=mysql-bin." in error and "stage=load" in error, error
    assert "SET GLOBAL binlog_row_image=FULL" in error, error
    assert f"setl snapshot --pipeline <pipeline> --table {source_db}.t" in error, error
    assert "attempt 2" not in error, error
    assert rows("t") == []


def test_unique_not_null_table_without_primary_key(request, mariadb_source, source_db, tmp_path):
    """A table keyed only by a UNIQUE NOT NULL column (MINIMAL logs that key alone) is applied exactly
    by that key, or refused; never a silent difference."""
    columns = TABLE.replace("INT PRIMARY KEY", "INT NOT NULL").replace("n INT NOT NULL", "n INT") + ", UNIQUE KEY (id)"
    rows_sql = "(1, 1, 'a', 'b', x'01', NULL, 1.5), (2, 2, 'c', 'd', x'02', NULL, 2)"
    mariadb_source.query(f"CREATE TABLE `{source_db}`.u ({columns})")
    mariadb_source.query(f"INSERT INTO `{source_db}`.u VALUES {rows_sql}")
    load, schema, rows = _target("mariadb", request, {"u": columns.replace("UNIQUE KEY (id)", "PRIMARY KEY (id)")},
                                 "unique")
    request.getfixturevalue("mariadb_target").query(f"INSERT INTO `{schema}`.u VALUES {rows_sql}")
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_image = MINIMAL")
        cur.execute("UPDATE u SET n = 10 WHERE id = 1")
        conn.commit()
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\.u", f"{schema}.u")], load, tmp_path,
                          name="unique", outcome=Outcome.CAUGHT_UP)
    assert scheduler.error is None
    assert rows("u") == _source_rows(mariadb_source, source_db, "u")


@pytest.mark.parametrize("image", ["NOBLOB", "MINIMAL"])
def test_keyless_table_is_logged_whole_and_applied_exactly(image, request, mariadb_source, source_db, tmp_path):
    """MariaDB logs a table without any key whole in a NOBLOB or MINIMAL session, so its changes apply
    exactly (a keyless table with a partial image, which merge refuses, never comes from it)."""
    columns = TABLE.replace("INT PRIMARY KEY", "INT")
    mariadb_source.query(f"CREATE TABLE `{source_db}`.k ({columns})")
    load, schema, rows = _target("mariadb", request, {"k": columns}, f"keyless_{image}")
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute(f"SET SESSION binlog_row_image = {image}")
        cur.execute("INSERT INTO k (id, n, body) VALUES (1, 1, 'one'), (2, 2, 'two'), (3, 3, 'three')")
        cur.execute("UPDATE k SET n = 10 WHERE id = 1")
        cur.execute("UPDATE k SET body = 'deux' WHERE id = 2")
        cur.execute("DELETE FROM k WHERE id = 3")
        conn.commit()
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.k", f"{schema}.k")], load, tmp_path,
              name=f"keyless_{image}")
    expected = _source_rows(mariadb_source, source_db, "k")
    assert len(expected) == 2 and rows("k") == expected


def test_filter_on_a_column_a_minimal_image_lacks_pauses(request, mariadb_source, source_db, tmp_path):
    """A row filter that reads a column a MINIMAL before-image lacks pauses the pipeline at Extract in one line."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t ({TABLE})")
    mariadb_source.query(f"INSERT INTO `{source_db}`.t VALUES (3, 3, 'a', 'b', x'01', NULL, NULL)")
    load, schema, rows = _target("mariadb", request, {"t": TABLE}, "filtered")
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_image = MINIMAL")
        cur.execute("UPDATE t SET s = 'z' WHERE id = 3")
        conn.commit()
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\.t", f"{schema}.t", filter="n > 0")],
                          load, tmp_path, name="filtered", outcome=Outcome.PAUSED)
    error = str(scheduler.error)
    assert "\n" not in error and "stage=extract" in error and f"table={source_db}.t" in error, error
    assert "filter of rule tables[0] reads a column the image lacks" in error and "position=mysql-bin." in error
    assert "SET GLOBAL binlog_row_image=FULL" in error and "attempt 2" not in error, error
    assert rows("t") == []
