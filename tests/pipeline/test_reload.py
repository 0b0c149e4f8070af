"""Issue 23: rule reload on a running node (`setl reload`, SIGHUP). A table added to the rules while
writes continue ends with exactly the source's rows, the other tables undisturbed; a change that
cannot apply online (the target) is refused and the pipeline keeps running on its old rules."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import pytest

from tests.e2e.setl_process import SetlProcess, mysql_target, spawned
from tests.helpers.receiver import Receiver
from tests.helpers.wait import wait_until
from tests.snapshot import tables as t
from tests.snapshot.test_snapshot_e2e import make_setl
from tests.snapshot.test_snapshot_resume import progress

pytestmark = pytest.mark.timeout(300)

ROWS = 1500


def _rules(source_db: str, mysql_db: str, pattern: str) -> list[dict[str, Any]]:
    return [{"source": rf"{re.escape(source_db)}\.{pattern}", "target": f"{mysql_db}.{{table}}"}]


def _copied(setl: SetlProcess, proc: Any, table: str) -> None:
    def done() -> bool:
        assert proc.poll() is None, setl.logs()[-3000:]
        found = progress(setl, full=True).get(table)
        return found is not None and found.status.value == "done"

    wait_until(done, timeout=120, interval=0.2, message=lambda: f"{table} copied: {progress(setl)}")


def _equal(setl: SetlProcess, proc: Any, source: Any, source_db: str, target: Any, mysql_db: str,
           tables: list[str]) -> None:
    """Wait (bounded) until every table of `tables` holds exactly the source's rows."""
    def same() -> bool:
        assert proc.poll() is None, setl.logs()[-3000:]
        return all(t.mariadb_rows(source, source_db, name) == t.mariadb_rows(target, mysql_db, name)
                   for name in tables)

    wait_until(same, timeout=120, interval=0.5, message=lambda: f"{tables} equal; log: {setl.logs()[-2000:]}")


def test_a_table_added_by_setl_reload_ends_with_every_row(tmp_path, mariadb_source, mariadb_target, source_db,
                                                         mysql_db):
    """A table added to the YAML of a running pipeline while a writer changes it, then `setl reload`:
    the node applies the new rules, copies the table online and streams it; it ends with exactly the
    source's rows, the table that ran before stays equal, the liveness figures carry the new rules'
    fingerprint (so `setl snapshot --table` of the new table is accepted)."""
    t.create(mariadb_source, source_db)
    t.fill(mariadb_source, source_db, ROWS, binlog=False)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2311)
    setl.config["tables"] = _rules(source_db, mysql_db, "ints")
    setl.write_config()
    with t.Writer(mariadb_source, source_db, ROWS, seed=23) as writer, spawned(setl) as proc:
        _copied(setl, proc, "ints")
        before = (setl.liveness_figures() or {}).get("rules")
        ints_copy = progress(setl, full=True)["ints"].started
        setl.config["tables"] = _rules(source_db, mysql_db, "(ints|strs)")
        setl.write_config()
        result = setl.run("reload", "--pipeline", setl.name)
        assert result.returncode == 0, result.stderr + setl.logs()[-3000:]
        assert "reload applied" in result.stdout and "strs" in result.stdout, result.stdout
        _copied(setl, proc, "strs")
        wait_until(lambda: (setl.liveness_figures() or {}).get("rules") not in (None, before), timeout=30,
                   message="the new rules' fingerprint published")
        again = setl.run("snapshot", "--pipeline", setl.name, "--table", f"{source_db}.strs")
        assert again.returncode == 0, again.stderr
        _copied(setl, proc, "strs")
        writer.stop.set()
        writer.thread.join(30)
        assert writer.transactions > 50
        _equal(setl, proc, mariadb_source, source_db, mariadb_target, mysql_db, ["ints", "strs"])
        assert len(t.mariadb_rows(mariadb_target, mysql_db, "strs")) >= ROWS
        assert progress(setl, full=True)["ints"].started == ints_copy  # ints streamed on, never copied again
        _lag_is_true_after_the_reload(setl, mariadb_source, source_db)
        assert setl.stop(proc) == 0
    untouched = {name for (name,) in mariadb_target.query(f"SHOW TABLES FROM `{mysql_db}`")}
    assert untouched == {"ints", "strs"}  # the other source tables stay out


def _lag_is_true_after_the_reload(setl: SetlProcess, source: Any, source_db: str) -> None:
    """Caught up after a reload, the lag reads as before it: near zero, the source heard within its
    heartbeat, and it stays so (the reader the figures came from before the reload is closed; read
    from it, the lag grew by a second every second)."""
    source.query(f"CREATE TABLE IF NOT EXISTS `{source_db}`.lag_probe (id INT PRIMARY KEY)")
    source.query(f"INSERT INTO `{source_db}`.lag_probe VALUES (1)")  # a change after the reload, read by its reader

    def caught_up() -> bool:
        figures = setl.liveness_figures() or {}
        return figures.get("caught_up") is True and (figures.get("lag_seconds") or 0) < 3

    wait_until(caught_up, timeout=60, interval=0.5, message=lambda: f"caught up: {setl.liveness_figures()}")
    until = time.monotonic() + 6  # and so it stays: the figures do not age

    def steady() -> bool:
        figures = setl.liveness_figures() or {}
        assert (figures.get("lag_seconds") or 0) < 3, figures
        heard = figures.get("source_heard_ago")
        assert heard is not None and heard < 5, figures
        row = setl.status()
        assert row["lag_seconds"] is not None and row["lag_seconds"] < 3, row
        return time.monotonic() >= until

    wait_until(steady, timeout=30, interval=1, message="six seconds of true lag figures")


def test_a_changed_target_is_refused_and_sighup_reloads(tmp_path, mariadb_source, mariadb_target, source_db,
                                                       mysql_db):
    """`setl reload` of a file whose target changed is refused (exit 1, one line, the reload_refused
    alert) and the pipeline keeps streaming on its old configuration; SIGHUP to the node then applies
    an added table like `setl reload`; a reload while paused is copied once resumed."""
    t.create(mariadb_source, source_db)
    t.fill(mariadb_source, source_db, ROWS, binlog=False)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2312)
    setl.config["tables"] = _rules(source_db, mysql_db, "ints")
    setl.write_config()
    receiver = Receiver()
    node = setl.conf / "setl.yaml"
    node.write_text(node.read_text() + f"alerts:\n  - webhook: {receiver.url}\n    events: [reload_refused]\n")
    with spawned(setl) as proc:
        _copied(setl, proc, "ints")
        good = dict(setl.config)
        setl.config["target"] = {**setl.config["target"], "port": setl.config["target"]["port"] + 1}
        setl.config["tables"] = _rules(source_db, mysql_db, "(ints|strs)")
        setl.write_config()
        refused = setl.run("reload", "--pipeline", setl.name)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        [line] = [line for line in refused.stderr.splitlines() if line.startswith("setl: error")]
        assert "refused" in line and "target" in line, line
        wait_until(lambda: receiver.bodies, timeout=30, message="the reload_refused alert")
        assert receiver.bodies[0]["event"] == "reload_refused" and "target" in receiver.bodies[0]["error"]
        mariadb_source.query(f"INSERT INTO `{source_db}`.ints VALUES (-1, 1, 'after the refusal')")
        _equal(setl, proc, mariadb_source, source_db, mariadb_target, mysql_db, ["ints"])  # still streaming

        setl.config = {**good, "tables": _rules(source_db, mysql_db, "(ints|strs)")}
        setl.write_config()
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "stage=reload applied" in setl.logs(), timeout=60, message="SIGHUP applied the reload")
        _copied(setl, proc, "strs")
        mariadb_source.query(f"UPDATE `{source_db}`.strs SET n = -n WHERE n < 10")
        _equal(setl, proc, mariadb_source, source_db, mariadb_target, mysql_db, ["ints", "strs"])

        # paused: the reload waits for `setl resume`, which runs the new rules and copies the table
        assert setl.run("pause", "--pipeline", setl.name).returncode == 0
        wait_until(lambda: "paused by an operator; stopping gracefully" in setl.logs(), timeout=30,
                   message="the node stopped the paused pipeline")
        setl.config["tables"] = _rules(source_db, mysql_db, "(ints|strs|comp)")
        setl.write_config()
        deferred = setl.run("reload", "--pipeline", setl.name)
        # the paused node swaps the new stages in at its next look (applied) or says it will (deferred)
        assert deferred.returncode == 0 and re.search("reload (applied|deferred)", deferred.stdout), \
            deferred.stdout + deferred.stderr
        assert setl.run("resume", "--pipeline", setl.name).returncode == 0
        _copied(setl, proc, "comp")
        _equal(setl, proc, mariadb_source, source_db, mariadb_target, mysql_db, ["ints", "strs", "comp"])
        assert setl.stop(proc) == 0
    receiver.close()


def test_what_a_reload_may_change(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """`setl.pipeline.reload.prepare` against a real source: unchanged rules are nothing to do; a table
    added is listed for an online copy; a rule that would route a running table elsewhere, new
    transform steps, changed pipeline settings and a scheduled check added are refused as a whole."""
    from setl.config import load_node, load_pipeline
    from setl.connectors import for_node
    from setl.meta.sqlite import SqliteMetaStore
    from setl.model import TableName
    from setl.pipeline import build_stages
    from setl.pipeline.reload import ReloadRefused, prepare

    t.create(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2313)
    settings = load_node(setl.conf)

    def config(**changes: Any):
        setl.config.update(changes)
        setl.write_config()
        return load_pipeline(setl.conf, setl.name, for_node(settings))

    old = config(tables=_rules(source_db, mysql_db, "ints"))
    old_pipeline = dict(setl.config["pipeline"])
    meta = SqliteMetaStore(tmp_path / "reload-meta.db")
    running = build_stages(settings, old, meta)
    try:
        assert prepare(settings, old, config(), meta, running) is None
        added = prepare(settings, old, config(tables=_rules(source_db, mysql_db, "(ints|strs)")), meta, running)
        assert added is not None and added.added == (TableName(source_db, "strs"),) and added.removed == ()
        added.stages.load.close()
        elsewhere = [{"source": rf"{re.escape(source_db)}\.(ints|strs)", "target": f"{mysql_db}.x_{{table}}"}]
        with pytest.raises(ReloadRefused, match=f"table {source_db}.ints would be replicated differently"):
            prepare(settings, old, config(tables=elsewhere), meta, running)
        steps = [{**_rules(source_db, mysql_db, "ints")[0],
                  "transforms": [{"use": "add_column", "name": "k2", "expr": "k * 2"}]}]
        with pytest.raises(ReloadRefused, match="transform steps changed"):
            prepare(settings, old, config(tables=steps), meta, running)
        with pytest.raises(ReloadRefused, match="pipeline settings changed"):
            prepare(settings, old, config(tables=_rules(source_db, mysql_db, "(ints|strs)"),
                                          pipeline={**setl.config["pipeline"], "parallelism": 1}), meta, running)
        with pytest.raises(ReloadRefused, match="verify settings changed"):
            prepare(settings, old, config(tables=_rules(source_db, mysql_db, "ints"), verify={"every": "1h"},
                                          pipeline=old_pipeline), meta, running)
    finally:
        meta.close()
