"""A kill -9 in the middle of a check: `setl verify` killed while a chunk's consistent snapshot is
open on the source leaves nothing behind (verify only reads: no transaction, lock, table or meta-store
record stays), and the next verify passes; a node killed during a scheduled check runs the next one
normally once restarted."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from tests.e2e.setl_process import binlog_head, mysql_target, spawned
from tests.helpers.wait import wait_until
from tests.verify.test_verify import ROWS, fill, make_setl, running, verify

pytestmark = pytest.mark.timeout(240)

#: the failpoint's log line: the check sits inside a chunk's consistent snapshot on the source
SLEEPING = "failpoint verify_chunk: sleeping"


def _scalar(server, sql: str):
    conn = server.connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def _open_transactions(server) -> int:
    return int(_scalar(server, "SELECT COUNT(*) FROM information_schema.INNODB_TRX"))


def _target_state(server, db: str) -> dict:
    """The target database's tables with their checksums."""
    conn = server.connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY 1", (db,))
        tables = [str(t) for (t,) in cur.fetchall()]
        state = {}
        for table in tables:
            cur.execute(f"CHECKSUM TABLE `{db}`.`{table}`")
            state[table] = cur.fetchone()[1]
        return state


def _marker(table: str) -> str:
    return json.dumps([{"stage": "verify_chunk", "action": "slow", "seconds": 120, "batch": 1, "task": table}])


def test_verify_killed_mid_check_leaves_nothing_behind(tmp_path, mariadb_source, mariadb_target, source_db,
                                                       mysql_db):
    """`setl verify` killed -9 inside a chunk's snapshot while the pipeline runs: the source's binlog and the
    target's tables are unchanged, no transaction stays open on either server, and the next verify passes."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2241)
    with running(setl, mariadb_source):
        head, before = binlog_head(mariadb_source), _target_state(mariadb_target, mysql_db)
        setl.faults = _marker(f"{source_db}.types")
        proc = setl.spawn("verify", "--pipeline", setl.name, "--json", "--chunk-rows", "15")
        setl.faults = None
        try:
            wait_until(lambda: SLEEPING in setl.logs() or proc.poll() is not None, timeout=60, interval=0.2,
                       message="verify at its failpoint")
            assert proc.poll() is None, setl.logs()[-3000:]
            assert _open_transactions(mariadb_source) >= 1  # the chunk's consistent snapshot
        finally:
            proc.kill()
            proc.wait(10)
        assert proc.returncode == -9
        wait_until(lambda: _open_transactions(mariadb_source) == 0 and _open_transactions(mariadb_target) == 0,
                   timeout=30, interval=0.2, message="the killed verify's transactions gone")
        assert binlog_head(mariadb_source) == head  # nothing written to the source
        assert _target_state(mariadb_target, mysql_db) == before  # nor to the target
        status = setl.status()
        assert status["status"] == "running" and status["verify"] is None, status
        code, report = verify(setl, "--chunk-rows", "15")
        assert code == 0 and report["equal"], report
        assert sum(t["rows"] for t in report["tables"]) == 4 * ROWS
        assert binlog_head(mariadb_source) == head


def test_node_killed_during_a_scheduled_check_runs_the_next(tmp_path, mariadb_source, mariadb_target, source_db,
                                                            mysql_db):
    """The node killed -9 while its scheduled check sits inside a chunk's snapshot: no result is kept, the
    source's transaction goes, and the restarted node's next check finds the tables equal."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2242)
    table = f"{source_db}.types"
    setl.config["verify"] = {"every": "2s", "tables": [table], "wait_timeout": "30s", "chunk_rows": 15}
    setl.write_config()
    setl.faults = _marker(table)
    with spawned(setl) as proc:
        setl.faults = None
        wait_until(lambda: SLEEPING in setl.logs() or proc.poll() is not None, timeout=120, interval=0.2,
                   message=lambda: f"the scheduled check at its failpoint: {setl.logs()[-3000:]}")
        assert proc.poll() is None, setl.logs()[-3000:]
        assert _open_transactions(mariadb_source) >= 1
        proc.kill()
        assert proc.wait(10) == -9
    wait_until(lambda: _open_transactions(mariadb_source) == 0, timeout=30, interval=0.2,
               message="the killed check's snapshot gone")
    assert setl.status()["verify"] is None  # a check cut short keeps no result
    restarted = time.time()
    with running(setl, mariadb_source):
        def checked() -> dict | None:
            found = setl.status().get("verify")
            return found if found and found["time"] > restarted else None

        result = wait_until(checked, timeout=90, interval=0.3, message=lambda: f"a check: {setl.logs()[-3000:]}")
        assert result["equal"] and result["error"] is None, result
        assert [t["table"] for t in result["tables"]] == [table] and result["rows"] == ROWS
