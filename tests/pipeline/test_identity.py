"""Issue 23: pipeline identity. The target keeps, next to the pipeline's position, the source server
and the rules fingerprint that wrote it: a meta store wiped (`rm -rf var/`) after a finished copy
takes the position by itself and resumes exactly; a start reading another source server is refused
with one line and exit 2 naming what differs and the commands on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.setl_process import mysql_source, mysql_target, postgres_target
from tests.schema.test_schema import make, q, run_source

pytestmark = pytest.mark.timeout(240)

QUERY = "SELECT * FROM {}.k ORDER BY id"


def test_a_wiped_meta_store_adopts_a_position_of_the_same_identity(
        tmp_path: Path, mariadb_source: Any, source_db: str, mariadb_target: Any, mysql_db: str) -> None:
    """After a finished copy, the meta store is deleted and rows are written: the next start takes
    the target's position (same source server, same rules), copies nothing again and ends equal."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k VALUES (1, 1), (2, 2)"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    first = setl.start_until_caught_up(timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    [(stored,)] = mariadb_target.query("SELECT identity FROM setl.setl_position_identity WHERE pipeline = %s",
                                       (setl.name,))
    assert '"server_id": 1' in stored and '"copying": false' in stored, stored

    setl.meta_path.unlink()  # rm -rf var/
    run_source(mariadb_source, source_db, ["INSERT INTO k VALUES (3, 3)", "UPDATE k SET v = 20 WHERE id = 2",
                                           "DELETE FROM k WHERE id = 1"])
    mariadb_target.query(f"INSERT INTO {q(mysql_db)}.k VALUES (99, 99)")  # a copy again would remove it
    adopted = setl.start_until_caught_up(timeout=120)
    assert adopted.returncode == 0, adopted.stderr[-2000:]
    assert "same source server, same table rules" in adopted.stderr, adopted.stderr[-2000:]
    assert "snapshot of" not in adopted.stderr, adopted.stderr[-2000:]
    assert mariadb_target.query(QUERY.format(q(mysql_db))) == [(2, 20), (3, 3), (99, 99)]


def test_a_different_source_server_is_refused(tmp_path: Path, mariadb_source: Any, source_db: str,
                                              mariadb_target: Any, mysql_db: str) -> None:
    """The pipeline's file is pointed at another server (the target server, server_id 2): the start
    exits 2 with one line naming server_id 1 -> 2 and `setl position reset`, writing nothing; after an
    operator's reset it starts."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k VALUES (1, 1)"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start="snapshot")
    assert setl.start_until_caught_up(timeout=120).returncode == 0
    before = setl.acked()
    setl.config["source"] = mysql_source(mariadb_target, server_id=setl.config["source"]["server_id"],
                                         start="latest")
    setl.write_config()
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("setl: error")]
    assert "another source server" in line and "server_id 1 -> 2" in line, line
    assert f"setl position reset --pipeline {setl.name}" in line, line
    assert setl.acked() == before
    assert mariadb_target.query(QUERY.format(q(mysql_db))) == [(1, 1)]

    reset = setl.run("position", "reset", "--pipeline", setl.name, "--start")
    assert reset.returncode == 0, reset.stderr
    started = setl.start_until_caught_up(timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]
    [(stored,)] = mariadb_target.query("SELECT identity FROM setl.setl_position_identity WHERE pipeline = %s",
                                       (setl.name,))
    assert '"server_id": 2' in stored, stored


def test_a_wiped_meta_store_mid_copy_is_refused(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                mariadb_target: Any, mysql_db: str) -> None:
    """The process dies (kill -9 by a failpoint) with its copy half acked, and the meta store is
    deleted: the target's identity says a copy was under way, so the start refuses (exit 2) rather
    than resume with half a table; `--start` then copies everything."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k SELECT seq, seq FROM seq_1_to_5000"])
    setl = make(tmp_path, mariadb_source, mysql_target(mariadb_target),
                [{"source": rf"{source_db}\.k", "target": f"{mysql_db}.{{table}}"}], start="snapshot",
                pipeline={"parallelism": 1, "batch": {"max_rows": 100, "max_wait_ms": 50}})
    setl.config["source"]["snapshot"] = {"chunk_rows": 100}
    setl.write_config()
    setl.faults = '[{"stage": "termin", "action": "crash", "batch": 4}]'
    crashed = setl.start_until_caught_up(timeout=120)
    assert crashed.returncode != 0 and setl.acked() is not None, crashed.stderr[-2000:]
    setl.faults = None
    [(copied,)] = mariadb_target.query(f"SELECT COUNT(*) FROM {q(mysql_db)}.k")
    assert 0 < copied < 5000

    setl.meta_path.unlink()
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("setl: error")]
    assert "a table copy was under way" in line and "--start" in line, line
    assert setl.run("position", "reset", "--pipeline", setl.name, "--start").returncode == 0
    again = setl.start_until_caught_up(timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert mariadb_target.query(QUERY.format(q(mysql_db))) == mariadb_source.query(QUERY.format(q(source_db)))


def test_a_postgresql_target_keeps_the_identity_too(tmp_path: Path, mariadb_source: Any, source_db: str,
                                                   postgres_server: Any, postgres_db: str) -> None:
    """The same adoption on a PostgreSQL target: its position schema holds the identity, and a wiped
    meta store resumes from the target's position."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k VALUES (1, 1)"])
    setl = make(tmp_path, mariadb_source, postgres_target(postgres_server, postgres_db),
                [{"source": rf"{source_db}\.k", "target": "public.{table}"}], start="snapshot")
    first = setl.start_until_caught_up(timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    [(stored,)] = postgres_server.query("SELECT identity FROM setl.setl_position_identity WHERE pipeline = %s",
                                        (setl.name,), dbname=postgres_db)
    assert '"server_id": 1' in stored and '"copying": false' in stored, stored
    setl.meta_path.unlink()
    run_source(mariadb_source, source_db, ["INSERT INTO k VALUES (2, 2)"])
    adopted = setl.start_until_caught_up(timeout=120)
    assert adopted.returncode == 0, adopted.stderr[-2000:]
    assert "same source server, same table rules" in adopted.stderr, adopted.stderr[-2000:]
    assert postgres_server.query("SELECT * FROM public.k ORDER BY id", dbname=postgres_db) == [(1, 1), (2, 2)]
