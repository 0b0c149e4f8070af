"""The table copies' progress: copies begun or resumed, the ledger of what the acks commit, and
what an ack that commits progress lets go and reports (`CopyProgress`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from setl.meta.base import MetaStore
from setl.model import DdlChange, TableName
from setl.snapshot.copies import CopyBook
from setl.snapshot.ledger import ProgressLedger
from setl.tablecopy import CopyStatus, TableProgress

log = logging.getLogger("setl.snapshot")


class CopyProgress:
    """The copies' progress on its way to the meta store.

    `begin` records tables as PENDING in the meta store at once and queues them for their
    TRUNCATE; `resume` queues the unfinished copies stored. Everything else reaches the meta store
    only through the `ledger`: `SnapshotSelect.acknowledge` writes what the ack of a batch commits
    in that ack's own write, under `lock`, which `abandon` holds too, so that a copy's progress is
    never stored after a DDL started it again. `committed` then lets the finished copies go (from
    the book, under its lock), calls `on_done` for each and reports every table's progress to the
    `reporter`; it blocks only on them and on the book's lock."""

    def __init__(self, book: CopyBook, *, meta: Callable[[], MetaStore], pipeline: str,
                 check_server: Callable[[], None],
                 reporter: Callable[[list[TableProgress], bool], None] | None = None,
                 copy_end: bool = False) -> None:
        self.book = book
        self.meta = meta
        self.pipeline = pipeline
        self.check_server = check_server  # refuses a server that cannot place a snapshot, once
        self.reporter = reporter
        #: called with each table whose copy was just acked to its end (the node sends the
        #: ``snapshot_done`` alert); an exception there is logged, never undoes the ack
        self.on_done: Callable[[TableProgress], None] | None = None
        self.ledger = ProgressLedger(copy_end=copy_end)
        self.lock = threading.Lock()  # progress committed and stored, or a copy abandoned
        self.began: float | None = None  # when the copies of this run began (the summary line)

    def begin(self, tables: Iterable[TableName], *, replace: bool) -> None:
        """Record `tables` as PENDING (their copy starts with a TRUNCATE) and queue them."""
        tables = list(tables)
        if not tables:
            return
        self.check_server()
        now = time.time()
        pending = [TableProgress(t.schema, t.table, CopyStatus.PENDING, started=now, updated=now) for t in tables]
        self.meta().save_snapshot_progress(self.pipeline, pending)
        if replace:
            self.ledger.reset({})
        self.ledger.set(pending)
        with self.book.lock:
            for p in pending:
                self.book.queue(p.name)
        if self.began is None:
            self.began = time.monotonic()

    def resume(self, stored: Iterable[TableProgress]) -> None:
        """Queue the copies `stored` as not done (their TRUNCATE, or their next chunk, is next)."""
        unfinished = [p for p in stored if p.status is not CopyStatus.DONE]
        if not unfinished:
            return
        self.check_server()
        for progress in unfinished:
            if progress.status is CopyStatus.COPYING and progress.last_key is not None:
                log.info("pipeline=%s stage=select table=%s snapshot resumes after chunk %d (last key %s, "
                         "%d rows copied)", self.pipeline, progress.name, progress.chunks,
                         list(progress.last_key), progress.rows)
            else:
                log.info("pipeline=%s stage=select table=%s snapshot resumes from its start", self.pipeline,
                         progress.name)
            with self.book.lock:
                self.book.queue(progress.name)
        if self.began is None:
            self.began = time.monotonic()

    def committed(self, changed: list[TableProgress], copies: dict[TableName, int]) -> None:
        """Progress just acked: let the copies it finished go (`copies`: table -> the serial of the
        copy finished; another copy of the table, begun since, goes on), log them, and report every
        table's progress."""
        finished = [p for p in changed if p.status is CopyStatus.DONE and p.name in copies]
        with self.book.lock:
            for progress in finished:
                self.book.finished(progress.name, copies[progress.name])
            active = self.book.active
        for p in finished:
            log.info("pipeline=%s stage=termin table=%s snapshot done: %d rows in %d chunk(s)", self.pipeline,
                     p.name, p.rows, p.chunks)
            if self.on_done is not None:
                self.on_done(p)
        tables = self.ledger.tables()
        done = bool(changed) and not active and all(p.status is CopyStatus.DONE for p in tables)
        if self.reporter is not None:
            self.reporter(tables, done)
        if done and self.began is not None:
            log.info("pipeline=%s snapshot finished: %d table(s), %d rows, %.1fs in this run", self.pipeline,
                     len(tables), sum(p.rows for p in tables), time.monotonic() - self.began)
            self.began = None

    def abandon(self, progress: TableProgress, carrier: DdlChange | None) -> None:
        """A copy forgotten (`CopyRestarts.drop_copy`) with `progress` its end or its new start: stored
        with the ack of the batch holding `carrier`, or now without one."""
        with self.lock:
            self.ledger.abandon(progress, carrier)
            if carrier is None:
                self.meta().save_snapshot_progress(self.pipeline, [progress])
