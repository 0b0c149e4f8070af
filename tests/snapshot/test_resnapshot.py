"""`setl snapshot --table` while the pipeline streams and a writer writes: a table copied again
(after its target copy was damaged) and a table added to the rules later both end equal."""

from __future__ import annotations

import re

import pytest

from tests.e2e.setl_process import mysql_target, spawned
from tests.helpers.receiver import Receiver
from tests.helpers.wait import wait_until
from tests.snapshot import tables as t
from tests.snapshot.test_snapshot_e2e import make_setl, run_until_caught_up
from tests.snapshot.test_snapshot_resume import progress

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


def test_a_copy_requested_while_stopped_is_served_by_until_caught_up(tmp_path, mariadb_source, mariadb_target,
                                                                      source_db, mysql_db):
    """Issue 23 item 1: `setl snapshot --table T` while the pipeline is stopped, then `setl start
    --until-caught-up`: the start copies T before it reports caught up (it used to exit 0 at once,
    T empty, the request left pending)."""
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2105)
    setl.config["tables"] = [{"source": rf"{re.escape(source_db)}\.ints", "target": f"{mysql_db}.{{table}}"}]
    setl.write_config()
    run_until_caught_up(setl)  # the first start copies ints (empty now)
    t.fill(mariadb_source, source_db, 3000, binlog=False)  # rows the binlog never holds
    result = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.ints")
    assert result.returncode == 0 and "when the pipeline starts" in result.stdout, result.stdout + result.stderr
    run_until_caught_up(setl)
    count = "SELECT COUNT(*) FROM `{}`.ints"
    assert mariadb_target.query(count.format(mysql_db)) == mariadb_source.query(count.format(source_db)) != [(0,)]
    assert t.checksums(mariadb_source, source_db, ["ints"]) == t.checksums(mariadb_target, mysql_db, ["ints"])
    assert setl.status()["snapshot"][0]["status"] == "done"


def test_a_copy_the_running_node_cannot_serve_is_refused(tmp_path, mariadb_source, mariadb_target, source_db,
                                                         mysql_db):
    """Issue 23 item 2: a rule added to the file of a running pipeline selects a new table; the
    running node runs with its start's rules and would drop the request, so the CLI refuses it with
    exit 2 instead of saying "starts within seconds"."""
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2106)
    setl.config["tables"] = [{"source": rf"{re.escape(source_db)}\.ints", "target": f"{mysql_db}.{{table}}"}]
    setl.write_config()
    with spawned(setl) as proc:
        wait_until(lambda: setl.status()["status"] == "running" and "rules" in (setl.liveness_figures() or {}),
                   timeout=60, message="a running node's beat")
        setl.config["tables"] = [{"source": rf"{re.escape(source_db)}\.(ints|strs)",
                                  "target": f"{mysql_db}.{{table}}"}]
        setl.write_config()
        refused = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.strs")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "other table rules" in refused.stderr and "restart the pipeline" in refused.stderr
        assert refused.stderr.count("\n") == 1
        assert proc.poll() is None
        assert setl.stop(proc) == 0


def test_each_finished_copy_sends_snapshot_done(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """Issue 23 item 6: `snapshot_done`, a documented alert event, is sent once per table whose copy
    is acked to its end, with the table and its rows."""
    t.create(mariadb_source, source_db)
    t.fill(mariadb_source, source_db, 1000, binlog=False)
    receiver = Receiver()
    try:
        setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target),
                         f"{mysql_db}.{{table}}", server_id=2107)
        setl.config["tables"] = [{"source": rf"{re.escape(source_db)}\.(ints|strs)",
                                  "target": f"{mysql_db}.{{table}}"}]
        setl.write_config()
        conf = setl.conf / "setl.yaml"
        conf.write_text(conf.read_text() + f"alerts:\n  - webhook: {receiver.url}\n    events: [snapshot_done]\n")
        run_until_caught_up(setl)
        sent = sorted((a["event"], a["table"], a["rows"]) for a in receiver.bodies)
        count = "SELECT COUNT(*) FROM `{}`.`{}`"
        assert sent == sorted(("snapshot_done", f"{source_db}.{name}",
                               mariadb_source.query(count.format(source_db, name))[0][0]) for name in ("ints", "strs"))
    finally:
        receiver.close()
