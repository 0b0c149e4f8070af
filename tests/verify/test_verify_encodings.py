"""Issue 34 point 2: targets in any server encoding. A PostgreSQL database in ``SQL_ASCII`` (psycopg
would hand catalogue names and text back as bytes) and a MariaDB database whose default charset is
latin1 are copied, streamed into and verified exactly; a table of which no column could be
compared is an error (exit 2), never equal."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target, postgres_target
from tests.schema.test_schema import q, run_source

pytestmark = pytest.mark.timeout(240)

ROWS = [(1, "plain", "2024-01-01 10:00:00"), (2, "café crème", "2024-01-02 11:00:00"),
        (3, "日本語 ✓", "2024-01-03 12:00:00")]
TABLES = ["CREATE TABLE k (id INT PRIMARY KEY, name VARCHAR(40) CHARACTER SET utf8mb4, ts DATETIME)",
          "CREATE TABLE bag (x INT NOT NULL, y VARCHAR(10) CHARACTER SET utf8mb4)",
          *(f"INSERT INTO k VALUES ({i}, '{name}', '{ts}')" for i, name, ts in ROWS),
          "INSERT INTO bag VALUES (1, 'é'), (1, 'é'), (2, 'b')"]


def pg_rows(server: Any, db: str, query: str) -> list[tuple[Any, ...]]:
    """`query`'s rows on `db`, text decoded as UTF-8 (the bytes setl wrote)."""
    with server.connect(dbname=db, client_encoding="UTF8") as conn:
        return list(conn.execute(query).fetchall())


def make(tmp_path: Path, source: Any, source_db: str, target: dict, template: str, server_id: int) -> SetlProcess:
    return SetlProcess(tmp_path, source=mysql_source(source, server_id=server_id, start="snapshot"), target=target,
                       tables=[{"source": rf"{re.escape(source_db)}\..*", "target": template}],
                       pipeline={"parallelism": 2, "batch": {"max_rows": 500, "max_wait_ms": 50},
                                 "retry": {"max_attempts": 2, "initial_backoff_ms": 50, "max_backoff_ms": 200}})


def verify(setl: SetlProcess, *tables: str) -> tuple[int, dict | None, str]:
    args = [arg for table in tables for arg in ("--table", table)]
    result = setl.run("verify", "--pipeline", setl.name, "--json", "--wait-timeout", "30", *args, timeout=90)
    report = json.loads(result.stdout) if result.returncode in (0, 1) else None
    return result.returncode, report, result.stderr


def start_stream_and_check(setl: SetlProcess, source: Any, source_db: str, stored_identity: Any) -> None:
    """Copy, stream more changes, and check status, the stored identity and verify's verdict."""
    first = setl.start_until_caught_up(timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "cannot record" not in first.stderr, first.stderr[-3000:]
    run_source(source, source_db, ["INSERT INTO k VALUES (4, 'ñandú €', '2024-01-04 13:00:00')",
                                   "UPDATE k SET name = 'crème brûlée' WHERE id = 2", "DELETE FROM k WHERE id = 1",
                                   "INSERT INTO bag VALUES (3, 'ü')"])
    streamed = setl.start_until_caught_up(timeout=120)
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    identity = json.loads(stored_identity())
    assert identity["copying"] is False, identity
    copies = setl.status()["snapshot"]
    assert sorted((c["table"], c["status"]) for c in copies) == [(f"{source_db}.bag", "done"),
                                                                (f"{source_db}.k", "done")], copies
    code, report, err = verify(setl)
    assert code == 0 and report is not None and report["equal"], json.dumps(report)
    assert sorted(t["rows"] for t in report["tables"]) == [3, 4], report
    assert all(t["unchecked_columns"] == {} for t in report["tables"]), report


def test_a_sql_ascii_postgresql_target_is_copied_streamed_and_verified(
        tmp_path: Path, mariadb_source: Any, source_db: str, postgres_server: Any, postgres_ascii_db: str) -> None:
    """Into an SQL_ASCII PostgreSQL database: copy and stream end with the identity recorded (not
    ``copying``), status says done, the text is the source's, verify says equal, and a row changed
    on the target is found different (exit 1)."""
    assert pg_rows(postgres_server, postgres_ascii_db, "SHOW server_encoding") == [("SQL_ASCII",)]
    run_source(mariadb_source, source_db, TABLES)
    setl = make(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_ascii_db),
                "public.{table}", 3401)

    def identity() -> Any:
        [(text,)] = pg_rows(postgres_server, postgres_ascii_db, "SELECT identity FROM setl.setl_position_identity")
        return text

    start_stream_and_check(setl, mariadb_source, source_db, identity)
    assert pg_rows(postgres_server, postgres_ascii_db, "SELECT id, name FROM public.k ORDER BY id") == [
        (2, "crème brûlée"), (3, "日本語 ✓"), (4, "ñandú €")]
    with postgres_server.connect(dbname=postgres_ascii_db, client_encoding="UTF8") as conn:
        conn.execute("UPDATE public.k SET name = 'crème brulée' WHERE id = 2")
    code, report, err = verify(setl, f"{source_db}.k")
    assert code == 1 and report is not None, err[-3000:]
    [table] = report["tables"]
    assert table["different"] == [{"key": {"id": "2"}, "columns": ["name"]}], table


def test_a_latin1_mariadb_target_is_copied_streamed_and_verified(
        tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any, mysql_latin1_db: str) -> None:
    """Into a MariaDB database whose default charset is latin1: the same copy, stream and verify,
    the text kept whole (the tables carry the source's charset), and a changed row found."""
    assert mariadb_target.query("SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA WHERE "
                                "SCHEMA_NAME = %s", (mysql_latin1_db,)) == [("latin1",)]
    run_source(mariadb_source, source_db, TABLES)
    setl = make(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target, database=mysql_latin1_db),
                f"{mysql_latin1_db}.{{table}}", 3402)

    def identity() -> Any:
        [(text,)] = mariadb_target.query("SELECT identity FROM setl.setl_position_identity WHERE pipeline = %s",
                                         (setl.name,))
        return text

    start_stream_and_check(setl, mariadb_source, source_db, identity)
    assert mariadb_target.query(f"SELECT id, name FROM {q(mysql_latin1_db)}.k ORDER BY id") == [
        (2, "crème brûlée"), (3, "日本語 ✓"), (4, "ñandú €")]
    mariadb_target.query(f"UPDATE {q(mysql_latin1_db)}.k SET ts = ts + INTERVAL 1 SECOND WHERE id = 3")
    code, report, err = verify(setl, f"{source_db}.k")
    assert code == 1 and report is not None, err[-3000:]
    [table] = report["tables"]
    assert table["different"] == [{"key": {"id": "3"}, "columns": ["ts"]}], table


def test_a_table_with_no_comparable_column_is_an_error(
        tmp_path: Path, mariadb_source: Any, source_db: str, postgres_server: Any, postgres_db: str) -> None:
    """A keyless table whose only column is spatial (not compared into PostgreSQL): verify exits 2
    with one line naming the table and why, and never reports it equal."""
    run_source(mariadb_source, source_db, ["CREATE TABLE g (p POINT)",
                                           "INSERT INTO g VALUES (ST_GeomFromText('POINT(1 2)'))"])
    setl = make(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                "public.{table}", 3403)
    first = setl.start_until_caught_up(timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    code, report, err = verify(setl, f"{source_db}.g")
    assert code == 2 and report is None, (code, report, err[-3000:])
    [line] = [line for line in err.splitlines() if line.startswith("setl: error")]
    assert f"table={source_db}.g" in line and "no column" in line and "compared" in line, line
