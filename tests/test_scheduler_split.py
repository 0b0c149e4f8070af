"""Transactions larger than a batch, delivered in pieces: faults and restarts inside them never duplicate rows."""

from __future__ import annotations

import time
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setl.config import BatchSettings, LoadSettings, PipelineSettings, RetrySettings
from setl.meta import SqliteMetaStore
from setl.model import Position
from setl.scheduler import Outcome
from setl.testing.harness import (
    Fault,
    FaultPlan,
    FaultyExtract,
    FaultyLoad,
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

#: Restarts a run may need: each pause (attempts ran out) is followed by a restart, as after a crash.
MAX_RUNS = 30


def split_settings(parallelism: int, max_rows: int, attempts: int, mode: str) -> PipelineSettings:
    return PipelineSettings(
        parallelism=parallelism,
        batch=BatchSettings(max_rows=max_rows, max_wait_ms=2),
        retry=RetrySettings(max_attempts=attempts, initial_backoff_ms=1, max_backoff_ms=2),
        load=LoadSettings(mode=mode),
        drain_timeout_ms=5000,
    )


@st.composite
def keyless_streams(draw, tables: tuple[str, ...] = ("k",)):
    """Streams of 1..12-row transactions over keyless tables (every row distinct, so the expected target is exact)."""
    live: dict[str, list[dict]] = {t: [] for t in tables}
    serial = 0
    txs = []
    for _ in range(draw(st.integers(1, 12))):
        tx = []
        for _ in range(draw(st.integers(1, 12))):
            table = draw(st.sampled_from(tables))
            rows = live[table]
            serial += 1
            action = draw(st.sampled_from(["insert", "insert", "update", "delete"])) if rows else "insert"
            if action == "insert":
                row = {"n": serial, "v": draw(st.integers(0, 3))}
                tx.append(insert(table, row, key=()))
                rows.append(row)
                continue
            old = rows.pop(draw(st.integers(0, len(rows) - 1)))
            if action == "update":
                new = {"n": serial, "v": old["v"] + 1}
                tx.append(update(table, old, new, key=()))
                rows.append(new)
            else:
                tx.append(delete(table, old, key=()))
        txs.append(tx)
    return txs


split_faults = st.lists(
    st.tuples(st.sampled_from(["extract", "transform", "load", "termin"]), st.integers(1, 20), st.integers(1, 2)),
    max_size=5,
)


def run_until_caught_up(txs, *, piece_rows, parallelism, max_rows, attempts, faults, mode):
    """Run, and after every pause (the attempts ran out: a crash) start again on the same target and meta store."""
    plan = FaultPlan(Fault(stage, batch=batch, times=times) for stage, batch, times in faults)
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    outcomes = []
    for _ in range(MAX_RUNS):
        source = ScriptedSource(txs, max_rows=piece_rows)
        listener = InvariantListener(parallelism, sink)
        result = run_pipeline(source, FaultyLoad(plan, sink),
                              settings=split_settings(parallelism, max_rows, attempts, mode),
                              extract=FaultyExtract(plan), transform=FaultyTransform(plan), meta=meta,
                              listener=listener)
        assert listener.violations == []
        outcomes.append(result.outcome)
        if result.outcome is Outcome.CAUGHT_UP:
            return sink, meta, source, outcomes
    raise AssertionError(f"not caught up after {MAX_RUNS} runs: {outcomes}")


def assert_exact(sink: MemorySink, txs) -> None:
    expected = reference_state(txs)
    assert sink.tables == expected
    for table, rows in expected.items():
        copies = Counter(tuple(sorted(r.items())) for r in sink.keyless_rows.get(table, []))
        assert copies == Counter(tuple(sorted(r.items())) for r in rows.values()), f"{table} differs"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txs=keyless_streams(("k", "m")), piece_rows=st.integers(1, 4), parallelism=st.integers(1, 4),
       max_rows=st.integers(1, 6), attempts=st.integers(1, 3), faults=split_faults)
def test_ordered_faults_inside_split_transactions_leave_keyless_tables_exact(
        txs, piece_rows, parallelism, max_rows, attempts, faults):
    """Ordered loads: faults, failed acks and restarts between pieces of split transactions leave no duplicate rows."""
    sink, meta, source, _ = run_until_caught_up(txs, piece_rows=piece_rows, parallelism=parallelism,
                                                max_rows=max_rows, attempts=attempts, faults=faults, mode="ordered")
    assert_exact(sink, txs)
    assert meta.position("test").position == source.head()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txs=keyless_streams(), piece_rows=st.integers(1, 4),
       max_rows=st.integers(1, 6), attempts=st.integers(1, 3), faults=split_faults)
def test_per_table_faults_inside_split_transactions_leave_a_keyless_table_exact(
        txs, piece_rows, max_rows, attempts, faults):
    """Per-table loads (one batch in flight): faults, failed acks and restarts between pieces leave no duplicate rows.

    Parallelism 1 and one table: with more, a later batch's part can land before an earlier
    batch fails, and per_table targets record positions per batch only, so its replay repeats it.
    """
    sink, meta, source, _ = run_until_caught_up(txs, piece_rows=piece_rows, parallelism=1,
                                                max_rows=max_rows, attempts=attempts, faults=faults, mode="per_table")
    assert_exact(sink, txs)
    assert meta.position("test").position == source.head()


def test_a_batch_ending_inside_a_split_transaction_acks_its_row_checkpoint():
    """A 10-row transaction in 3-row pieces with 3-row batches is acked at +3, +6, +9, then at its end."""
    txs = [[insert("k", {"n": n}, key=()) for n in range(10)]]
    sink = MemorySink(holds_position=True)
    listener = InvariantListener(1, sink)
    result = run_pipeline(ScriptedSource(txs, max_rows=3), sink, settings=split_settings(1, 3, 3, "ordered"),
                          listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert [a.position for a in listener.acks] == [
        Position("scripted", 0, row=3), Position("scripted", 0, row=6), Position("scripted", 0, row=9),
        Position("scripted", 1)]
    assert [r.end for r in sink.loads] == [a.position for a in listener.acks]
    assert_exact(sink, txs)


def test_a_restart_from_a_row_checkpoint_skips_the_rows_already_loaded():
    """A pipeline paused after the first piece of a transaction resumes at LOG:OFFSET+ROW and loads each row once."""
    txs = [[insert("k", {"n": n}, key=()) for n in range(6)]]
    plan = FaultPlan([Fault("load", batch=2, times=1)])
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    first = run_pipeline(ScriptedSource(txs, max_rows=2), FaultyLoad(plan, sink), meta=meta,
                         settings=split_settings(1, 2, 1, "ordered"))
    assert first.outcome is Outcome.PAUSED
    assert meta.position("test").position == Position("scripted", 0, row=2)
    source = ScriptedSource(txs, max_rows=2)
    second = run_pipeline(source, FaultyLoad(plan, sink), meta=meta, settings=split_settings(1, 2, 1, "ordered"))
    assert second.outcome is Outcome.CAUGHT_UP
    assert_exact(sink, txs)
    assert [r.start for r in sink.loads] == [Position("scripted", 0), Position("scripted", 0, row=2),
                                             Position("scripted", 0, row=4)]


def test_a_failed_ack_after_the_target_committed_replays_from_the_target_position():
    """A failure between load and ack inside a split transaction acks the target's position instead of loading twice."""
    txs = [[insert("k", {"n": n}, key=()) for n in range(6)]]
    plan = FaultPlan([Fault("termin", batch=2, times=1)])
    sink = MemorySink(holds_position=True)
    listener = InvariantListener(1, sink)
    result = run_pipeline(ScriptedSource(txs, max_rows=2), FaultyLoad(plan, sink), listener=listener,
                          settings=split_settings(1, 2, 3, "ordered"))
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == []
    assert_exact(sink, txs)
    assert len(sink.loads) == 3  # the batch whose ack failed was not loaded again
    assert [a.position for a in listener.acks] == [Position("scripted", 0, row=2), Position("scripted", 0, row=4),
                                                   Position("scripted", 1)]


class SlowRollbackListener(InvariantListener):
    """Holds Termin in `on_rollback` (after the rollback completed, before a pause ends the run)."""

    def on_rollback(self, batch_id, epoch, error, attempt) -> None:
        super().on_rollback(batch_id, epoch, error, attempt)
        time.sleep(0.3)


def test_a_pause_hands_no_batch_on_after_its_rollback_so_no_part_is_loaded_twice():
    """A rollback that pauses lets Select hand nothing on: no part of a keyless table is applied without its mark."""
    txs = [[insert("k", {"n": n, "v": 0}, key=()) for n in range(6)], [insert("k", {"n": 9, "v": 0}, key=())]]
    plan = FaultPlan([Fault("transform", batch=1, times=1)])
    sink = MemorySink(holds_position=True)
    meta = SqliteMetaStore(":memory:")
    listener = SlowRollbackListener(1, sink)
    result = run_pipeline(ScriptedSource(txs, max_rows=2), FaultyLoad(plan, sink),
                          settings=split_settings(1, 4, 1, "per_table"), transform=FaultyTransform(plan), meta=meta,
                          listener=listener)
    assert result.outcome is Outcome.PAUSED and listener.violations == []
    assert sink.keyless_rows.get("demo.k", []) == [] and sink.loads == []  # nothing applied after the failure
    result = run_pipeline(ScriptedSource(txs, max_rows=2), FaultyLoad(plan, sink),
                          settings=split_settings(1, 4, 1, "per_table"), meta=meta)
    assert result.outcome is Outcome.CAUGHT_UP
    assert_exact(sink, txs)
