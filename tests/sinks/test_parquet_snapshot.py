"""The Parquet target after a snapshot: the copy's files and the streamed batches' files never share
a name, and a replay removes only files of unacknowledged attempts (real MariaDB, `setl start`)."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from setl.testing.harness import parquet_rows, parquet_state
from tests.e2e.setl_process import SetlProcess, mysql_source

pytestmark = pytest.mark.timeout(240)

_server_ids = itertools.count(7300 + os.getpid() % 500 * 3)


def run_source(server: Any, db: str, statements: list[str]) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        conn.commit()


def make(tmp_path: Path, server: Any, source_db: str, tables: str = "k", **snapshot: Any) -> SetlProcess:
    """A pipeline copying `source_db`'s `tables` (a regex) into a Parquet directory, then streaming."""
    source = mysql_source(server, server_id=next(_server_ids), start="snapshot",
                          snapshot={"chunk_rows": 100, **snapshot})
    settings = {"parallelism": 2, "batch": {"max_rows": 100, "max_wait_ms": 50},
                "retry": {"max_attempts": 2, "initial_backoff_ms": 50, "max_backoff_ms": 200}}
    return SetlProcess(tmp_path, source=source, target={"type": "parquet", "path": str(tmp_path / "lake")},
                       tables=[{"source": rf"{source_db}\.({tables})", "target": "shop.{table}"}], pipeline=settings)


def started(setl: SetlProcess) -> None:
    result = setl.start_until_caught_up(timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def source_rows(server: Any, db: str, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {(i,): {"id": i, "v": v} for i, v in server.query(f"SELECT id, v FROM `{db}`.`{table}` ORDER BY id")}


def test_a_streamed_batch_after_a_copy_keeps_every_copied_row(tmp_path: Path, mariadb_source: Any,
                                                              source_db: str) -> None:
    """300 rows copied in 3 chunks, then one UPDATE streamed by a second start: the change log
    replays to the source's 300 rows (the stream's first batch starts at the copy's position)."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k SELECT seq, seq FROM seq_1_to_300"])
    setl = make(tmp_path, mariadb_source, source_db)
    started(setl)
    assert parquet_state(tmp_path / "lake", "shop.k") == source_rows(mariadb_source, source_db, "k")
    run_source(mariadb_source, source_db, ["UPDATE k SET v = -1 WHERE id = 7"])
    started(setl)
    assert parquet_state(tmp_path / "lake", "shop.k") == source_rows(mariadb_source, source_db, "k")
    assert len(source_rows(mariadb_source, source_db, "k")) == 300



def keyless_rows(server: Any, db: str) -> list[str]:
    return sorted(repr({"msg": m}) for (m,) in server.query(f"SELECT msg FROM `{db}`.nk"))


def test_two_tables_copied_again_on_request_end_exact(tmp_path: Path, mariadb_source: Any, source_db: str) -> None:
    """A keyed and a keyless table copied, streamed, then copied again by `setl snapshot --table`
    (served by the next start while changes stream): both logs replay to the source's rows."""
    run_source(mariadb_source, source_db, [
        "CREATE TABLE k (id INT PRIMARY KEY, v INT)", "INSERT INTO k SELECT seq, seq FROM seq_1_to_250",
        "CREATE TABLE nk (msg VARCHAR(10))", "INSERT INTO nk SELECT IF(seq % 3, 'a', 'b') FROM seq_1_to_120"])
    setl = make(tmp_path, mariadb_source, source_db, tables="k|nk")
    started(setl)
    run_source(mariadb_source, source_db, ["UPDATE k SET v = -1 WHERE id = 7", "INSERT INTO nk VALUES ('c')",
                                           "DELETE FROM nk WHERE msg = 'b' LIMIT 2"])
    started(setl)
    for table in ("k", "nk"):
        result = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.{table}")
        assert result.returncode == 0, result.stdout + result.stderr
    run_source(mariadb_source, source_db, ["DELETE FROM k WHERE id = 8", "INSERT INTO nk VALUES ('d')"])
    started(setl)
    assert parquet_state(tmp_path / "lake", "shop.k") == source_rows(mariadb_source, source_db, "k")
    assert sorted(map(repr, parquet_rows(tmp_path / "lake", "shop.nk"))) == keyless_rows(mariadb_source, source_db)
