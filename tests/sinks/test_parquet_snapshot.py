"""The Parquet target after a snapshot: the copy's files and the streamed batches' files never share
a name, and a replay removes only files of unacknowledged attempts (real MariaDB, `setl start`)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from setl.testing.harness import parquet_rows, parquet_state
from tests.e2e.setl_process import SetlProcess, mysql_source, spawned
from tests.helpers.wait import wait_until
from tests.snapshot.test_snapshot_resume import progress

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


def test_an_online_re_copy_while_streaming_ends_exact(tmp_path: Path, mariadb_source: Any, source_db: str) -> None:
    """`setl snapshot --table` taken by a running pipeline into Parquet while rows change, then the
    pipeline killed -9 and started again: both tables' logs replay to the source's rows."""
    run_source(mariadb_source, source_db, [
        "CREATE TABLE k (id INT PRIMARY KEY, v INT)", "INSERT INTO k SELECT seq, seq FROM seq_1_to_250",
        "CREATE TABLE nk (msg VARCHAR(10))", "INSERT INTO nk SELECT IF(seq % 3, 'a', 'b') FROM seq_1_to_120"])
    setl = make(tmp_path, mariadb_source, source_db, tables="k|nk")

    def copied_since(after: float) -> bool:
        found = {p.table: p for p in progress(setl, full=True).values()}
        return len(found) == 2 and all(p.status.value == "done" and p.started > after for p in found.values())

    with spawned(setl) as proc:
        wait_until(lambda: copied_since(0.0), timeout=60, interval=0.1, message=lambda: setl.logs()[-2000:])
        first = max(p.started for p in progress(setl, full=True).values())
        run_source(mariadb_source, source_db, ["UPDATE k SET v = -1 WHERE id = 7", "INSERT INTO nk VALUES ('c')"])
        for table in ("k", "nk"):
            result = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.{table}")
            assert result.returncode == 0, result.stdout + result.stderr
        for i in range(20):  # changes stream while the tables are copied again
            run_source(mariadb_source, source_db, [f"UPDATE k SET v = v + 1 WHERE id = {i * 11 + 1}",
                                                   f"INSERT INTO nk VALUES ('w{i}')", "DELETE FROM nk LIMIT 1"])
        wait_until(lambda: copied_since(first), timeout=60, interval=0.1, message=lambda: setl.logs()[-2000:])
        run_source(mariadb_source, source_db, ["DELETE FROM k WHERE id = 8", "INSERT INTO nk VALUES ('d')"])
        proc.kill()  # kill -9: whatever was written and not acked is replayed by the next start
        proc.wait(10)
    started(setl)
    assert parquet_state(tmp_path / "lake", "shop.k") == source_rows(mariadb_source, source_db, "k")
    assert sorted(map(repr, parquet_rows(tmp_path / "lake", "shop.nk"))) == keyless_rows(mariadb_source, source_db)


def test_a_kill_between_load_and_ack_during_the_copy_leaves_each_change_once(tmp_path: Path, mariadb_source: Any,
                                                                              source_db: str) -> None:
    """SIGKILL after a copy batch's files are written and before its ack, then again after a streamed
    batch's: the next starts replay those batches in new epochs, and the log holds each copied row and
    each change exactly once."""
    run_source(mariadb_source, source_db, ["CREATE TABLE k (id INT PRIMARY KEY, v INT)",
                                           "INSERT INTO k SELECT seq, seq FROM seq_1_to_300"])
    setl = make(tmp_path, mariadb_source, source_db)
    setl.faults = json.dumps([{"stage": "termin", "action": "crash", "batch": 3}])
    crashed = setl.start_until_caught_up(timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    acked = setl.acked()
    # acks written before the crash: batch 2's, or none after batch 1 when Termin acks them together
    assert acked is None or acked.batch_id < 3, acked
    written = {pq.read_metadata(p).num_rows for p in (tmp_path / "lake").rglob("*.parquet")}
    assert written  # the killed batch's files are there, not acked
    run_source(mariadb_source, source_db, ["UPDATE k SET v = -1 WHERE id = 7"])
    setl.faults = json.dumps([{"stage": "termin", "action": "crash", "batch": (acked.batch_id if acked else 0) + 4}])
    again = setl.start_until_caught_up(timeout=120)
    assert again.returncode in (0, -signal.SIGKILL), again.stderr[-3000:]
    run_source(mariadb_source, source_db, ["DELETE FROM k WHERE id = 8"])
    setl.faults = None
    started(setl)
    assert parquet_state(tmp_path / "lake", "shop.k") == source_rows(mariadb_source, source_db, "k")
    ops = [r["_setl_op"] for p in (tmp_path / "lake").rglob("*.parquet") for r in pq.read_table(p).to_pylist()]
    assert sorted(set(ops)) == ["delete", "read", "truncate", "update"]
    assert (ops.count("read"), ops.count("update"), ops.count("delete"), ops.count("truncate")) == (300, 1, 1, 1)
