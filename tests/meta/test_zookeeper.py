"""The ZooKeeper meta store on a real ZooKeeper: records, epochs across nodes, fenced writes, DDL tasks."""

from __future__ import annotations

import threading

import pytest

from setl.errors import LeadershipLost
from setl.ha import Lease
from setl.meta.base import DdlTask, DdlTaskStatus, Status
from setl.model import Position
from setl.testing.servers import wait_until
from tests.ha.zk import expire, hold, stores, unique_root

pytestmark = pytest.mark.timeout(60)


def test_acks_history_state_and_reset_round_trip(zookeeper_server):
    """Acks, history (newest first), state, pipelines and resets read back as written, from another session."""
    with stores(zookeeper_server.hosts, 2) as (node, cli):
        assert cli.position("p") is None and cli.state("p").epoch == 0
        hold(node, "p", "n1")
        epoch = node.next_epoch("p")
        node.set_state("p", Status.RUNNING, node="n1")
        for i in range(1, 6):
            node.ack("p", i, epoch, Position("bin.000001", 100 * i), rows=i)
        ack = cli.position("p")
        assert (ack.batch_id, ack.epoch, ack.position) == (5, epoch, Position("bin.000001", 500))
        assert [a.batch_id for a in cli.history("p", 3)] == [5, 4, 3]
        state = cli.state("p")
        assert (state.status, state.node, state.epoch) == (Status.RUNNING, "n1", epoch)
        assert cli.pipelines() == ["p"]
        cli.set_state("p", Status.PAUSED)  # an operator's write needs no mainstem
        assert node.state("p").status is Status.PAUSED
        cli.reset_position("p", Position("bin.000002", 4))
        assert cli.position_was_reset("p") and node.position("p").position == Position("bin.000002", 4)
        node.ack("p", 6, epoch, Position("bin.000002", 50))
        assert not cli.position_was_reset("p")
        cli.reset_position("p", None)
        assert node.position("p") is None


def test_documented_paths_hold_the_records(zookeeper_server):
    """The records live at the paths the module docstring documents, under the configured root."""
    root = unique_root()
    with stores(zookeeper_server.hosts, 1, root=root) as (node,):
        hold(node, "p", "n1")
        node.ack("p", 1, node.next_epoch("p"), Position("bin.000001", 10))
        co = node.coordinator
        assert co.root == root
        for path in ("/pipelines/p/mainstem", "/pipelines/p/term", "/pipelines/p/position",
                     "/pipelines/p/state", "/pipelines/p/epoch"):
            assert co.get(path) is not None, path
        assert co.get("/pipelines/p/mainstem").json()["node"] == "n1"
        assert co.get("/pipelines/p/epoch").data == b"1"
        assert len(co.children("/pipelines/p/acks")) == 1


def test_epochs_grow_across_nodes(zookeeper_server):
    """Each new holder's epoch is higher than every epoch any node took before."""
    with stores(zookeeper_server.hosts, 2) as (a, b):
        seen = []
        for store, name in ((a, "a"), (b, "b"), (a, "a"), (b, "b")):
            mainstem, lease = hold(store, "p", name, delay=0)
            seen += [store.next_epoch("p"), store.next_epoch("p")]
            store.coordinator.drop(lease)
            mainstem.release(lease)
        assert seen == sorted(seen) and len(set(seen)) == len(seen)
        mainstem, lease = hold(a, "p", "a", delay=0)
        jumped = a.next_epoch("p", at_least=seen[-1] + 10)
        assert jumped == seen[-1] + 10 and a.next_epoch("p", at_least=1) == jumped + 1


def test_writes_without_the_mainstem_are_refused(zookeeper_server):
    """Acks and epoch bumps need the mainstem; a stale epoch's ack is refused too."""
    with stores(zookeeper_server.hosts, 1) as (node,):
        with pytest.raises(LeadershipLost):
            node.next_epoch("p")
        hold(node, "p", "n1")
        old = node.next_epoch("p")
        node.next_epoch("p")
        with pytest.raises(LeadershipLost, match="not this holder's current epoch"):
            node.ack("p", 1, old, Position("bin.000001", 10))
        assert node.position("p") is None


def test_deposed_holder_cannot_ack_after_its_session_expired(zookeeper_server):
    """A holder whose session expired and whose mainstem another node took fails its late ack and epoch bump."""
    with stores(zookeeper_server.hosts, 2) as (a, b):
        _, lease_a = hold(a, "p", "a")
        epoch_a = a.next_epoch("p")
        a.ack("p", 1, epoch_a, Position("bin.000001", 10))
        expire(a.coordinator)
        _, lease_b = hold(b, "p", "b", delay=0)
        epoch_b = b.next_epoch("p")
        assert epoch_b > epoch_a
        wait_until(lambda: lease_a.lost, timeout=10, message="the old holder to notice")
        with pytest.raises(LeadershipLost, match="no longer holds"):
            a.ack("p", 2, epoch_a, Position("bin.000001", 20))
        # Even a holder that does not know it lost (a lease on its new session) is fenced by ZooKeeper.
        wait_until(lambda: a.coordinator.connected and a.coordinator.session_id != lease_a.session_id,
                   timeout=10, message="a new session")
        a.coordinator.hold(Lease("p", "a", lease_a.term, a.coordinator.session_id, a.coordinator))
        with pytest.raises(LeadershipLost, match="another node took the mainstem"):
            a.ack("p", 2, epoch_a, Position("bin.000001", 20))
        assert b.position("p").batch_id == 1
        b.ack("p", 2, epoch_b, Position("bin.000001", 30))
        assert [x.epoch for x in b.history("p")] == [epoch_b, epoch_a]


def test_ddl_task_claims_are_won_once_and_overwrites_deprecate_earlier_tasks(zookeeper_server):
    """Of concurrent first claims exactly one wins; an overwrite claim deprecates the op's earlier tasks."""
    with stores(zookeeper_server.hosts, 2) as (a, b):
        first = DdlTask("p", "t/1", "truncate", "db", "t", Position("bin.000001", 10))
        second = DdlTask("p", "t2", "truncate", "db", "t", Position("bin.000001", 20), overwrite=True)
        assert a.declare_ddl_task(first).status is DdlTaskStatus.DECLARED
        b.declare_ddl_task(second)
        assert b.declare_ddl_task(first).create_time == a.ddl_task("p", "t/1").create_time
        results = []
        threads = [threading.Thread(target=lambda s=s, o=o: results.append(s.claim_ddl_task("p", "t/1", o)))
                   for s, o in ((a, "x"), (b, "y"), (a, "z"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r.won for r in results) == [False, False, True]
        claim = b.claim_ddl_task("p", "t2", "w")
        assert claim.won
        stored = a.ddl_task("p", "t/1")
        assert stored.status is DdlTaskStatus.DEPRECATED and stored.reason.endswith("t2")
        assert a.finish_ddl_task("p", "t2", "w", DdlTaskStatus.SUCCEEDED).status is DdlTaskStatus.SUCCEEDED
        assert [t.task_id for t in a.ddl_tasks("p", first.op_id)] == ["t/1", "t2"]
        with pytest.raises(KeyError):
            a.claim_ddl_task("p", "nope", "x")


def test_ack_history_is_pruned_to_the_newest(zookeeper_server, monkeypatch):
    """Only the newest HISTORY_KEEP acks stay in ZooKeeper."""
    import setl.meta.zookeeper as zookeeper

    monkeypatch.setattr(zookeeper, "HISTORY_KEEP", 30)
    monkeypatch.setattr(zookeeper, "PRUNE_EVERY", 20)
    with stores(zookeeper_server.hosts, 1) as (node,):
        hold(node, "p", "n1")
        epoch = node.next_epoch("p")
        for i in range(1, 101):
            node.ack("p", i, epoch, Position("bin.000001", i))
        assert len(node.coordinator.children("/pipelines/p/acks")) == 30
        assert [a.batch_id for a in node.history("p", 100)] == list(range(100, 70, -1))


def test_reset_to_the_start_and_retrying_state_round_trip(zookeeper_server):
    """reset_position(None) forgets the position but stays a reset until an ack; retrying_since reads back."""
    with stores(zookeeper_server.hosts, 2) as (node, cli):
        hold(node, "p", "n1")
        epoch = node.next_epoch("p")
        node.ack("p", 3, epoch, Position("bin.000001", 300))
        cli.reset_position("p", None)
        assert cli.position("p") is None and node.position_was_reset("p")
        node.ack("p", 1, epoch, Position("bin.000001", 100))
        assert not cli.position_was_reset("p") and cli.position("p").position == Position("bin.000001", 100)
        node.set_state("p", Status.RUNNING, error="target away", node="n1", retrying_since=42.0)
        state = cli.state("p")
        assert state.retrying and state.retrying_since == 42.0
        node.set_state("p", Status.RUNNING, node="n1")
        assert not cli.state("p").retrying


def test_snapshot_progress_and_requests_round_trip_and_a_deposed_holder_cannot_write_progress(zookeeper_server):
    """Snapshot progress (keys of any type) and requests read back from another session; progress
    written by a holder whose mainstem another node took is refused."""
    import datetime
    import decimal

    from setl.model import TableName
    from setl.snapshot import CopyStatus, TableProgress

    with stores(zookeeper_server.hosts, 2) as (a, b):
        hold(a, "p", "a")
        key = (7, "Mixed.Case", b"\x00\x01", decimal.Decimal("1.50"), datetime.datetime(2024, 1, 2, 3, 4, 5))
        a.save_snapshot_progress("p", [TableProgress("s.x", "t/1", CopyStatus.COPYING, key, 10, 100, 2, 1.0, 2.0),
                                       TableProgress("s", "u", CopyStatus.DONE)])
        found = b.snapshot_progress("p")
        assert [(p.schema, p.table, p.status, p.last_key, p.rows) for p in found] == [
            ("s", "u", CopyStatus.DONE, None, 0), ("s.x", "t/1", CopyStatus.COPYING, key, 10)]
        b.request_snapshot("p", TableName("s.x", "t/1"))
        b.request_snapshot("p", TableName("s.x", "t/1"))
        assert a.snapshot_requests("p") == [TableName("s.x", "t/1")]
        a.drop_snapshot_request("p", TableName("s.x", "t/1"))
        a.drop_snapshot_request("p", TableName("s.x", "t/1"))
        assert b.snapshot_requests("p") == []
        expire(a.coordinator)
        hold(b, "p", "b", delay=0)
        wait_until(lambda: a.coordinator.connected, timeout=10, message="a new session")
        with pytest.raises(LeadershipLost):
            a.save_snapshot_progress("p", [TableProgress("s", "u", CopyStatus.PENDING)])
        assert b.snapshot_progress("p")[0].status is CopyStatus.DONE


def test_an_ack_writes_its_snapshot_progress_in_its_own_multi_op_and_a_deposed_one_writes_neither(
        zookeeper_server):
    """`ack(progress=...)` is one fenced ZooKeeper transaction holding the position, the history
    node and each table's progress; a deposed holder's ack with progress writes none of them."""
    from setl.ha import SetData
    from setl.tablecopy import CopyStatus, TableProgress

    with stores(zookeeper_server.hosts, 2) as (a, b):
        _, lease_a = hold(a, "p", "a")
        epoch_a = a.next_epoch("p")
        commits: list[list] = []
        real_commit = a.coordinator.commit

        def recording(ops, **kwargs):
            commits.append(list(ops))
            return real_commit(ops, **kwargs)

        a.coordinator.commit = recording  # type: ignore[method-assign]
        copied = (TableProgress("s", "t", CopyStatus.COPYING, (10,), 10, 50, 1),
                  TableProgress("s.x", "u/1", CopyStatus.DONE, None, 3, 3, 1))
        a.ack("p", 1, epoch_a, Position("bin.000001", 10), rows=13, progress=copied)
        (ops,) = commits
        written = [op.path for op in ops if isinstance(op, SetData)]
        assert written[0].endswith("/p/position") and len(written) == 3
        assert b.position("p").batch_id == 1 and b.snapshot_progress("p") == sorted(copied,
                                                                                   key=lambda t: (t.schema, t.table))
        expire(a.coordinator)
        hold(b, "p", "b", delay=0)
        wait_until(lambda: lease_a.lost, timeout=10, message="the old holder to notice")
        later = TableProgress("s", "t", CopyStatus.DONE, (20,), 20, 50, 2)
        with pytest.raises(LeadershipLost):
            a.ack("p", 2, epoch_a, Position("bin.000001", 20), progress=[later])
        assert b.position("p").batch_id == 1
        assert [p.status for p in b.snapshot_progress("p")] == [CopyStatus.COPYING, CopyStatus.DONE]


def test_repair_requests_and_verify_results_round_trip(zookeeper_server):
    """Repair requests (ids of any text, replaced by id, ordered) and the last scheduled check read
    back from another session; a request dropped twice is no error."""
    from setl.meta.base import RepairRequest
    from setl.model import TableName

    with stores(zookeeper_server.hosts, 2) as (a, b):
        first = RepairRequest("2-00001/x", TableName("s.x", "t"), ("id", "k"), (("1", "a.b"), ("2", "ü")), 5.0)
        second = RepairRequest("1-00000", TableName("s", "u"), ("id",), (("9",),), 4.0)
        a.request_repair("p", first)
        a.request_repair("p", second)
        a.request_repair("p", first)
        assert b.repair_requests("p") == [second, first]
        b.drop_repair_request("p", "2-00001/x")
        b.drop_repair_request("p", "2-00001/x")
        assert a.repair_requests("p") == [second]
        assert a.verify_result("p") is None
        a.save_verify_result("p", {"time": 1.5, "equal": True})
        a.save_verify_result("p", {"time": 2.5, "equal": False})
        assert b.verify_result("p") == {"time": 2.5, "equal": False}


def test_reload_requests_replace_each_other_per_pipeline(zookeeper_server):
    """`setl reload`'s request: the last id per pipeline, read back from another session (a node on
    another host)."""
    with stores(zookeeper_server.hosts, 2) as (a, b):
        assert b.reload_request("p") is None
        a.request_reload("p", "r1")
        a.request_reload("p", "r2")
        a.request_reload("q", "r3")
        assert (b.reload_request("p"), b.reload_request("q"), b.reload_request("other")) == ("r2", "r3", None)
