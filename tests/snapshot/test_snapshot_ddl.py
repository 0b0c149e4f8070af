"""A DDL on a table in the middle of its copy: the copy never goes on with a plan (columns, key) made
before the DDL, neither while running nor when it resumes after a crash; the target ends equal."""

from __future__ import annotations

import json
import signal

import pytest

from tests.e2e.setl_process import SetlProcess, mysql_target, spawned
from tests.helpers.wait import wait_until
from tests.snapshot import tables as t
from tests.snapshot.test_snapshot_e2e import make_setl, run_until_caught_up
from tests.snapshot.test_snapshot_resume import progress

pytestmark = pytest.mark.timeout(400)

ROWS = 60_000
CHUNK = 500
# The key changes from (id) to (c), and id goes: reading on after the last id copied would be wrong.
ALTER = ("ALTER TABLE ints DROP PRIMARY KEY, DROP COLUMN id, ADD PRIMARY KEY (c), "
         "ADD COLUMN extra INT NOT NULL DEFAULT 7")


def _equal(source, source_db: str, target, target_db: str, tables: list[str] | None = None) -> None:
    names = tables or list(t.TABLES)
    assert t.checksums(source, source_db, names) == t.checksums(target, target_db, names)
    for name in names:
        assert t.mariadb_rows(source, source_db, name) == t.mariadb_rows(target, target_db, name), name


def _filled(tmp_path, source, target, source_db: str, target_db: str, *, server_id: int) -> SetlProcess:
    """The test tables on both sides, ROWS of them on the source (outside the binlog), and a
    pipeline that snapshots them in chunks of CHUNK rows."""
    t.create(source, source_db)
    t.create(target, target_db)
    t.fill(source, source_db, ROWS, binlog=False)
    return make_setl(tmp_path, source, source_db, mysql_target(target), f"{target_db}.{{table}}",
                     server_id=server_id, chunk_rows=CHUNK)


def test_a_table_altered_while_being_copied_is_copied_again(tmp_path, mariadb_source, mariadb_target, source_db,
                                                            mysql_db):
    """ALTER TABLE (new key, a column dropped, one added) on the source while its copy runs, then
    writes to the new column, and a RENAME of another table: the copy starts again with the new
    definition, the renamed table is copied under its new name, and the target (which replays the
    DDL) ends equal to the source, row by row."""
    setl = _filled(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, server_id=2111)
    with spawned(setl) as proc:
        def copying() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            ints = progress(setl).get("ints")
            return ints is not None and ints[0] == "copying" and ints[2] >= 3

        wait_until(copying, timeout=120, interval=0.05, message=lambda: f"progress {progress(setl)}")
        before = progress(setl)["ints"]
        conn = mariadb_source.connect(database=source_db)
        try:
            with conn.cursor() as cur:
                cur.execute(ALTER)
                cur.execute("UPDATE ints SET extra = k WHERE k < 10")
                cur.execute("INSERT INTO ints (k, c, extra) VALUES (1, 'after the alter', 99)")
                cur.execute("RENAME TABLE strs TO strs2")
                cur.execute("UPDATE strs2 SET n = n + 1 WHERE n < 100")
            conn.commit()
        finally:
            conn.close()
        assert before[2] < -(-ROWS // CHUNK) - 10, before  # the copy was far from over

        def done() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            found = progress(setl)
            return len(found) >= len(t.TABLES) and all(s == "done" for s, _, _ in found.values())

        wait_until(done, timeout=180, interval=0.2, message=lambda: f"progress {progress(setl)}: {setl.logs()[-5000:]}")
        assert setl.stop(proc) == 0
    logs = setl.logs() + run_until_caught_up(setl)
    _equal(mariadb_source, source_db, mariadb_target, mysql_db, [n for n in t.TABLES if n != "strs"] + ["strs2"])
    assert not mariadb_target.query(f"SHOW TABLES FROM `{mysql_db}` LIKE 'strs'")
    # Either the DDL reached the stream first (the copy starts again after it), or a chunk read
    # failed on the new definition first (a retry; the resume sees the new key): never read on.
    assert (f"table={source_db}.ints position=" in logs and "altered while being copied" in logs) or (
        f"table={source_db}.ints its primary key is (c) now, not (id)" in logs), logs[-4000:]
    final = progress(setl, full=True)["ints"]
    assert final.key == ("c",) and final.rows == ROWS + 1, final


def test_a_key_changed_while_stopped_mid_copy_restarts_the_copy(tmp_path, mariadb_source, mariadb_target,
                                                                source_db, mysql_db):
    """kill -9 in the middle of a copy, the table's primary key changed while setl is down: the
    next start does not resume after a key of the old shape, it copies the table again. Another
    table half copied was renamed with the binlog off: its copy ends with a warning, not a hang."""
    setl = _filled(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, server_id=2112)
    with spawned(setl) as proc:
        def copying() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            found = progress(setl)
            ints, strs = found.get("ints"), found.get("strs")
            return (ints is not None and ints[0] == "copying" and ints[2] >= 3
                    and strs is not None and strs[0] == "copying" and strs[2] >= 1)

        wait_until(copying, timeout=120, interval=0.05, message=lambda: f"progress {progress(setl)}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    stopped = progress(setl, full=True)
    assert stopped["ints"].status.value == "copying" and stopped["ints"].key == ("id",), stopped
    assert stopped["strs"].status.value == "copying", stopped
    mariadb_source.query(f"ALTER TABLE `{source_db}`.`ints` DROP PRIMARY KEY, ADD PRIMARY KEY (k, id)")
    conn = mariadb_source.connect(database=source_db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("RENAME TABLE strs TO strs_hidden")
    finally:
        conn.close()
    stderr = run_until_caught_up(setl)
    _equal(mariadb_source, source_db, mariadb_target, mysql_db, [n for n in t.TABLES if n != "strs"])
    assert f"table={source_db}.ints its primary key is (k, id) now, not (id)" in stderr, stderr[-3000:]
    assert f"table={source_db}.strs position=" in stderr and "no DDL in the binlog removed it" in stderr, \
        stderr[-3000:]
    assert progress(setl)["strs"][0] == "done"
    final = progress(setl, full=True)["ints"]
    assert final.key == ("k", "id") and final.rows == ROWS, final


def test_a_copy_ended_by_a_rename_is_done_only_once_the_rename_is_acked(tmp_path, mariadb_source, mariadb_target,
                                                                        source_db, mysql_db):
    """RENAME TABLE of a table in the middle of its copy, and kill -9 (the `snapshot_ended`
    failpoint) while the RENAME is handed on and not acked: the meta store does not say the copy
    is done (nor that the new name's copy began), so the next start resumes it, replays the RENAME,
    copies the new name after it, and the target ends equal to the source."""
    setl = _filled(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, server_id=2113)
    setl.faults = json.dumps([{"stage": "snapshot_ended", "action": "crash", "task": f"{source_db}.strs"}])
    with spawned(setl) as proc:
        def copying() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            strs = progress(setl).get("strs")
            return strs is not None and strs[0] == "copying" and strs[2] >= 3

        wait_until(copying, timeout=120, interval=0.05, message=lambda: f"progress {progress(setl)}")
        conn = mariadb_source.connect(database=source_db)
        try:
            with conn.cursor() as cur:
                cur.execute("RENAME TABLE strs TO strs2")
                cur.execute("UPDATE strs2 SET n = n + 1 WHERE n < 100")
            conn.commit()
        finally:
            conn.close()
        assert proc.wait(60) == -signal.SIGKILL, setl.logs()[-3000:]
    assert "failpoint snapshot_ended: crashing" in setl.logs(), setl.logs()[-3000:]
    crashed = progress(setl)
    assert crashed["strs"][0] == "copying" and "strs2" not in crashed, crashed
    setl.faults = None
    run_until_caught_up(setl)
    _equal(mariadb_source, source_db, mariadb_target, mysql_db, [n for n in t.TABLES if n != "strs"] + ["strs2"])
    assert not mariadb_target.query(f"SHOW TABLES FROM `{mysql_db}` LIKE 'strs'")
    found = progress(setl)
    assert found["strs"][0] == "done" and found["strs2"][0] == "done", found
