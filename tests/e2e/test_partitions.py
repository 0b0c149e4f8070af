"""Partitioned source tables reach PostgreSQL as plain tables holding the same rows (issue 26.4):
CREATE TABLE ... PARTITION BY and the partition statements that move no row (ADD, REORGANIZE,
COALESCE, REMOVE PARTITIONING) replicate; DROP PARTITION, which removes rows without a single row
event, stops the pipeline with one line naming table, position and cause instead of leaving the
dropped rows on the target."""

from __future__ import annotations

import contextlib

import pytest

from setl.scheduler import Outcome
from setl.sinks.postgresql import PostgresqlLoad
from tests.e2e.setl_process import postgres_target
from tests.schema.test_schema import make

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(180)


def _run(server, db: str, statements: list[str]) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
        conn.commit()


def test_partitioned_table_reaches_postgresql_and_drop_partition_stops(mariadb_source, source_db, postgres_server,
                                                                       postgres_db, tmp_path):
    start = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, [
        "CREATE TABLE pt (id INT NOT NULL, y INT NOT NULL, v VARCHAR(10), PRIMARY KEY (id, y)) "
        "PARTITION BY RANGE (y) (PARTITION p0 VALUES LESS THAN (2000), PARTITION p1 VALUES LESS THAN (2100))",
        "INSERT INTO pt VALUES (1, 1990, 'a'), (2, 2010, 'b'), (3, 1999, 'c')",
        "ALTER TABLE pt ADD PARTITION (PARTITION p2 VALUES LESS THAN (2200))",
        "INSERT INTO pt VALUES (4, 2150, 'd')",
        "ALTER TABLE pt REORGANIZE PARTITION p1, p2 INTO (PARTITION p12 VALUES LESS THAN (2200))",
        "UPDATE pt SET v = 'bb' WHERE id = 2",
    ])
    rules = [table_rule(rf"{source_db}\.pt", f"{source_db}.{{table}}")]
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="parts")
    replicate(mariadb_source, start, rules, load, tmp_path)
    query = f'SELECT id, y, v FROM "{source_db}".pt ORDER BY id'
    assert postgres_server.query(query, dbname=postgres_db) == mariadb_source.query(
        f"SELECT id, y, v FROM `{source_db}`.pt ORDER BY id")

    middle = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, ["ALTER TABLE pt DROP PARTITION p0"])  # rows 1 and 3 go, no row event
    load = PostgresqlLoad(postgres_server.target_config(postgres_db), pipeline="parts")
    scheduler = replicate(mariadb_source, middle, rules, load, tmp_path, name="parts2", outcome=Outcome.PAUSED)
    error = str(scheduler.error)
    assert "DROP PARTITION" in error and f"{source_db}.pt" in error and "position=mysql-bin." in error, error
    assert "\n" not in error


def test_partitioned_table_copied_by_a_snapshot_start(mariadb_source, source_db, postgres_server, postgres_db,
                                                      tmp_path):
    """`start: snapshot`: the partitioned table is created plain and copied, the partition
    statements that move no row and the row changes after the copy replicate, and DROP PARTITION
    stops the pipeline with one line, as from the binlog alone."""
    _run(mariadb_source, source_db, [
        "CREATE TABLE pt (id INT NOT NULL, y INT NOT NULL, v VARCHAR(10), PRIMARY KEY (id, y)) "
        "PARTITION BY RANGE (y) (PARTITION p0 VALUES LESS THAN (2000), PARTITION p1 VALUES LESS THAN (2100))",
        "INSERT INTO pt VALUES (1, 1990, 'a'), (2, 2010, 'b'), (3, 1999, 'c')",
    ])
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.pt", "target": f"{source_db}.{{table}}"}], start="snapshot")
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    _run(mariadb_source, source_db, [
        "ALTER TABLE pt ADD PARTITION (PARTITION p2 VALUES LESS THAN (2200))",
        "INSERT INTO pt VALUES (4, 2150, 'd')",
        "ALTER TABLE pt REORGANIZE PARTITION p1, p2 INTO (PARTITION p12 VALUES LESS THAN (2200))",
        "UPDATE pt SET v = 'bb' WHERE id = 2",
        "DELETE FROM pt WHERE id = 3",
    ])
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    query = f'SELECT id, y, v FROM "{source_db}".pt ORDER BY id'
    assert postgres_server.query(query, dbname=postgres_db) == mariadb_source.query(
        f"SELECT id, y, v FROM `{source_db}`.pt ORDER BY id") == [(1, 1990, "a"), (2, 2010, "bb"), (4, 2150, "d")]
    assert postgres_server.query("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                 "WHERE n.nspname = %s AND c.relname = 'pt'", (source_db,),
                                 dbname=postgres_db) == [("r",)]  # a plain table

    _run(mariadb_source, source_db, ["ALTER TABLE pt DROP PARTITION p0"])  # row 1 goes, no row event
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "DROP PARTITION" in last and f"{source_db}.pt" in last and "position=mysql-bin." in last, last
    assert postgres_server.query(query, dbname=postgres_db)[0] == (1, 1990, "a")  # kept, not silently diverged


@pytest.mark.parametrize("start", ["snapshot", "binlog"])
def test_partitions_refuse_stops_on_a_partitioned_table(start, mariadb_source, source_db, postgres_server,
                                                        postgres_db, tmp_path):
    """`target.partitions: refuse`: a partitioned source table stops the pipeline with one line naming
    it, whether a snapshot would create it or its CREATE arrives from the binlog; no table is made."""
    begin = binlog_head(mariadb_source)
    _run(mariadb_source, source_db, [
        "CREATE TABLE pt (id INT NOT NULL PRIMARY KEY, v INT) PARTITION BY HASH (id) PARTITIONS 2",
        "INSERT INTO pt VALUES (1, 1), (2, 2)",
    ])
    target = {**postgres_target(postgres_server, postgres_db), "partitions": "refuse"}
    setl = make(tmp_path, mariadb_source, target, [{"source": rf"{source_db}\.pt", "target": f"{source_db}.{{table}}"}],
                start="snapshot" if start == "snapshot" else {"file": begin.log, "pos": begin.offset})
    result = setl.start_until_caught_up(timeout=180)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "partitions option is refuse" in last and f"{source_db}.pt" in last, result.stderr[-3000:]
    assert postgres_server.query("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                                 (source_db,), dbname=postgres_db) == [(0,)]
