"""The merge hand-off (`MergeHandOff`): the table copies' TRUNCATEs, chunks and repairs placed in
the binlog stream in position order, as the poll thread hands them on."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import attrs

from setl.model import DdlChange, Position, RowChange, TableName, Transaction
from setl.reads import new_reads
from setl.snapshot.copies import Copy, CopyBook
from setl.snapshot.ledger import Chunk, ProgressLedger, Record
from setl.snapshot.reader import ChunkReader
from setl.snapshot.requests import CopyRequests
from setl.snapshot.restarts import CopyRestarts
from setl.stages.select import Select
from setl.tablecopy import CopyStatus, TableProgress

log = logging.getLogger("setl.snapshot")


class MergeHandOff:
    """`poll` for `SnapshotSelect`, on the poll thread: with no copy, read or repair under way it is
    the inner source's poll; otherwise it hands on each waiting table's TRUNCATE at the current
    position (opening its copy for the readers), offers the inner source's transactions to the
    book's merge and returns whichever comes next by position (`StreamMerge.next`): a binlog
    transaction (after `CopyRestarts` has seen it, and without the changes of keyless tables being
    copied), a chunk as READ row changes (remembered in the ledger) or a repair.

    With `copy_end`, a copy's end marker (`DdlChange.end_of_copy`) follows, as a transaction of its
    own, once every chunk of the copy is handed on (or right after the TRUNCATE of a table found
    empty); its "copied" record finishes the copy in the ledger.

    It blocks at most `timeout` seconds, waiting on the book's lock while a read in flight or a
    chunk not yet placed holds the stream back, and raises a reader's failure. Transactions it
    makes end at the position of the last binlog transaction handed on before them."""

    def __init__(self, book: CopyBook, ledger: ProgressLedger, restarts: CopyRestarts, requests: CopyRequests, *,
                 inner: Select, reader: ChunkReader, connection: Callable[[], Any], pipeline: str,
                 copy_end: bool = False) -> None:
        self.book = book
        self.copy_end = copy_end
        self.ledger = ledger
        self.restarts = restarts
        self.requests = requests
        self.inner = inner
        self.reader = reader
        self.connection = connection
        self.pipeline = pipeline

    def poll(self, timeout: float) -> Transaction | None:
        """The next transaction in position order, or None after `timeout` seconds."""
        with self.book.lock:
            idle = self.book.idle
            failure = self.book.failure
        if failure is not None:
            raise failure
        if idle:
            tx = self.inner.poll(timeout)
            if tx is not None:
                with self.book.lock:
                    self.book.merge.frontier = tx.end
                    self.book.passed(tx)
            return tx
        if self.book.waiting:
            self._start_waiting()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with self.book.lock:
                queued = self.book.next_out()
                if queued is not None:
                    return queued
                wanted = self.book.merge.lookahead is None
            if wanted:
                tx = self.inner.poll(0)
                with self.book.lock:
                    self.book.merge.offer(tx)
            with self.book.lock:
                if self.book.failure is not None:
                    raise self.book.failure
                found = self._next()
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if self.book.merge.lookahead is not None:
                    # held by a read in flight or a chunk not yet placed: wait for a reader
                    self.book.lock.wait(min(remaining, 0.02))
                    continue
            tx = self.inner.poll(min(remaining, 0.02))
            with self.book.lock:
                self.book.merge.offer(tx)

    def _next(self) -> Transaction | None:
        """Under the lock: the next transaction in position order, if it can be told yet."""
        found = self.book.merge.next()
        if found is None:
            return None
        if isinstance(found, tuple) and found[1].repair is not None:
            return self.requests.hand_repair(found[1])
        if isinstance(found, tuple):
            self.book.taken(found[1])  # room for another chunk
            return self._hand_chunk(found[1])
        for change in found.changes:
            if isinstance(change, DdlChange) and not change.snapshot and change.table is not None and (
                    self.book.copies or self.book.gone):
                self.restarts.altered(change)
        if self.book.windows:
            self.restarts.check_windows(found)
        self.book.passed(found)
        if self.book.gone:
            self.restarts.lost_without_ddl(found.end)
        if self.book.keyless_open and found.changes:
            kept = tuple(c for c in found.changes if not (
                isinstance(c, RowChange) and TableName(c.schema, c.table) in self.book.keyless_open))
            if len(kept) != len(found.changes):
                found = attrs.evolve(found, changes=kept)
        return found

    def _hand_chunk(self, chunk: Chunk) -> Transaction:
        """Under the lock: a chunk's transaction of READ row changes, its record remembered in the
        ledger (empty, and not remembered, for a chunk of a copy a DDL started again)."""
        if chunk.copy in self.book.abandoned:
            return Transaction((), self.book.merge.frontier or chunk.position)  # a copy a DDL started again
        copy = self.book.copies.get(chunk.table)
        key = copy.plan.key if copy is not None else ()
        # made with their source table, so that a route that changes nothing hands them on as they are
        changes = tuple(new_reads(chunk.table.schema, chunk.table.table, key, chunk.rows, chunk.position, chunk.table))
        if chunk.final and not key:
            self.book.keyless_read(chunk.table)
        self.ledger.remember(Record(chunk.table, "chunk", changes[-1] if changes else None, chunk=chunk))
        frontier = self.book.merge.frontier
        at = frontier if frontier is not None else chunk.position
        # Chunks of a table may be placed out of index order: it is all handed on (and its marker
        # follows) once its last chunk and every chunk claimed before it are.
        if copy is not None and chunk.copy == copy.serial and copy.handed(keyed=bool(key), final=chunk.final):
            self._mark_end(copy, at)
        return Transaction(changes, at)

    def _mark_end(self, copy: Copy, at: Position) -> None:
        """Under the lock: `copy` is all handed on: queue its end marker, as a transaction of its own
        after the one being handed on (with `copy_end`; once per copy)."""
        if not self.copy_end or not copy.mark():
            return
        marker = DdlChange.end_of_copy(copy.plan.name, at)
        self.ledger.remember(Record(copy.plan.name, "copied", marker, copy=copy.serial))
        self.book.then(Transaction((marker,), at))

    def _start_waiting(self) -> None:
        """Hand on the TRUNCATE of each waiting table at the current position, and open its copy."""
        with self.book.lock:
            if self.book.merge.frontier is None:
                return  # after a GTID start: wait for the first position
            waiting = self.book.take_waiting()
            generation = self.book.generation
        if not waiting:
            return
        frontier = self.book.merge.frontier
        conn = self.connection()
        try:
            for name in waiting:
                plan = self.reader.plan(conn, name)
                stored = self.ledger.get(name) or TableProgress(name.schema, name.table)
                if plan is None:
                    # Removed after the stream's position: its copy ends when the DDL that removed
                    # it passes (a RENAME then copies the new name), or once the stream reaches
                    # today's head without one.
                    head = self.inner.head()
                    with self.book.lock:
                        if generation == self.book.generation:
                            self.book.gone_since(name, head)
                            if self.book.handed is not None:
                                self.restarts.lost_without_ddl(self.book.handed)  # already past today's head
                    log.info("pipeline=%s stage=select table=%s no longer exists: not copied; waiting for the DDL "
                             "that removed it to pass (by %s)", self.pipeline, name, head)
                    continue
                resume = stored.status is CopyStatus.COPYING and not plan.keyless
                if resume and stored.key is not None and stored.key != plan.key:
                    log.warning("pipeline=%s stage=select table=%s its primary key is (%s) now, not (%s) as when "
                                "its copy began: copying it again from its start", self.pipeline, name,
                                ", ".join(plan.key), ", ".join(stored.key))
                    resume = False
                if resume:
                    copy = self.book.new_copy(plan, after=stored.last_key)
                    with self.book.lock:
                        if generation == self.book.generation:
                            self.book.open(copy)
                    continue
                # Empty now: nothing to copy, and any later row arrives through the binlog.
                empty = not self.reader.has_rows(conn, plan)
                statement = f"TRUNCATE TABLE {plan.quoted}"
                change = DdlChange(name.schema, name.table, statement, position=frontier, snapshot=True)
                with self.book.lock:
                    if generation != self.book.generation:
                        return
                    copy = self.book.new_copy(plan, empty=empty)
                    self.book.open(copy, keyless_open=plan.keyless and not empty)
                    self.ledger.remember(Record(name, "truncate", change, empty=empty, estimate=plan.estimate,
                                                key=plan.key, copy=copy.serial))
                    self.book.then(Transaction((change,), frontier or Position("", 0)))
                    if empty:
                        self._mark_end(copy, frontier or Position("", 0))
        finally:
            conn.close()
