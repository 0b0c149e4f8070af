"""In-memory stages and fault markers for testing pipelines without a binlog or a target.

* `ScriptedSource` replays a scripted list of transactions with positions.
* `MemorySink` applies batches to dicts and records every load.
* `FaultPlan` fails, slows or crashes a stage at a given batch, once, n times or always.
* `InvariantListener` checks the scheduler's invariants while it runs.
* `run_pipeline` runs all of it until the source is caught up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from setl.config import PipelineSettings
from setl.failpoints import (
    Fault,
    FaultPlan,
    FaultyExtract,
    FaultyLoad,
    FaultyPartLoad,
    FaultyTransform,
    InjectedFault,
)
from setl.meta.base import MetaStore
from setl.meta.sqlite import SqliteMetaStore
from setl.model import (
    Ack,
    Batch,
    Change,
    DdlChange,
    Op,
    Position,
    RowChange,
    Transaction,
)
from setl.scheduler import Listener, Outcome, Scheduler
from setl.sinks.merge import merge
from setl.stages import Extract, Load, LoadCapabilities, Select, Transform

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


def read(table: str, row: Mapping[str, Any], *, key: Sequence[str] = ("id",), schema: str = "demo") -> RowChange:
    """A snapshot read of `row` in `schema.table` (`Op.READ`: "insert, or replace the row with the same key")."""
    return RowChange(Op.READ, schema, table, tuple(key), None, dict(row))


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
    in (``_setl_log``, ``_setl_offset``, ``_setl_row``, ``_setl_batch``, ``_setl_seq``) order
    (a ``truncate`` empties the table); the key is the columns that have a ``_setl_before_*``
    column, in name order.
    """
    import pyarrow.parquet as pq

    from setl.sinks.parquet import BEFORE_PREFIX

    data = pq.read_table(os.path.join(root, table), partitioning="hive").to_pylist()
    data.sort(key=lambda r: (r["_setl_log"], r["_setl_offset"], r.get("_setl_row") or 0, r["_setl_batch"],
                             r["_setl_seq"]))
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in data:
        if row["_setl_op"] == "truncate":
            state.clear()
            continue
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


def parquet_rows(root: str | os.PathLike[str], table: str) -> list[dict[str, Any]]:
    """Every row of a table without a primary key, duplicates included, from the Parquet target's
    change log under `root`, in the order `parquet_state` applies it: an insert or read adds its
    image, a delete removes one equal row, an update removes one row equal to its before-image
    (its ``_setl_before_*`` columns) and adds its image, a truncate removes every row."""
    import pyarrow.parquet as pq

    from setl.sinks.parquet import BEFORE_PREFIX

    data = pq.read_table(os.path.join(root, table), partitioning="hive").to_pylist()
    data.sort(key=lambda r: (r["_setl_log"], r["_setl_offset"], r.get("_setl_row") or 0, r["_setl_batch"],
                             r["_setl_seq"]))
    rows: list[dict[str, Any]] = []
    for row in data:
        if row["_setl_op"] == "truncate":
            rows.clear()
            continue
        image = {c: v for c, v in row.items() if not c.startswith("_setl_")}
        op = row["_setl_op"]
        gone = image if op == "delete" else None
        if op == "update":
            gone = {c[len(BEFORE_PREFIX):]: v for c, v in row.items() if c.startswith(BEFORE_PREFIX)}
        if gone is not None and gone in rows:
            rows.remove(gone)
        if op != "delete":
            rows.append(image)
    return rows


# --- faults: the product's failpoints (setl.failpoints), re-exported -------------------------


# --- source and sink ------------------------------------------------------------------------


class ScriptedSource(Select):
    """Replays scripted transactions; transaction i starts at ``Position(name, i)`` and ends at
    ``Position(name, i + 1)``.

    With `max_rows`, a transaction of more rows comes in pieces of at most `max_rows` changes,
    as the binlog source delivers big ones: every piece but the last has ``complete=False`` and
    ends at the checkpoint ``Position(name, i, row=rows handed on so far)``, and each change of
    such a transaction is stamped with ``Position(name, i, row=its 1-based ordinal)``. Opening
    or seeking at a checkpoint re-reads the transaction and skips its first `row` changes.

    More transactions can be appended while a pipeline runs (`append`), and the
    source can be told to fail at a transaction through a `FaultPlan`'s
    "select" markers, counted by transaction index (checked for each piece).
    """

    def __init__(
        self,
        transactions: Iterable[Transaction | Sequence[Change]] = (),
        *,
        name: str = "scripted",
        faults: FaultPlan | None = None,
        max_rows: int | None = None,
    ) -> None:
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        self.name = name
        self.faults = faults or FaultPlan()
        self.max_rows = max_rows
        self._txs: list[Transaction] = []
        self._cond = threading.Condition()
        self._index = 0
        self._row = 0
        self.opens = 0
        for tx in transactions:
            self.append(tx)

    def _split(self, count: int) -> bool:
        return self.max_rows is not None and count > self.max_rows

    def append(self, tx: Transaction | Sequence[Change]) -> Position:
        """Add a transaction at the end of the log; returns its end position."""
        with self._cond:
            index = len(self._txs)
            end = Position(self.name, index + 1)
            changes = tx.changes if isinstance(tx, Transaction) else tuple(tx)
            if self._split(len(changes)):
                stamped = tuple(attrs.evolve(c, position=Position(self.name, index, row=n))
                                for n, c in enumerate(changes, start=1))
            else:
                stamped = tuple(attrs.evolve(c, position=end) for c in changes)
            self._txs.append(Transaction(stamped, end))
            self._cond.notify_all()
            return end

    @property
    def transactions(self) -> list[Transaction]:
        """The whole transactions of the log (never pieces)."""
        with self._cond:
            return list(self._txs)

    def open(self, start: Position | None) -> None:
        self.opens += 1
        with self._cond:
            self._index = start.offset if start is not None else 0
            self._row = start.row if start is not None else 0
            if self._row and (self._index >= len(self._txs) or self._row >= len(self._txs[self._index].changes)):
                raise ValueError(f"{start} is not a checkpoint inside a transaction of {self.name}")

    def poll(self, timeout: float) -> Transaction | None:
        with self._cond:
            if self._index >= len(self._txs):
                self._cond.wait(timeout)
                if self._index >= len(self._txs):
                    return None
            index = self._index
            tx = self._txs[index]
            rest = tx.changes[self._row:]
            if self._split(len(tx.changes)) or self._row:
                piece = rest[:self.max_rows] if self.max_rows is not None else rest
                self._row += len(piece)
                if self._row < len(tx.changes):
                    tx = Transaction(piece, Position(self.name, index, row=self._row), complete=False)
                else:
                    tx = Transaction(piece, tx.end)
            if tx.complete:
                self._index, self._row = index + 1, 0
        self.faults.check("select", index)
        return tx

    def tell(self) -> Position:
        with self._cond:
            return Position(self.name, self._index, row=self._row)

    def head(self) -> Position:
        with self._cond:
            return Position(self.name, len(self._txs))


@attrs.frozen
class LoadRecord:
    """One load a test sink saw: which batch, at which epoch, from where to where, and its changes."""

    batch_id: int
    epoch: int
    start: Position
    end: Position
    rows: int


class MemorySink(Load):
    """Applies batches to in-memory tables and records each load.

    `tables` is ``{schema.table: {key: row}}``, comparable with
    `reference_state`; a table without a primary key is also kept as a list
    of rows in `keyless_rows`, as a database holds it (an insert replayed adds
    a second copy; a delete removes one equal row). With `holds_position=True` it also keeps the last
    batch's end position, like a database target, and reports it from
    `committed()`. A "load" marker of `faults` fires before anything is applied.
    In per_table mode `load_part` applies rows only; `mark_loaded` records the
    load and the position.
    """

    capabilities = LoadCapabilities(per_table=True)

    def __init__(self, faults: FaultPlan | None = None, *, holds_position: bool = False) -> None:
        self.faults = faults or FaultPlan()
        self.holds_position = holds_position
        self.tables: dict[str, dict] = {}
        self.keyless_rows: dict[str, list[dict]] = {}
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
                    bag = self.keyless_rows.setdefault(f"{table.schema}.{table.table}", []) if table.sequence else []
                    for change in table.sequence:
                        if change.before is not None:
                            state.pop(change.old_key, None)
                            if dict(change.before) in bag:
                                bag.remove(dict(change.before))
                        if change.after is not None:
                            state[change.key] = dict(change.after)
                            bag.append(dict(change.after))
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
                # An ack with no changes acks a position the target already holds (its batch's ack failed).
                loaded = [r for r in self.sink.loads
                          if r.end == ack.position and (r.epoch == batch.epoch or not batch.changes)]
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
    """What `run_pipeline` returns: how the scheduler ended, the scheduler and its meta store to inspect."""

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


__all__ = [
    "Fault", "FaultPlan", "FaultyExtract", "FaultyLoad", "FaultyPartLoad", "FaultyTransform", "InjectedFault",
    "InvariantListener", "LoadRecord", "MemorySink", "RunResult", "ScriptedSource", "delete", "insert",
    "parquet_rows", "parquet_state", "read", "reference_state", "run_pipeline", "update",
]
