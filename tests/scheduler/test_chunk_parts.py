"""Ordered mode with `load.chunks: per_table` loads a snapshot's chunks (batches of reads only) as
per-table parts on the load slots; whole batches wait for those parts and their acks, so key order
and the target's position stay exact."""

from __future__ import annotations

import threading

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setl.config import LoadSettings, PipelineSettings
from setl.model import Batch, Op, Position, RowChange
from setl.scheduler import Outcome
from setl.scheduler.loading import chunks_only
from setl.testing.harness import (
    Fault,
    FaultPlan,
    FaultyLoad,
    FaultyTransform,
    InvariantListener,
    MemorySink,
    ScriptedSource,
    delete,
    insert,
    read,
    reference_state,
    run_pipeline,
    update,
)
from tests.test_scheduler import fast_settings

pytestmark = pytest.mark.timeout(300)


class PositionRecordingSink(MemorySink):
    """A position-holding sink that records how each batch was loaded (whole or by parts), every
    position it was told to hold, in order, and each key's writes as (epoch, offset)."""

    def __init__(self) -> None:
        super().__init__(holds_position=True)
        self.whole: list[int] = []
        self.parts: list[int] = []
        self.held: list[Position] = []
        self.writes: dict[tuple[str, tuple], list[tuple[int, int]]] = {}
        self._record = threading.Lock()

    def load(self, batch: Batch) -> None:
        super().load(batch)
        self._wrote(batch, self.whole, hold=bool(batch.changes))

    def load_part(self, batch: Batch) -> None:
        super().load_part(batch)
        self._wrote(batch, self.parts, hold=False)

    def mark_loaded(self, batch: Batch) -> None:
        super().mark_loaded(batch)
        with self._record:
            self.held.append(batch.end)

    def _wrote(self, batch: Batch, into: list[int], *, hold: bool) -> None:
        with self._record:
            into.append(batch.id)
            if hold:
                self.held.append(batch.end)
            for change in batch.changes:
                assert isinstance(change, RowChange)
                self.writes.setdefault((change.qualified_table, change.key), []).append(
                    (batch.epoch, change.position.offset))


@st.composite
def snapshot_streams(draw: st.DrawFn) -> list[list[RowChange]]:
    """Transactions over two tables and a few keys: chunks (reads of several keys of one table, as
    a snapshot copies them) between binlog transactions that change the same keys."""
    state: dict[tuple[str, int], dict] = {}
    txs: list[list[RowChange]] = []
    for n in range(draw(st.integers(1, 30))):
        table = draw(st.sampled_from(["a", "b"]))
        if draw(st.booleans()):
            keys = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4, unique=True))
            tx = []
            for key in keys:
                row = {"id": key, "v": 1000 + n}
                tx.append(read(table, row))
                state[(table, key)] = row
            txs.append(tx)
            continue
        key = draw(st.integers(1, 6))
        row = state.get((table, key))
        if row is None:
            new = {"id": key, "v": n}
            txs.append([insert(table, new)])
            state[(table, key)] = new
        elif draw(st.booleans()):
            new = {"id": key, "v": n}
            txs.append([update(table, row, new)])
            state[(table, key)] = new
        else:
            txs.append([delete(table, row)])
            del state[(table, key)]
    return txs


faults = st.lists(
    st.tuples(st.sampled_from(["load", "load", "termin", "transform"]), st.integers(1, 12), st.integers(1, 2)),
    max_size=4,
)


def ordered(parallelism: int, max_rows: int) -> PipelineSettings:
    return attrs.evolve(fast_settings(parallelism, max_rows), load=LoadSettings(mode="ordered", chunks="per_table"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txs=snapshot_streams(), parallelism=st.integers(1, 5), max_rows=st.integers(1, 8), plan=faults)
def test_chunks_by_parts_keep_key_order_and_the_position_never_goes_back(txs, parallelism, max_rows, plan):
    """Ordered mode, chunks between binlog changes to the same keys, random failures: chunks load by
    parts, every key's writes stay in binlog order, the held position never moves back, the end is exact."""
    fault_plan = FaultPlan(Fault(stage, batch=batch, times=times) for stage, batch, times in plan)
    sink = PositionRecordingSink()
    source = ScriptedSource(txs)
    listener = InvariantListener(parallelism, sink, Position("scripted", 0))
    result = run_pipeline(source, FaultyLoad(fault_plan, sink), settings=ordered(parallelism, max_rows),
                          transform=FaultyTransform(fault_plan), listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == []
    assert sink.tables == reference_state(txs)
    assert sink.committed() == source.head() == result.meta.position("test").position
    if not plan:  # a rollback replays from the ack: the held position may go back to it then
        assert sink.held == sorted(sink.held), f"the held position went back: {sink.held}"
    for (table, key), writes in sink.writes.items():
        for (epoch_a, offset_a), (epoch_b, offset_b) in zip(writes, writes[1:]):
            assert epoch_a <= epoch_b, f"{table} {key}: epoch went back in {writes}"
            if epoch_a == epoch_b:
                assert offset_a <= offset_b, f"{table} {key}: out of binlog order in {writes}"
    if any(all(c.op is Op.READ for c in tx) for tx in txs) and max_rows == 1 and not plan:
        assert sink.parts, "a batch of reads only was not loaded by parts"


def test_a_chunk_loads_by_parts_and_a_binlog_batch_after_it_waits_for_its_ack():
    """A batch of reads of two tables goes by parts (one per table); the next, a binlog change,
    loads whole only after the chunk's position is held, and the target ends at the last batch."""
    txs = [[read("a", {"id": 1, "v": 1}), read("b", {"id": 1, "v": 1})], [update("a", {"id": 1, "v": 1},
                                                                                  {"id": 1, "v": 2})]]
    sink = PositionRecordingSink()
    source = ScriptedSource(txs)
    result = run_pipeline(source, sink, settings=ordered(3, max_rows=2))
    assert result.outcome is Outcome.CAUGHT_UP
    assert sink.parts == [1, 1] and sink.whole == [2]
    assert sink.held == sorted(sink.held) and len(sink.held) == 2
    assert sink.committed() == source.head()
    assert sink.tables == reference_state(txs)


def test_chunks_load_whole_by_default():
    """Without `load.chunks: per_table` a batch of reads loads whole, as every ordered batch does."""
    txs = [[read("a", {"id": 1, "v": 1}), read("b", {"id": 1, "v": 1})]]
    sink = PositionRecordingSink()
    result = run_pipeline(ScriptedSource(txs), sink, settings=fast_settings(3, max_rows=2))
    assert result.outcome is Outcome.CAUGHT_UP
    assert sink.parts == [] and sink.whole == [1]
    assert sink.tables == reference_state(txs)


def test_only_batches_of_reads_only_are_chunks():
    """`chunks_only`: an empty batch, or one holding any binlog change, loads whole."""
    start = Position("scripted", 0)
    chunk = Batch("test", 1, 0, start, start, (read("a", {"id": 1}),))
    mixed = Batch("test", 2, 0, start, start, (read("a", {"id": 1}), insert("a", {"id": 2})))
    assert chunks_only(chunk)
    assert not chunks_only(mixed)
    assert not chunks_only(attrs.evolve(chunk, changes=()))
