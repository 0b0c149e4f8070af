"""The Parquet target after a snapshot: the copy's files and the streamed batches' files never share
a name, and a replay removes only files of unacknowledged attempts (real MariaDB, `setl start`)."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from setl.testing.harness import parquet_state
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

