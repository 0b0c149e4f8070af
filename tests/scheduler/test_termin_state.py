"""The Termin state machine driven step by step, without threads: the `Ledger` with `Termin` and
the ordered `LoadDispatcher` around it, on an in-memory meta store and a scripted load."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from setl.errors import LoadError
from setl.meta import SqliteMetaStore, Status
from setl.model import Ack, Batch, Position
from setl.retry import Backoff
from setl.runtime import Progress
from setl.scheduler import Listener, Outcome
from setl.scheduler.ledger import Ledger, Permits, Slot
from setl.scheduler.loading import LoadDispatcher
from setl.scheduler.termin import Termin
from setl.stages import Load
from setl.tablecopy import CopyStatus, TableProgress
from setl.testing.harness import ScriptedSource

A = TypeVar("A")

PIPELINE = "p"


def pos(n: int) -> Position:
    """Position `n` of the rig's source: batch i covers (i - 1, i]."""
    return Position("src", n)


class Recorder(Listener):
    """Records the hooks the parts call."""

    def __init__(self) -> None:
        self.acks: list[tuple[int, int]] = []  # (batch id, epoch)
        self.termins: list[tuple[int, bool]] = []
        self.retired: list[tuple[int, int]] = []  # (batch id, epoch)
        self.rollbacks: list[tuple[int, int, int]] = []  # (failed id, new epoch, attempt)
        self.pauses: list[int] = []

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        self.acks.append((batch.id, batch.epoch))

    def on_termin(self, batch: Batch, ok: bool) -> None:
        self.termins.append((batch.id, ok))

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        self.retired.append((batch.id, batch.epoch))

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        self.rollbacks.append((batch_id, epoch, attempt))

    def on_pause(self, batch_id: int, error: BaseException) -> None:
        self.pauses.append(batch_id)


class ScriptedLoad(Load):
    """Records each load; fails the load of batch id i as many times as `failures[i]` says. Records
    in `bad_loads` a load of an old epoch, or one started while a rollback is under way."""

    def __init__(self) -> None:
        self.failures: dict[int, int] = {}
        self.loads: list[tuple[int, int]] = []  # (batch id, epoch), loaded without error
        self.marked: list[int] = []
        self.ledger: Ledger | None = None
        self.bad_loads: list[tuple[int, int]] = []

    def load(self, batch: Batch) -> None:
        if self.ledger is not None and (batch.epoch != self.ledger.epoch or self.ledger.rolling is not None):
            self.bad_loads.append((batch.id, batch.epoch))  # stale, or started during a rollback
        if self.failures.get(batch.id, 0) > 0:
            self.failures[batch.id] -= 1
            raise LoadError(f"scripted failure of batch {batch.id}")
        self.loads.append((batch.id, batch.epoch))

    def mark_loaded(self, batch: Batch) -> None:
        self.marked.append(batch.id)


class FlakyMeta(SqliteMetaStore):
    """An in-memory meta store whose ack of batch id i fails as many times as `ack_failures[i]` says,
    and whose writes of table-copy progress fail `progress_failures` times (inside the ack's transaction)."""

    def __init__(self) -> None:
        super().__init__(":memory:")
        self.ack_failures: dict[int, int] = {}
        self.progress_failures = 0

    def _write_progress(self, db, pipeline: str, progress: Sequence[TableProgress]) -> None:  # type: ignore[override]
        if progress and self.progress_failures > 0:
            self.progress_failures -= 1
            raise OSError("scripted failure writing snapshot progress")
        SqliteMetaStore._write_progress(db, pipeline, progress)

    def ack(self, pipeline: str, batch_id: int, epoch: int, position: Position, rows: int = 0, *,
            progress: Sequence[TableProgress] = ()) -> Ack:
        if self.ack_failures.get(batch_id, 0) > 0:
            self.ack_failures[batch_id] -= 1
            raise OSError(f"scripted ack failure of batch {batch_id}")
        return super().ack(pipeline, batch_id, epoch, position, rows, progress=progress)


class CopyingSource(ScriptedSource):
    """A source whose ack of batch id i makes `progress[i]` durable (`Select.acknowledge`), as a
    table copy does."""

    def __init__(self) -> None:
        super().__init__([])
        self.progress: dict[int, tuple[TableProgress, ...]] = {}

    def acknowledge(self, batch: Batch, write: Callable[[tuple[TableProgress, ...]], A]) -> A:
        return write(self.progress.get(batch.id, ()))


class Rig:
    """A ledger, Termin and an ordered (or per_table) load dispatcher, wired as `Scheduler` wires them."""

    def __init__(self, parallelism: int = 3, attempts: int = 20, *, per_table: bool = False,
                 select: ScriptedSource | None = None) -> None:
        self.lock = threading.Condition()
        self.listener = Recorder()
        self.select_wakes = 0
        self.permits = Permits(parallelism, None, self.lock, self._wake_select, self.listener.on_retire)
        backoff = Backoff(0.001, 0.002, attempts)
        self.ledger = Ledger(self.permits, self.lock, backoff, clock=lambda: 0.0)
        self.meta = FlakyMeta()
        self.load = ScriptedLoad()
        self.load.ledger = self.ledger
        self.finished: list[tuple[Outcome, BaseException | None]] = []
        self.termin = Termin(self.ledger, name=PIPELINE, node_id=None, lock=self.lock, load=self.load,
                             select=select or ScriptedSource([]), meta=self.meta, listener=self.listener,
                             backoff=backoff, per_table=per_table, wake=self._wake,
                             wrap=lambda exc, stage, batch: exc, finish=self._finish)
        self.loader = LoadDispatcher(self.ledger, self.load, name=PIPELINE, lock=self.lock, listener=self.listener,
                                     per_table=per_table, serial=None, wake=self._wake,
                                     wrap=lambda exc, stage, batch: exc, lost=lambda exc: None)
        self.ledger.begin(self.meta.next_epoch(PIPELINE), pos(0), 1)
        self.meta.set_state(PIPELINE, Status.RUNNING)

    def _wake_select(self) -> None:
        self.select_wakes += 1

    def _wake(self, *roles: str) -> None:
        """Tasks are stepped by hand here: nothing to wake."""

    def _finish(self, outcome: Outcome, error: BaseException | None) -> None:
        self.finished.append((outcome, error))

    def cut(self, batch_id: int, epoch: int | None = None, end: Position | None = None) -> Slot | None:
        """Select takes a permit and hands on batch `batch_id` (covering (id-1, id] unless `end` is
        given); None if refused."""
        assert self.permits.take(), "no permit free"
        epoch = self.ledger.epoch if epoch is None else epoch
        batch = Batch(PIPELINE, batch_id, epoch, pos(batch_id - 1), end or pos(batch_id), ())
        admitted = self.ledger.admit(batch)
        return None if admitted is None else admitted[0]

    def work(self, slot: Slot, error: BaseException | None = None) -> bool:
        """Extract/Transform of `slot` ends (with `error`, or ready)."""
        return self.ledger.worked(slot, slot.batch, error)

    def run(self, steps: int = 50) -> None:
        """Step Load and Termin until neither moves."""
        for _ in range(steps):
            moved = self.loader.step() is Progress.PROGRESS
            moved = self.termin.step() is Progress.PROGRESS or moved
            if not moved:
                return
        raise AssertionError("Load and Termin kept moving")


def test_a_result_for_k_plus_1_waits_for_the_result_of_k():
    """per_table: batch 2's load ends before batch 1's; Termin acks nothing until 1 is in, then 1 and 2 in order."""
    rig = Rig(per_table=True)
    one, two = rig.cut(1), rig.cut(2)
    assert one is not None and two is not None
    rig.work(one)
    rig.work(two)
    rig.ledger.begin_load(one, parts=True)
    rig.ledger.begin_load(two, parts=True)
    rig.ledger.parts_settled(two)
    assert rig.termin.step() is Progress.BLOCKED
    assert rig.listener.acks == [] and rig.ledger.next_ack == 1
    rig.ledger.parts_settled(one)
    assert rig.termin.step() is Progress.PROGRESS
    assert rig.termin.step() is Progress.PROGRESS
    assert rig.listener.acks == [(1, 1), (2, 1)]
    assert rig.load.marked == [1, 2]
    assert rig.ledger.acked == pos(2) and rig.meta.position(PIPELINE).position == pos(2)


def test_ordered_load_and_termin_wait_for_the_earlier_worker():
    """Batch 2's Extract/Transform ends first: nothing loads or acks until batch 1's does."""
    rig = Rig()
    one, two = rig.cut(1), rig.cut(2)
    assert one is not None and two is not None
    rig.work(two)
    assert rig.loader.step() is Progress.BLOCKED
    assert rig.termin.step() is Progress.BLOCKED
    rig.work(one)
    rig.run()
    assert rig.load.loads == [(1, 1), (2, 1)]
    assert rig.listener.acks == [(1, 1), (2, 1)]
    assert rig.termin.acked_batches == 2 and len(rig.ledger) == 0


def test_failure_of_batch_k_discards_later_batches_and_rewinds_to_the_ack_with_a_new_epoch():
    """Batch 2's load fails: 3 and 4 are discarded unloaded, the epoch goes up, Select is told to
    rewind to batch 1's end with id 2, and every permit comes back."""
    rig = Rig(parallelism=4)
    slots = [rig.cut(i) for i in (1, 2, 3, 4)]
    for slot in slots:
        assert slot is not None
        rig.work(slot)
    rig.load.failures[2] = 1
    rig.run()
    assert rig.load.loads == [(1, 1)]
    assert rig.listener.acks == [(1, 1)]
    assert rig.listener.termins == [(1, True), (2, False)]
    assert rig.listener.rollbacks == [(2, 2, 1)]
    assert rig.ledger.epoch == 2 and rig.ledger.next_ack == rig.ledger.next_load == 2
    assert len(rig.ledger) == 0 and rig.permits.live == 0
    assert sorted(rig.listener.retired) == [(1, 1), (2, 1), (3, 1), (4, 1)]
    rewind = rig.ledger.take_rewind()
    assert rewind is not None and rewind.position == pos(1) and rewind.next_id == 2
    assert rig.ledger.take_rewind() is None  # taken once
    assert rig.finished == []  # a retry, not a pause
    assert [slot.discarded for slot in slots] == [False, True, True, True]


def test_a_rollback_waits_for_a_running_load():
    """A failure while a later batch is still LOADING: the rollback completes only once that load ends."""
    rig = Rig(per_table=True)
    one, two, three = rig.cut(1), rig.cut(2), rig.cut(3)
    assert one is not None and two is not None and three is not None
    for slot in (one, two, three):
        rig.work(slot)
    rig.ledger.begin_load(one, parts=True)
    rig.ledger.parts_settled(one, LoadError("part failed"))
    rig.ledger.begin_load(two, parts=True)
    assert rig.termin.step() is Progress.BLOCKED  # the rollback began; batch 2 is LOADING
    assert rig.ledger.rolling is not None and rig.ledger.rolling_back
    assert not rig.ledger.runnable(two, two.batch)  # no part of batch 2 or later starts now
    assert rig.ledger.loadable() is None and rig.loader.step() is Progress.BLOCKED  # nor batch 3's load
    rig.ledger.parts_settled(two)
    assert rig.termin.step() is Progress.PROGRESS
    assert rig.ledger.rolling is None and rig.ledger.epoch == 2 and rig.listener.acks == []


def test_late_results_of_an_old_epoch_are_ignored():
    """Batch 1 fails while 2 and 3 are still in Extract/Transform: their late results only give
    the permits back; a cut of the old epoch is refused; the replay acks in the new epoch."""
    rig = Rig()
    one, two, three = rig.cut(1), rig.cut(2), rig.cut(3)
    assert one is not None and two is not None and three is not None
    rig.work(one, LoadError("transform failed"))
    rig.run()
    assert rig.ledger.epoch == 2 and rig.permits.live == 2  # 2 and 3 still hold theirs
    assert rig.work(two) is False and rig.work(three) is False
    assert rig.permits.live == 0
    rig.run()
    assert rig.load.loads == [] and rig.listener.acks == []
    assert rig.cut(1) is None and rig.permits.live == 0  # the rewind is not taken yet: refused, permit back
    rewind = rig.ledger.take_rewind()
    assert rewind is not None and rewind.position == pos(0) and rewind.next_id == 1
    assert rig.cut(1, epoch=1) is None and rig.permits.live == 0  # a cut of the old epoch: refused
    replay = rig.cut(1)
    assert replay is not None
    assert not rig.ledger.runnable(two, two.batch.replace(()))  # a part of the old epoch
    rig.work(replay)
    rig.run()
    assert rig.listener.acks == [(1, 2)]
    assert rig.load.bad_loads == []


def test_the_pipeline_pauses_when_the_attempts_run_out():
    """Batch 1 fails on every attempt: the first failure retries, the second (max_attempts 2) pauses."""
    rig = Rig(attempts=2)
    rig.load.failures[1] = 5
    for attempt in (1, 2):
        slot = rig.cut(1)
        assert slot is not None
        rig.work(slot)
        rig.run()
        assert rig.listener.rollbacks[-1] == (1, attempt + 1, attempt)
        assert rig.ledger.take_rewind() is not None
    assert rig.listener.pauses == [1]
    assert [outcome for outcome, _ in rig.finished] == [Outcome.PAUSED]
    assert isinstance(rig.finished[0][1], LoadError)
    assert rig.meta.state(PIPELINE).status is Status.PAUSED
    assert rig.permits.live == 0


def test_attempts_count_again_once_the_ack_passes_the_rewind_point():
    """An ack past the point the last rollback rewound to starts the count of attempts again."""
    rig = Rig(attempts=2)
    rig.load.failures[1] = 1
    slot = rig.cut(1)
    assert slot is not None
    rig.work(slot)
    rig.run()
    assert rig.ledger.attempt == 1 and rig.ledger.take_rewind() is not None
    slot = rig.cut(1)
    assert slot is not None
    rig.work(slot)
    rig.run()
    assert rig.ledger.attempt == 0 and rig.listener.acks == [(1, 2)]


def test_an_ack_short_of_the_rewind_point_keeps_counting_attempts():
    """A replayed batch acked without passing where the rollback rewound to (a piece of a split
    transaction) does not start the count of attempts again."""
    rig = Rig(attempts=3)
    rig.load.failures[2] = 1
    one, two = rig.cut(1), rig.cut(2)
    assert one is not None and two is not None
    rig.work(one)
    rig.work(two)
    rig.run()
    assert rig.ledger.attempt == 1 and rig.ledger.take_rewind() is not None
    piece = rig.cut(2, end=pos(1))  # ends where the rollback rewound to
    assert piece is not None
    rig.work(piece)
    rig.run()
    assert rig.listener.acks == [(1, 1), (2, 2)] and rig.ledger.attempt == 1


def test_permits_are_released_on_retire():
    """parallelism 2: a third cut finds no permit until a batch is acked; the retire wakes Select."""
    rig = Rig(parallelism=2)
    one, two = rig.cut(1), rig.cut(2)
    assert one is not None and two is not None
    assert rig.permits.take() is False and rig.permits.live == 2
    rig.work(one)
    wakes = rig.select_wakes
    rig.run()
    assert rig.listener.acks == [(1, 1)] and rig.listener.retired == [(1, 1)]
    assert rig.permits.live == 1 and rig.select_wakes == wakes + 1
    assert rig.permits.take() is True


def test_an_ack_that_fails_rolls_back_from_the_same_batch():
    """The meta store refuses batch 1's ack: batch 1 and later roll back, and the replay acks it."""
    rig = Rig()
    rig.meta.ack_failures[1] = 1
    one, two = rig.cut(1), rig.cut(2)
    assert one is not None and two is not None
    rig.work(one)
    rig.work(two)
    rig.run()
    assert rig.listener.acks == [] and rig.listener.rollbacks == [(1, 2, 1)]
    assert rig.load.loads == [(1, 1)]  # the rollback came before batch 2's turn to load
    assert rig.ledger.take_rewind() is not None
    for i in (1, 2):
        slot = rig.cut(i)
        assert slot is not None
        rig.work(slot)
    rig.run()
    assert rig.listener.acks == [(1, 2), (2, 2)]


def test_a_failing_progress_write_rolls_back_and_is_retried_like_a_failing_ack():
    """The table-copy progress batch 1's ack makes durable cannot be written: nothing of the ack is
    written (same transaction), batch 1 rolls back like a failed ack (no crash), and the replay's ack
    writes position and progress together."""
    source = CopyingSource()
    copied = TableProgress("s", "t", CopyStatus.COPYING, last_key=(10,), rows=10, chunks=1)
    source.progress[1] = (copied,)
    rig = Rig(select=source)
    rig.meta.progress_failures = 1
    one = rig.cut(1)
    assert one is not None
    rig.work(one)
    rig.run()
    assert rig.finished == [] and rig.listener.acks == [] and rig.listener.rollbacks == [(1, 2, 1)]
    assert rig.meta.position(PIPELINE) is None and rig.meta.snapshot_progress(PIPELINE) == []
    assert rig.ledger.take_rewind() is not None
    slot = rig.cut(1)
    assert slot is not None
    rig.work(slot)
    rig.run()
    assert rig.listener.acks == [(1, 2)] and rig.finished == []
    assert rig.meta.position(PIPELINE).position == pos(1)
    assert rig.meta.snapshot_progress(PIPELINE) == [copied]


def test_a_source_failure_rolls_back_after_the_batches_handed_on_before_it():
    """Select fails after batch 1: Termin acks 1 first, then rolls back from its end."""
    rig = Rig()
    one = rig.cut(1)
    assert one is not None
    rig.ledger.source_failed(OSError("source away"))
    assert rig.ledger.select_failed
    rig.work(one)
    rig.run()
    assert rig.listener.acks == [(1, 1)] and rig.listener.rollbacks == [(2, 2, 1)]
    rewind = rig.ledger.take_rewind()
    assert rewind is not None and rewind.position == pos(1) and rewind.next_id == 2
    assert not rig.ledger.select_failed


class Model:
    """A Select and workers stepped by hypothesis around a `Rig`: Select cuts batches 1..`total`
    of the source, reading each in two steps (take a permit, then hand on), and rewinds when asked."""

    def __init__(self, rig: Rig, total: int) -> None:
        self.rig = rig
        self.total = total
        self.cursor = 0  # the source position Select reads from
        self.next_id = 1
        self.cutting: tuple[int, int, int] | None = None  # (id, epoch, cursor) of the batch being read
        self.working: list[Slot] = []
        self.faults: dict[int, int] = {}  # Extract/Transform failures by batch id

    def select(self) -> None:
        ledger, permits = self.rig.ledger, self.rig.permits
        rewind = ledger.take_rewind()
        if rewind is not None:
            if self.cutting is not None:
                self.cutting = None
                permits.abandon_cut()
            assert rewind.position is not None
            self.cursor, self.next_id = rewind.position.offset, rewind.next_id
            return
        if self.cutting is None:
            if self.cursor < self.total and permits.take():
                self.cutting = (self.next_id, ledger.epoch, self.cursor)
            return
        batch_id, epoch, cursor = self.cutting
        self.cutting = None
        batch = Batch(PIPELINE, batch_id, epoch, pos(cursor), pos(cursor + 1), ())
        admitted = ledger.admit(batch)
        if admitted is not None:
            self.working.append(admitted[0])
            self.cursor, self.next_id = cursor + 1, batch_id + 1

    def work(self, index: int) -> None:
        if self.working:
            slot = self.working.pop(index % len(self.working))
            error = None
            if self.faults.get(slot.batch.id, 0) > 0:
                self.faults[slot.batch.id] -= 1
                error = LoadError(f"scripted transform failure of batch {slot.batch.id}")
            self.rig.work(slot, error)


fault_plans = st.lists(
    st.tuples(st.sampled_from(["work", "load", "ack"]), st.integers(1, 8), st.integers(1, 2)), max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parallelism=st.integers(1, 5), total=st.integers(1, 8), faults=fault_plans,
       steps=st.lists(st.tuples(st.sampled_from(["select", "work", "load", "termin"]), st.integers(0, 7)),
                      max_size=120))
def test_random_interleavings_ack_every_batch_once_in_order(parallelism, total, faults, steps):
    """Any interleaving of Select, workers, Load and Termin, with failures anywhere: acks run 1, 2, ...
    in order, each in the epoch it was loaded in, never more than `parallelism` permits are
    held, nothing stale is loaded, and once drained every batch is acked and every permit back."""
    rig = Rig(parallelism=parallelism, attempts=50)
    model = Model(rig, total)
    for stage, batch_id, times in faults:
        plan = {"work": model.faults, "load": rig.load.failures, "ack": rig.meta.ack_failures}[stage]
        plan[batch_id] = plan.get(batch_id, 0) + times

    def act(stage: str, index: int) -> None:
        if stage == "select":
            model.select()
        elif stage == "work":
            model.work(index)
        elif stage == "load":
            rig.loader.step()
        else:
            rig.termin.step()
        assert rig.permits.live <= parallelism
        assert rig.ledger.next_ack <= rig.ledger.next_load

    for stage, index in steps:
        act(stage, index)
    for _ in range(40 * (total + 10)):  # drain: every part in turn until all is acked
        if rig.ledger.acked == pos(total) and not model.working and model.cutting is None:
            break
        for stage in ("select", "work", "load", "termin"):
            act(stage, 0)
    assert rig.finished == []
    assert rig.ledger.acked == pos(total)
    assert [batch_id for batch_id, _ in rig.listener.acks] == list(range(1, total + 1))
    assert all(batch in rig.load.loads for batch in rig.listener.acks)  # acked only what was loaded, same epoch
    assert rig.load.bad_loads == []
    assert len(rig.ledger) == 0 and rig.permits.live == 0
    retired = rig.listener.retired
    assert len(retired) == len(set(retired))  # every batch gave its permits back once
    event(f"rollbacks: {min(len(rig.listener.rollbacks), 3)}")
    event(f"discarded batches: {min(len(retired) - len(rig.listener.acks), 3)}")


def test_a_batch_is_admitted_only_once():
    """Handing on a batch id already in flight is a bug the ledger refuses loudly."""
    rig = Rig()
    assert rig.cut(1) is not None
    with pytest.raises(AssertionError):
        rig.cut(1)
