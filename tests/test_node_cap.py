"""The node-wide cap on batches in flight (`BatchCap`): never exceeded, fair, and never leaked."""

from __future__ import annotations

import threading

import attrs
import pytest

from setl.config import LoadSettings, NodeSettings, RuntimeConfig
from setl.errors import LeadershipLost, SourceError
from setl.meta import SqliteMetaStore
from setl.model import Batch, Position
from setl.node import node_batch_cap
from setl.runtime import SerialExecutorService, TaskExecutionService
from setl.scheduler import BatchCap, Outcome, Scheduler
from setl.stages import Extract, Transform
from setl.testing.harness import FaultPlan, InvariantListener, MemorySink, ScriptedSource, reference_state
from tests.helpers.wait import wait_until
from tests.test_scheduler import fast_settings, single_row_stream


class NodeCount(InvariantListener):
    """One pipeline's invariants, and the batches in flight across every pipeline sharing `node`."""

    def __init__(self, parallelism: int, sink: MemorySink, node: "NodeCount.Shared") -> None:
        super().__init__(parallelism, sink)
        self.node = node

    class Shared:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.live = 0
            self.peak = 0

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        super().on_handoff(batch, in_flight)
        with self.node.lock:
            self.node.live += 1
            self.node.peak = max(self.node.peak, self.node.live)

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        super().on_retire(batch, in_flight)
        with self.node.lock:
            self.node.live -= 1


class CountingCap(BatchCap):
    """Counts the times a pipeline asked for a permit and was queued."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.refused = 0

    def try_acquire(self, waiter, wake) -> bool:
        taken = super().try_acquire(waiter, wake)
        self.refused += not taken
        return taken


class Gate(Transform):
    """Holds every transform call until `release` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def transform(self, batch: Batch) -> Batch:
        self.entered.set()
        assert self.release.wait(30)
        return batch


def shared_tasks(name: str) -> TaskExecutionService:
    return TaskExecutionService(2, 4, idle_backoff=0.002, name=name)


def test_the_runtime_setting_makes_the_node_cap():
    """`runtime.max_batches_in_flight` defaults to 4x workers; 0 or null means no cap."""
    assert node_batch_cap(NodeSettings(runtime=RuntimeConfig(workers=3, max_workers=5))).limit == 12
    assert node_batch_cap(NodeSettings(runtime=RuntimeConfig(max_batches_in_flight=7))).limit == 7
    assert node_batch_cap(NodeSettings(runtime=RuntimeConfig(max_batches_in_flight=0))) is None
    assert node_batch_cap(NodeSettings(runtime=RuntimeConfig(max_batches_in_flight=None))) is None
    with pytest.raises(ValueError):
        RuntimeConfig(max_batches_in_flight=-1)


def test_a_cap_serves_waiters_in_order_and_hands_permits_over():
    """A released permit goes to the first waiter, not to a newcomer; a cancelled grant passes on."""
    cap = BatchCap(1)
    woken: list[str] = []
    assert cap.try_acquire("a", lambda: woken.append("a"))
    assert not cap.try_acquire("b", lambda: woken.append("b"))
    assert not cap.try_acquire("c", lambda: woken.append("c"))
    assert not cap.try_acquire("b", lambda: woken.append("b-again"))  # queued once
    cap.release()
    assert woken == ["b"] and cap.available == 0
    assert not cap.try_acquire("d", lambda: woken.append("d"))  # behind c
    cap.cancel("b")  # granted, never taken: c gets it
    assert woken == ["b", "c"]
    assert cap.try_acquire("c", lambda: None)
    cap.release()
    assert woken == ["b", "c", "d"]
    cap.cancel("d")
    assert cap.available == 1
    with pytest.raises(RuntimeError):
        cap.release()


@pytest.mark.timeout(120)
def test_the_cap_is_never_exceeded_across_many_pipelines():
    """30 pipelines of parallelism 3 under a cap of 6: at most 6 batches in flight in the node, all caught up.

    Their loads run per table on a shared load executor and are slow, so that batches pile up
    without holding the task threads Select needs.
    """
    cap = CountingCap(6)
    tasks = shared_tasks("cap-many")
    serial = SerialExecutorService(8, 4, name="cap-many-load")
    settings = attrs.evolve(fast_settings(3, max_rows=2), load=LoadSettings(mode="per_table"))
    meta = SqliteMetaStore(":memory:")
    node = NodeCount.Shared()
    runs = []
    try:
        for i in range(30):
            txs = single_row_stream(20)
            faults = FaultPlan().slow("load", 0.005)
            if i % 5 == 0:
                faults.fail_load(batch=3)
            sink = MemorySink(faults)
            listener = NodeCount(3, sink, node)
            scheduler = Scheduler(f"p{i}", settings, ScriptedSource(txs, name=f"p{i}"), Extract(), Transform(),
                                  sink, meta, listener=listener, tasks=tasks, serial=serial, batch_cap=cap)
            runs.append((scheduler, sink, listener, txs))
        for scheduler, *_ in runs:
            scheduler.start(until_caught_up=True)
        for scheduler, sink, listener, txs in runs:
            assert scheduler.wait(60) is Outcome.CAUGHT_UP, scheduler.name
            assert sink.tables == reference_state(txs), scheduler.name
            assert not listener.violations, (scheduler.name, listener.violations)
    finally:
        tasks.shutdown(timeout=10)
        serial.shutdown_now()
        serial.await_termination(10)
    assert 0 < node.peak <= cap.limit, f"peak {node.peak} batches in flight under a cap of {cap.limit}"
    assert cap.refused > 0, "the cap never held a pipeline back"
    assert sum(len(listener.rollbacks) for _, _, listener, _ in runs) >= 6  # rollbacks ran under the cap too
    assert node.live == 0 and cap.available == cap.limit


@pytest.mark.timeout(120)
def test_no_pipeline_starves_under_the_cap():
    """Behind a pipeline with a long backlog, eight small ones under a cap of 2 all finish long before it does."""
    cap = BatchCap(2)
    tasks = shared_tasks("cap-fair")
    meta = SqliteMetaStore(":memory:")
    hog_txs = single_row_stream(300)
    hog_sink = MemorySink(FaultPlan().slow("load", 0.002))
    hog = Scheduler("hog", fast_settings(3, max_rows=2), ScriptedSource(hog_txs, name="hog"), Extract(),
                    Transform(), hog_sink, meta, tasks=tasks, batch_cap=cap)
    small = []
    try:
        hog.start(until_caught_up=True)
        wait_until(lambda: hog.acked_batches >= 1, timeout=30, message="the hog under way")
        for i in range(8):
            txs = single_row_stream(6)
            sink = MemorySink()
            scheduler = Scheduler(f"s{i}", fast_settings(3, max_rows=2), ScriptedSource(txs, name=f"s{i}"),
                                  Extract(), Transform(), sink, meta, tasks=tasks, batch_cap=cap)
            scheduler.start(until_caught_up=True)
            small.append((scheduler, sink, txs))
        for scheduler, sink, txs in small:
            assert scheduler.wait(60) is Outcome.CAUGHT_UP, scheduler.name
            assert sink.tables == reference_state(txs), scheduler.name
        # In turn, the hog gets about one batch per eight of theirs: 24 small batches, a few of its 150.
        hog_batches = hog.acked_batches
        assert hog_batches <= 50, f"the hog acked {hog_batches} of its 150 batches while 8 pipelines waited"
        assert hog.wait(60) is Outcome.CAUGHT_UP
        assert hog_sink.tables == reference_state(hog_txs)
    finally:
        tasks.shutdown(timeout=10)
    assert cap.available == cap.limit


class LosingLoad(MemorySink):
    """Loses leadership at its second load."""

    def load(self, batch: Batch) -> None:
        if len(self.loads) >= 1:
            raise LeadershipLost("deposed", pipeline=batch.pipeline)
        super().load(batch)


class BrokenSource(ScriptedSource):
    def open(self, start: Position | None) -> None:
        raise OSError("no route to host")


@pytest.mark.timeout(120)
def test_pause_stop_rollback_lost_and_a_failed_start_give_every_node_permit_back():
    """After pipelines roll back, pause, stop with batches abandoned, lose leadership or fail to start,
    the cap is full."""
    cap = BatchCap(5)
    tasks = shared_tasks("cap-leaks")
    meta = SqliteMetaStore(":memory:")

    def scheduler(name, sink, txs=None, *, settings=None, source=None, transform=None, own_tasks=False):
        source = source or ScriptedSource(txs if txs is not None else single_row_stream(30), name=name)
        return Scheduler(name, settings or fast_settings(3, max_rows=2), source, Extract(),
                         transform or Transform(), sink, meta, listener=InvariantListener(3), batch_cap=cap,
                         tasks=None if own_tasks else tasks)

    gate = Gate()
    rolled_sink = MemorySink(FaultPlan().fail_load(batch=2, times=2))
    rolled = scheduler("rolled", rolled_sink)
    paused = scheduler("paused", MemorySink(FaultPlan().fail_load(batch=3, times=None)),
                       settings=fast_settings(3, max_rows=2, attempts=2))
    lost = scheduler("lost", LosingLoad())
    following = scheduler("following", MemorySink())
    # Its batches hang in Transform (on threads of its own); a stop abandons them after the drain timeout.
    hung = scheduler("hung", MemorySink(), settings=attrs.evolve(fast_settings(3, max_rows=2), drain_timeout_ms=200),
                     transform=gate, own_tasks=True)
    broken = scheduler("broken", MemorySink(), source=BrokenSource(name="broken"))
    try:
        with pytest.raises(SourceError):
            broken.start()
        for s in (rolled, paused, lost, following, hung):
            s.start(until_caught_up=s is rolled)
        assert gate.entered.wait(30)
        wait_until(lambda: following.acked_batches >= 3, timeout=30, message="following acked batches")
        assert rolled.wait(60) is Outcome.CAUGHT_UP
        assert len(rolled.listener.rollbacks) == 2
        assert rolled_sink.tables == reference_state(rolled.select.transactions)
        assert paused.wait(60) is Outcome.PAUSED
        assert lost.wait(60) is Outcome.LOST
        assert hung.in_flight > 0
        following.stop()
        hung.stop()
        assert following.wait(60) is Outcome.STOPPED
        assert hung.wait(60) is Outcome.STOPPED  # its transforms still hang: their batches were abandoned
        assert cap.available == cap.limit
        gate.release.set()  # the abandoned batches' workers finish late: nothing is given back twice
        wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("setl-hung")],
                   timeout=30, message="the hung pipeline's threads ended")
        assert cap.available == cap.limit
    finally:
        gate.release.set()
        tasks.shutdown(timeout=10)
    assert cap.available == cap.limit


def parked(scheduler: Scheduler) -> bool:
    """Whether the pipeline's Select task is parked (waiting to be woken, on no thread)."""
    return scheduler._handles["select"]._state.value == "parked"


@pytest.mark.timeout(60)
def test_a_pipeline_waiting_for_the_cap_is_parked_and_leaves_the_queue_when_stopped():
    """A Select with a batch to cut and no node permit holds no thread; stopped, it hands its turn on."""
    cap = BatchCap(1)
    tasks = shared_tasks("cap-park")
    meta = SqliteMetaStore(":memory:")
    gate = Gate()
    holder = Scheduler("holder", fast_settings(1, max_rows=1), ScriptedSource(single_row_stream(3), name="holder"),
                       Extract(), gate, MemorySink(), meta, tasks=tasks, batch_cap=cap)
    waiter = Scheduler("waiter", fast_settings(1, max_rows=1), ScriptedSource(single_row_stream(3), name="waiter"),
                       Extract(), Transform(), MemorySink(), meta, tasks=tasks, batch_cap=cap)
    third_sink = MemorySink()
    third_txs = single_row_stream(4)
    third = Scheduler("third", fast_settings(1, max_rows=1), ScriptedSource(third_txs, name="third"),
                      Extract(), Transform(), third_sink, meta, tasks=tasks, batch_cap=cap)
    try:
        holder.start(until_caught_up=True)
        assert gate.entered.wait(30)
        waiter.start(until_caught_up=True)
        wait_until(lambda: parked(waiter), timeout=10, message="the waiting Select parked")
        third.start(until_caught_up=True)
        wait_until(lambda: parked(third), timeout=10, message="the third Select parked behind it")
        assert tasks.stats().dedicated == 0 and cap.available == 0
        assert waiter.acked_batches == 0 and third.acked_batches == 0
        waiter.stop()
        assert waiter.wait(30) is Outcome.STOPPED
        assert cap.available == 0  # still the holder's; when it comes back it goes to `third`
        gate.release.set()
        assert holder.wait(30) is Outcome.CAUGHT_UP
        assert third.wait(30) is Outcome.CAUGHT_UP
        assert third_sink.tables == reference_state(third_txs)
    finally:
        gate.release.set()
        tasks.shutdown(timeout=10)
    assert cap.available == cap.limit
