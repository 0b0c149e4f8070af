"""Text holding NUL (0x00) on a PostgreSQL target (issue 26.4, `target.nul_in_text`): refused at
once with one line by default (no retries), stripped or escaped when configured, counted in the
log and the ``setl_values_rewritten`` metric; a key holding NUL is refused under every policy."""

from __future__ import annotations

import contextlib

import attrs
import pytest

from setl.scheduler import Outcome
from setl.sinks import rewrites
from setl.sinks.postgresql import PostgresqlLoad

from .replicate import SETTINGS, binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(180)


def _write(server, db: str) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1, 'a\\0b', 'x'), (2, 'plain', '\\0\\0'), (3, NULL, 'y')")
        cur.execute("UPDATE t SET v = 'c\\0' WHERE id = 3")
        cur.execute("INSERT INTO loose VALUES ('k\\0'), ('k\\0')")
        cur.execute("DELETE FROM loose LIMIT 1")
        conn.commit()


def _setup(mariadb_source, source_db, postgres_server, postgres_db) -> None:
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY, v VARCHAR(10), w TEXT)")
    mariadb_source.query(f"CREATE TABLE `{source_db}`.loose (v VARCHAR(10))")
    postgres_server.query(f'CREATE SCHEMA "{source_db}"', dbname=postgres_db)
    postgres_server.query(f'CREATE TABLE "{source_db}".t (id int PRIMARY KEY, v varchar(10), w text)',
                          dbname=postgres_db)
    postgres_server.query(f'CREATE TABLE "{source_db}".loose (v varchar(10))', dbname=postgres_db)


@pytest.mark.parametrize("policy, replacement", [("strip", ""), ("escape", "\\0")])
def test_nul_is_stripped_or_escaped_as_configured(policy, replacement, mariadb_source, source_db, postgres_server,
                                                   postgres_db, tmp_path):
    _setup(mariadb_source, source_db, postgres_server, postgres_db)
    start = binlog_head(mariadb_source)
    _write(mariadb_source, source_db)
    config = attrs.evolve(postgres_server.target_config(postgres_db), nul_in_text=policy)
    load = PostgresqlLoad(config, pipeline=f"nul_{policy}")
    replicate(mariadb_source, start, [table_rule(rf"{source_db}\.(t|loose)", f"{source_db}.{{table}}")], load,
              tmp_path, name=f"nul_{policy}")
    rows = postgres_server.query(f'SELECT id, v, w FROM "{source_db}".t ORDER BY id', dbname=postgres_db)
    expected = [(i, None if v is None else v.replace("\0", replacement), w.replace("\0", replacement))
                for i, v, w in mariadb_source.query(f"SELECT id, v, w FROM `{source_db}`.t ORDER BY id")]
    assert [tuple(r) for r in rows] == expected
    # the keyless table's delete found the rewritten row: one of the two copies is left
    assert postgres_server.query(f'SELECT v FROM "{source_db}".loose', dbname=postgres_db) == [
        (f"k{replacement}",)]
    counted = {k: n for k, n in rewrites.counts().items() if k[0] == f"nul_{policy}"}
    kind = "nul_stripped" if policy == "strip" else "nul_escaped"
    assert counted[(f"nul_{policy}", f"{source_db}.t", kind)] == 3  # row 1 v, row 2 w, row 3 v (its update)


def test_nul_is_refused_at_once_by_default(mariadb_source, source_db, postgres_server, postgres_db, tmp_path):
    _setup(mariadb_source, source_db, postgres_server, postgres_db)
    start = binlog_head(mariadb_source)
    _write(mariadb_source, source_db)
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="nul_refuse")
    settings = attrs.evolve(SETTINGS, retry=attrs.evolve(SETTINGS.retry, max_attempts=50))
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\.(t|loose)", f"{source_db}.{{table}}")],
                          load, tmp_path, name="nul_refuse", settings=settings, outcome=Outcome.PAUSED)
    error = str(scheduler.error)
    assert "NUL (0x00)" in error and "nul_in_text" in error and f"table={source_db}." in error, error
    assert "attempt 2" not in error
    assert postgres_server.query(f'SELECT count(*) FROM "{source_db}".t', dbname=postgres_db) == [(0,)]


def test_a_key_holding_nul_is_refused_under_every_policy(mariadb_source, source_db, postgres_server, postgres_db,
                                                         tmp_path):
    mariadb_source.query(f"CREATE TABLE `{source_db}`.k (k VARCHAR(5) PRIMARY KEY)")
    postgres_server.query(f'CREATE SCHEMA "{source_db}"', dbname=postgres_db)
    postgres_server.query(f'CREATE TABLE "{source_db}".k (k varchar(5) PRIMARY KEY)', dbname=postgres_db)
    start = binlog_head(mariadb_source)
    mariadb_source.query(f"INSERT INTO `{source_db}`.k VALUES ('a\\0'), ('a')")
    config = attrs.evolve(postgres_server.target_config(postgres_db), nul_in_text="strip")
    load = PostgresqlLoad(config, pipeline="nul_key")
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\.k", f"{source_db}.k")], load, tmp_path,
                          name="nul_key", outcome=Outcome.PAUSED)
    assert "primary-key column k holds text with NUL" in str(scheduler.error), scheduler.error
