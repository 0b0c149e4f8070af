"""A node killed (SIGKILL) during a repair: while reading the keys, and after the batch holding them
was acked but before its request was dropped. The next start serves the request again, and the
target ends equal to the source, with the source's writes made meanwhile, nothing lost or doubled."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from tests.e2e.setl_process import mysql_target
from tests.verify.test_verify import ROWS, fill, make_setl, running, verify

pytestmark = pytest.mark.timeout(240)


def test_kill_during_repair_loses_and_repeats_nothing(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """Drift queued for repair while stopped; a start killed at the repair's read, one killed right
    after its ack, then a clean start: verify equal, every row once, the source's later writes in."""
    fill(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2231)
    with running(setl, mariadb_source):
        conn = mariadb_target.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(f"DELETE FROM `{mysql_db}`.types WHERE id IN (1, 2)")
            cur.execute(f"UPDATE `{mysql_db}`.types SET i = -1 WHERE id = 3")
            cur.execute(f"INSERT INTO `{mysql_db}`.types (id, i) VALUES (500, 1)")
        code, report = verify(setl, "--table", f"{source_db}.types")
    assert code == 1
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    result = setl.run("repair", "--pipeline", setl.name, "--from-report", str(path))
    assert result.returncode == 1 and "not running" in result.stdout, result.stdout + result.stderr
    conn = mariadb_source.connect(database=source_db)
    with contextlib.closing(conn), conn.cursor() as cur:  # the source moves on meanwhile
        cur.execute("UPDATE types SET i = 42 WHERE id IN (2, 3)")
        cur.execute("INSERT INTO types (id, i) VALUES (600, 6), (601, 7)")
    for marker in ({"stage": "snapshot_read", "action": "crash", "task": f"{source_db}.types"},
                   {"stage": "repair_acked", "action": "crash", "task": f"{source_db}.types"}):
        setl.faults = json.dumps([marker])
        killed = setl.start_until_caught_up(timeout=120)
        assert killed.returncode == -9, (marker, killed.returncode, killed.stderr[-3000:])
    setl.faults = None
    done = setl.start_until_caught_up(timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    served = re.findall(r"table=\S+\.types position=\S+ repair \S+: (\d+) row\(s\) copied again, (\d+) deleted",
                        setl.logs() + killed.stderr + done.stderr)
    assert ("3", "1") in served, served  # keys 1, 2, 3 read again, 500 deleted
    with running(setl, mariadb_source):
        code, report = verify(setl)
    assert code == 0 and report["equal"], report
    conn = mariadb_target.connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*), COUNT(DISTINCT id), SUM(id IN (600, 601)), SUM(id = 500) "
                    f"FROM `{mysql_db}`.types")
        assert tuple(int(v) for v in cur.fetchone()) == (ROWS + 2, ROWS + 2, 2, 0)
        cur.execute(f"SELECT id, i FROM `{mysql_db}`.types WHERE id IN (1, 2, 3) ORDER BY id")
        assert [(int(a), int(b)) for a, b in cur.fetchall()] == [(1, 1000), (2, 42), (3, 42)]
