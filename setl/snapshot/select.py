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
4. When the target takes it, a marker (`DdlChange.end_of_copy`) follows the copy's last chunk (or
   the TRUNCATE of a table found empty): an SQL target that copied into a staging table, because
   the table held rows (a re-copy), switches the table to the copied rows there in one
   transaction, so that readers of the target see the old rows until the copy is done.

A repair (`setl repair`, `setl.snapshot.repair`) is a request in the meta store for some keys of a
table: the poll thread reads them in one consistent snapshot and places the result like a chunk
(found keys as READs, the others as key-only DELETEs); the request is dropped once the batch
holding it is acked, so a restart before that serves it again.

Chunks are read by `readers` threads, at most `max_chunks` read and not yet handed on. Progress
reaches the meta store only with the ack of the batch holding a chunk, in that ack's own atomic
write (`Select.acknowledge`), so a restart resumes after the last acked chunk; a chunk replayed
after a crash is harmless (READ replaces the row).

`SnapshotSelect` is the `Select` the pipeline sees; its roles are collaborators sharing one
`copies.CopyBook` (the copies' state, under one lock): `reads.CopyReads` (the copy scheduler:
reader threads, claims, room), `handoff.MergeHandOff` (the poll: TRUNCATEs, chunks and repairs
placed in the stream), `restarts.CopyRestarts` (what a DDL or a write handed on does to a copy),
`requests.CopyRequests` (`setl snapshot` and `setl repair` requests) and `progress.CopyProgress`
(copies begun and resumed, the progress ledger, what an ack reports).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, cast

import pymysql

from setl import failpoints
from setl.errors import ConfigError
from setl.meta.base import MetaStore
from setl.model import Batch, Position, TableName, Transaction
from setl.snapshot.copies import CopyBook
from setl.snapshot.display import ProgressReporter
from setl.snapshot.handoff import MergeHandOff
from setl.snapshot.ledger import ProgressLedger
from setl.snapshot.progress import CopyProgress
from setl.snapshot.reader import ChunkReader
from setl.snapshot.reads import CopyReads
from setl.snapshot.requests import CopyRequests
from setl.snapshot.restarts import CopyRestarts
from setl.stages.layers import find_layer
from setl.stages.select import A, Select, SelectWrapper
from setl.stages.snapshot import SnapshotCapable
from setl.tablecopy import SnapshotSettings, TableProgress

log = logging.getLogger("setl.snapshot")


class SnapshotSelect(SelectWrapper):
    """Wraps a MySQL binlog source; see the module docstring. It builds its collaborators, opens,
    seeks and closes them in order, and writes the progress an ack commits.

    Contract additions to `Select`: chunk transactions end at the position of the last binlog
    transaction handed on before them (resuming there re-reads nothing they depend on), and their
    row changes carry the chunk's snapshot position. `backlog()` is true while a copy is not
    acked to the end, so ``--until-caught-up`` waits for it. With `copy_end` (the target takes it,
    `setl.stages.load.LoadCapabilities.copy_end`) each copy's end marker (`DdlChange.end_of_copy`)
    follows its last chunk as a transaction of its own, and the copy is done only once the batch
    holding the marker is acked: a restart before that reads the last chunk again and hands the
    marker on again.
    """

    def __init__(self, inner: Select, *, pipeline: str, meta: Callable[[], MetaStore], connect: Callable[[], Any],
                 where: str, start_mode: bool, selects: Callable[[str, str], bool] | None,
                 settings: SnapshotSettings, parallelism: int = 2, batch_rows: int = 10_000,
                 reporter: Callable[[list[TableProgress], bool], None] | None = None,
                 spark_reads: Any = None, copy_end: bool = False, interleave: bool = False) -> None:
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
        self.spark_reads = spark_reads  # a setl.snapshot.spark_engine.SparkReads: chunks read as Spark tasks
        self.reader = ChunkReader(self._connection, pipeline)
        #: the copies' state, shared with the collaborators below under its one lock
        self.book = CopyBook(interleave=interleave)
        #: the reader threads, which copy they read next and their room (the copy scheduler)
        self.reads = CopyReads(self.book, reader=self.reader, connection=self._connection, inner=inner,
                               pipeline=pipeline, where=where, readers=self.readers, chunk_rows=self.chunk_rows,
                               max_chunks=self.max_chunks, spark_reads=spark_reads)
        #: tables begun and resumed, the ledger of what the acks commit, and what a commit reports
        self.progress = CopyProgress(self.book, meta=lambda: self.meta, pipeline=pipeline,
                                     check_server=self._check_server, reporter=reporter, copy_end=copy_end)
        #: what the binlog handed on does to the copies (DDL, keyless windows, tables gone)
        self.restarts = CopyRestarts(self.book, self.progress, pipeline=pipeline, selects=selects)
        #: `setl snapshot` and `setl repair` requests from the meta store
        self.requests = CopyRequests(self.book, self.progress, self.reads, reader=self.reader,
                                     connection=self._connection, meta=lambda: self.meta, pipeline=pipeline,
                                     where=where, selects=selects)
        #: the poll thread's hand-off of TRUNCATEs, chunks and repairs into the stream
        self.handoff = MergeHandOff(self.book, self.progress.ledger, self.restarts, self.requests, inner=inner,
                                    reader=self.reader, connection=self._connection, pipeline=pipeline,
                                    copy_end=copy_end)
        self._checked = False

    @property
    def meta(self) -> MetaStore:
        """The meta store, made at first use."""
        if self._meta is None:
            self._meta = self._meta_factory()
        return self._meta

    @property
    def ledger(self) -> ProgressLedger:
        """The copies' progress handed on and not acked yet (`CopyProgress.ledger`)."""
        return self.progress.ledger

    @property
    def on_done(self) -> Callable[[TableProgress], None] | None:
        """Called with each table whose copy was just acked to its end (the node sends the
        ``snapshot_done`` alert); an exception there is logged, never undoes the ack."""
        return self.progress.on_done

    @on_done.setter
    def on_done(self, callback: Callable[[TableProgress], None] | None) -> None:
        self.progress.on_done = callback

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

    def listen(self, ready: Callable[[], None]) -> None:
        self.inner.listen(ready)

    def notifies(self) -> bool:
        """The inner source's while no copy, read or repair is under way (`MergeHandOff.poll` is then
        its poll); False otherwise. A snapshot request is seen at the next poll (they are looked
        for once a second). Read without the book's lock (this is asked under the scheduler's): a
        stale answer only delays a poll, by `NOTIFIED_IDLE` at most."""
        return self.book.idle and self.inner.notifies()

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
            waiting = bool(self.book.waiting or self.requests.repairs or self.requests.deferred)
        return waiting or self.progress.ledger.unfinished()

    def _restart(self, frontier: Position | None, *, fresh: bool) -> None:
        """Forget everything not acked; take the copies up again from the meta store's progress."""
        stored = {p.name: p for p in self.meta.snapshot_progress(self.pipeline)}
        with self.book.lock:
            self.book.reset(frontier)
            self.requests.repairs.clear()  # not acked: served again from the meta store's requests
        self.progress.ledger.reset(stored)
        self.reads.stop = threading.Event()
        if fresh:
            tables = self._selected_tables()
            log.info("pipeline=%s stage=select snapshot of %d table(s) starting at %s", self.pipeline,
                     len(tables), frontier)
            self.progress.begin(tables, replace=True)
        else:
            self.progress.resume(stored.values())
        self.requests.next_poll = 0.0
        # A copy requested while the pipeline was stopped starts now: `backlog()` then holds a
        # `--until-caught-up` start until it is done, instead of it ending "caught up" at once.
        self.requests.take()
        with self.book.lock:
            active = self.book.active
        if active:
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

    def _check_server(self) -> None:
        """Refuse a server that cannot place a consistent snapshot in its binlog (once)."""
        if self._checked:
            return
        conn = self._connection()
        try:
            self.reader.check(conn, self.where)
        finally:
            conn.close()
        self._checked = True

    def poll(self, timeout: float) -> Transaction | None:
        """Take the meta store's requests, then the next transaction in position order
        (`MergeHandOff.poll`)."""
        self.requests.take()
        return self.handoff.poll(timeout)

    # --- acks (Select and Termin threads) ------------------------------------------------------

    def handed_on(self, batch: Batch) -> None:
        """Note which of the copies' records `batch` holds (their progress commits with its ack)."""
        self.progress.ledger.handed_on(batch)
        self.requests.handed_on(batch)
        self.inner.handed_on(batch)

    def acknowledge(self, batch: Batch, write: Callable[[tuple[TableProgress, ...]], A]) -> A:
        """The ack of `batch` writes the copy progress it commits in its own meta-store write; once
        written, the progress is the ledger's, finished copies are let go and progress is reported.

        A failed write changes nothing here (the ledger's commit is applied only after it), and
        Termin rolls back and retries as for any failed ack."""
        progress, ledger = self.progress, self.progress.ledger
        if not ledger.pending:
            ack = self.inner.acknowledge(batch, write)
            if self.requests.repairs:
                self.requests.acked(batch)
            return ack
        with progress.lock:  # never a copy's progress stored after a DDL started it again
            commit = ledger.prepare(batch)
            ack = self.inner.acknowledge(batch, lambda inner: write((*inner, *commit.progress)))
            changed = ledger.apply(commit)
        failpoints.hit("snapshot_acked", batch.id)
        if self.requests.repairs:
            self.requests.acked(batch)
        try:
            progress.committed(changed, commit.finished if changed else {})
        except Exception:  # the ack is written: reporting must not undo it
            log.exception("pipeline=%s stage=termin batch=%d reporting snapshot progress failed", self.pipeline,
                          batch.id)
        return ack


def find_snapshot(select: Select) -> SnapshotSelect | None:
    """The `SnapshotSelect` in a chain of Select wrappers, if there is one."""
    return find_layer(select, SnapshotSelect)


def with_snapshots(select: Select, *, pipeline: str, meta: Callable[[], MetaStore], parallelism: int,
                   spark: Any = None, copy_end: bool = False, interleave: bool = False) -> Select:
    """`select` wrapped in a `SnapshotSelect` when its connector declares the snapshots capability
    (`setl.stages.snapshot.SnapshotCapable`: a source that can place a consistent snapshot in its
    log); any other source as it is. `spark` is the node's SparkConfig, for
    ``source.snapshot.engine: spark``; `copy_end`: hand on each copy's end marker (the target takes
    it: `setl.stages.load.LoadCapabilities.copy_end`); `interleave`: read the copies' chunks in
    turn (`setl.snapshot.copies.CopyBook`), for a load that takes chunks of different tables at once."""
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
                          spark_reads=spark_reads, copy_end=copy_end, interleave=interleave)

