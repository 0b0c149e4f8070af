"""A table whose key defaults to a sequence's next value, created and written on the source after
the start: the replicated CREATE TABLE reaches MariaDB and PostgreSQL without that DEFAULT
(sequences are not replicated; the rows carry the values drawn), instead of stopping the pipeline
with "No database selected" (MariaDB) or "not translated" (PostgreSQL)."""

from __future__ import annotations

import contextlib

import pytest

from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(180)

STATEMENTS = [
    "CREATE SEQUENCE seq1 START WITH 100",
    "CREATE TABLE t (id INT NOT NULL DEFAULT NEXTVAL(seq1) PRIMARY KEY, v INT)",
    "INSERT INTO t (v) VALUES (1), (2)",
    "CREATE TABLE t2 (id BIGINT NOT NULL DEFAULT (NEXT VALUE FOR seq1) PRIMARY KEY, v INT DEFAULT 7)",
    "INSERT INTO t2 (id) VALUES (DEFAULT), (DEFAULT)",
    "ALTER TABLE t ALTER COLUMN id SET DEFAULT (NEXTVAL(seq1) + 1000)",
    "INSERT INTO t (v) VALUES (3)",
]


def _source(server, db: str):
    start = binlog_head(server)
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        for sql in STATEMENTS:
            cur.execute(sql)
        conn.commit()
    return start


def test_into_mariadb(mariadb_source, source_db, mariadb_target, mysql_db, tmp_path):
    start = _source(mariadb_source, source_db)
    load = MysqlLoad(mariadb_target.target_config(), pipeline="seq", position_schema=mysql_db)
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.t2?", f"{mysql_db}.{{table}}")], load, tmp_path)
    for table in ("t", "t2"):
        query = f"SELECT id, v FROM `{{}}`.{table} ORDER BY id"
        assert mariadb_target.query(query.format(mysql_db)) == mariadb_source.query(query.format(source_db))
    create = mariadb_target.query(f"SHOW CREATE TABLE `{mysql_db}`.t2")[0][1]
    assert "nextval" not in create.lower() and "DEFAULT 7" in create


def test_into_postgresql(mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    start = _source(mariadb_source, source_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="seq")
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.t2?", f"{source_db}.{{table}}")], load, tmp_path)
    for table in ("t", "t2"):
        got = postgres_server.query(f'SELECT id, v FROM "{source_db}".{table} ORDER BY id', dbname=postgres_db)
        assert [tuple(r) for r in got] == mariadb_source.query(f"SELECT id, v FROM `{source_db}`.{table} ORDER BY id")
