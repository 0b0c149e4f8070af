"""`SnapshotSelect`: the binlog source with table copies merged into its stream in position order.

How a table is copied (docs/snapshot.md):

1. A ``TRUNCATE TABLE`` of it (a `DdlChange` with ``snapshot=True``) is handed on at the current
   stream position, so the copy replaces what the target held.
2. Its rows are read in chunks split on the primary key (boundaries found by the server), each in
   its own consistent-snapshot transaction whose binlog position Pc the server tells. A chunk is a
   transaction of READ row changes handed on after every binlog transaction ending at or before Pc
   and before any ending after it. The target merges changes by key, so a change before Pc is
   replaced by the chunk's row and one after Pc applies on top of it: every key ends right.
3. A table without a primary key is one chunk (streamed in pieces from one consistent snapshot, so
   one transaction stays open while it is read), and its binlog changes are dropped until the
   copy has been handed on (they are in it).

A repair (`setl repair`, `setl.snapshot.repair`) is a request in the meta store for some keys of a
table: the poll thread reads them in one consistent snapshot and places the result like a chunk
(found keys as READs, the others as key-only DELETEs); the request is dropped once the batch
holding it is acked, so a restart before that serves it again.

Chunks are read by `readers` threads, at most `max_chunks` read and not yet handed on. Progress
reaches the meta store only with the ack of the batch holding a chunk, in that ack's own atomic
write (`Select.acknowledge`), so a restart resumes after the last acked chunk; a chunk replayed
after a crash is harmless (READ replaces the row).
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import attrs
import pymysql

from setl import ddl, failpoints
from setl.errors import ConfigError, SourceError
from setl.meta.base import MetaStore, RepairRequest
from setl.model import Batch, DdlChange, Op, Position, RowChange, TableName, Transaction
from setl.snapshot.copies import Copy, CopyBook
from setl.snapshot.display import ProgressReporter
from setl.snapshot.ledger import Chunk, ProgressLedger, Record
from setl.snapshot.reader import ChunkReader
from setl.snapshot.reads import CopyReads
from setl.snapshot.repair import RepairRefused, absent, query_value, typed_keys
from setl.stages.layers import find_layer
from setl.stages.select import A, Select, SelectWrapper
from setl.stages.snapshot import SnapshotCapable
from setl.tablecopy import CopyStatus, SnapshotSettings, TableProgress

log = logging.getLogger("setl.snapshot")

#: How often the running source looks for `setl snapshot` requests in the meta store (seconds).
REQUEST_POLL = 1.0
#: How often in a row a keyless non-transactional table is copied again after a write while its
#: read began, before the pipeline stops with an error.
MAX_REREADS = 5


class SnapshotSelect(SelectWrapper):
    """Wraps a MySQL binlog source; see the module docstring.

    Contract additions to `Select`: chunk transactions end at the position of the last binlog
    transaction handed on before them (resuming there re-reads nothing they depend on), and their
    row changes carry the chunk's snapshot position. `backlog()` is true while a copy is not
    acked to the end, so ``--until-caught-up`` waits for it.
    """

    def __init__(self, inner: Select, *, pipeline: str, meta: Callable[[], MetaStore], connect: Callable[[], Any],
                 where: str, start_mode: bool, selects: Callable[[str, str], bool] | None,
                 settings: SnapshotSettings, parallelism: int = 2, batch_rows: int = 10_000,
                 reporter: Callable[[list[TableProgress], bool], None] | None = None,
                 spark_reads: Any = None) -> None:
        super().__init__(inner)
        self.pipeline = pipeline
        self._meta_factory = meta
        self._meta: MetaStore | None = None
        self.connect = connect
        self.where = where
        self.start_mode = start_mode
        self.selects = selects
        self.settings = settings
        self.chunk_rows = max(1, settings.chunk_rows or batch_rows)
        self.readers = settings.readers or max(1, parallelism)
        self.max_chunks = settings.max_chunks or 2 * self.readers
        self.reporter = reporter
        #: called with each table whose copy was just acked to its end (the node sends the
        #: ``snapshot_done`` alert); an exception there is logged, never undoes the ack
        self.on_done: Callable[[TableProgress], None] | None = None
        self.spark_reads = spark_reads  # a setl.snapshot.spark_engine.SparkReads: chunks read as Spark tasks
        self.reader = ChunkReader(self._connection, pipeline)
        #: the copies' state, shared with the collaborators below under its one lock
        self.book = CopyBook()
        #: the reader threads, which copy they read next and their room (the copy scheduler)
        self.reads = CopyReads(self.book, reader=self.reader, connection=self._connection, inner=inner,
                               pipeline=pipeline, where=where, readers=self.readers, chunk_rows=self.chunk_rows,
                               max_chunks=self.max_chunks, spark_reads=spark_reads)
        self._rereads: collections.Counter[TableName] = collections.Counter()
        self._progress_lock = threading.Lock()  # progress committed and stored, or a copy abandoned
        self.ledger = ProgressLedger()
        self._next_request = 0.0
        self._checked = False
        self._began: float | None = None
        #: repairs read and not acked: request id -> [the change that carries it, its batch id once handed on]
        self._repairs: dict[str, list[Any]] = {}
        self._repaired: set[str] = set()  # requests acked and dropped (a list read before may still hold them)
        self._repairs_deferred = False  # requests seen before the stream had a position (a GTID start)

    @property
    def meta(self) -> MetaStore:
        if self._meta is None:
            self._meta = self._meta_factory()
        return self._meta

    # --- connections --------------------------------------------------------------------------

    def _connection(self) -> pymysql.connections.Connection:
        conn = self.connect()
        ChunkReader.prepare(conn)
        return conn

    # --- Select -------------------------------------------------------------------------------

    def open(self, start: Position | None) -> None:
        self.reads.shutdown()
        self.inner.open(start)
        fresh = start is None and self.start_mode
        self._restart(self.inner.tell(), fresh=fresh)

    def seek(self, position: Position | None) -> None:
        self.reads.shutdown()
        self.inner.seek(position)
        self._restart(self.inner.tell() or position, fresh=False)

    def close(self) -> None:
        self.reads.shutdown()
        self.inner.close()

    def backlog(self) -> bool:
        with self.book.lock:
            # a repair holds `--until-caught-up` until acked
            waiting = bool(self.book.waiting or self._repairs or self._repairs_deferred)
        return waiting or self.ledger.unfinished()

    def _restart(self, frontier: Position | None, *, fresh: bool) -> None:
        """Forget everything not acked; take the copies up again from the meta store's progress."""
        stored = {p.name: p for p in self.meta.snapshot_progress(self.pipeline)}
        with self.book.lock:
            self.book.reset(frontier)
            self._repairs.clear()  # not acked: served again from the meta store's requests
        self.ledger.reset(stored)
        self.reads.stop = threading.Event()
        if fresh:
            tables = self._selected_tables()
            log.info("pipeline=%s stage=select snapshot of %d table(s) starting at %s", self.pipeline,
                     len(tables), frontier)
            self._begin_tables(tables, replace=True)
        else:
            self._resume(stored.values())
        self._next_request = 0.0
        # A copy requested while the pipeline was stopped starts now: `backlog()` then holds a
        # `--until-caught-up` start until it is done, instead of it ending "caught up" at once.
        self._take_requests()
        if self.book.copies or self.book.waiting:
            self.reads.start()

    def _selected_tables(self) -> list[TableName]:
        conn = self._connection()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE IN "
                            "('BASE TABLE', 'SYSTEM VERSIONED') AND TABLE_SCHEMA NOT IN ('mysql', "
                            "'information_schema', 'performance_schema', 'sys') ORDER BY TABLE_SCHEMA, TABLE_NAME")
                found = [TableName(str(s), str(t)) for s, t in cur.fetchall()]
        finally:
            conn.close()
        return [t for t in found if self.selects is None or self.selects(t.schema, t.table)]

    def _begin_tables(self, tables: Iterable[TableName], *, replace: bool) -> None:
        """Record `tables` as PENDING (their copy starts with a TRUNCATE) and queue them."""
        tables = list(tables)
        if not tables:
            return
        self._check_server()
        now = time.time()
        pending = [TableProgress(t.schema, t.table, CopyStatus.PENDING, started=now, updated=now) for t in tables]
        self.meta.save_snapshot_progress(self.pipeline, pending)
        if replace:
            self.ledger.reset({})
        self.ledger.set(pending)
        with self.book.lock:
            self.book.waiting.extend(p.name for p in pending)
        if self._began is None:
            self._began = time.monotonic()

    def _resume(self, stored: Iterable[TableProgress]) -> None:
        unfinished = [p for p in stored if p.status is not CopyStatus.DONE]
        if not unfinished:
            return
        self._check_server()
        for progress in unfinished:
            if progress.status is CopyStatus.COPYING and progress.last_key is not None:
                log.info("pipeline=%s stage=select table=%s snapshot resumes after chunk %d (last key %s, "
                         "%d rows copied)", self.pipeline, progress.name, progress.chunks,
                         list(progress.last_key), progress.rows)
            else:
                log.info("pipeline=%s stage=select table=%s snapshot resumes from its start", self.pipeline,
                         progress.name)
            with self.book.lock:
                self.book.waiting.append(progress.name)
        if self._began is None:
            self._began = time.monotonic()

    def _check_server(self) -> None:
        if self._checked:
            return
        conn = self._connection()
        try:
            self.reader.check(conn, self.where)
        finally:
            conn.close()
        self._checked = True

    # --- starting tables (poll thread) ---------------------------------------------------------

    def _start_waiting(self) -> None:
        """Hand on the TRUNCATE of each waiting table at the current position, and open its copy."""
        with self.book.lock:
            if self.book.merge.frontier is None:
                return  # after a GTID start: wait for the first position
            waiting, self.book.waiting = self.book.waiting, []
            generation = self.book.generation
        if not waiting:
            return
        frontier = self.book.merge.frontier
        conn = self._connection()
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
                            self.book.gone[name] = head
                            if self.book.handed is not None:
                                self._lost_without_ddl(self.book.handed)  # already past today's head
                    log.info("pipeline=%s stage=select table=%s no longer exists: not copied; waiting for the DDL "
                             "that removed it to pass (by %s)", self.pipeline, name, head)
                    continue
                resume = stored.status is CopyStatus.COPYING and not plan.keyless
                if resume and stored.key is not None and stored.key != plan.key:
                    log.warning("pipeline=%s stage=select table=%s its primary key is (%s) now, not (%s) as when "
                                "its copy began: copying it again from its start", self.pipeline, name,
                                ", ".join(plan.key), ", ".join(stored.key))
                    resume = False
                copy = Copy(plan, attrs.evolve(stored, estimate=plan.estimate), serial=next(self.book.serials))
                if resume:
                    copy.truncated, copy.lower = True, stored.last_key
                    with self.book.lock:
                        if generation == self.book.generation:
                            self.book.copies[name] = copy
                            self.book.lock.notify_all()
                    continue
                # Empty now: nothing to copy, and any later row arrives through the binlog.
                empty = not self.reader.has_rows(conn, plan)
                statement = f"TRUNCATE TABLE {plan.quoted}"
                change = DdlChange(name.schema, name.table, statement, position=frontier, snapshot=True)
                with self.book.lock:
                    if generation != self.book.generation:
                        return
                    copy.truncated = True
                    copy.exhausted = empty
                    self.book.copies[name] = copy
                    if plan.keyless and not empty:
                        self.book.keyless_open.add(name)
                    self.ledger.remember(Record(name, "truncate", change, empty=empty, estimate=plan.estimate,
                                                key=plan.key, copy=copy.serial))
                    self.book.out.append(Transaction((change,), frontier or Position("", 0)))
                    self.book.lock.notify_all()
        finally:
            conn.close()

    def _take_requests(self) -> None:
        now = time.monotonic()
        if now < self._next_request:
            return
        self._next_request = now + REQUEST_POLL
        requests = self.meta.snapshot_requests(self.pipeline)
        taken = []
        for table in requests:
            with self.book.lock:
                busy = table in self.book.copies or table in self.book.waiting
            if busy:
                continue  # copied again once the current copy ends
            if self.selects is not None and not self.selects(table.schema, table.table):
                log.warning("pipeline=%s stage=select table=%s snapshot requested but no table rule selects it; "
                            "request dropped", self.pipeline, table)
                self.meta.drop_snapshot_request(self.pipeline, table)
                continue
            taken.append(table)
        if taken:
            self._begin_tables(taken, replace=False)
            for table in taken:
                self.meta.drop_snapshot_request(self.pipeline, table)
            log.info("pipeline=%s stage=select snapshot requested for %s: copying at %s", self.pipeline,
                     ", ".join(map(str, taken)), self.book.merge.frontier)
            self.reads.start()
        self._take_repairs()

    # --- repairs (poll thread) -----------------------------------------------------------------

    def _take_repairs(self) -> None:
        """Serve the meta store's repair requests not in flight (`setl.snapshot.repair`)."""
        requests = self.meta.repair_requests(self.pipeline)
        with self.book.lock:
            self._repairs_deferred = bool(requests) and self.book.merge.frontier is None
            if self._repairs_deferred:
                return  # after a GTID start: wait for the first position
        for request in requests:
            with self.book.lock:
                if request.id in self._repairs or request.id in self._repaired:
                    continue
                if request.table in self.book.copies or request.table in self.book.waiting:
                    self._repairs_deferred = True  # a table being copied is repaired once its copy ends
                    continue
            if self.selects is not None and not self.selects(request.table.schema, request.table.table):
                log.warning("pipeline=%s stage=select table=%s repair requested but no table rule selects it; "
                            "request dropped", self.pipeline, request.table)
                self.meta.drop_repair_request(self.pipeline, request.id)
                continue
            self._serve_repair(request)

    def _serve_repair(self, request: RepairRequest) -> None:
        """Read the request's keys in one consistent snapshot and put the result in the merge at
        its position; a table without that key (keyless now, or another key), or a key type that
        cannot be looked up, is copied whole instead."""
        conn = self._connection()
        name = request.table
        try:
            plan = self.reader.plan(conn, name)
            if plan is None:
                log.warning("pipeline=%s stage=select table=%s repair requested but the table no longer exists; "
                            "request dropped", self.pipeline, name)
                self.meta.drop_repair_request(self.pipeline, request.id)
                return
            try:
                if plan.keyless or tuple(request.columns) != plan.key:
                    raise RepairRefused(f"its key is ({', '.join(plan.key)}), the request names "
                                        f"({', '.join(request.columns)})")
                keys = typed_keys(plan.types, plan.key, request.keys)
            except RepairRefused as exc:
                log.warning("pipeline=%s stage=select table=%s repair %s cannot be served by key (%s): copying the "
                            "whole table", self.pipeline, name, request.id, exc)
                self._begin_tables([name], replace=False)
                self.meta.drop_repair_request(self.pipeline, request.id)
                self.reads.start()
                return
            with self.book.lock:
                generation = self.book.generation
                rid = self.book.register(generation)
            try:
                rows, position = self.reader.read_keys(conn, plan, [[query_value(v) for v in key] for key in keys],
                                                       lambda at: self.book.started(generation, rid, at))
            except BaseException:
                with self.book.lock:
                    self.book.ended(generation, rid)
                raise
            found = [tuple(row[c] for c in plan.key) for row in rows]
            deletes = tuple(dict(zip(plan.key, key)) for key in absent(keys, found))
            chunk = Chunk(name, generation, 0, tuple(rows), position, None, None, True, repair=request.id,
                          key=plan.key, deletes=deletes)
            with self.book.lock:
                if generation == self.book.generation:
                    self.book.merge.add(position, chunk)
                    self._repairs[request.id] = [None, None]
                self.book.ended(generation, rid)
        except pymysql.MySQLError as exc:
            raise SourceError(f"repair read of {self.where} failed: {exc}", pipeline=self.pipeline, stage="select",
                              table=str(name), position=self.book.merge.frontier) from exc
        finally:
            conn.close()

    def _hand_repair(self, chunk: Chunk) -> Transaction:
        """Under the lock: a repair's transaction: the deletes of the keys not found, the rows read."""
        schema, table, key, position = chunk.table.schema, chunk.table.table, chunk.key, chunk.position
        changes = tuple([RowChange(Op.DELETE, schema, table, key, image, None, position) for image in chunk.deletes]
                        + [RowChange(Op.READ, schema, table, key, None, row, position) for row in chunk.rows])
        assert chunk.repair is not None
        if chunk.repair in self._repairs:
            # with no change (no key asked), any later ack may drop it
            self._repairs[chunk.repair][:] = [changes[-1], None] if changes else [None, -1]
        log.info("pipeline=%s stage=select table=%s position=%s repair %s: %d row(s) copied again, %d deleted",
                 self.pipeline, chunk.table, position, chunk.repair, len(chunk.rows), len(chunk.deletes))
        frontier = self.book.merge.frontier
        return Transaction(changes, frontier if frontier is not None else position)

    def _acked_repairs(self, batch: Batch) -> None:
        """Drop the requests whose repairs `batch` (acked) or an earlier batch holds. A crash before
        a drop serves the request again after the restart: a repeat of an idempotent repair."""
        with self.book.lock:
            done = [(rid, carrier) for rid, (carrier, held) in self._repairs.items()
                    if held is not None and held <= batch.id]
        for rid, carrier in done:
            failpoints.hit("repair_acked", batch.id, task=f"{carrier.schema}.{carrier.table}" if carrier else None)
            try:
                self.meta.drop_repair_request(self.pipeline, rid)
            except Exception:  # the ack is written: the next ack drops it (or a restart repeats the repair)
                log.exception("pipeline=%s stage=termin batch=%d dropping repair request %s failed", self.pipeline,
                              batch.id, rid)
                continue
            with self.book.lock:
                self._repairs.pop(rid, None)
                self._repaired.add(rid)
            log.info("pipeline=%s stage=termin batch=%d repair %s acked", self.pipeline, batch.id, rid)

    # --- the merge (poll thread) ---------------------------------------------------------------

    def poll(self, timeout: float) -> Transaction | None:
        self._take_requests()
        with self.book.lock:
            book = self.book
            idle = not (book.copies or book.waiting or book.out or book.gone or book.windows) and book.merge.idle
            failure = self.book.failure
        if failure is not None:
            raise failure
        if idle:
            tx = self.inner.poll(timeout)
            if tx is not None:
                with self.book.lock:
                    self.book.merge.frontier = self.book.handed = tx.end
            return tx
        if self.book.waiting:
            self._start_waiting()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with self.book.lock:
                if self.book.out:
                    return self.book.out.popleft()
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
            return self._hand_repair(found[1])
        if isinstance(found, tuple):
            serial = found[1].copy
            self.book.queued[serial] -= 1
            if self.book.queued[serial] <= 0:
                del self.book.queued[serial]
            self.book.lock.notify_all()  # room for another chunk
            return self._hand_chunk(found[1])
        for change in found.changes:
            if isinstance(change, DdlChange) and not change.snapshot and change.table is not None and (
                    self.book.copies or self.book.gone):
                self._altered(change)
        if self.book.windows:
            self._check_windows(found)
        self.book.handed = found.end
        if self.book.gone:
            self._lost_without_ddl(found.end)
        if self.book.keyless_open and found.changes:
            kept = tuple(c for c in found.changes if not (
                isinstance(c, RowChange) and TableName(c.schema, c.table) in self.book.keyless_open))
            if len(kept) != len(found.changes):
                found = attrs.evolve(found, changes=kept)
        return found

    def _altered(self, change: DdlChange) -> None:
        """Under the lock: a DDL handed on, naming tables whose copy is not all handed on yet.

        A copy that goes on would follow a plan (columns, key) made before the DDL, so each such
        table starts again after it, from a new TRUNCATE (chunks of the old copy still to come are
        dropped), unless the DDL removed it (DROP, RENAME): then its copy ends. A table a RENAME
        gives one of their names, if the rules select it, is copied (the target's renamed table
        holds only part of the rows)."""
        parsed = ddl.parse(change.statement)
        names = [TableName(ref.schema or change.schema, ref.table) for ref in parsed.tables] or [
            TableName(change.schema, str(change.table))]
        moving = [n for n in names if n in self.book.gone
                  or (n in self.book.copies and not self.book.copies[n].handed_final)]
        if not moving:
            return  # waiting tables are planned after the DDL; a copy all handed on precedes it
        removed, pairs = removed_and_renamed(parsed, names)
        renamed = [new for old, new in pairs if old in moving]
        ended = [n for n in moving if n in removed or n in self.book.gone]
        again = [n for n in moving if n not in ended] + [
            n for n in renamed if n not in self.book.copies and n not in self.book.waiting and n not in moving
            and (self.selects is None or self.selects(n.schema, n.table))]
        for name in ended + again:
            self._drop_copy(name, again=name not in ended, carrier=change)
        for name in ended:
            failpoints.hit("snapshot_ended", task=str(name))
        log.warning("pipeline=%s stage=select table=%s position=%s altered while being copied (%s): %s",
                    self.pipeline, ", ".join(map(str, moving)), change.position, change.statement[:120],
                    "; ".join(filter(None, [
                        f"copy of {', '.join(map(str, ended))} ended" if ended else "",
                        f"copying {', '.join(map(str, again))} from its start after it" if again else ""])))

    def _drop_copy(self, name: TableName, *, again: bool, carrier: DdlChange | None = None) -> None:
        """Under the lock: forget the table's copy (its chunks still to come are dropped, its
        progress not committed yet never will be); `again`: copy it from its start (a new TRUNCATE
        at the current position), else its copy is done.

        With a `carrier` (the DDL being handed on that ends or restarts the copy) the meta store
        gets that progress only with the ack of the batch holding the DDL: a crash before it
        resumes the copy from its last acked chunk, and the DDL, replayed, ends it again. Without
        one (a table gone with no DDL, a keyless re-read) it is written now."""
        copy = self.book.copies.pop(name, None)
        if copy is not None:
            self.book.abandoned.add(copy.serial)
        self.book.gone.pop(name, None)
        self.book.windows.pop(name, None)
        self.book.keyless_open.discard(name)
        now = time.time()
        stored = self.ledger.get(name) or TableProgress(name.schema, name.table)
        progress = (TableProgress(name.schema, name.table, CopyStatus.PENDING, started=now, updated=now) if again
                    else attrs.evolve(stored, status=CopyStatus.DONE, updated=now))
        with self._progress_lock:
            self.ledger.abandon(progress, carrier)
            if carrier is None:
                self.meta.save_snapshot_progress(self.pipeline, [progress])
        if again:
            self.book.waiting.append(name)

    def _check_windows(self, found: Transaction) -> None:
        """Under the lock, before `found` is handed on: a write to a keyless table the snapshot does
        not cover, committed between its read's snapshot position and the head read once its SELECT
        ran, may be in the copy and would be applied again: copy the table again (its TRUNCATE after
        `found`), at most `MAX_REREADS` times in a row."""
        for name, (since, until, _serial) in list(self.book.windows.items()):
            if found.end <= since:
                continue
            if until is not None and found.end > until:
                del self.book.windows[name]  # past the window with no write to the table: the copy holds
                self._rereads.pop(name, None)
                continue
            if not any(isinstance(c, RowChange) and c.schema == name.schema and c.table == name.table
                       for c in found.changes):
                continue
            self._rereads[name] += 1
            if self._rereads[name] > MAX_REREADS:
                raise SourceError(
                    f"the keyless {name} is not transactional, and it was written while its snapshot read began "
                    f"{MAX_REREADS + 1} times in a row: a copy of it cannot be placed in the binlog exactly; give it "
                    "a primary key, or copy it (setl snapshot --table) while it is not written",
                    pipeline=self.pipeline, stage="select", table=str(name), position=found.end)
            log.warning("pipeline=%s stage=select table=%s position=%s was written while its snapshot read began "
                        "(a non-transactional table without a primary key: the copy may hold that write): "
                        "copying it again", self.pipeline, name, found.end)
            self._drop_copy(name, again=True)

    def _lost_without_ddl(self, at: Position) -> None:
        """Under the lock: tables gone without a DDL in the stream up to the head seen when they were
        found gone (removed with the binlog off): their copy ends, with a warning."""
        for name, head in list(self.book.gone.items()):
            if head is not None and at < head:
                continue
            self._drop_copy(name, again=False)
            log.warning("pipeline=%s stage=select table=%s position=%s no longer exists and no DDL in the binlog "
                        "removed it: its copy ends unfinished (the target may hold part of its rows)",
                        self.pipeline, name, at)

    def _hand_chunk(self, chunk: Chunk) -> Transaction:
        if chunk.copy in self.book.abandoned:
            return Transaction((), self.book.merge.frontier or chunk.position)  # a copy a DDL started again
        copy = self.book.copies.get(chunk.table)
        key = copy.plan.key if copy is not None else ()
        schema, table, position, read = chunk.table.schema, chunk.table.table, chunk.position, Op.READ
        changes = tuple([RowChange(read, schema, table, key, None, row, position) for row in chunk.rows])
        if copy is not None:
            copy.handed_rows += len(changes)
        if chunk.final and copy is not None:
            copy.handed_final = True
        if chunk.final and not key:
            self.book.keyless_open.discard(chunk.table)
        self.ledger.remember(Record(chunk.table, "chunk", changes[-1] if changes else None, chunk=chunk))
        frontier = self.book.merge.frontier
        return Transaction(changes, frontier if frontier is not None else chunk.position)

    # --- acks (Select and Termin threads) ------------------------------------------------------

    def handed_on(self, batch: Batch) -> None:
        """Note which of the copies' records `batch` holds (their progress commits with its ack)."""
        self.ledger.handed_on(batch)
        if self._repairs:
            with self.book.lock:
                carriers = {id(held[0]): held for held in self._repairs.values()
                            if held[0] is not None and held[1] is None}
                for change in batch.changes if carriers else ():
                    held = carriers.get(id(change))
                    if held is not None and held[0] is change:
                        held[1] = batch.id
        self.inner.handed_on(batch)

    def acknowledge(self, batch: Batch, write: Callable[[tuple[TableProgress, ...]], A]) -> A:
        """The ack of `batch` writes the copy progress it commits in its own meta-store write; once
        written, the progress is the ledger's, finished copies are let go and progress is reported.

        A failed write changes nothing here (the ledger's commit is applied only after it), and
        Termin rolls back and retries as for any failed ack."""
        if not self.ledger.pending:
            ack = self.inner.acknowledge(batch, write)
            if self._repairs:
                self._acked_repairs(batch)
            return ack
        with self._progress_lock:  # never a copy's progress stored after a DDL started it again
            commit = self.ledger.prepare(batch)
            ack = self.inner.acknowledge(batch, lambda inner: write((*inner, *commit.progress)))
            changed = self.ledger.apply(commit)
        failpoints.hit("snapshot_acked", batch.id)
        if self._repairs:
            self._acked_repairs(batch)
        try:
            self._committed(changed, commit.finished if changed else {})
        except Exception:  # the ack is written: reporting must not undo it
            log.exception("pipeline=%s stage=termin batch=%d reporting snapshot progress failed", self.pipeline,
                          batch.id)
        return ack

    def _committed(self, changed: list[TableProgress], copies: dict[TableName, int]) -> None:
        """Progress just acked: let the copies it finished go (`copies`: table -> the serial of the
        copy finished; another copy of the table, begun since, goes on), log them, and report every
        table's progress."""
        finished = [p for p in changed if p.status is CopyStatus.DONE and p.name in copies]
        with self.book.lock:
            for progress in finished:
                copy = self.book.copies.get(progress.name)
                if copy is not None and copy.serial == copies[progress.name]:
                    del self.book.copies[progress.name]
            active = bool(self.book.copies or self.book.waiting)
        for p in finished:
            log.info("pipeline=%s stage=termin table=%s snapshot done: %d rows in %d chunk(s)", self.pipeline,
                     p.name, p.rows, p.chunks)
            if self.on_done is not None:
                self.on_done(p)
        tables = self.ledger.tables()
        done = bool(changed) and not active and all(p.status is CopyStatus.DONE for p in tables)
        if self.reporter is not None:
            self.reporter(tables, done)
        if done and self._began is not None:
            log.info("pipeline=%s snapshot finished: %d table(s), %d rows, %.1fs in this run", self.pipeline,
                     len(tables), sum(p.rows for p in tables), time.monotonic() - self._began)
            self._began = None


_RENAME_TABLE = re.compile(r"\bRENAME\s+(?!(?:COLUMN|INDEX|KEY)\b)", re.IGNORECASE)


def removed_and_renamed(parsed: ddl.Statement, names: list[TableName]
                        ) -> tuple[list[TableName], list[tuple[TableName, TableName]]]:
    """The tables a DDL removes (DROP, RENAME), and its renames as (old, new): `names` are the
    statement's tables (`parsed.tables`, qualified). ``ALTER TABLE ... RENAME COLUMN|INDEX`` renames
    no table."""
    if parsed.kind == "rename_table":
        pairs = list(zip(names[0::2], names[1::2]))
        return [old for old, _ in pairs], pairs
    if parsed.kind == "alter_table" and len(names) > 1 and _RENAME_TABLE.search(parsed.text):
        return names[:1], [(names[0], new) for new in names[1:]]
    if parsed.kind == "drop_table":
        return list(names), []
    return [], []


def find_snapshot(select: Select) -> SnapshotSelect | None:
    """The `SnapshotSelect` in a chain of Select wrappers, if there is one."""
    return find_layer(select, SnapshotSelect)


def with_snapshots(select: Select, *, pipeline: str, meta: Callable[[], MetaStore], parallelism: int,
                   spark: Any = None) -> Select:
    """`select` wrapped in a `SnapshotSelect` when its connector declares the snapshots capability
    (`setl.stages.snapshot.SnapshotCapable`: a source that can place a consistent snapshot in its
    log); any other source as it is. `spark` is the node's SparkConfig, for
    ``source.snapshot.engine: spark``."""
    if not select.capabilities.snapshots:
        return select
    access = cast(SnapshotCapable, select).snapshot_access()  # the registry checked it implements it
    settings = access.settings
    reporter = ProgressReporter(pipeline, every=settings.progress_every)
    spark_reads = None
    if settings.engine == "spark":
        from setl.snapshot.spark_engine import SparkReads

        if access.task_connect is None:
            raise ConfigError("source.snapshot.engine: spark does not support source.ssl (the Spark tasks "
                              "connect without TLS); use engine: python", pipeline=pipeline)
        spark_reads = SparkReads(dict(access.task_connect), spark)
    return SnapshotSelect(select, pipeline=pipeline, meta=meta, connect=access.connect, where=access.where,
                          start_mode=access.start_mode, selects=access.selects, settings=settings,
                          parallelism=parallelism, batch_rows=access.batch_rows, reporter=reporter,
                          spark_reads=spark_reads)

