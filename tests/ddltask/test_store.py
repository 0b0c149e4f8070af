"""The ddl_task contract of the meta store, on SQLite and on a real ZooKeeper, from many threads
and two store instances at once (two processes, or the two nodes of an HA pair)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest

from setl.meta.base import OVERWRITTEN_BY, DdlTask, DdlTaskStatus, MetaStore
from setl.meta.sqlite import SqliteMetaStore
from setl.model import Position

pytestmark = pytest.mark.timeout(60)

THREADS = 16


@pytest.fixture(params=["sqlite", "zookeeper"])
def pair(request, tmp_path) -> Iterator[tuple[MetaStore, MetaStore]]:
    """Two store instances over the same state."""
    if request.param == "sqlite":
        a, b = SqliteMetaStore(tmp_path / "meta.db"), SqliteMetaStore(tmp_path / "meta.db")
        try:
            yield a, b
        finally:
            a.close()
            b.close()
        return
    from tests.ha.zk import stores

    server = request.getfixturevalue("zookeeper_server")
    with stores(server.hosts, 2) as (a, b):
        yield a, b


def task(task_id: str, offset: int, *, partition: str = "p1", overwrite: bool = False) -> DdlTask:
    return DdlTask("p", task_id, "truncate_partition", "db", "fact", Position("bin.000001", offset),
                   op_partition=partition, op_system="mysql", overwrite=overwrite)


def in_threads(work, items) -> list:
    """Run `work(item)` for every item, each on its own thread, all released at once."""
    results: list = []
    lock = threading.Lock()
    gate = threading.Barrier(len(items))

    def run(item) -> None:
        gate.wait(timeout=10)
        outcome = work(item)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return results


def test_declare_is_idempotent_and_never_resets_a_task(pair):
    """A re-declared task (a replayed signal) keeps its stored status, op and times."""
    a, b = pair
    first = a.declare_ddl_task(task("t1", 10))
    assert first.status is DdlTaskStatus.DECLARED and first.owner is None
    assert a.claim_ddl_task("p", "t1", "o1").won
    a.finish_ddl_task("p", "t1", "o1", DdlTaskStatus.SUCCEEDED)
    again = b.declare_ddl_task(task("t1", 99, partition="other"))
    assert (again.status, again.position, again.op_partition) == (
        DdlTaskStatus.SUCCEEDED, Position("bin.000001", 10), "p1")
    assert again.create_time == first.create_time
    assert b.ddl_task("p", "nope") is None
    with pytest.raises(KeyError):
        b.claim_ddl_task("p", "nope", "o")


def test_first_arrival_is_won_exactly_once_across_threads_and_instances(pair):
    """Of many concurrent first claims of each task, from two instances, exactly one wins."""
    a, b = pair
    ids = [f"t{i}" for i in range(4)]
    for i, task_id in enumerate(ids):
        a.declare_ddl_task(task(task_id, 10 + i, partition=f"p{i}"))
    attempts = [(store, task_id, f"owner-{n}") for n in range(THREADS // 2)
                for store in (a, b) for task_id in ids]
    random.Random(7).shuffle(attempts)
    claims = in_threads(lambda item: (item[1], item[2], item[0].claim_ddl_task("p", item[1], item[2])),
                        attempts)
    for task_id in ids:
        won = [owner for tid, owner, claim in claims if tid == task_id and claim.won]
        assert len(won) == 1
        stored = b.ddl_task("p", task_id)
        assert (stored.status, stored.owner) == (DdlTaskStatus.RUNNING, won[0])


def test_take_over_of_a_dead_claim_is_won_once_and_fences_the_dead_owner(pair):
    """Concurrent take-overs from one dead owner: one wins; the dead owner's late record is refused."""
    a, b = pair
    a.declare_ddl_task(task("t1", 10))
    assert a.claim_ddl_task("p", "t1", "dead").won
    claims = in_threads(lambda n: (n, (a if n % 2 else b).claim_ddl_task("p", "t1", f"new-{n}",
                                                                          expected_owner="dead")),
                        list(range(THREADS)))
    winners = [f"new-{n}" for n, claim in claims if claim.won]
    assert len(winners) == 1
    late = a.finish_ddl_task("p", "t1", "dead", DdlTaskStatus.SUCCEEDED)
    assert (late.status, late.owner) == (DdlTaskStatus.RUNNING, winners[0])
    assert not b.claim_ddl_task("p", "t1", "x", expected_owner="dead").won
    done = b.finish_ddl_task("p", "t1", winners[0], DdlTaskStatus.SUCCEEDED)
    assert (done.status, done.owner) == (DdlTaskStatus.SUCCEEDED, None)
    assert not a.claim_ddl_task("p", "t1", "y").won


def test_overwrites_claimed_in_any_order_leave_only_the_latest_task(pair):
    """Overwrites of one op claimed concurrently in any order leave only the latest task SUCCEEDED."""
    a, b = pair
    ids = [f"run{i}" for i in range(8)]
    for i, task_id in enumerate(ids):
        a.declare_ddl_task(task(task_id, 100 + i, overwrite=True))
    b.declare_ddl_task(task("other-part", 50, partition="p2"))
    a.claim_ddl_task("p", "other-part", "o")
    a.finish_ddl_task("p", "other-part", "o", DdlTaskStatus.SUCCEEDED)
    order = ids * 2
    random.Random(11).shuffle(order)

    def settle(item):
        n, task_id = item
        store = a if n % 2 else b
        claim = store.claim_ddl_task("p", task_id, f"o{n}")
        if claim.won:
            return store.finish_ddl_task("p", task_id, f"o{n}", DdlTaskStatus.SUCCEEDED)
        return claim.task

    in_threads(settle, list(enumerate(order)))
    final = {t.task_id: t for t in a.ddl_tasks("p")}
    assert [t.task_id for t in a.ddl_tasks("p", final["run0"].op_id)] == ids
    assert final["run7"].status is DdlTaskStatus.SUCCEEDED
    for task_id in ids[:-1]:
        assert final[task_id].status is DdlTaskStatus.DEPRECATED, task_id
        assert final[task_id].reason.startswith(OVERWRITTEN_BY)
    assert final["other-part"].status is DdlTaskStatus.SUCCEEDED  # another partition: untouched


def test_without_overwrite_nothing_is_deprecated(pair):
    """overwrite=false never deprecates, and an overwrite never touches a later task."""
    a, b = pair
    a.declare_ddl_task(task("t1", 10))
    a.declare_ddl_task(task("t2", 20))
    a.declare_ddl_task(task("t0", 5, overwrite=True))
    for store, task_id in ((a, "t2"), (b, "t1"), (a, "t0")):
        assert store.claim_ddl_task("p", task_id, "o").won
        store.finish_ddl_task("p", task_id, "o", DdlTaskStatus.SUCCEEDED)
    assert {t.task_id: t.status for t in b.ddl_tasks("p")} == {
        "t0": DdlTaskStatus.SUCCEEDED, "t1": DdlTaskStatus.SUCCEEDED, "t2": DdlTaskStatus.SUCCEEDED}


def test_a_running_task_deprecated_by_an_overwrite_refuses_its_owner_s_success(pair):
    """An overwrite deprecates an earlier RUNNING task, whose late record then reports DEPRECATED."""
    a, b = pair
    a.declare_ddl_task(task("old", 10))
    a.declare_ddl_task(task("new", 20, overwrite=True))
    assert a.claim_ddl_task("p", "old", "o1").won
    assert b.claim_ddl_task("p", "new", "o2").won
    late = a.finish_ddl_task("p", "old", "o1", DdlTaskStatus.SUCCEEDED)
    assert late.status is DdlTaskStatus.DEPRECATED and late.reason == OVERWRITTEN_BY + "new"
    with pytest.raises(ValueError):
        a.finish_ddl_task("p", "new", "o2", DdlTaskStatus.RUNNING)
