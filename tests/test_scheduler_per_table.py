"""`pipeline.load.mode: per_table`: per-table parts on the serial executor, EOF tasks and a batch latch."""

from __future__ import annotations

import threading

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setl.config import LoadSettings, PipelineSettings
from setl.errors import ConfigError
from setl.meta import SqliteMetaStore, Status
from setl.model import Batch, Position, RowChange
from setl.runtime import hash_slot
from setl.scheduler import Outcome, Scheduler
from setl.stages import Extract, Load, LoadCapabilities, Transform
from setl.testing.harness import (
    Fault,
    FaultPlan,
    FaultyLoad,
    InvariantListener,
    MemorySink,
    ScriptedSource,
    insert,
    reference_state,
    run_pipeline,
    update,
)
from tests.test_scheduler import fast_settings, streams


def per_table(settings: PipelineSettings) -> PipelineSettings:
    return attrs.evolve(settings, load=LoadSettings(mode="per_table"))


class OrderRecordingSink(MemorySink):
    """A position-holding sink that records every part it applies, and checks each mark.

    `starts` is the epoch of every part in the order parts started; `writes` maps
    (table, key) to the (epoch, offset) of each change applied to it, in apply order.
    """

    def __init__(self) -> None:
        super().__init__(holds_position=True)
        self.starts: list[int] = []
        self.writes: dict[tuple[str, tuple], list[tuple[int, int]]] = {}
        self.applied: dict[tuple[int, int], set[str]] = {}
        self.problems: list[str] = []
        self._record = threading.Lock()

    def load_part(self, batch: Batch) -> None:
        with self._record:
            self.starts.append(batch.epoch)
        super().load_part(batch)
        with self._record:
            for change in batch.changes:
                assert isinstance(change, RowChange)
                self.writes.setdefault((change.qualified_table, change.key), []).append(
                    (batch.epoch, change.position.offset))
                if change.old_key is not None and change.old_key != change.key:
                    self.writes.setdefault((change.qualified_table, change.old_key), []).append(
                        (batch.epoch, change.position.offset))
            self.applied.setdefault((batch.id, batch.epoch), set()).update(batch.tables)

    def mark_loaded(self, batch: Batch) -> None:
        with self._record:
            missing = set(batch.tables) - self.applied.get((batch.id, batch.epoch), set())
            if missing:
                self.problems.append(f"batch {batch.id} marked loaded without {sorted(missing)}")
        super().mark_loaded(batch)


load_faults = st.lists(
    st.tuples(st.sampled_from(["load", "load", "termin", "transform"]), st.integers(1, 12), st.integers(1, 2)),
    max_size=5,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(txs=streams(), parallelism=st.integers(1, 6), max_rows=st.integers(1, 8), faults=load_faults)
def test_per_table_keeps_per_key_order_under_random_load_failures(txs, parallelism, max_rows, faults):
    """Under random failures per_table keeps per-key order, runs no stale part, marks only whole batches, ends right."""
    from setl.testing.harness import FaultyTransform

    plan = FaultPlan(Fault(stage, batch=batch, times=times) for stage, batch, times in faults)
    sink = OrderRecordingSink()
    listener = InvariantListener(parallelism, sink, Position("scripted", 0))
    source = ScriptedSource(txs)
    result = run_pipeline(source, FaultyLoad(plan, sink), settings=per_table(fast_settings(parallelism, max_rows)),
                          transform=FaultyTransform(plan), listener=listener)
    assert result.outcome is Outcome.CAUGHT_UP
    assert listener.violations == []
    assert sink.problems == []
    assert sink.tables == reference_state(txs)
    assert sink.committed() == source.head() == result.meta.position("test").position
    assert sink.starts == sorted(sink.starts), "a part of an old epoch started after the replay began"
    for (table, key), writes in sink.writes.items():
        for (epoch_a, offset_a), (epoch_b, offset_b) in zip(writes, writes[1:]):
            assert epoch_a <= epoch_b, f"{table} {key}: epoch went back in {writes}"
            if epoch_a == epoch_b:
                assert offset_a <= offset_b, f"{table} {key}: out of binlog order in {writes}"


def two_tables_on_different_slots() -> tuple[str, str]:
    names = [f"t{i}" for i in range(20)]
    first = names[0]
    slot = hash_slot(("test", f"demo.{first}"), 8)
    second = next(n for n in names[1:] if hash_slot(("test", f"demo.{n}"), 8) != slot)
    return first, second


def test_parts_of_different_tables_load_concurrently_and_the_mark_waits_for_both():
    """The two tables of one batch are loaded at the same time on their own slots; the batch is marked after both."""
    a, b = two_tables_on_different_slots()
    both_started = threading.Barrier(2, timeout=10)

    class Rendezvous(OrderRecordingSink):
        def load_part(self, batch):
            both_started.wait()  # raises BrokenBarrierError unless the other part runs at the same time
            super().load_part(batch)

    sink = Rendezvous()
    txs = [[insert(a, {"id": 1, "v": 1}), insert(b, {"id": 1, "v": 1})]]
    result = run_pipeline(ScriptedSource(txs), sink, settings=per_table(fast_settings(1, max_rows=10)))
    assert result.outcome is Outcome.CAUGHT_UP
    assert sink.problems == []
    assert [r.batch_id for r in sink.loads] == [1]
    assert sink.tables == reference_state(txs)


def test_a_failing_table_rolls_the_batch_back_and_later_queued_parts_never_run():
    """When one table's part fails, the batch is rolled back; parts of later batches queued behind it are skipped."""
    a, b = two_tables_on_different_slots()
    release = threading.Event()
    seen: list[tuple[int, int, str]] = []

    class FailFirstA(OrderRecordingSink):
        failed = False

        def load_part(self, batch):
            table = batch.tables[0]
            seen.append((batch.id, batch.epoch, table))
            if table == f"demo.{a}" and batch.id == 1 and not self.failed:
                assert release.wait(10)  # let batches 2 and 3 queue behind this part
                self.failed = True
                raise RuntimeError("table a refused the batch")
            super().load_part(batch)

    sink = FailFirstA()
    txs = [[insert(a, {"id": i, "v": i}), insert(b, {"id": i, "v": i})] for i in range(1, 4)]
    settings = per_table(fast_settings(3, max_rows=2, wait_ms=0))
    meta = SqliteMetaStore(":memory:")
    scheduler = Scheduler("test", settings, ScriptedSource(txs), Extract(), Transform(), sink, meta,
                          listener=InvariantListener(3, sink))
    done: list[Outcome] = []
    thread = threading.Thread(target=lambda: done.append(scheduler.run(until_caught_up=True)))
    thread.start()
    from tests.helpers.wait import wait_until

    try:
        # Table b has its own slot, so its part of batch 3 ran: the table-a parts of 2 and 3 are queued.
        wait_until(lambda: any(s[0] == 3 and s[2] == f"demo.{b}" for s in seen), message="batch 3 dispatched")
    finally:
        release.set()
        thread.join(30)
    assert done == [Outcome.CAUGHT_UP]
    first_epoch = seen[0][1]
    stale = [s for s in seen if s[1] == first_epoch and s[2] == f"demo.{a}" and s[0] > 1]
    assert stale == [], "parts of table a queued behind the failed part ran in the old epoch"
    assert sink.tables == reference_state(txs)
    assert sink.problems == []


def test_per_table_is_refused_for_a_target_that_cannot_load_parts():
    """A target without load_part cannot run per_table: a ConfigError naming the pipeline, before anything starts."""

    class WholeBatchesOnly(Load):
        def load(self, batch):
            pass

    with pytest.raises(ConfigError, match="cannot load per table") as info:
        Scheduler("p9", per_table(fast_settings()), ScriptedSource(), Extract(), Transform(), WholeBatchesOnly(),
                  SqliteMetaStore(":memory:"))
    assert "pipeline=p9" in str(info.value)


def test_per_table_into_postgresql_marks_the_position_only_when_every_table_is_in(postgres_server, postgres_db):
    """On PostgreSQL, a batch whose table b part keeps failing never moves the target's position."""
    from setl.connectors import registry
    from setl.sinks.postgresql import PostgresqlLoad

    postgres_server.query("CREATE SCHEMA demo", dbname=postgres_db)
    for table in ("a", "b"):
        postgres_server.query(f"CREATE TABLE demo.{table} (id INT PRIMARY KEY, v INT)", dbname=postgres_db)
    txs = [[insert("a", {"id": i, "v": i}) if i < 7 else update("a", {"id": i % 7, "v": i - 7}, {"id": i % 7, "v": i}),
            insert("b", {"id": i, "v": i})] for i in range(20)]

    class TableBFailsAtBatch3(Load):
        capabilities = LoadCapabilities(per_table=True, stores_position=True)

        def __init__(self, inner):
            self.inner = inner

        def load_part(self, batch):
            if batch.id == 3 and batch.tables == ("demo.b",):
                raise RuntimeError("table b is down")
            self.inner.load_part(batch)

        def mark_loaded(self, batch):
            self.inner.mark_loaded(batch)

        def committed(self):
            return self.inner.committed()

    sink = PostgresqlLoad.from_config(postgres_server.target_config(postgres_db), pipeline="test")
    sink.capabilities = registry().target("postgresql").capabilities  # as the connector declares them
    sink.open()
    try:
        meta = SqliteMetaStore(":memory:")
        settings = per_table(fast_settings(2, max_rows=4, attempts=2))
        source = ScriptedSource(txs)
        result = run_pipeline(source, TableBFailsAtBatch3(sink), settings=settings, meta=meta)
        assert result.outcome is Outcome.PAUSED
        acked = meta.position("test").position
        assert acked == Position("scripted", 4)  # batches 1 and 2, two transactions each
        assert postgres_server.query("SELECT count(*) FROM demo.a WHERE v IN (4, 5)", dbname=postgres_db) == [(2,)]
        assert sink.committed() == acked, "a batch was marked while its table b part had not landed"

        meta.set_state("test", Status.STOPPED)  # what `setl resume` does
        result = run_pipeline(ScriptedSource(txs), sink, settings=settings, meta=meta)
        assert result.outcome is Outcome.CAUGHT_UP
        assert sink.committed() == source.head()
        expected = reference_state(txs)
        for table in ("a", "b"):
            rows = postgres_server.query(f"SELECT id, v FROM demo.{table}", dbname=postgres_db)
            assert {(r[0],): {"id": r[0], "v": r[1]} for r in rows} == expected[f"demo.{table}"]
    finally:
        sink.close()
