"""Created tables match the source (issue 26.2): expression defaults stay expressions, INVISIBLE
columns stay invisible, a system-versioned table and a table whose key defaults to a sequence's
next value are created and copied; what is deliberately not created is listed in docs/schema.md.

Each table is created by `setl start` with `start: snapshot` (tables created, then copied), and
again from the binlog alone (the source's CREATE statements replicated as DDL, the rows as row
events), and compared with the source by SHOW CREATE TABLE, less what docs/schema.md says is left
out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from setl.sinks.postgresql_ddl import pg_name
from tests.e2e.setl_process import mysql_target, postgres_target
from tests.schema.test_schema import make, position, q, run_source

pytestmark = pytest.mark.timeout(300)

SOURCE = [
    "CREATE TABLE expr (id INT NOT NULL PRIMARY KEY, a VARCHAR(10) DEFAULT concat('a','b'), "
    "n INT DEFAULT (1 + 1), s VARCHAR(12) DEFAULT 'it''s', d DATETIME DEFAULT current_timestamp(), "
    "u UUID DEFAULT uuid(), f DOUBLE DEFAULT -1.5e3, b BIT(3) DEFAULT b'101')",
    "CREATE TABLE inv (id INT NOT NULL PRIMARY KEY, v INT, h INT INVISIBLE DEFAULT 3)",
    "CREATE TABLE ver (id INT NOT NULL PRIMARY KEY, v INT) WITH SYSTEM VERSIONING",
    "CREATE SEQUENCE seq1",
    "CREATE TABLE seqd (id INT NOT NULL DEFAULT NEXTVAL(seq1) PRIMARY KEY, v INT)",
    "INSERT INTO expr (id) VALUES (1), (2)",
    "INSERT INTO inv (id, v, h) VALUES (1, 1, 10), (2, 2, 20)",
    "INSERT INTO ver VALUES (1, 1), (2, 2)",
    "UPDATE ver SET v = 5 WHERE id = 1",
    "INSERT INTO seqd (v) VALUES (1), (2), (3)",
]


def _shape(create: str, source_db: str, target_db: str) -> str:
    """SHOW CREATE TABLE less what is deliberately not created: table options, system versioning."""
    body = create.replace(f"`{source_db}`", f"`{target_db}`")
    body = re.sub(r"\)[^)]*$", ")", body)  # ENGINE=..., WITH SYSTEM VERSIONING
    return body.replace(f"nextval(`{source_db}`.`seq1`)", "").replace(" DEFAULT ,", ",")


def _started(mariadb_source: Any, source_db: str, start: str) -> Any:
    """Run SOURCE on the source; the pipeline's start: ``snapshot``, or the binlog position before SOURCE."""
    begin = position(mariadb_source)
    run_source(mariadb_source, source_db, SOURCE)
    return "snapshot" if start == "snapshot" else begin


@pytest.mark.parametrize("start", ["snapshot", "binlog"])
def test_created_tables_match_the_source_and_are_copied(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                        mariadb_target: Any, mysql_db: str, start: str) -> None:
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.(expr|inv|ver|seqd|seq1)", "target": f"{mysql_db}.{{table}}"}],
                start=_started(mariadb_source, source_db, start))
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    for table in ("expr", "inv", "ver"):
        source = mariadb_source.query(f"SHOW CREATE TABLE {q(source_db)}.{table}")[0][1]
        target = mariadb_target.query(f"SHOW CREATE TABLE {q(mysql_db)}.{table}")[0][1]
        assert _shape(target, mysql_db, mysql_db) == _shape(source, source_db, mysql_db), table
    target = mariadb_target.query(f"SHOW CREATE TABLE {q(mysql_db)}.seqd")[0][1]
    # the default drawing on a sequence is left out in both modes (docs/sql-targets.md)
    assert "`id` int(11) NOT NULL," in target and "nextval" not in target.lower()
    for table, columns in (("expr", "id, a, n, s, u, f, b"), ("inv", "id, v, h"), ("ver", "id, v"),
                           ("seqd", "id, v")):
        query = f"SELECT {columns} FROM {{}}.{table} ORDER BY id"
        assert mariadb_target.query(query.format(q(mysql_db))) == mariadb_source.query(query.format(q(source_db)))
    assert mariadb_target.query(f"SELECT * FROM {q(mysql_db)}.inv ORDER BY id") == [(1, 1), (2, 2)]  # h invisible


@pytest.mark.parametrize("start", ["snapshot", "binlog"])
def test_the_same_tables_into_postgresql(tmp_path: Path, mariadb_source: Any, source_db: str,
                                         postgres_server: Any, postgres_db: str, start: str) -> None:
    """PostgreSQL: the versioned table without its period, the sequence-keyed table without the
    default, the UUID column as uuid; every row copied."""
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.(expr|inv|ver|seqd|seq1)", "target": f"{source_db}.{{table}}"}],
                start=_started(mariadb_source, source_db, start))
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    for table, columns in (("expr", "id, a, n, s, f, b"), ("inv", "id, v, h"), ("ver", "id, v"),
                           ("seqd", "id, v")):
        got = postgres_server.query(f'SELECT {columns} FROM "{source_db}".{table} ORDER BY id', dbname=postgres_db)
        source = columns.replace(", b", ", b + 0")  # BIT maps to bigint
        assert [tuple(r) for r in got] == mariadb_source.query(f"SELECT {source} FROM {q(source_db)}.{table} "
                                                               "ORDER BY id"), table
    uuids = postgres_server.query(f'SELECT u::text FROM "{source_db}".expr ORDER BY id', dbname=postgres_db)
    assert [r[0] for r in uuids] == [r[0] for r in mariadb_source.query(f"SELECT u FROM {q(source_db)}.expr "
                                                                         "ORDER BY id")]


def test_a_long_name_mapped_onto_another_column_is_refused_with_the_table(
        tmp_path: Path, mariadb_source: Any, source_db: str, postgres_server: Any, postgres_db: str) -> None:
    """Names over 63 bytes are mapped (cut plus a hash: tests/schema/test_long_names.py); a column
    whose own name is another's mapped name cannot be told apart: one line naming the table and
    both columns, exit 2, before anything is created."""
    first = "c" * 63 + "1"
    second = pg_name(first)
    run_source(mariadb_source, source_db, [f"CREATE TABLE longn (id INT PRIMARY KEY, `{first}` INT, `{second}` INT)"])
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.longn", "target": f"{source_db}.{{table}}"}])
    result = setl.run("schema", "--pipeline", setl.name, "--apply")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and f"{source_db}.longn" in result.stderr, result.stderr
    assert repr(first) in result.stderr and repr(second) in result.stderr
    assert postgres_server.query("SELECT count(*) FROM information_schema.tables WHERE table_name = 'longn'",
                                 dbname=postgres_db) == [(0,)]
