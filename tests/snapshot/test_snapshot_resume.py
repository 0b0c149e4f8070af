"""A snapshot survives kill -9 of `setl start`: the next start resumes after the last acked chunk
(the log says from which), chunks acked before are not copied again, and the target ends equal."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from setl.meta import SqliteMetaStore
from tests.e2e.setl_process import mysql_target, spawned
from tests.helpers.wait import wait_until
from tests.snapshot import tables as t
from tests.snapshot.test_snapshot_e2e import make_setl, run_until_caught_up

pytestmark = pytest.mark.timeout(400)

ROWS = 385_000  # about 1,000,000 rows over the five tables
CHUNK = 5000


def progress(setl, full: bool = False) -> dict[str, Any]:
    """Each table's (status, rows, chunks) in the pipeline's meta store (`full`: its TableProgress)."""
    if not setl.meta_path.exists():
        return {}
    meta = SqliteMetaStore(setl.meta_path)
    try:
        return {p.table: p if full else (p.status.value, p.rows, p.chunks) for p in meta.snapshot_progress(setl.name)}
    finally:
        meta.close()


def stuck(setl, proc) -> str:
    """What a copy that stopped moving shows: its progress, and the process's log with every
    thread's stack (SIGUSR1: faulthandler)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
    time.sleep(1.0)
    return f"progress {progress(setl)}\n{setl.logs()[-20000:]}"


def finish_copy(setl) -> None:
    """Start `setl` again and let it copy until every table's snapshot is done, then stop it cleanly."""
    with spawned(setl) as proc:
        def done() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            found = progress(setl)
            return len(found) == len(t.TABLES) and all(s == "done" for s, _, _ in found.values())

        wait_until(done, timeout=180, interval=0.2, message=lambda: f"progress {progress(setl)}")
        assert setl.stop(proc) == 0


def kill_once_mid_copy(setl, source, source_db: str, target, target_db: str, rows: int, chunk: int, seed: int,
                       ready: Callable[[], bool] = lambda: True) -> None:
    """Under writes: kill -9 once the ints table has acked 4 chunks (and `ready()`), restart until
    the copy is done, catch up; then CHECKSUM TABLE equal, the restart resumed after the chunks acked
    before the kill, and no chunk counted twice."""
    with t.Writer(source, source_db, rows, seed=seed):
        with spawned(setl) as proc:
            def moved() -> bool:
                assert proc.poll() is None, setl.logs()[-3000:]
                ints = progress(setl).get("ints")
                return ints is not None and ints[0] == "copying" and ints[2] >= 4 and ready()

            wait_until(moved, timeout=120, interval=0.02, message=lambda: stuck(setl, proc))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        acked = progress(setl)["ints"][2]
        finish_copy(setl)
    run_until_caught_up(setl)
    assert t.checksums(source, source_db) == t.checksums(target, target_db), setl.logs()[-3000:]
    resumes = [int(m) for m in re.findall(r"table=\S+\.ints snapshot resumes after chunk (\d+)", setl.logs())]
    assert resumes and resumes[0] >= acked >= 4, setl.logs()[-3000:]
    final = progress(setl)["ints"]
    assert -(-rows // chunk) <= final[2] <= -(-rows // chunk) + 4, final


def test_kill_9_twice_during_a_snapshot(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """Two kill -9 in the middle of a copy of ~1M rows under writes: each restart logs the chunk it
    resumes from, the ints table's acked chunk count never restarts from zero, and CHECKSUM TABLE agrees."""
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    t.fill(mariadb_source, source_db, ROWS, binlog=False)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2103, chunk_rows=CHUNK)
    resumed_at: list[int] = []
    with t.Writer(mariadb_source, source_db, ROWS, seed=3) as writer:
        for _ in range(2):
            floor = resumed_at[-1] if resumed_at else 0
            with spawned(setl) as proc:
                def moved(floor: int = floor) -> bool:
                    assert proc.poll() is None, setl.logs()[-3000:]
                    ints = progress(setl).get("ints")
                    return ints is not None and ints[0] == "copying" and ints[2] >= floor + 5

                wait_until(moved, timeout=120, interval=0.05, message=lambda: stuck(setl, proc))
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            chunks = progress(setl)["ints"][2]
            resumed_at.append(chunks)
        finish_copy(setl)
    run_until_caught_up(setl)
    assert t.row_count(mariadb_target, mysql_db) >= 1_000_000
    assert t.checksums(mariadb_source, source_db) == t.checksums(mariadb_target, mysql_db), setl.logs()[-3000:]
    logs = setl.logs()
    resumes = [int(m) for m in re.findall(r"table=\S+\.ints snapshot resumes after chunk (\d+)", logs)]
    assert len(resumes) == 2, logs[-3000:]
    # each restart resumed at (or after) the chunks acked before its kill, never from the start
    assert resumes[0] >= resumed_at[0] - 0 and resumes[0] >= 5
    assert resumes[1] >= resumes[0] + 5
    final = progress(setl)["ints"]
    expected = -(-ROWS // CHUNK)
    # a chunk copied again would count twice; the writer adds up to a few chunks' worth of keys
    assert expected <= final[2] <= expected + 4, (final, writer.transactions)


def test_kill_9_during_a_per_table_snapshot(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """load.mode per_table (chunks' parts by LOAD DATA, each table on its own connection): a kill -9 in
    the middle of a copy under writes, then a restart, resumes after the acked chunks and ends with
    CHECKSUM TABLE equal."""
    rows, chunk = 60_000, 2000
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    t.fill(mariadb_source, source_db, rows, binlog=False)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2107, chunk_rows=chunk, load={"mode": "per_table"})
    kill_once_mid_copy(setl, mariadb_source, source_db, mariadb_target, mysql_db, rows, chunk, seed=5)


def test_kill_9_while_ordered_mode_loads_chunks_by_parts(tmp_path, mariadb_source, mariadb_target, source_db,
                                                        mysql_db):
    """load.chunks per_table (ordered mode) loads chunks as per-table parts, their tables' positions in
    the target: a kill -9 mid-copy under writes, then a restart, resumes after the acked chunks, no
    chunk counted twice, and CHECKSUM TABLE equal after the switch to streaming."""
    rows, chunk = 60_000, 2000
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    t.fill(mariadb_source, source_db, rows, binlog=False)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2111, chunk_rows=chunk, load={"chunks": "per_table"})

    def by_parts() -> bool:
        # A batch of chunks only goes by parts: under the writer some batches mix chunks and binlog
        # changes and go whole, so the kill waits for a part (of this test's tables) to have loaded.
        return bool(mariadb_target.query("SELECT target_table FROM `setl`.`setl_position_table` WHERE"
                                         " target_table LIKE %s", (f"{mysql_db}.%",)))

    kill_once_mid_copy(setl, mariadb_source, source_db, mariadb_target, mysql_db, rows, chunk, seed=11,
                       ready=by_parts)
