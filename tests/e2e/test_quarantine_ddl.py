"""A DDL the target refuses (a target-side column or view in its way) is the table's refusal, on
MariaDB and PostgreSQL: under ``on_table_error: quarantine`` that table is quarantined at the
statement, kept with its later rows, and the replay after the fix applies the DDL first; under
``pause`` the pipeline pauses with one line (docs/quarantine.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import psycopg
import pymysql
import pytest

from setl.ddl import parse
from setl.errors import RefusedLoadError, TableRefused
from setl.model import DdlChange
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad, MysqlTargetConfig
from setl.sinks.postgresql import PostgresqlLoad, PostgresqlTargetConfig
from setl.sinks.sql_failures import changes_one_table, ddl_refused

from .replicate import binlog_head
from .test_quarantine import TABLES, assert_equal, make_source, run, write

pytestmark = pytest.mark.timeout(180)

#: The source's ALTER: MariaDB's target refuses it for a column of the same name the target has
#: (error 1060), PostgreSQL's for a view on the column whose type it changes (SQLSTATE 0A000).
ALTER = "ALTER TABLE `{db}`.bad ADD COLUMN w INT NOT NULL DEFAULT 7, MODIFY v VARCHAR(30)"


@attrs.frozen
class Target:
    """One SQL target: its schema, a Load, a query, the obstacle in the ALTER's way and its fix."""

    kind: str
    schema: str
    load: Callable[..., Any]
    query: Callable[..., list[tuple[Any, ...]]]
    obstacle: str
    fix: str

    def rows(self, table: str, columns: str = "id, v") -> list[tuple[Any, ...]]:
        return self.query(f"SELECT {columns} FROM {self.schema}.{table} ORDER BY id")


@pytest.fixture(params=["mariadb", "postgresql"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "mariadb":
        server, db = request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db")

        def mysql_load(**options: Any) -> MysqlLoad:
            return MysqlLoad(server.target_config(), pipeline="q", position_schema=db, initial_backoff=0.01,
                             **options)

        made = Target("mariadb", db, mysql_load, lambda sql, args=None: server.query(sql, args),
                      "w INT NULL", f"ALTER TABLE `{db}`.bad DROP COLUMN w")
    else:
        server, pgdb = request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db")

        def pg_load(**options: Any) -> PostgresqlLoad:
            return PostgresqlLoad(server.target_config(pgdb), pipeline="q", initial_backoff=0.01, **options)

        made = Target("postgresql", "dw", pg_load, lambda sql, args=None: server.query(sql, args, dbname=pgdb),
                      "", "DROP VIEW dw.bad_v")
        made.query("CREATE SCHEMA dw")
    for table in TABLES:
        extra = f", {made.obstacle}" if table == "bad" and made.obstacle else ""
        made.query(f"CREATE TABLE {made.schema}.{table} (id INT PRIMARY KEY, v VARCHAR(20){extra})")
    if made.kind == "postgresql":
        made.query("CREATE VIEW dw.bad_v AS SELECT id, v FROM dw.bad")
    return made


def source_after_alter(mariadb_source: Any, source_db: str) -> tuple[Any, Any, Any]:
    """Rows before the ALTER, the ALTER, a row only the altered table takes, rows after; (start, the
    binlog before the ALTER, after it)."""
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    before = binlog_head(mariadb_source)
    mariadb_source.query(ALTER.format(db=source_db))
    after = binlog_head(mariadb_source)
    mariadb_source.query(f"INSERT INTO `{source_db}`.bad (id, v, w) VALUES (500, %s, 9)", ("y" * 25,))
    write(mariadb_source, source_db, 100)
    return start, before, after


def test_a_ddl_the_target_refuses_quarantines_its_table_and_the_replay_applies_it_first(
        mariadb_source, source_db, target, tmp_path):
    """The target refuses one table's ALTER: that table is quarantined at the ALTER (nothing of it or
    after it applied, its rows before it are), the other tables end equal; the replay before the fix
    refuses again and keeps everything; after the fix it applies the ALTER, then the kept rows, and
    every table (with the new column) ends equal, also after later changes."""
    make_source(mariadb_source, source_db)
    start, before, after = source_after_alter(mariadb_source, source_db)
    run(mariadb_source, start, source_db, target.schema, target.load(on_table_error="quarantine"), tmp_path)
    assert_equal(mariadb_source, source_db, target.rows, ("a", "b"))
    sink = target.load(on_table_error="quarantine")
    [found] = sink.quarantined()
    assert found.table == f"{target.schema}.bad" and "the target refuses this DDL" in found.cause, found
    assert "ADD COLUMN w" in found.cause and before < found.first <= after, (found, before, after)
    assert target.rows("bad") == [r for r in mariadb_source.query(
        f"SELECT id, v FROM `{source_db}`.bad WHERE id < 100 ORDER BY id")]  # up to the ALTER, as it stood
    assert sink.quarantine is not None
    conn = sink.sql.connect()
    try:
        kept = sink.quarantine.store.first_kept(conn, found.table, 3)
    finally:
        conn.close()
    assert isinstance(kept[0].change, DdlChange) and "ADD COLUMN w" in kept[0].change.statement, kept

    with pytest.raises(TableRefused, match="the target refuses this DDL"):
        sink.replay(found.table, chunk=7)
    assert sink.quarantined() == [found]  # nothing of the refused replay transaction applied

    target.query(target.fix)
    assert sink.replay(found.table, chunk=7) == found.changes
    sink.close()
    every = "id, v, w"
    assert target.rows("bad", every) == mariadb_source.query(f"SELECT {every} FROM `{source_db}`.bad ORDER BY id")
    assert_equal(mariadb_source, source_db, target.rows)
    write(mariadb_source, source_db, 300)
    run(mariadb_source, start, source_db, target.schema, target.load(on_table_error="quarantine"), tmp_path)
    assert target.rows("bad", every) == mariadb_source.query(f"SELECT {every} FROM `{source_db}`.bad ORDER BY id")
    assert_equal(mariadb_source, source_db, target.rows)
    assert target.load().quarantined() == []


def test_a_ddl_the_target_refuses_pauses_by_default_with_one_line(mariadb_source, source_db, target, tmp_path):
    """Under ``on_table_error: pause`` the refused ALTER pauses the pipeline with one TableRefused line
    naming the table, the ALTER's position and the target's cause; nothing is quarantined, and the
    target holds nothing of the ALTER or after it."""
    make_source(mariadb_source, source_db)
    start, before, after = source_after_alter(mariadb_source, source_db)
    scheduler = run(mariadb_source, start, source_db, target.schema, target.load(), tmp_path, outcome=Outcome.PAUSED)
    error = scheduler.error
    assert isinstance(error, TableRefused) and not error.retryable, error
    text = str(error)
    assert "\n" not in text and "the target refuses this DDL" in text and "ADD COLUMN w" in text, text
    assert ("Duplicate column" in text) if target.kind == "mariadb" else ("view" in text), text
    assert error.context["table"] == f"{target.schema}.bad" and error.context["stage"] == "load"
    assert before < error.context["position"] <= after, error.context
    assert target.load().quarantined() == []
    for table in TABLES:  # every table as the source held it before the ALTER
        assert all(i < 100 for i, _ in target.rows(table)), table


def test_only_a_ddl_that_changes_its_own_table_alone_is_a_table_refusal():
    """A refused DDL quarantines its table only when it touches no other: a RENAME TABLE, an ALTER
    ... RENAME TO or a CREATE TABLE ... LIKE pauses (RefusedLoadError) whatever on_table_error says."""
    one = ["ALTER TABLE t ADD COLUMN c INT", "CREATE TABLE t (id INT PRIMARY KEY)", "DROP TABLE t",
           "CREATE INDEX i ON t (c)", "TRUNCATE TABLE t", "ALTER TABLE t RENAME COLUMN a TO b"]
    several = ["RENAME TABLE t TO u", "ALTER TABLE t RENAME TO u", "CREATE TABLE u LIKE t", "DROP TABLE t, u"]
    assert [changes_one_table(parse(s)) for s in one] == [True] * len(one)
    assert [changes_one_table(parse(s)) for s in several] == [False] * len(several)
    context = {"pipeline": "p", "stage": "load", "table": None, "batch": 3, "position": None}
    renamed = DdlChange("s", "t", "RENAME TABLE t TO u", None)
    assert type(ddl_refused("denied", renamed, parse(renamed.statement), context)) is RefusedLoadError
    altered = DdlChange("s", "t", "ALTER TABLE t ADD c INT", None)
    refused = ddl_refused("denied", altered, parse(altered.statement), context)
    assert type(refused) is TableRefused and refused.context["table"] == "s.t"


@pytest.mark.parametrize("code, refused", [
    (1060, True), (1142, True), (1265, True), (1050, True), (1091, True), (1062, True),
    (1205, False), (1213, False), (2013, False), (1146, False), (1021, False), (1114, False), (1317, False),
    (1037, False),
])
def test_mariadb_ddl_errors_that_are_the_tables_refusal(code, refused):
    """A MariaDB error answered to a DDL is its table's refusal unless it is transient (a lock wait, a
    deadlock, a lost connection), a missing table, or says nothing of the table (disk or memory short,
    the statement interrupted)."""
    sql = MysqlLoad(MysqlTargetConfig(type="mysql"), pipeline="p").sql
    assert sql.refuses(pymysql.err.OperationalError(code, "message")) is refused


@pytest.mark.parametrize("error, refused", [
    (psycopg.errors.DuplicateColumn, True), (psycopg.errors.FeatureNotSupported, True),
    (psycopg.errors.InsufficientPrivilege, True), (psycopg.errors.UniqueViolation, True),
    (psycopg.errors.NotNullViolation, True), (psycopg.errors.DeadlockDetected, False),
    (psycopg.errors.LockNotAvailable, False), (psycopg.errors.UndefinedTable, False),
    (psycopg.errors.QueryCanceled, False), (psycopg.errors.DiskFull, False), (psycopg.errors.InternalError_, False),
])
def test_postgresql_ddl_errors_that_are_the_tables_refusal(error, refused):
    """A PostgreSQL error answered to a DDL is its table's refusal unless it is transient, a missing
    table, or says nothing of the table (resources, a cancel, a system or internal error)."""
    sql = PostgresqlLoad(PostgresqlTargetConfig(type="postgresql"), pipeline="p").sql
    assert sql.refuses(error("message")) is refused
    assert not sql.refuses(psycopg.OperationalError("connection refused"))  # no SQLSTATE: never answered
