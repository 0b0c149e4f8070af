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
import contextlib
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import attrs
import pymysql

from setl import ddl, failpoints
from setl.errors import ConfigError, SetlError, SourceError
from setl.meta.base import MetaStore, RepairRequest
from setl.model import Batch, DdlChange, Op, Position, RowChange, TableName, Transaction
from setl.snapshot.display import ProgressReporter
from setl.snapshot.ledger import Chunk, ProgressLedger, Record
from setl.snapshot.merge import StreamMerge
from setl.snapshot.reader import ChunkReader, TablePlan
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
#: Server errors of a chunk read on a table altered under it: unknown column, table definition
#: changed, no such table, key column gone.
_ALTERED_ERRORS = frozenset({1054, 1412, 1146, 1176})


@attrs.define(eq=False)
class _Copy:
    """A table being copied, as the reader threads and the poll thread see it."""

    plan: TablePlan
    progress: TableProgress
    truncated: bool = False  # its TRUNCATE was handed on: chunks may be read
    lower: tuple[Any, ...] | None = None  # the next chunk starts after this key
    exhausted: bool = False  # the final chunk was claimed
    claiming: bool = False  # a reader is finding the next boundary
    next_index: int = 0
    handed_rows: int = 0
    serial: int = 0  # tells this copy's chunks from those of an earlier copy of the table
    handed_final: bool = False  # its last chunk was handed on


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
        self._lock = threading.Condition()
        self._generation = 0
        self._copies: dict[TableName, _Copy] = {}
        self._waiting: list[TableName] = []  # tables whose TRUNCATE is to be handed on
        self._keyless_open: set[TableName] = set()
        self._serials = itertools.count(1)
        self._abandoned: set[int] = set()  # serials of copies a DDL started again: their chunks are dropped
        #: tables whose copy is not done but which no longer exist, with the binlog head when found so:
        #: the DDL that removed them is still ahead in the stream (and may rename them)
        self._gone: dict[TableName, Position | None] = {}
        self._handed: Position | None = None  # the end of the last binlog transaction handed on
        #: keyless tables the snapshot does not cover (MyISAM), read as of some time in (Pc, head]:
        #: (Pc, head, copy serial); a write to the table in there may be in the copy and replayed too
        self._windows: dict[TableName, tuple[Position, Position | None, int]] = {}
        self._rereads: collections.Counter[TableName] = collections.Counter()
        self._progress_lock = threading.Lock()  # progress committed and stored, or a copy abandoned
        self._merge: StreamMerge[Chunk] = StreamMerge()
        #: chunks (keyless pieces included) in the merge and not handed on, by copy serial
        self._queued: collections.Counter[int] = collections.Counter()
        self._out: collections.deque[Transaction] = collections.deque()
        self.ledger = ProgressLedger()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._failure: BaseException | None = None
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
        self._shutdown()
        self.inner.open(start)
        fresh = start is None and self.start_mode
        self._restart(self.inner.tell(), fresh=fresh)

    def seek(self, position: Position | None) -> None:
        self._shutdown()
        self.inner.seek(position)
        self._restart(self.inner.tell() or position, fresh=False)

    def close(self) -> None:
        self._shutdown()
        self.inner.close()

    def backlog(self) -> bool:
        with self._lock:
            # a repair holds `--until-caught-up` until acked
            waiting = bool(self._waiting or self._repairs or self._repairs_deferred)
        return waiting or self.ledger.unfinished()

    def _shutdown(self) -> None:
        self._stop.set()
        with self._lock:
            self._generation += 1
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(30.0)
            if thread.is_alive():
                log.warning("pipeline=%s snapshot reader %s did not stop within 30s", self.pipeline, thread.name)
        self._threads = []

    def _restart(self, frontier: Position | None, *, fresh: bool) -> None:
        """Forget everything not acked; take the copies up again from the meta store's progress."""
        stored = {p.name: p for p in self.meta.snapshot_progress(self.pipeline)}
        with self._lock:
            self._generation += 1
            self._copies.clear()
            self._waiting.clear()
            self._keyless_open.clear()
            self._abandoned.clear()
            self._gone.clear()
            self._windows.clear()
            self._handed = frontier
            self._merge.clear(frontier)
            self._queued.clear()
            self._out.clear()
            self._failure = None
            self._repairs.clear()  # not acked: served again from the meta store's requests
        self.ledger.reset(stored)
        self._stop = threading.Event()
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
        if self._copies or self._waiting:
            self._start_readers()

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
        with self._lock:
            self._waiting.extend(p.name for p in pending)
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
            with self._lock:
                self._waiting.append(progress.name)
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
        with self._lock:
            if self._merge.frontier is None:
                return  # after a GTID start: wait for the first position
            waiting, self._waiting = self._waiting, []
            generation = self._generation
        if not waiting:
            return
        frontier = self._merge.frontier
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
                    with self._lock:
                        if generation == self._generation:
                            self._gone[name] = head
                            if self._handed is not None:
                                self._lost_without_ddl(self._handed)  # already past today's head
                    log.info("pipeline=%s stage=select table=%s no longer exists: not copied; waiting for the DDL "
                             "that removed it to pass (by %s)", self.pipeline, name, head)
                    continue
                resume = stored.status is CopyStatus.COPYING and not plan.keyless
                if resume and stored.key is not None and stored.key != plan.key:
                    log.warning("pipeline=%s stage=select table=%s its primary key is (%s) now, not (%s) as when "
                                "its copy began: copying it again from its start", self.pipeline, name,
                                ", ".join(plan.key), ", ".join(stored.key))
                    resume = False
                copy = _Copy(plan, attrs.evolve(stored, estimate=plan.estimate), serial=next(self._serials))
                if resume:
                    copy.truncated, copy.lower = True, stored.last_key
                    with self._lock:
                        if generation == self._generation:
                            self._copies[name] = copy
                            self._lock.notify_all()
                    continue
                # Empty now: nothing to copy, and any later row arrives through the binlog.
                empty = not self.reader.has_rows(conn, plan)
                statement = f"TRUNCATE TABLE {plan.quoted}"
                change = DdlChange(name.schema, name.table, statement, position=frontier, snapshot=True)
                with self._lock:
                    if generation != self._generation:
                        return
                    copy.truncated = True
                    copy.exhausted = empty
                    self._copies[name] = copy
                    if plan.keyless and not empty:
                        self._keyless_open.add(name)
                    self.ledger.remember(Record(name, "truncate", change, empty=empty, estimate=plan.estimate,
                                                key=plan.key, copy=copy.serial))
                    self._out.append(Transaction((change,), frontier or Position("", 0)))
                    self._lock.notify_all()
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
            with self._lock:
                busy = table in self._copies or table in self._waiting
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
                     ", ".join(map(str, taken)), self._merge.frontier)
            self._start_readers()
        self._take_repairs()

    # --- repairs (poll thread) -----------------------------------------------------------------

    def _take_repairs(self) -> None:
        """Serve the meta store's repair requests not in flight (`setl.snapshot.repair`)."""
        requests = self.meta.repair_requests(self.pipeline)
        with self._lock:
            self._repairs_deferred = bool(requests) and self._merge.frontier is None
            if self._repairs_deferred:
                return  # after a GTID start: wait for the first position
        for request in requests:
            with self._lock:
                if request.id in self._repairs or request.id in self._repaired:
                    continue
                if request.table in self._copies or request.table in self._waiting:
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
                self._start_readers()
                return
            with self._lock:
                generation = self._generation
                rid = self._register(generation)
            try:
                rows, position = self.reader.read_keys(conn, plan, [[query_value(v) for v in key] for key in keys],
                                                       lambda at: self._started(generation, rid, at))
            except BaseException:
                with self._lock:
                    self._ended(generation, rid)
                raise
            found = [tuple(row[c] for c in plan.key) for row in rows]
            deletes = tuple(dict(zip(plan.key, key)) for key in absent(keys, found))
            chunk = Chunk(name, generation, 0, tuple(rows), position, None, None, True, repair=request.id,
                          key=plan.key, deletes=deletes)
            with self._lock:
                if generation == self._generation:
                    self._merge.add(position, chunk)
                    self._repairs[request.id] = [None, None]
                self._ended(generation, rid)
        except pymysql.MySQLError as exc:
            raise SourceError(f"repair read of {self.where} failed: {exc}", pipeline=self.pipeline, stage="select",
                              table=str(name), position=self._merge.frontier) from exc
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
        frontier = self._merge.frontier
        return Transaction(changes, frontier if frontier is not None else position)

    def _acked_repairs(self, batch: Batch) -> None:
        """Drop the requests whose repairs `batch` (acked) or an earlier batch holds. A crash before
        a drop serves the request again after the restart: a repeat of an idempotent repair."""
        with self._lock:
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
            with self._lock:
                self._repairs.pop(rid, None)
                self._repaired.add(rid)
            log.info("pipeline=%s stage=termin batch=%d repair %s acked", self.pipeline, batch.id, rid)

    # --- the merge (poll thread) ---------------------------------------------------------------

    def poll(self, timeout: float) -> Transaction | None:
        self._take_requests()
        with self._lock:
            idle = not (self._copies or self._waiting or self._out or self._gone or self._windows) and self._merge.idle
            failure = self._failure
        if failure is not None:
            raise failure
        if idle:
            tx = self.inner.poll(timeout)
            if tx is not None:
                with self._lock:
                    self._merge.frontier = self._handed = tx.end
            return tx
        if self._waiting:
            self._start_waiting()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with self._lock:
                if self._out:
                    return self._out.popleft()
                wanted = self._merge.lookahead is None
            if wanted:
                tx = self.inner.poll(0)
                with self._lock:
                    self._merge.offer(tx)
            with self._lock:
                if self._failure is not None:
                    raise self._failure
                found = self._next()
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if self._merge.lookahead is not None:
                    # held by a read in flight or a chunk not yet placed: wait for a reader
                    self._lock.wait(min(remaining, 0.02))
                    continue
            tx = self.inner.poll(min(remaining, 0.02))
            with self._lock:
                self._merge.offer(tx)

    def _next(self) -> Transaction | None:
        """Under the lock: the next transaction in position order, if it can be told yet."""
        found = self._merge.next()
        if found is None:
            return None
        if isinstance(found, tuple) and found[1].repair is not None:
            return self._hand_repair(found[1])
        if isinstance(found, tuple):
            serial = found[1].copy
            self._queued[serial] -= 1
            if self._queued[serial] <= 0:
                del self._queued[serial]
            self._lock.notify_all()  # room for another chunk
            return self._hand_chunk(found[1])
        for change in found.changes:
            if isinstance(change, DdlChange) and not change.snapshot and change.table is not None and (
                    self._copies or self._gone):
                self._altered(change)
        if self._windows:
            self._check_windows(found)
        self._handed = found.end
        if self._gone:
            self._lost_without_ddl(found.end)
        if self._keyless_open and found.changes:
            kept = tuple(c for c in found.changes if not (
                isinstance(c, RowChange) and TableName(c.schema, c.table) in self._keyless_open))
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
        moving = [n for n in names if n in self._gone
                  or (n in self._copies and not self._copies[n].handed_final)]
        if not moving:
            return  # waiting tables are planned after the DDL; a copy all handed on precedes it
        removed, pairs = removed_and_renamed(parsed, names)
        renamed = [new for old, new in pairs if old in moving]
        ended = [n for n in moving if n in removed or n in self._gone]
        again = [n for n in moving if n not in ended] + [
            n for n in renamed if n not in self._copies and n not in self._waiting and n not in moving
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
        copy = self._copies.pop(name, None)
        if copy is not None:
            self._abandoned.add(copy.serial)
        self._gone.pop(name, None)
        self._windows.pop(name, None)
        self._keyless_open.discard(name)
        now = time.time()
        stored = self.ledger.get(name) or TableProgress(name.schema, name.table)
        progress = (TableProgress(name.schema, name.table, CopyStatus.PENDING, started=now, updated=now) if again
                    else attrs.evolve(stored, status=CopyStatus.DONE, updated=now))
        with self._progress_lock:
            self.ledger.abandon(progress, carrier)
            if carrier is None:
                self.meta.save_snapshot_progress(self.pipeline, [progress])
        if again:
            self._waiting.append(name)

    def _check_windows(self, found: Transaction) -> None:
        """Under the lock, before `found` is handed on: a write to a keyless table the snapshot does
        not cover, committed between its read's snapshot position and the head read once its SELECT
        ran, may be in the copy and would be applied again: copy the table again (its TRUNCATE after
        `found`), at most `MAX_REREADS` times in a row."""
        for name, (since, until, _serial) in list(self._windows.items()):
            if found.end <= since:
                continue
            if until is not None and found.end > until:
                del self._windows[name]  # past the window with no write to the table: the copy holds
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
        for name, head in list(self._gone.items()):
            if head is not None and at < head:
                continue
            self._drop_copy(name, again=False)
            log.warning("pipeline=%s stage=select table=%s position=%s no longer exists and no DDL in the binlog "
                        "removed it: its copy ends unfinished (the target may hold part of its rows)",
                        self.pipeline, name, at)

    def _hand_chunk(self, chunk: Chunk) -> Transaction:
        if chunk.copy in self._abandoned:
            return Transaction((), self._merge.frontier or chunk.position)  # a copy a DDL started again
        copy = self._copies.get(chunk.table)
        key = copy.plan.key if copy is not None else ()
        schema, table, position, read = chunk.table.schema, chunk.table.table, chunk.position, Op.READ
        changes = tuple([RowChange(read, schema, table, key, None, row, position) for row in chunk.rows])
        if copy is not None:
            copy.handed_rows += len(changes)
        if chunk.final and copy is not None:
            copy.handed_final = True
        if chunk.final and not key:
            self._keyless_open.discard(chunk.table)
        self.ledger.remember(Record(chunk.table, "chunk", changes[-1] if changes else None, chunk=chunk))
        frontier = self._merge.frontier
        return Transaction(changes, frontier if frontier is not None else chunk.position)

    # --- readers ------------------------------------------------------------------------------

    def _start_readers(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        while len(self._threads) < self.readers:
            thread = threading.Thread(target=self._read_loop, args=(self._stop,),
                                      name=f"setl-{self.pipeline}-snapshot-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _claim(self, stop: threading.Event) -> tuple[int, _Copy] | None:
        """Under the lock, waiting for room: a table with a chunk to read (marked as claiming).

        A claim counts as a chunk from here: a reader finding its boundary has not registered its
        read with the merge yet, and readers claiming together must not take more than the room."""
        while not stop.is_set():
            claims = sum(1 for c in self._copies.values() if c.claiming)
            if self._merge.pending + claims < self.max_chunks:
                for copy in self._copies.values():
                    if copy.truncated and not copy.exhausted and not copy.claiming:
                        copy.claiming = True
                        return self._generation, copy
            self._lock.wait(0.2)
        return None

    def _read_loop(self, stop: threading.Event) -> None:
        conn = None
        copy: _Copy | None = None
        try:
            while not stop.is_set():
                with self._lock:
                    claimed = self._claim(stop)
                if claimed is None:
                    return
                generation, copy = claimed
                if conn is None:
                    conn = self._connection()
                try:
                    if copy.plan.keyless:
                        self._read_keyless(conn, generation, copy)
                    else:
                        self._read_chunk(conn, generation, copy)
                except BaseException:
                    with self._lock:
                        copy.claiming = False
                    raise
        except BaseException as exc:
            if not stop.is_set():
                log.debug("pipeline=%s snapshot reader failed", self.pipeline, exc_info=True)
                error = exc if isinstance(exc, SetlError) else SourceError(
                    f"snapshot read failed: {type(exc).__name__}: {exc}", pipeline=self.pipeline, stage="select",
                    table=str(copy.plan.name) if copy is not None else None, position=self._merge.frontier)
                with self._lock:
                    self._failure = error
                    self._lock.notify_all()
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):  # closing a connection that may be broken already
                    conn.close()

    def _register(self, generation: int) -> int:
        """Under the lock: a read about to start (-1 for one no longer wanted)."""
        return self._merge.read_started() if generation == self._generation else -1

    def _started(self, generation: int, rid: int, position: Position) -> None:
        with self._lock:
            if generation == self._generation:
                self._merge.read_positioned(rid, position)
                self._lock.notify_all()

    def _ended(self, generation: int, rid: int, chunk: Chunk | None = None) -> None:
        """Under the lock: a read is over (with its chunk, or its last piece)."""
        if generation != self._generation:
            return
        if chunk is not None:
            self._merge.add(chunk.position, chunk)
            self._queued[chunk.copy] += 1
        self._merge.read_ended(rid)
        self._lock.notify_all()

    def _read_chunk(self, conn: Any, generation: int, copy: _Copy) -> None:
        lower = copy.lower
        try:
            upper = self.reader.boundary(conn, copy.plan, lower, self.chunk_rows)
        except pymysql.MySQLError as exc:
            raise self._read_error(copy, exc)  # noqa: B904 (it sets its own cause)
        with self._lock:
            if generation != self._generation:
                return
            index = copy.next_index
            copy.next_index += 1
            copy.lower, copy.exhausted, copy.claiming = upper, upper is None, False
            rid = self._register(generation)
            self._lock.notify_all()
        try:
            if self.spark_reads is not None:
                rows, position = self.spark_reads.read(copy.plan, lower, upper)
            else:
                rows, position = self.reader.read(conn, copy.plan, lower, upper,
                                                  lambda at: self._started(generation, rid, at))
        except BaseException as exc:
            with self._lock:
                self._ended(generation, rid)
            if isinstance(exc, pymysql.MySQLError):
                raise self._read_error(copy, exc)  # noqa: B904 (it sets its own cause)
            raise
        chunk = Chunk(copy.plan.name, generation, index, tuple(rows), position, lower, upper, upper is None,
                      copy=copy.serial)
        with self._lock:
            self._ended(generation, rid, chunk)

    def _read_keyless(self, conn: Any, generation: int, copy: _Copy) -> None:
        with self._lock:
            copy.exhausted = True
            copy.claiming = False
            rid = self._register(generation)
        index = itertools.count()
        position: list[Position] = []

        def started(at: Position) -> None:
            position.append(at)
            self._started(generation, rid, at)

        def piece(rows: list[dict[str, Any]], final: bool) -> None:
            chunk = Chunk(copy.plan.name, generation, next(index), tuple(rows), position[0], None, None, final,
                          copy=copy.serial)
            with self._lock:
                # Room is counted in this read's own pieces: they are the only chunks that can be
                # handed on while it runs (its open read holds back everything placed after its
                # snapshot), so waiting for other chunks to go would wait for ever.
                while (generation == self._generation and not self._stop.is_set()
                       and copy.serial not in self._abandoned and self._queued[copy.serial] >= self.max_chunks):
                    self._lock.wait(0.2)
                if generation != self._generation or self._stop.is_set() or copy.serial in self._abandoned:
                    raise _Abandoned()
                self._merge.add(chunk.position, chunk)
                self._queued[copy.serial] += 1
                if final:
                    self._merge.read_ended(rid)
                self._lock.notify_all()

        def running() -> None:
            head = self.inner.head()  # the binlog's end once the SELECT holds its lock
            with self._lock:
                if generation == self._generation and copy.serial not in self._abandoned:
                    self._windows[copy.plan.name] = (position[0], head, copy.serial)

        try:
            self.reader.read_all(conn, copy.plan, self.chunk_rows, started, piece, running)
        except _Abandoned:
            pass
        except pymysql.MySQLError as exc:
            raise self._read_error(copy, exc)  # noqa: B904 (it sets its own cause)
        finally:
            with self._lock:
                self._ended(generation, rid)

    def _read_error(self, copy: _Copy, exc: BaseException) -> SourceError:
        """The error to raise (``from`` it) for a chunk read that failed with `exc`."""
        error = SourceError(f"snapshot read of {self.where} failed: {exc}", pipeline=self.pipeline, stage="select",
                            table=str(copy.plan.name), position=self._merge.frontier)
        code = exc.args[0] if isinstance(exc, pymysql.MySQLError) and exc.args else None
        if code in _ALTERED_ERRORS:
            # The server's error would say retrying cannot help (an unknown column), but the next
            # attempt plans the table again: the copy goes on with its new definition, or starts
            # again if its key changed. Raised without that cause, so that it is retried.
            error.message += (" (the table was altered while being copied: the pipeline retries, and the copy "
                              "goes on with its new definition, or starts again if its primary key changed)")
            error.__suppress_context__ = True
            return error
        error.__cause__ = exc
        return error

    # --- acks (Select and Termin threads) ------------------------------------------------------

    def handed_on(self, batch: Batch) -> None:
        """Note which of the copies' records `batch` holds (their progress commits with its ack)."""
        self.ledger.handed_on(batch)
        if self._repairs:
            with self._lock:
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
        with self._lock:
            for progress in finished:
                copy = self._copies.get(progress.name)
                if copy is not None and copy.serial == copies[progress.name]:
                    del self._copies[progress.name]
            active = bool(self._copies or self._waiting)
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


class _Abandoned(Exception):
    """A keyless read whose results are no longer wanted (a rewind, or a stop)."""


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

