"""`setl repair`'s plan from a verify report (`setl.verify.repair`) and the scheduled checks' timing
(`setl.verify.schedule`), without servers."""

from __future__ import annotations

import json

import pytest

from setl.errors import UsageError
from setl.meta import SqliteMetaStore
from setl.model import TableName
from setl.verify import repair

REPORT = {"pipeline": "p", "equal": False, "tables": [
    {"source": "s.keyed", "missing": [{"key": {"a": "1", "b": "x"}}], "extra": [{"key": {"a": "2", "b": "y"}}],
     "different": [{"key": {"a": "1", "b": "x"}, "columns": ["v"]}], "unsettled": []},
    {"source": "s.bag", "missing": [], "extra": [{"row": {"x": "1"}, "count": 1}], "different": []},
    {"source": "s.filtered", "missing": [{"key": {"id": "5"}}], "extra": [], "different": []},
    {"source": "s.equal", "missing": [], "extra": [], "different": []},
]}


def test_keys_become_requests_and_the_rest_whole_copies(monkeypatch):
    """Differing keys (deduplicated, in key-column order) become requests of at most KEYS_PER_REQUEST
    keys; a keyless table and one whose rule needs whole rows are copied whole; equal ones are left."""
    monkeypatch.setattr(repair, "KEYS_PER_REQUEST", 1)
    plan = repair.plan_repairs(REPORT, lambda t: "a row filter" if t.table == "filtered" else None, now=lambda: 7.0)
    assert [(r.table, r.columns, r.keys) for r in plan.requests] == [
        (TableName("s", "keyed"), ("a", "b"), (("1", "x"),)), (TableName("s", "keyed"), ("a", "b"), (("2", "y"),))]
    assert len({r.id for r in plan.requests}) == 2
    assert [(t.table, why) for t, why in plan.whole] == [("bag", "it has no primary key (rows are compared as a "
                                                                  "multiset)"), ("filtered", "a row filter")]
    only = repair.plan_repairs(REPORT, lambda t: None, [TableName("s", "bag")])
    assert only.requests == () and [t for t, _ in only.whole] == [TableName("s", "bag")]


def test_a_report_of_another_pipeline_or_no_report_is_refused(tmp_path):
    """--from-report checks that the file is a verify report of this pipeline."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(REPORT))
    assert repair.load_report(path, "p")["tables"]
    with pytest.raises(UsageError, match="not 'q'"):
        repair.load_report(path, "q")
    path.write_text("[1]")
    with pytest.raises(UsageError, match="no tables list"):
        repair.load_report(path, "p")


def test_a_scheduled_check_is_due_every_period_and_not_while_a_table_is_copied(tmp_path):
    """Never checked: due `first_delay` (or `every`, if shorter) after the node took the pipeline; then
    `every` after the last check the meta store holds; never while a table copy is unfinished."""
    from setl.config import VerifySchedule
    from setl.snapshot import CopyStatus, TableProgress
    from setl.verify.schedule import ScheduledChecks

    meta = SqliteMetaStore(tmp_path / "m.db")
    config = type("C", (), {"name": "p", "verify": VerifySchedule(every="10m")})()
    checks = ScheduledChecks(None, [config], meta, holds=lambda n: True, on_result=lambda n, r: None,  # type: ignore[arg-type]
                             first_delay=60.0)
    assert not checks.due(config, 1000.0)
    assert not checks.due(config, 1059.0) and checks.due(config, 1060.0)
    meta.save_verify_result("p", {"time": 2000.0})
    assert not checks.due(config, 2599.0) and checks.due(config, 2600.0)
    meta.save_snapshot_progress("p", [TableProgress("s", "t", CopyStatus.COPYING)])
    assert not checks.due(config, 9999.0)
    meta.close()


def test_a_repair_is_outstanding_until_its_requests_and_copies_are_done(tmp_path):
    """Requests still in the meta store, a keyed table the node copies whole instead (not done yet),
    and a whole copy not begun anew since the request are outstanding; then nothing is."""
    from setl.snapshot import CopyStatus, TableProgress

    meta = SqliteMetaStore(tmp_path / "m.db")
    keyed, bag = TableName("s", "keyed"), TableName("s", "bag")
    meta.save_snapshot_progress("p", [TableProgress("s", "bag", CopyStatus.DONE, started=1.0)])
    plan = repair.plan_repairs(REPORT, lambda t: None, [keyed, bag], now=lambda: 7.0)
    before = repair.copies_begun(meta, "p")
    repair.submit(meta, "p", plan)
    assert repair.outstanding(meta, "p", plan, before) == [f"repair {plan.requests[0].id} of s.keyed",
                                                            "copy of s.bag"]
    meta.drop_repair_request("p", plan.requests[0].id)
    meta.drop_snapshot_request("p", bag)
    meta.save_snapshot_progress("p", [TableProgress("s", "keyed", CopyStatus.COPYING, started=8.0),
                                      TableProgress("s", "bag", CopyStatus.DONE, started=1.0)])
    assert repair.outstanding(meta, "p", plan, before) == ["copy of s.keyed", "copy of s.bag"]
    meta.save_snapshot_progress("p", [TableProgress("s", "keyed", CopyStatus.DONE, started=8.0),
                                      TableProgress("s", "bag", CopyStatus.DONE, started=9.0)])
    assert repair.outstanding(meta, "p", plan, before) == []
    meta.close()


def test_stopping_ends_a_check_waiting_for_the_ack(tmp_path):
    """A check waiting (for the acked position, or its throttle) ends as soon as the node stops,
    without a result in the meta store."""
    import threading

    from setl.config import VerifySchedule
    from setl.verify.schedule import ScheduledChecks

    meta = SqliteMetaStore(tmp_path / "m.db")
    config = type("C", (), {"name": "p", "verify": VerifySchedule(every="1s", tables=("s.t",))})()
    waiting = threading.Event()

    def check(settings, config, meta, tables, *, sleep, **kwargs):
        assert tables == [TableName("s", "t")] and kwargs["wait_timeout"] == 300.0
        assert (kwargs["max_lag"], kwargs["lag_timeout"], kwargs["engine"]) == (30.0, 1800.0, "local")
        waiting.set()
        while True:
            sleep(0.05)

    checks = ScheduledChecks(None, [config], meta, holds=lambda n: True, on_result=lambda n, r: None,  # type: ignore[arg-type]
                             check=check, tick=0.01, first_delay=0.0)
    checks.start()
    thread = checks._thread
    assert thread is not None
    try:
        assert waiting.wait(10)
    finally:
        checks.stop(timeout=10)
    assert not thread.is_alive() and meta.verify_result("p") is None
    meta.close()
