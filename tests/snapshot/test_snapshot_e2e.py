"""`source.start: snapshot` end to end: `setl start` copies live tables of every key kind while a
writer changes them, then follows the binlog; the targets end equal to the source."""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target, postgres_target, spawned
from tests.helpers.wait import wait_until
from tests.snapshot import tables as t

pytestmark = pytest.mark.timeout(300)

ROWS = 20_000


def make_setl(tmp_path, source, source_db: str, target: dict, target_name: str, *, server_id: int,
              chunk_rows: int = 1500, **pipeline) -> SetlProcess:
    settings = {"parallelism": 3, "batch": {"max_rows": 2000, "max_wait_ms": 50},
                "retry": {"max_attempts": 5, "initial_backoff_ms": 50, "max_backoff_ms": 500}}
    settings.update(pipeline)
    return SetlProcess(tmp_path, source=mysql_source(source, server_id=server_id, start="snapshot",
                                                     snapshot={"chunk_rows": chunk_rows}),
                       target=target, tables=[{"source": rf"{re.escape(source_db)}\..*", "target": target_name}],
                       pipeline=settings)


def run_until_caught_up(setl: SetlProcess, timeout: float = 240) -> str:
    result = setl.start_until_caught_up(timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def test_snapshot_while_writing_into_mariadb(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """Integer, string (case-insensitive, mixed case), composite, keyless and empty tables copied while a
    writer changes them, over stale target rows and under `pipeline.ddl: fail`, end equal to the source by
    CHECKSUM TABLE and row by row, and status shows every table done."""
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    t.fill(mariadb_source, source_db, ROWS, binlog=False)  # rows the binlog never held
    # the target holds stale rows: the snapshot's TRUNCATE replaces them
    t.fill(mariadb_target, mysql_db, 50)
    # pipeline.ddl: fail refuses replicated DDL, never the snapshot's own TRUNCATE
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2101, ddl="fail")
    with t.Writer(mariadb_source, source_db, ROWS) as writer:
        with spawned(setl) as proc:
            def copied() -> bool:
                assert proc.poll() is None, setl.logs()[-3000:]
                row = setl.status()
                return bool(row["snapshot"]) and all(s["status"] == "done" for s in row["snapshot"])

            wait_until(copied, timeout=180, interval=0.5, message=lambda: f"snapshot done: {setl.status()}")
            wait_until(lambda: writer.transactions > 200, timeout=60, message="writes during the copy")
            assert setl.stop(proc) == 0
    assert writer.transactions > 200
    stderr = run_until_caught_up(setl)
    assert t.checksums(mariadb_source, source_db) == t.checksums(mariadb_target, mysql_db), setl.logs()[-3000:]
    for name in t.TABLES:
        assert t.mariadb_rows(mariadb_source, source_db, name) == t.mariadb_rows(mariadb_target, mysql_db, name)
    status = setl.status()
    by_table = {s["table"].split(".", 1)[1]: s for s in status["snapshot"]}
    assert set(by_table) == set(t.TABLES)
    assert by_table["ints"]["chunks"] >= ROWS // 1500
    assert all(s["status"] == "done" for s in by_table.values())
    assert "snapshot finished" in setl.logs() + stderr


#: about 1,000,000 rows over the five tables (`tables.fill`)
PG_ROWS = 385_000


def test_snapshot_into_postgresql(tmp_path, mariadb_source, postgres_server, source_db, postgres_db):
    """The same copy of about 1M rows into PostgreSQL under writes, with `--until-caught-up` waiting
    for the copy: equal row by row."""
    t.create(mariadb_source, source_db)
    t.fill(mariadb_source, source_db, PG_ROWS, binlog=False)
    for name, body in t.PG_TYPES.items():
        postgres_server.query(f'CREATE SCHEMA IF NOT EXISTS "{source_db}"', dbname=postgres_db)
        postgres_server.query(f'CREATE TABLE "{source_db}"."{name}" {body}', dbname=postgres_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                     f"{source_db}.{{table}}", server_id=2102, chunk_rows=5000)
    with t.Writer(mariadb_source, source_db, PG_ROWS, seed=11) as writer:
        run_until_caught_up(setl)
    assert writer.transactions > 50
    run_until_caught_up(setl)
    assert t.row_count(mariadb_source, source_db) >= 1_000_000
    for name in t.TABLES:
        assert t.mariadb_rows(mariadb_source, source_db, name) == t.postgres_rows(
            postgres_server, postgres_db, source_db, name), name
    result = setl.run("status", "--json")
    assert all(s["status"] == "done" for s in json.loads(result.stdout)[0]["snapshot"])
    text = setl.run("status").stdout
    assert f"{setl.name}: snapshot {source_db}.ints done" in text, text


def test_snapshot_into_an_empty_postgresql_creates_the_tables_first(tmp_path, mariadb_source, postgres_server,
                                                                     source_db, postgres_db):
    """`create_tables` (the default) with `start: snapshot` into a PostgreSQL database without the
    tables: each table is created before the TRUNCATE that starts its copy; equal row by row."""
    t.create(mariadb_source, source_db)
    t.fill(mariadb_source, source_db, 2000, binlog=False)
    setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                     f"{source_db}.{{table}}", server_id=2103, chunk_rows=500)
    with t.Writer(mariadb_source, source_db, 2000, seed=5):
        run_until_caught_up(setl)
    run_until_caught_up(setl)
    for name in t.TABLES:
        assert t.mariadb_rows(mariadb_source, source_db, name) == t.postgres_rows(
            postgres_server, postgres_db, source_db, name), name
