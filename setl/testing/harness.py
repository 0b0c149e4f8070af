"""In-memory stages and fault markers for testing pipelines without a binlog or a target.

* `ScriptedSource` replays a scripted list of transactions with positions.
* `MemorySink` applies batches to dicts and records every load.
* `FaultPlan` fails, slows or crashes a stage at a given batch, once, n times or always.
* `InvariantListener` checks the scheduler's invariants while it runs.
* `run_pipeline` runs all of it until the source is caught up.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from setl.config import PipelineSettings
from setl.meta.base import MetaStore
from setl.meta.sqlite import SqliteMetaStore
from setl.model import Ack, Batch, Change, DdlChange, Op, Position, RowChange, Transaction
from setl.scheduler import Listener, Outcome, Scheduler
from setl.sinks.merge import merge
from setl.stages import Extract, Load, LoadWrapper, Select, Transform

# --- building changes -----------------------------------------------------------------------


def insert(table: str, row: Mapping[str, Any], *, key: Sequence[str] = ("id",), schema: str = "demo") -> RowChange:
    """An insert of `row` into `schema.table`."""
    return RowChange(Op.INSERT, schema, table, tuple(key), None, dict(row))


def update(
    table: str, before: Mapping[str, Any], after: Mapping[str, Any], *, key: Sequence[str] = ("id",),
    schema: str = "demo",
) -> RowChange:
    """An update from `before` to `after` (full images)."""
    return RowChange(Op.UPDATE, schema, table, tuple(key), dict(before), dict(after))


def delete(table: str, row: Mapping[str, Any], *, key: Sequence[str] = ("id",), schema: str = "demo") -> RowChange:
    """A delete of `row` (its full before image)."""
    return RowChange(Op.DELETE, schema, table, tuple(key), dict(row), None)


def reference_state(transactions: Iterable[Transaction | Sequence[Change]]) -> dict[str, dict]:
    """The state of every table after applying all changes in order: ``{schema.table: {key: row}}``."""
    tables: dict[str, dict] = {}
    for tx in transactions:
        changes = tx.changes if isinstance(tx, Transaction) else tx
        for change in changes:
            if isinstance(change, DdlChange):
                continue
            rows = tables.setdefault(change.qualified_table, {})
            if change.before is not None:
                rows.pop(change.old_key, None)
            if change.after is not None:
                rows[change.key] = dict(change.after)
    return {name: rows for name, rows in tables.items()}


def parquet_state(root: str | os.PathLike[str], table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """A table's rows, ``{key: row}``, from the Parquet target's change log under `root`.

    Applied as `setl.sinks.parquet` tells a reader to, with plain pyarrow: rows
    in (``_setl_log``, ``_setl_offset``, ``_setl_row``, ``_setl_seq``) order; the key is the
    columns that have a ``_setl_before_*`` column, in name order.
    """
    import pyarrow.parquet as pq

    from setl.sinks.parquet import BEFORE_PREFIX

    data = pq.read_table(os.path.join(root, table), partitioning="hive").to_pylist()
    data.sort(key=lambda r: (r["_setl_log"], r["_setl_offset"], r.get("_setl_row") or 0, r["_setl_seq"]))
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in data:
        image = {c: v for c, v in row.items() if not c.startswith("_setl_")}
        before = tuple(v for c, v in sorted(row.items()) if c.startswith(BEFORE_PREFIX))
        key = tuple(v for c, v in sorted(image.items()) if BEFORE_PREFIX + c in row)
        if row["_setl_op"] == "update":
            state.pop(before, None)
        if row["_setl_op"] == "delete":
            state.pop(key, None)
        else:
            state[key] = image
    return state


# --- faults ---------------------------------------------------------------------------------


class InjectedFault(RuntimeError):
    """Raised by a `FaultPlan` marker."""


@attrs.define
class Fault:
    """One marker: at `stage` for batch id `batch` (None: every batch), do `action`.

    `action` is "fail" (raise `InjectedFault`), "slow" (sleep `seconds`) or
    "crash" (SIGKILL this process). `times` is how often it fires (None: always).
    For stage "select", `batch` counts transactions polled from the source.
    """

    stage: str
    action: str = "fail"
    batch: int | None = None
    times: int | None = 1
    seconds: float = 0.0
    fired: int = 0

    def __attrs_post_init__(self) -> None:
        if self.stage not in ("select", "extract", "transform", "load", "termin"):
            raise ValueError(f"unknown stage {self.stage!r} in fault marker")
        if self.action not in ("fail", "slow", "crash"):
            raise ValueError(f"unknown action {self.action!r} in fault marker")


class FaultPlan:
    """A set of fault markers, checked by the testing stages; thread-safe."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self.faults = list(faults)
        self._lock = threading.Lock()

    @classmethod
    def from_json(cls, text: str) -> "FaultPlan":
        """Markers as a JSON list of objects: ``[{"stage": "load", "batch": 3, "times": 2}]``."""
        return cls(Fault(**item) for item in json.loads(text))

    def fail(self, stage: str, batch: int | None = None, times: int | None = 1) -> "FaultPlan":
        self.faults.append(Fault(stage, "fail", batch, times))
        return self

    def fail_load(self, batch: int | None = None, times: int | None = 1) -> "FaultPlan":
        return self.fail("load", batch, times)

    def slow(self, stage: str, seconds: float, batch: int | None = None, times: int | None = None) -> "FaultPlan":
        self.faults.append(Fault(stage, "slow", batch, times, seconds))
        return self

    def crash(self, stage: str, batch: int | None = None) -> "FaultPlan":
        self.faults.append(Fault(stage, "crash", batch, 1))
        return self

    def check(self, stage: str, batch: int) -> None:
        """Fire the markers for `stage` and `batch`, if any are left."""
        sleep = 0.0
        with self._lock:
            for fault in self.faults:
                if fault.stage != stage or (fault.batch is not None and fault.batch != batch):
                    continue
                if fault.times is not None and fault.fired >= fault.times:
                    continue
                fault.fired += 1
                if fault.action == "crash":
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault.action == "fail":
                    raise InjectedFault(f"injected {stage} failure at batch {batch} (#{fault.fired})")
                sleep += fault.seconds
        if sleep:
            time.sleep(sleep)


class FaultyExtract(Extract):
    """Wraps an Extract and fires the plan's "extract" markers first."""

    def __init__(self, plan: FaultPlan, inner: Extract | None = None) -> None:
        self.plan, self.inner = plan, inner or Extract()

    def extract(self, batch: Batch) -> Batch:
        self.plan.check("extract", batch.id)
        return self.inner.extract(batch)


class FaultyTransform(Transform):
    """Wraps a Transform and fires the plan's "transform" markers first."""

    def __init__(self, plan: FaultPlan, inner: Transform | None = None) -> None:
        self.plan, self.inner = plan, inner or Transform()

    def transform(self, batch: Batch) -> Batch:
        self.plan.check("transform", batch.id)
        return self.inner.transform(batch)


class FaultyLoad(LoadWrapper):
    """Wraps a Load: fires "load" markers before it and "termin" markers after it.

    A "termin" marker therefore strikes between a batch's load and its ack.
    """

    def __init__(self, plan: FaultPlan, inner: Load) -> None:
        super().__init__(inner)
        self.plan = plan

    def load(self, batch: Batch) -> None:
        self.plan.check("load", batch.id)
        self.inner.load(batch)
        self.plan.check("termin", batch.id)

    def load_part(self, batch: Batch) -> None:
        self.plan.check("load", batch.id)
        self.inner.load_part(batch)

    def mark_loaded(self, batch: Batch) -> None:
        self.inner.mark_loaded(batch)
        self.plan.check("termin", batch.id)


# --- source and sink ------------------------------------------------------------------------


class ScriptedSource(Select):
    """Replays scripted transactions; transaction i ends at ``Position(name, i + 1)``.

    More transactions can be appended while a pipeline runs (`append`), and the
    source can be told to fail at a transaction through a `FaultPlan`'s
    "select" markers, counted by transaction index.
    """

    def __init__(
        self,
        transactions: Iterable[Transaction | Sequence[Change]] = (),
        *,
        name: str = "scripted",
        faults: FaultPlan | None = None,
    ) -> None:
        self.name = name
        self.faults = faults or FaultPlan()
        self._txs: list[Transaction] = []
        self._cond = threading.Condition()
        self._index = 0
        self.opens = 0
        for tx in transactions:
            self.append(tx)

    def append(self, tx: Transaction | Sequence[Change]) -> Position:
        """Add a transaction at the end of the log; returns its end position."""
        with self._cond:
            end = Position(self.name, len(self._txs) + 1)
            changes = tx.changes if isinstance(tx, Transaction) else tuple(tx)
            stamped = tuple(attrs.evolve(c, position=end) for c in changes)
            self._txs.append(Transaction(stamped, end))
            self._cond.notify_all()
            return end

    @property
    def transactions(self) -> list[Transaction]:
        with self._cond:
            return list(self._txs)

    def open(self, start: Position | None) -> None:
        self.opens += 1
        with self._cond:
            self._index = start.offset if start is not None else 0

    def poll(self, timeout: float) -> Transaction | None:
        with self._cond:
            if self._index >= len(self._txs):
                self._cond.wait(timeout)
                if self._index >= len(self._txs):
                    return None
            index = self._index
            tx = self._txs[index]
            self._index += 1
        self.faults.check("select", index)
        return tx

    def tell(self) -> Position:
        with self._cond:
            return Position(self.name, self._index)

    def head(self) -> Position:
        with self._cond:
            return Position(self.name, len(self._txs))


@attrs.frozen
class LoadRecord:
    batch_id: int
    epoch: int
    start: Position
    end: Position
    rows: int


class MemorySink(Load):
    """Applies batches to in-memory tables and records each load.

    `tables` is ``{schema.table: {key: row}}``, comparable with
    `reference_state`. With `holds_position=True` it also keeps the last
    batch's end position, like a database target, and reports it from
    `committed()`. A "load" marker of `faults` fires before anything is applied.
    In per_table mode `load_part` applies rows only; `mark_loaded` records the
    load and the position.
    """

    def __init__(self, faults: FaultPlan | None = None, *, holds_position: bool = False) -> None:
        self.faults = faults or FaultPlan()
        self.holds_position = holds_position
        self.tables: dict[str, dict] = {}
        self.loads: list[LoadRecord] = []
        self.position: Position | None = None
        self._lock = threading.Lock()
        self._loading = 0
        self.max_concurrent_loads = 0

    def load(self, batch: Batch) -> None:
        self._apply(batch, record=True)

    def load_part(self, batch: Batch) -> None:
        self._apply(batch, record=False)

    def mark_loaded(self, batch: Batch) -> None:
        with self._lock:
            self.loads.append(LoadRecord(batch.id, batch.epoch, batch.start, batch.end, len(batch)))
            if self.holds_position:
                self.position = batch.end

    def _apply(self, batch: Batch, *, record: bool) -> None:
        with self._lock:
            self._loading += 1
            self.max_concurrent_loads = max(self.max_concurrent_loads, self._loading)
        try:
            self.faults.check("load", batch.id)
            rows = [c for c in batch.changes if isinstance(c, RowChange)]
            with self._lock:
                for table in merge(rows):
                    state = self.tables.setdefault(f"{table.schema}.{table.table}", {})
                    for image in table.deletes:
                        state.pop(tuple(image[c] for c in table.primary_key), None)
                    for image in table.upserts:
                        state[tuple(image[c] for c in table.primary_key)] = dict(image)
                    for change in table.sequence:
                        if change.before is not None:
                            state.pop(change.old_key, None)
                        if change.after is not None:
                            state[change.key] = dict(change.after)
                if record:
                    self.loads.append(LoadRecord(batch.id, batch.epoch, batch.start, batch.end, len(batch)))
                    if self.holds_position:
                        self.position = batch.end
        finally:
            with self._lock:
                self._loading -= 1

    def committed(self) -> Position | None:
        return self.position if self.holds_position else None


# --- invariants -----------------------------------------------------------------------------


class InvariantListener(Listener):
    """Checks the scheduler's invariants as it runs; `violations` lists what broke.

    * at most `parallelism` batches hold permits at once (counted from events);
    * within an epoch Termin takes batch ids in strictly ascending order, and
      acked ids are consecutive;
    * an ack's position is the end of a load that started at the previous ack,
      so the position never passes a change that is not applied (needs `sink`).
    """

    def __init__(self, parallelism: int, sink: MemorySink | None = None, start: Position | None = None) -> None:
        self.parallelism = parallelism
        self.sink = sink
        self.violations: list[str] = []
        self.max_in_flight = 0
        self.acks: list[Ack] = []
        self.termins: list[tuple[int, int, bool]] = []
        self.rollbacks: list[tuple[int, int]] = []
        self._live: set[tuple[int, int]] = set()
        self._last_position = start
        self._lock = threading.Lock()

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        with self._lock:
            self._live.add((batch.id, batch.epoch))
            self.max_in_flight = max(self.max_in_flight, len(self._live))
            if len(self._live) > self.parallelism:
                self.violations.append(f"{len(self._live)} batches in flight > {self.parallelism}")

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        with self._lock:
            self._live.discard((batch.id, batch.epoch))

    def on_termin(self, batch: Batch, ok: bool) -> None:
        with self._lock:
            same_epoch = [t for t in self.termins if t[1] == batch.epoch]
            if same_epoch and same_epoch[-1][0] >= batch.id:
                self.violations.append(f"termin took batch {batch.id} after {same_epoch[-1][0]} in epoch {batch.epoch}")
            self.termins.append((batch.id, batch.epoch, ok))

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        with self._lock:
            if self.acks and ack.batch_id != self.acks[-1].batch_id + 1:
                self.violations.append(f"ack of batch {ack.batch_id} after {self.acks[-1].batch_id}")
            if self.sink is not None:
                loaded = [r for r in self.sink.loads if r.end == ack.position and r.epoch == batch.epoch]
                if not loaded:
                    self.violations.append(f"ack at {ack.position} but no load ended there")
                elif self._last_position is not None and loaded[-1].start != self._last_position:
                    self.violations.append(
                        f"ack at {ack.position}: its load started at {loaded[-1].start}, "
                        f"not at the previous ack {self._last_position}"
                    )
            self._last_position = ack.position
            self.acks.append(ack)

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        with self._lock:
            self.rollbacks.append((batch_id, attempt))


# --- running --------------------------------------------------------------------------------


@attrs.frozen
class RunResult:
    outcome: Outcome
    scheduler: Scheduler
    meta: MetaStore


def run_pipeline(
    source: Select,
    sink: Load,
    *,
    settings: PipelineSettings | None = None,
    extract: Extract | None = None,
    transform: Transform | None = None,
    meta: MetaStore | None = None,
    listener: Listener | None = None,
    name: str = "test",
    until_caught_up: bool = True,
) -> RunResult:
    """Run one pipeline in this process until the source is caught up (or it pauses)."""
    meta = meta if meta is not None else SqliteMetaStore(":memory:")
    scheduler = Scheduler(
        name,
        settings or PipelineSettings(),
        source,
        extract or Extract(),
        transform or Transform(),
        sink,
        meta,
        listener=listener,
    )
    outcome = scheduler.run(until_caught_up=until_caught_up)
    return RunResult(outcome, scheduler, meta)
