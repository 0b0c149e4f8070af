"""What a snapshot has handed on and what of it is acked: the progress the meta store may hold.

Each transaction a copy hands on (a table's TRUNCATE, a chunk) carries a `Record`. A record is
committed (turned into the table's `TableProgress`, written in the ack's own meta-store write)
only when the batch holding its last change is acked, in the order the records were handed on; a
record without a change (an empty chunk) when every record before it is. Chunks of a table count
only in a run from the table's start (or its resumed key), whatever order their batches are acked
in, so a resume never skips a key range. With `ProgressLedger.copy_end` a copy is done only at the
"copied" record of its end marker (`DdlChange.end_of_copy`), not at its last chunk: a restart
before the marker is acked reads the last chunk again and hands the marker on again.
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
    #: a repair's (`setl.snapshot.repair`): the request it serves, its key columns and the before
    #: images (key columns only) of the requested keys the read did not find
    repair: str | None = None
    key: tuple[str, ...] = ()
    deletes: tuple[dict[str, Any], ...] = ()


@attrs.define(eq=False)
class Record:
    """Progress a handed-on transaction carries."""

    table: TableName
    #: "truncate", "chunk", "copied" (the copy's end marker), or "end" (a DDL ended or restarted the
    #: copy: `progress`)
    kind: str
    carrier: Any  # the change whose batch must be acked (None: commit once the records before are)
    chunk: Chunk | None = None
    empty: bool = False  # a TRUNCATE of a table found empty: its copy is done
    estimate: int = 0
    key: tuple[str, ...] | None = None  # a TRUNCATE's: the key columns its copy splits on
    batch: int | None = None  # the batch holding `carrier`, once handed on
    copy: int = 0  # a TRUNCATE's or a marker's: the serial of its copy (a chunk's is `chunk.copy`)
    progress: TableProgress | None = None  # an "end" record's: the progress it commits


@attrs.frozen
class Commit:
    """What the ack of `batch_id` commits (`ProgressLedger.prepare`): `progress`, the tables'
    progress to write with the ack, and the ledger's state once that write has succeeded (`apply`)."""

    batch_id: int
    progress: tuple[TableProgress, ...]
    records: int  # how many records at the front of the ledger it commits
    chunks: dict[TableName, dict[int, Chunk]] = attrs.field(eq=False)
    next: dict[TableName, int] = attrs.field(eq=False)
    generation: int = 0
    #: the tables whose copy it finishes (its last chunk, or a TRUNCATE of an empty table), each
    #: with the serial of that copy: a later copy of the same table is not the one finished
    finished: dict[TableName, int] = attrs.field(factory=dict, eq=False)


class ProgressLedger:
    """Records handed on, in order, and each table's committed progress; safe for the Select and
    Termin threads (its own lock).

    An ack commits in two steps, so that the progress is written in the ack's own meta-store
    write: `prepare` says what the ack of a batch commits without changing anything, and `apply`
    makes it the committed state once the write succeeded (a failed write changes nothing). A
    `reset` or `abandon` in between makes the prepared commit stale: `apply` then ignores it.
    """

    def __init__(self, *, copy_end: bool = False) -> None:
        """`copy_end`: each copy hands on an end marker, whose "copied" record finishes it."""
        self.copy_end = copy_end
        self._lock = threading.Lock()
        self._records: collections.deque[Record] = collections.deque()
        self._carriers: dict[int, list[Record]] = {}  # id(carrier) -> the records it carries
        self._committed: dict[TableName, TableProgress] = {}
        self._chunks: dict[TableName, dict[int, Chunk]] = {}  # acked, waiting for an earlier chunk
        self._next: dict[TableName, int] = {}  # the chunk index each table commits next
        self._generation = 0  # moved by reset and abandon: a commit prepared before is stale

    def reset(self, committed: dict[TableName, TableProgress]) -> None:
        """Forget every record not committed (a restart or a rewind); `committed` is the store's."""
        with self._lock:
            self._records.clear()
            self._carriers.clear()
            self._chunks.clear()
            self._next.clear()
            self._committed = dict(committed)
            self._generation += 1

    def remember(self, record: Record) -> None:
        with self._lock:
            self._records.append(record)
            if record.carrier is not None:
                self._carriers.setdefault(id(record.carrier), []).append(record)

    def handed_on(self, batch: Batch) -> None:
        """Select handed `batch` on (its changes as the source gave them)."""
        with self._lock:
            if not self._carriers:
                return
            # The carriers in `batch` (the ids of its changes gathered at C speed, not one lookup per
            # change): a record holds its carrier and the batch its changes, so while both live an id
            # common to them is one object.
            ids = set(map(id, batch.changes))
            for key in [key for key in self._carriers if key in ids]:
                for record in self._carriers.pop(key):
                    record.batch = batch.id

    def prepare(self, batch: Batch) -> Commit:
        """What the ack of `batch` (loaded, every earlier batch acked) commits: the records it and
        those before hold, in order; nothing changes until `apply`."""
        with self._lock:
            chunks: dict[TableName, dict[int, Chunk]] = {}
            nexts: dict[TableName, int] = {}
            changed: dict[TableName, TableProgress] = {}
            finished: dict[TableName, int] = {}
            count = 0
            for record in self._records:
                if record.carrier is not None and (record.batch is None or record.batch > batch.id):
                    break
                count += 1
                current = changed.get(record.table, self._committed.get(record.table))
                updated = self._apply(record, current, chunks, nexts)
                if updated is not None:
                    changed[record.table] = updated
                    if record.kind == "end" or updated.status is not CopyStatus.DONE:
                        finished.pop(record.table, None)
                    elif record.kind in ("truncate", "copied"):
                        finished[record.table] = record.copy
                    elif record.chunk is not None:
                        finished[record.table] = record.chunk.copy
            return Commit(batch.id, tuple(changed.values()), count, chunks, nexts, self._generation, finished)

    def apply(self, commit: Commit) -> list[TableProgress]:
        """`commit`'s progress is written with its ack: it is the committed state now. Returns the
        progress applied (none when a reset or an abandon since made `commit` stale)."""
        with self._lock:
            if commit.generation != self._generation:
                return []
            for _ in range(commit.records):
                self._records.popleft()
            self._chunks.update(commit.chunks)
            self._next.update(commit.next)
            for progress in commit.progress:
                self._committed[progress.name] = progress
            return list(commit.progress)

    def _apply(self, record: Record, current: TableProgress | None, chunks: dict[TableName, dict[int, Chunk]],
               nexts: dict[TableName, int]) -> TableProgress | None:
        """`current` (a table's progress) with `record` committed, or None when it does not move;
        the table's waiting chunks and next index go to `chunks` and `nexts` (copies)."""
        now = time.time()
        if record.kind == "end":
            assert record.progress is not None
            chunks[record.table] = {}
            nexts[record.table] = 0
            return attrs.evolve(record.progress, updated=now)
        if current is None:
            return None
        if record.kind == "copied":
            return attrs.evolve(current, status=CopyStatus.DONE, updated=now)
        if record.kind == "truncate":
            chunks[record.table] = {}
            nexts[record.table] = 0
            status = CopyStatus.DONE if record.empty and not self.copy_end else CopyStatus.COPYING
            return attrs.evolve(current, status=status, last_key=None, rows=0, chunks=0,
                                estimate=record.estimate or current.estimate, updated=now, key=record.key)
        assert record.chunk is not None
        if record.table not in chunks:
            chunks[record.table] = dict(self._chunks.get(record.table, {}))
        waiting = chunks[record.table]
        waiting[record.chunk.index] = record.chunk
        updated = current
        index = nexts.get(record.table, self._next.get(record.table, 0))
        while index in waiting:
            done = waiting.pop(index)
            index += 1
            last = done.final and not self.copy_end  # else the marker's "copied" record finishes it
            updated = attrs.evolve(updated, status=CopyStatus.DONE if last else CopyStatus.COPYING,
                                   last_key=done.upper if done.upper is not None else updated.last_key,
                                   rows=updated.rows + len(done.rows), chunks=updated.chunks + 1, updated=now)
        nexts[record.table] = index
        return None if updated is current else updated

    def abandon(self, progress: TableProgress, carrier: Any = None) -> None:
        """The table's copy ends or starts again (`progress`: DONE, or PENDING): its records not
        committed yet never will be, whenever their batches are acked. `progress` is the table's
        at once here; with a `carrier` (the DDL that ended it) it is also committed, as an "end"
        record, with the ack of the batch holding that change, so that the meta store holds it
        only once the target holds the DDL (without one, the caller writes it)."""
        with self._lock:
            self._records = collections.deque(r for r in self._records if r.table != progress.name)
            for key, records in list(self._carriers.items()):
                kept = [r for r in records if r.table != progress.name]
                if kept:
                    self._carriers[key] = kept
                else:
                    del self._carriers[key]
            self._chunks.pop(progress.name, None)
            self._next.pop(progress.name, None)
            self._committed[progress.name] = progress
            self._generation += 1
            if carrier is not None:
                record = Record(progress.name, "end", carrier, progress=progress)
                self._records.append(record)
                self._carriers.setdefault(id(carrier), []).append(record)

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
