"""What a snapshot has handed on and what of it is acked: the progress the meta store may hold.

Each transaction a copy hands on (a table's TRUNCATE, a chunk) carries a `Record`. A record is
committed (turned into the table's `TableProgress`) only when the batch holding its last change is
acked, in the order the records were handed on; a record without a change (an empty chunk) when
every record before it is. Chunks of a table count only in a run from the table's start (or its
resumed key), whatever order their batches are acked in, so a resume never skips a key range.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import attrs

from setl.model import Batch, Position, TableName
from setl.tablecopy import CopyStatus, TableProgress


@attrs.frozen
class Chunk:
    """Rows read in one consistent snapshot at binlog position `position`.

    Keyed tables: chunk `index` of the table's copy, the rows with key in (`lower`, `upper`]
    (`upper` None: to the end, `final`). Keyless tables: piece `index` of the one read of the whole
    table (`final` on the last).
    """

    table: TableName
    generation: int
    index: int
    rows: tuple[dict[str, Any], ...]
    position: Position
    lower: tuple[Any, ...] | None
    upper: tuple[Any, ...] | None
    final: bool
    copy: int = 0  # which copy of the table (a copy started again after a DDL gets a new number)


@attrs.define(eq=False)
class Record:
    """Progress a handed-on transaction carries."""

    table: TableName
    kind: str  # "truncate" or "chunk"
    carrier: Any  # the change whose batch must be acked (None: commit once the records before are)
    chunk: Chunk | None = None
    empty: bool = False  # a TRUNCATE of a table found empty: its copy is done
    estimate: int = 0
    key: tuple[str, ...] | None = None  # a TRUNCATE's: the key columns its copy splits on
    batch: int | None = None  # the batch holding `carrier`, once handed on


class ProgressLedger:
    """Records handed on, in order, and each table's committed progress; safe for the Select and
    Termin threads (its own lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: collections.deque[Record] = collections.deque()
        self._carriers: dict[int, Record] = {}
        self._committed: dict[TableName, TableProgress] = {}
        self._chunks: dict[TableName, dict[int, Chunk]] = {}  # acked, waiting for an earlier chunk
        self._next: dict[TableName, int] = {}  # the chunk index each table commits next
        self._termin_ok = 0  # the last batch id Termin took as loaded

    def reset(self, committed: dict[TableName, TableProgress]) -> None:
        """Forget every record not committed (a restart or a rewind); `committed` is the store's."""
        with self._lock:
            self._records.clear()
            self._carriers.clear()
            self._chunks.clear()
            self._next.clear()
            self._committed = dict(committed)

    def remember(self, record: Record) -> None:
        with self._lock:
            self._records.append(record)
            if record.carrier is not None:
                self._carriers[id(record.carrier)] = record

    def handed_on(self, batch: Batch) -> None:
        """Select handed `batch` on (its changes as the source gave them)."""
        with self._lock:
            if not self._carriers:
                return
            for change in batch.changes:
                record = self._carriers.pop(id(change), None)
                if record is not None and record.carrier is change:
                    record.batch = batch.id

    def terminated(self, batch: Batch, ok: bool) -> None:
        """Termin took `batch` as loaded (`ok`) or failed; only loaded batches' records commit."""
        if ok:
            with self._lock:
                self._termin_ok = max(self._termin_ok, batch.id)

    def commit(self, batch: Batch) -> list[TableProgress]:
        """`batch` is acked: the progress of the tables whose records it (and those before) commits."""
        changed: dict[TableName, TableProgress] = {}
        with self._lock:
            limit = min(batch.id, self._termin_ok)
            while self._records:
                record = self._records[0]
                if record.carrier is not None and (record.batch is None or record.batch > limit):
                    break
                self._records.popleft()
                updated = self._apply(record)
                if updated is not None:
                    self._committed[record.table] = changed[record.table] = updated
        return list(changed.values())

    def _apply(self, record: Record) -> TableProgress | None:
        current = self._committed.get(record.table)
        if current is None:
            return None
        now = time.time()
        if record.kind == "truncate":
            self._chunks.pop(record.table, None)
            self._next[record.table] = 0
            status = CopyStatus.DONE if record.empty else CopyStatus.COPYING
            return attrs.evolve(current, status=status, last_key=None, rows=0, chunks=0,
                                estimate=record.estimate or current.estimate, updated=now, key=record.key)
        assert record.chunk is not None
        waiting = self._chunks.setdefault(record.table, {})
        waiting[record.chunk.index] = record.chunk
        updated = current
        index = self._next.get(record.table, 0)
        while index in waiting:
            done = waiting.pop(index)
            index += 1
            updated = attrs.evolve(updated, status=CopyStatus.DONE if done.final else CopyStatus.COPYING,
                                   last_key=done.upper if done.upper is not None else updated.last_key,
                                   rows=updated.rows + len(done.rows), chunks=updated.chunks + 1, updated=now)
        self._next[record.table] = index
        return None if updated is current else updated

    def abandon(self, progress: TableProgress) -> None:
        """The table's copy starts again (`progress`, PENDING): its records not committed yet never
        will be, whenever their batches are acked."""
        with self._lock:
            self._records = collections.deque(r for r in self._records if r.table != progress.name)
            for key, record in list(self._carriers.items()):
                if record.table == progress.name:
                    del self._carriers[key]
            self._chunks.pop(progress.name, None)
            self._next.pop(progress.name, None)
            self._committed[progress.name] = progress

    def set(self, progress: list[TableProgress]) -> None:
        """Progress written to the store some other way (a table begun, or gone)."""
        with self._lock:
            for p in progress:
                self._committed[p.name] = p

    def get(self, table: TableName) -> TableProgress | None:
        with self._lock:
            return self._committed.get(table)

    def tables(self) -> list[TableProgress]:
        with self._lock:
            return list(self._committed.values())

    @property
    def pending(self) -> bool:
        """Records handed on and not committed."""
        with self._lock:
            return bool(self._records)

    def unfinished(self) -> bool:
        with self._lock:
            return any(p.status is not CopyStatus.DONE for p in self._committed.values())
