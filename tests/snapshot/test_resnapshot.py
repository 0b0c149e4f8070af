"""`setl snapshot --table` while the pipeline streams and a writer writes: a table copied again
(after its target copy was damaged) and a table added to the rules later both end equal."""

from __future__ import annotations

import re

import pytest

from tests.e2e.setl_process import mysql_target, spawned
from tests.helpers.wait import wait_until
from tests.snapshot import tables as t
from tests.snapshot.test_snapshot_resume import progress
from tests.snapshot.test_snapshot_e2e import make_setl, run_until_caught_up

pytestmark = pytest.mark.timeout(400)

ROWS = 10_000


def test_snapshot_one_table_while_running(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """A re-copy of a damaged table and the copy of a table added to the rules later run online (the
    pipeline keeps streaming) and end equal to the source by CHECKSUM TABLE."""
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    t.fill(mariadb_source, source_db, ROWS, binlog=False)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2104)
    setl.config["tables"] = [{"source": rf"{re.escape(source_db)}\.ints", "target": f"{mysql_db}.{{table}}"}]
    setl.write_config()

    def copied(proc, table: str, started_after: float = 0.0) -> float:
        """Wait for a copy of `table` begun after `started_after` to be done; when it began."""
        def done() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            found = progress(setl, full=True).get(table)
            return found is not None and found.status.value == "done" and found.started > started_after

        wait_until(done, timeout=120, interval=0.2, message=lambda: f"{table} copied: {progress(setl)}")
        return progress(setl, full=True)[table].started

    with t.Writer(mariadb_source, source_db, ROWS, seed=5) as writer:
        with spawned(setl) as proc:
            first = copied(proc, "ints")
            # damage the copy behind setl's back, then ask for the table again
            mariadb_target.query(f"DELETE FROM `{mysql_db}`.`ints` WHERE id % 3 = 0")
            mariadb_target.query(f"UPDATE `{mysql_db}`.`ints` SET c = 'damaged' WHERE id % 5 = 0")
            result = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.ints")
            assert result.returncode == 0, result.stderr
            assert "within seconds" in result.stdout
            wait_until(lambda: "snapshot requested for" in setl.logs(), timeout=30,
                       message="the running source took the request")
            copied(proc, "ints", started_after=first)
            assert setl.stop(proc) == 0
        # a table the rules did not select, added later: its existing rows arrive by a snapshot
        setl.config["tables"] = [{"source": rf"{re.escape(source_db)}\.(ints|strs)",
                                  "target": f"{mysql_db}.{{table}}"}]
        setl.write_config()
        with spawned(setl) as proc:
            wait_until(lambda: "reading the mariadb binlog" in setl.logs().split("finished: stopped")[-1],
                       timeout=60, message="the second start")
            result = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.strs")
            assert result.returncode == 0, result.stderr
            copied(proc, "strs")
            assert setl.stop(proc) == 0
        refused = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.comp")
        assert refused.returncode == 2 and "no table rule selects" in refused.stderr
        assert writer.transactions > 100
    run_until_caught_up(setl)
    assert t.checksums(mariadb_source, source_db, ["ints", "strs"]) == t.checksums(
        mariadb_target, mysql_db, ["ints", "strs"]), setl.logs()[-3000:]
