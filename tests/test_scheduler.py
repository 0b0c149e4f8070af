"""The scheduler's invariants, proven on the in-memory harness."""

from __future__ import annotations

import threading

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setl.config import BatchSettings, LoadSettings, PipelineSettings, RetrySettings
from setl.errors import RefusedLoadError
from setl.meta import SqliteMetaStore, Status
from setl.model import Batch, Position
from setl.scheduler import Outcome, Scheduler
from setl.stages import Extract, Transform
from setl.testing.harness import (
    Fault,
    FaultPlan,
    FaultyExtract,
    FaultyTransform,
    InvariantListener,
    MemorySink,
    ScriptedSource,
    delete,
    insert,
    reference_state,
    run_pipeline,
    update,
)


def fast_settings(parallelism: int = 3, max_rows: int = 5, attempts: int = 20, wait_ms: int = 2) -> PipelineSettings:
    return PipelineSettings(
        parallelism=parallelism,
        batch=BatchSettings(max_rows=max_rows, max_wait_ms=wait_ms),
        retry=RetrySettings(max_attempts=attempts, initial_backoff_ms=1, max_backoff_ms=2),
        drain_timeout_ms=5000,
    )


@st.composite
def streams(draw, max_transactions: int = 40):
    """Consistent transaction streams over two tables and a small key space (so keys collide)."""
    state: dict[tuple[str, int], dict] = {}
    txs = []
    for n in range(draw(st.integers(1, max_transactions))):
        tx = []
        for _ in range(draw(st.integers(1, 3))):
            table = draw(st.sampled_from(["a", "b"]))
            key = draw(st.integers(1, 6))
            row = state.get((table, key))
            if row is None:
                new = {"id": key, "v": n}
                tx.append(insert(table, new))
                state[(table, key)] = new
            elif draw(st.booleans()):
                new_key = draw(st.integers(1, 6))
                if new_key != key and (table, new_key) in state:
                    new_key = key
                new = {"id": new_key, "v": n}
                tx.append(update(table, row, new))
                del state[(table, key)]
                state[(table, new_key)] = new
            else:
                tx.append(delete(table, row))
                del state[(table, key)]
        txs.append(tx)
    return txs


fault_markers = st.lists(
    st.tuples(st.sampled_from(["extract", "transform", "load", "termin"]), st.integers(1, 12), st.integers(1, 2)),
    max_size=4,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txs=streams(), parallelism=st.integers(1, 8), max_rows=st.integers(1, 8), faults=fault_markers)
def test_random_streams_and_faults_end_equal_to_the_stream(txs, parallelism, max_rows, faults):
    """Random streams, parallelism 1..8 and random faults: the sink ends equal to the stream and no invariant breaks."""
    from setl.testing.harness import FaultyLoad

    plan = FaultPlan(Fault(stage, batch=batch, times=times) for stage, batch, times in faults)
    source = ScriptedSource(txs)
    sink = MemorySink()
    listener = InvariantListener(parallelism, sink, Position("scripted", 0))
    result = run_pipeline(
        source, FaultyLoad(plan, sink),
        settings=fast_settings(parallelism, max_rows),
        extract=FaultyExtract(plan), transform=FaultyTransform(plan),
        listener=listener,
    )
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == []
    assert listener.max_in_flight <= parallelism
    assert sink.tables == reference_state(txs)
    assert result.meta.position("test").position == source.head()
    assert [a.batch_id for a in listener.acks] == list(range(1, len(listener.acks) + 1))


class GatedTransform(Transform):
    """Counts transform calls per batch id and how many run at once."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: dict[int, int] = {}
        self.running = 0
        self.max_running = 0
        self.delay = delay
        self._lock = threading.Lock()

    def transform(self, batch: Batch) -> Batch:
        with self._lock:
            self.calls[batch.id] = self.calls.get(batch.id, 0) + 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            threading.Event().wait(self.delay)
            return batch
        finally:
            with self._lock:
                self.running -= 1


def single_row_stream(n: int):
    return [[insert("t", {"id": i, "v": i})] for i in range(1, n + 1)]


def test_extract_and_transform_of_different_batches_run_concurrently():
    """With parallelism 4 and a slow transform, four batches are transformed at once, never more."""
    transform = GatedTransform(delay=0.05)
    sink = MemorySink()
    listener = InvariantListener(4, sink)
    result = run_pipeline(ScriptedSource(single_row_stream(40)), sink,
                          settings=fast_settings(parallelism=4, max_rows=1, wait_ms=0),
                          transform=transform, listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert transform.max_running == 4
    assert listener.max_in_flight == 4
    assert sink.max_concurrent_loads == 1
    assert listener.violations == []


class FailOnceWhenOthersInFlight(MemorySink):
    """Fails the load of batch `k` once, only after batches k+1..k+P-1 were handed on."""

    def __init__(self, k: int, parallelism: int) -> None:
        super().__init__()
        self.k, self.parallelism = k, parallelism
        self.others_in_flight = threading.Event()
        self.failed = False

    def load(self, batch: Batch) -> None:
        if batch.id == self.k and not self.failed:
            assert self.others_in_flight.wait(10), "later batches never got in flight"
            self.failed = True
            raise RuntimeError("target refused batch")
        super().load(batch)


def test_failure_of_batch_k_discards_later_in_flight_batches_and_replays_them():
    """When batch k fails while k+1..k+P-1 are in flight, those are discarded and processed again after k."""
    k, parallelism = 3, 4
    sink = FailOnceWhenOthersInFlight(k, parallelism)

    class SignalWhenLaterBatchesTransformed(GatedTransform):
        def transform(self, batch):
            result = super().transform(batch)
            if all(self.calls.get(i) for i in range(k + 1, k + parallelism)):
                sink.others_in_flight.set()
            return result

    transform = SignalWhenLaterBatchesTransformed()
    listener = InvariantListener(parallelism, sink, Position("scripted", 0))
    txs = single_row_stream(12)
    result = run_pipeline(ScriptedSource(txs), sink,
                          settings=fast_settings(parallelism=parallelism, max_rows=1, wait_ms=0),
                          transform=transform, listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == []
    assert listener.rollbacks == [(k, 1)]
    for batch_id in range(k + 1, k + parallelism):
        assert transform.calls[batch_id] == 2, f"batch {batch_id} was not discarded and redone"
        epochs = [r.epoch for r in sink.loads if r.batch_id == batch_id]
        assert len(epochs) == 1, "a discarded batch must never reach the sink"
    failed_epoch = [t for t in listener.termins if t[0] == k and not t[2]][0][1]
    assert all(r.epoch > failed_epoch for r in sink.loads if r.batch_id >= k)
    assert sink.tables == reference_state(txs)


def test_retries_run_out_and_the_pipeline_pauses_with_its_error_persisted(tmp_path):
    """A batch that always fails pauses the pipeline after max_attempts; the pause survives a restart."""
    txs = single_row_stream(10)
    meta_path = tmp_path / "meta.db"
    plan = FaultPlan().fail_load(batch=3, times=None)
    sink = MemorySink(plan)
    listener = InvariantListener(2, sink)
    result = run_pipeline(ScriptedSource(txs), sink, settings=fast_settings(2, max_rows=2, attempts=3),
                          meta=SqliteMetaStore(meta_path), listener=listener)
    assert result.outcome is Outcome.PAUSED
    assert [attempt for _, attempt in listener.rollbacks] == [1, 2, 3]
    result.meta.close()

    reopened = SqliteMetaStore(meta_path)
    state = reopened.state("test")
    assert state.status is Status.PAUSED
    assert "injected load failure at batch 3" in state.error
    assert "stage=load" in state.error and "pipeline=test" in state.error
    assert reopened.position("test").position == Position("scripted", 4)  # batches 1 and 2 acked

    reopened.set_state("test", Status.STOPPED)  # what `setl resume` does
    healthy = MemorySink()
    healthy.tables = sink.tables
    result = run_pipeline(ScriptedSource(txs), healthy, settings=fast_settings(2, max_rows=2), meta=reopened)
    assert result.outcome is Outcome.CAUGHT_UP
    assert healthy.tables == reference_state(txs)
    assert reopened.state("test").status is Status.STOPPED


def test_a_refusal_retrying_cannot_change_pauses_at_the_first_attempt(tmp_path):
    """An error marked not retryable (``pipeline.ddl: fail``) pauses at once instead of spending the retries."""
    txs = single_row_stream(10)

    class Refusing(MemorySink):
        def load(self, batch):
            if batch.id == 3:
                raise RefusedLoadError("DDL refused (pipeline.ddl is fail): DROP TABLE t", table="demo.t")
            super().load(batch)

    sink = Refusing()
    listener = InvariantListener(2, sink)
    result = run_pipeline(ScriptedSource(txs), sink, settings=fast_settings(2, max_rows=2, attempts=5),
                          meta=SqliteMetaStore(tmp_path / "meta.db"), listener=listener)
    assert result.outcome is Outcome.PAUSED
    assert [attempt for _, attempt in listener.rollbacks] == [1]
    state = result.meta.state("test")
    assert state.status is Status.PAUSED
    assert "DDL refused" in state.error and "table=demo.t" in state.error and "stage=load" in state.error
    assert result.meta.position("test").position == Position("scripted", 4)  # batches 1 and 2 acked
    result.meta.close()


def test_a_failure_inside_a_split_transaction_still_runs_out_of_retries(tmp_path):
    """Retrying a failing piece of a split transaction does not reset the attempts: it pauses at the piece before it."""
    txs = [[insert("t", {"id": i * 10 + j, "v": j}) for j in range(4)] for i in range(3)]

    class FailsOnId21(MemorySink):
        def load(self, batch):
            if any(c.after["id"] == 21 for c in batch.changes):
                raise RuntimeError("row 21 is refused")
            super().load(batch)

    sink = FailsOnId21()
    listener = InvariantListener(2, sink)
    result = run_pipeline(ScriptedSource(txs, max_rows=1), sink, settings=fast_settings(2, max_rows=1, attempts=3),
                          meta=SqliteMetaStore(tmp_path / "meta.db"), listener=listener)
    assert result.outcome is Outcome.PAUSED
    assert [attempt for _, attempt in listener.rollbacks] == [1, 2, 3]
    # transactions 0 and 1 and the first row of transaction 2 acked
    assert result.meta.position("test").position == Position("scripted", 2, row=1)
    result.meta.close()


def test_epochs_start_above_the_one_the_target_holds():
    """A fresh meta store (epochs from 1) against a target that accepted epoch 7 starts at 8, not refused."""

    class Fencing(MemorySink):
        held = 7

        def load(self, batch):
            assert batch.epoch >= self.held, f"epoch {batch.epoch} would be refused"
            self.held = batch.epoch
            super().load(batch)

        def committed_epoch(self):
            return self.held

    txs = single_row_stream(12)
    sink = Fencing()
    result = run_pipeline(ScriptedSource(txs), sink, settings=fast_settings(2, max_rows=3))
    assert result.outcome is Outcome.CAUGHT_UP
    assert sink.tables == reference_state(txs)
    assert {load.epoch for load in sink.loads} == {8}


def test_a_failing_source_rewinds_to_the_ack_and_loses_nothing():
    """A source that raises mid-stream is reopened at the acked position; the sink ends equal to the stream."""
    txs = single_row_stream(30)
    source = ScriptedSource(txs, faults=FaultPlan().fail("select", batch=17, times=2))
    sink = MemorySink()
    listener = InvariantListener(3, sink, Position("scripted", 0))
    result = run_pipeline(source, sink, settings=fast_settings(3, max_rows=4), listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert len(listener.rollbacks) == 2
    assert source.opens == 1 + len(listener.rollbacks)  # each rewind reopens at the ack
    assert sink.tables == reference_state(txs)
    assert listener.violations == []


def test_target_held_position_wins_over_an_older_ack():
    """A target that committed past the last ack (crash between load and ack) is resumed from, not replayed."""
    txs = single_row_stream(10)
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    run_pipeline(ScriptedSource(txs[:6]), sink, settings=fast_settings(1, max_rows=3), meta=meta)
    meta.reset_position("test", None)  # as if the acks were lost
    meta.ack("test", 1, 1, Position("scripted", 3))
    loads_before = len(sink.loads)
    result = run_pipeline(ScriptedSource(txs), sink, settings=fast_settings(1, max_rows=3), meta=meta)
    assert result.outcome is Outcome.CAUGHT_UP
    assert all(r.start >= Position("scripted", 6) for r in sink.loads[loads_before:])
    assert sink.tables == reference_state(txs)


def test_a_target_held_position_is_acked_at_start_with_nothing_new_to_read():
    """A new leader meeting a target that committed past the ack acks that position at once, in its
    own epoch: an idle source must not leave the ack (and the lag, status and a waiting client)
    behind what the target holds until the next write (seen: a frozen leader's batch that committed
    just before the freeze, its ack never written)."""
    txs = single_row_stream(6)
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    run_pipeline(ScriptedSource(txs), sink, settings=fast_settings(1, max_rows=3), meta=meta)
    held = sink.committed()
    assert held is not None and held > Position("scripted", 3)
    meta.reset_position("test", None)  # as if the last acks were lost
    first = meta.ack("test", 1, 1, Position("scripted", 3))
    loads_before = len(sink.loads)
    result = run_pipeline(ScriptedSource(txs), sink, settings=fast_settings(1, max_rows=3), meta=meta)
    assert result.outcome is Outcome.CAUGHT_UP
    assert len(sink.loads) == loads_before  # nothing loaded again
    ack = meta.position("test")
    assert ack is not None and ack.position == held
    assert ack.batch_id == first.batch_id + 1 and ack.epoch > first.epoch
    assert sink.tables == reference_state(txs)
    meta.close()


def test_stop_drains_in_flight_batches_and_acks_them():
    """stop() lets every handed-on batch be loaded and acked: nothing is left half done."""
    source = ScriptedSource(single_row_stream(5))
    sink = MemorySink(FaultPlan().slow("load", 0.05))
    meta = SqliteMetaStore(":memory:")
    scheduler = Scheduler("test", fast_settings(3, max_rows=1, wait_ms=0), source, Extract(), Transform(),
                          sink, meta, listener=InvariantListener(3, sink))
    done = []
    thread = threading.Thread(target=lambda: done.append(scheduler.run()))
    thread.start()
    from tests.helpers.wait import wait_until

    wait_until(lambda: len(sink.loads) >= 1, message="first load")
    scheduler.stop()
    thread.join(10)
    assert done == [Outcome.STOPPED]
    ack = meta.position("test")
    assert ack.position == sink.loads[-1].end
    assert scheduler.in_flight == 0
    assert meta.state("test").status is Status.STOPPED


def test_a_ddl_transaction_is_a_batch_of_its_own():
    """A DDL is cut into its own batch, ordered with the rows around it."""
    from setl.model import DdlChange

    txs = [[insert("t", {"id": 1})], [insert("t", {"id": 2})], [DdlChange("demo", "t", "ALTER TABLE t ADD c INT")],
           [insert("t", {"id": 3})]]
    batches = []

    class Record(Transform):
        def transform(self, batch):
            batches.append(batch)
            return batch

    class DdlTolerantSink(MemorySink):
        def load(self, batch):
            super().load(batch.replace(tuple(c for c in batch.changes if not isinstance(c, DdlChange))))

    run_pipeline(ScriptedSource(txs), DdlTolerantSink(), settings=fast_settings(1, max_rows=100, wait_ms=50),
                 transform=Record())
    shapes = [[type(c).__name__ for c in b.changes] for b in sorted(batches, key=lambda b: b.id)]
    assert shapes == [["RowChange", "RowChange"], ["DdlChange"], ["RowChange"]]


@pytest.mark.parametrize("max_rows", [1, 3, 1000])
def test_batches_never_exceed_max_rows_and_end_on_transaction_boundaries(max_rows):
    """Batches hold whole transactions and at most max_rows changes (unless one transaction is larger)."""
    txs = [[insert("t", {"id": i * 10 + j}) for j in range(1 + i % 3)] for i in range(30)]
    seen = []

    class Record(Transform):
        def transform(self, batch):
            seen.append(batch)
            return batch

    run_pipeline(ScriptedSource(txs), MemorySink(), settings=fast_settings(2, max_rows=max_rows), transform=Record())
    ends = {Position("scripted", i + 1) for i in range(len(txs))}
    for batch in seen:
        assert batch.end in ends
        assert len(batch) <= max(max_rows, 3)


@pytest.mark.parametrize("mode", ["ordered", "per_table"])
def test_batches_are_prepared_for_their_load_and_a_failing_preparation_changes_nothing(mode):
    """In ordered mode every batch object the sink loads was handed to `prepare` first (by a worker,
    once transformed); a `prepare` that raises fails nothing. per_table loads parts: nothing is prepared."""

    class Preparing(MemorySink):
        def __init__(self) -> None:
            super().__init__()
            self.prepared: list[Batch] = []
            self.unprepared: list[int] = []

        def prepare(self, batch: Batch) -> None:
            self.prepared.append(batch)
            if batch.id % 3 == 0:
                raise RuntimeError("preparation fails")

        def load(self, batch: Batch) -> None:
            if not any(p is batch for p in self.prepared):
                self.unprepared.append(batch.id)
            super().load(batch)

    txs = single_row_stream(20)
    sink = Preparing()
    settings = attrs.evolve(fast_settings(3, max_rows=3), load=LoadSettings(mode=mode))
    result = run_pipeline(ScriptedSource(txs), sink, settings=settings)
    assert result.outcome is Outcome.CAUGHT_UP
    assert sink.tables == reference_state(txs)
    if mode == "ordered":
        assert sink.unprepared == [] and len(sink.loads) >= 7
    else:
        assert sink.prepared == []
