"""The SQLite meta store: atomic acks, history, state, epochs, resets, and sharing across processes."""

from __future__ import annotations

import multiprocessing

import attrs

from setl.meta import SqliteMetaStore, Status
from setl.model import Position


def test_ack_history_state_and_epochs(tmp_path):
    """Acks persist position and history together; epochs only grow; state keeps its error."""
    meta = SqliteMetaStore(tmp_path / "m.db")
    assert meta.position("p") is None and meta.state("p").status is Status.STOPPED
    assert [meta.next_epoch("p") for _ in range(3)] == [1, 2, 3]
    meta.ack("p", 1, 3, Position("f", 10), rows=5)
    meta.ack("p", 2, 3, Position("f", 20), rows=5)
    assert meta.position("p").position == Position("f", 20)
    assert [a.batch_id for a in meta.history("p")] == [2, 1]
    meta.set_state("p", Status.PAUSED, error="boom")
    meta.close()
    again = SqliteMetaStore(tmp_path / "m.db")
    assert again.state("p").status is Status.PAUSED and again.state("p").error == "boom"
    assert again.state("p").epoch == 3 and again.next_epoch("p") == 4
    assert again.pipelines() == ["p"]
    assert again.next_epoch("p", at_least=10) == 10 and again.next_epoch("p", at_least=3) == 11
    assert again.next_epoch("q", at_least=5) == 5


def test_reset_marks_the_position_until_the_next_ack(tmp_path):
    """A reset position is flagged as such until an ack replaces it; None forgets it."""
    meta = SqliteMetaStore(tmp_path / "m.db")
    meta.ack("p", 4, 1, Position("f", 40))
    meta.reset_position("p", Position("f", 0))
    assert meta.position("p").position == Position("f", 0) and meta.position_was_reset("p")
    meta.ack("p", 5, 2, Position("f", 50))
    assert not meta.position_was_reset("p")
    meta.reset_position("p", None)
    assert meta.position("p") is None


def _ack_many(path, pipeline, n):
    meta = SqliteMetaStore(path)
    for i in range(1, n + 1):
        meta.ack(pipeline, i, 1, Position("f", i))
    meta.close()


def test_two_processes_write_one_file_without_losing_acks(tmp_path):
    """Two processes acking into one file concurrently (node and CLI) both succeed completely."""
    path = tmp_path / "m.db"
    SqliteMetaStore(path).close()
    procs = [multiprocessing.Process(target=_ack_many, args=(path, name, 200)) for name in ("a", "b")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    meta = SqliteMetaStore(path)
    assert meta.position("a").batch_id == 200 and meta.position("b").batch_id == 200
    assert len(meta.history("a", 1000)) == 200


def test_reset_to_the_start_forgets_the_position_and_stays_a_reset_until_the_next_ack(tmp_path):
    """reset_position(None): no position, position_was_reset true (the target's record is ignored) until an ack."""
    meta = SqliteMetaStore(tmp_path / "m.db")
    meta.ack("p", 7, 2, Position("f", 70))
    meta.reset_position("p", None)
    assert meta.position("p") is None and meta.position_was_reset("p")
    meta.ack("p", 1, 3, Position("f", 10))
    assert meta.position("p").position == Position("f", 10) and not meta.position_was_reset("p")


def test_retrying_state_round_trips_and_any_other_write_clears_it(tmp_path):
    """set_state(..., retrying_since=T) reads back as retrying; a plain RUNNING write clears it."""
    meta = SqliteMetaStore(tmp_path / "m.db")
    meta.set_state("p", Status.RUNNING, error="target away", retrying_since=123.0)
    state = SqliteMetaStore(tmp_path / "m.db").state("p")
    assert state.retrying and state.retrying_since == 123.0 and state.error == "target away"
    meta.set_state("p", Status.RUNNING)
    assert not meta.state("p").retrying and meta.state("p").error is None


def test_snapshot_progress_and_requests_round_trip(tmp_path):
    """Snapshot progress (keys of any type, replaced per table) and requests read back from another handle."""
    import datetime

    from setl.model import TableName
    from setl.snapshot import CopyStatus, TableProgress

    a, b = SqliteMetaStore(tmp_path / "m.db"), SqliteMetaStore(tmp_path / "m.db")
    key = ("Ab", datetime.date(2024, 5, 6), datetime.timedelta(seconds=90), b"\xff")
    a.save_snapshot_progress("p", [TableProgress("s", "t", CopyStatus.COPYING, key, 5, 9, 1)])
    a.save_snapshot_progress("p", [TableProgress("s", "t", CopyStatus.DONE, key, 9, 9, 2),
                                   TableProgress("s", "a", CopyStatus.PENDING)])
    assert [(p.table, p.status, p.last_key, p.rows) for p in b.snapshot_progress("p")] == [
        ("a", CopyStatus.PENDING, None, 0), ("t", CopyStatus.DONE, key, 9)]
    assert b.snapshot_progress("other") == []
    b.request_snapshot("p", TableName("s", "t"))
    b.request_snapshot("p", TableName("s", "t"))
    assert a.snapshot_requests("p") == [TableName("s", "t")]
    a.drop_snapshot_request("p", TableName("s", "t"))
    assert b.snapshot_requests("p") == []
    a.close()
    b.close()


def test_an_ack_writes_its_snapshot_progress_in_the_same_transaction(tmp_path):
    """`ack(progress=...)` persists position, history and table-copy progress together; when the
    progress cannot be written (a key value no encoding knows) the ack writes nothing at all."""
    import pytest

    from setl.tablecopy import CopyStatus, TableProgress

    a, b = SqliteMetaStore(tmp_path / "m.db"), SqliteMetaStore(tmp_path / "m.db")
    copied = TableProgress("s", "t", CopyStatus.COPYING, (10,), 10, 50, 1)
    a.ack("p", 1, 1, Position("f", 10), rows=10, progress=[copied])
    assert b.position("p").position == Position("f", 10) and b.snapshot_progress("p") == [copied]
    broken = TableProgress("s", "t", CopyStatus.COPYING, (object(),), 20, 50, 2)
    with pytest.raises(TypeError):
        a.ack("p", 2, 1, Position("f", 20), rows=10, progress=[TableProgress("s", "a", CopyStatus.DONE), broken])
    assert b.position("p").batch_id == 1 and [h.batch_id for h in b.history("p")] == [1]
    assert b.snapshot_progress("p") == [copied]
    done = attrs.evolve(copied, status=CopyStatus.DONE, rows=20, chunks=2)
    a.ack("p", 2, 1, Position("f", 20), progress=[done])
    assert b.position("p").batch_id == 2 and b.snapshot_progress("p") == [done]


def test_repair_requests_and_verify_results_round_trip(tmp_path):
    """Repair requests (replaced by id, ordered by id, dropped idempotently) and the last scheduled
    check read back from another handle."""
    from setl.meta.base import RepairRequest
    from setl.model import TableName

    a, b = SqliteMetaStore(tmp_path / "m.db"), SqliteMetaStore(tmp_path / "m.db")
    first = RepairRequest("2-00001", TableName("s", "t"), ("id", "k"), (("1", "a b"), ("2", "ü")), 5.0)
    second = RepairRequest("1-00000", TableName("s", "u"), ("id",), (("9",),), 4.0)
    a.request_repair("p", first)
    a.request_repair("p", second)
    a.request_repair("p", first)
    assert b.repair_requests("p") == [second, first]
    assert b.repair_requests("other") == []
    b.drop_repair_request("p", "1-00000")
    b.drop_repair_request("p", "1-00000")
    assert a.repair_requests("p") == [first]
    assert a.verify_result("p") is None
    a.save_verify_result("p", {"time": 1.5, "equal": True, "tables": []})
    a.save_verify_result("p", {"time": 2.5, "equal": False, "tables": [{"table": "s.t"}]})
    assert b.verify_result("p") == {"time": 2.5, "equal": False, "tables": [{"table": "s.t"}]}
    a.close()
    b.close()


def _open_and_close(path, barrier, results) -> None:
    barrier.wait(timeout=30)
    try:
        SqliteMetaStore(path).close()
        results.put(None)
    except BaseException as exc:  # reported to the test, which fails on it
        results.put(repr(exc))


def test_an_older_file_opened_by_many_processes_at_once_gets_its_new_columns(tmp_path):
    """A meta store written before `retrying_since` existed, opened by several processes at once
    (a node and CLI commands starting together): each switches it to WAL and adds the missing
    columns or finds them done, and none fails with "database is locked" (some of those steps
    fail at once without waiting on SQLite's busy timeout; before the retry around them, 13 of
    40 such rounds failed here, and a fresh CI run once failed on it)."""
    import multiprocessing
    import sqlite3

    context = multiprocessing.get_context("fork")
    for round_ in range(10):
        path = tmp_path / f"meta{round_}.db"
        old = sqlite3.connect(path)
        old.execute("CREATE TABLE pipeline_state (pipeline TEXT PRIMARY KEY, status TEXT NOT NULL, error TEXT, "
                    "epoch INTEGER NOT NULL DEFAULT 0, node TEXT, updated REAL NOT NULL)")
        old.execute("INSERT INTO pipeline_state VALUES ('p', ?, NULL, 3, NULL, 1.0)", (Status.RUNNING.value,))
        old.commit()
        old.close()
        barrier, results = context.Barrier(8), context.Queue()
        openers = [context.Process(target=_open_and_close, args=(path, barrier, results)) for _ in range(8)]
        for opener in openers:
            opener.start()
        outcomes = [results.get(timeout=90) for _ in openers]
        for opener in openers:
            opener.join(timeout=30)
        assert outcomes == [None] * 8, (round_, outcomes)
        store = SqliteMetaStore(path)
        state = store.state("p")
        assert state.epoch == 3 and not state.retrying
        store.set_state("p", Status.RUNNING, error="away", retrying_since=5.0)
        assert SqliteMetaStore(path).state("p").retrying_since == 5.0
        store.close()


def test_reload_requests_replace_each_other_per_pipeline(tmp_path):
    """`setl reload`'s request: the last id per pipeline, read back from another handle."""
    a, b = SqliteMetaStore(tmp_path / "m.db"), SqliteMetaStore(tmp_path / "m.db")
    assert b.reload_request("p") is None
    a.request_reload("p", "r1")
    a.request_reload("p", "r2")
    a.request_reload("q", "r3")
    assert (b.reload_request("p"), b.reload_request("q"), b.reload_request("other")) == ("r2", "r3", None)
