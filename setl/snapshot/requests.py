"""The meta store's requests to a running source (`CopyRequests`): `setl snapshot --table` copies,
and `setl repair` keys read again and placed in the stream like a chunk (`setl.snapshot.repair`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pymysql

from setl import failpoints
from setl.errors import SourceError
from setl.meta.base import MetaStore, RepairRequest
from setl.model import Batch, Op, RowChange, Transaction
from setl.snapshot.copies import CopyBook
from setl.snapshot.ledger import Chunk
from setl.snapshot.progress import CopyProgress
from setl.snapshot.reader import ChunkReader
from setl.snapshot.reads import CopyReads
from setl.snapshot.repair import RepairRefused, absent, query_value, typed_keys

log = logging.getLogger("setl.snapshot")

#: How often the running source looks for `setl snapshot` requests in the meta store (seconds).
REQUEST_POLL = 1.0


class CopyRequests:
    """Takes the meta store's requests on the poll thread, at most every `REQUEST_POLL` seconds
    (`take`; `next_poll` 0 takes them at the next call): a copy request for a table not being
    copied begins its copy (`CopyProgress.begin`) and is dropped; a repair request is read in one
    consistent snapshot on the poll thread (which blocks on that read) and put in the book's merge
    at its position, or begins a copy of the whole table when its keys cannot be looked up.

    A repair is dropped from the meta store only once the batch holding it is acked (`handed_on`,
    then `acked`), so a restart before that serves it again. `repairs` (request id -> [the change
    that carries it, its batch id once handed on]), `repaired` and `deferred` are read and written
    under the book's lock; a request for a table a rule no longer selects is dropped with a
    warning."""

    def __init__(self, book: CopyBook, progress: CopyProgress, reads: CopyReads, *, reader: ChunkReader,
                 connection: Callable[[], Any], meta: Callable[[], MetaStore], pipeline: str, where: str,
                 selects: Callable[[str, str], bool] | None) -> None:
        self.book = book
        self.progress = progress
        self.reads = reads
        self.reader = reader
        self.connection = connection
        self.meta = meta
        self.pipeline = pipeline
        self.where = where
        self.selects = selects
        self.next_poll = 0.0  # time.monotonic() of the next look at the meta store's requests
        #: repairs read and not acked: request id -> [the change that carries it, its batch id once handed on]
        self.repairs: dict[str, list[Any]] = {}
        self.repaired: set[str] = set()  # requests acked and dropped (a list read before may still hold them)
        self.deferred = False  # requests seen before the stream had a position (a GTID start)

    def take(self) -> None:
        """Begin the copies requested for tables not being copied, then serve the repair requests
        (`REQUEST_POLL` seconds at the earliest after the last look)."""
        now = time.monotonic()
        if now < self.next_poll:
            return
        self.next_poll = now + REQUEST_POLL
        requests = self.meta().snapshot_requests(self.pipeline)
        taken = []
        for table in requests:
            with self.book.lock:
                busy = self.book.busy(table)
            if busy:
                continue  # copied again once the current copy ends
            if self.selects is not None and not self.selects(table.schema, table.table):
                log.warning("pipeline=%s stage=select table=%s snapshot requested but no table rule selects it; "
                            "request dropped", self.pipeline, table)
                self.meta().drop_snapshot_request(self.pipeline, table)
                continue
            taken.append(table)
        if taken:
            self.progress.begin(taken, replace=False)
            for table in taken:
                self.meta().drop_snapshot_request(self.pipeline, table)
            log.info("pipeline=%s stage=select snapshot requested for %s: copying at %s", self.pipeline,
                     ", ".join(map(str, taken)), self.book.merge.frontier)
            self.reads.start()
        self._take_repairs()

    def _take_repairs(self) -> None:
        """Serve the meta store's repair requests not in flight (`setl.snapshot.repair`)."""
        requests = self.meta().repair_requests(self.pipeline)
        with self.book.lock:
            self.deferred = bool(requests) and self.book.merge.frontier is None
            if self.deferred:
                return  # after a GTID start: wait for the first position
        for request in requests:
            with self.book.lock:
                if request.id in self.repairs or request.id in self.repaired:
                    continue
                if self.book.busy(request.table):
                    self.deferred = True  # a table being copied is repaired once its copy ends
                    continue
            if self.selects is not None and not self.selects(request.table.schema, request.table.table):
                log.warning("pipeline=%s stage=select table=%s repair requested but no table rule selects it; "
                            "request dropped", self.pipeline, request.table)
                self.meta().drop_repair_request(self.pipeline, request.id)
                continue
            self._serve_repair(request)

    def _serve_repair(self, request: RepairRequest) -> None:
        """Read the request's keys in one consistent snapshot and put the result in the merge at
        its position; a table without that key (keyless now, or another key), or a key type that
        cannot be looked up, is copied whole instead."""
        conn = self.connection()
        name = request.table
        try:
            plan = self.reader.plan(conn, name)
            if plan is None:
                log.warning("pipeline=%s stage=select table=%s repair requested but the table no longer exists; "
                            "request dropped", self.pipeline, name)
                self.meta().drop_repair_request(self.pipeline, request.id)
                return
            try:
                if plan.keyless or tuple(request.columns) != plan.key:
                    raise RepairRefused(f"its key is ({', '.join(plan.key)}), the request names "
                                        f"({', '.join(request.columns)})")
                keys = typed_keys(plan.types, plan.key, request.keys)
            except RepairRefused as exc:
                log.warning("pipeline=%s stage=select table=%s repair %s cannot be served by key (%s): copying the "
                            "whole table", self.pipeline, name, request.id, exc)
                self.progress.begin([name], replace=False)
                self.meta().drop_repair_request(self.pipeline, request.id)
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
                    self.book.merge.add(position, chunk)  # not a copy's: no room counted
                    self.repairs[request.id] = [None, None]
                self.book.ended(generation, rid)
        except pymysql.MySQLError as exc:
            raise SourceError(f"repair read of {self.where} failed: {exc}", pipeline=self.pipeline, stage="select",
                              table=str(name), position=self.book.merge.frontier) from exc
        finally:
            conn.close()

    def hand_repair(self, chunk: Chunk) -> Transaction:
        """Under the lock: a repair's transaction: the deletes of the keys not found, the rows read."""
        schema, table, key, position = chunk.table.schema, chunk.table.table, chunk.key, chunk.position
        changes = tuple([RowChange(Op.DELETE, schema, table, key, image, None, position) for image in chunk.deletes]
                        + [RowChange(Op.READ, schema, table, key, None, row, position) for row in chunk.rows])
        assert chunk.repair is not None
        if chunk.repair in self.repairs:
            # with no change (no key asked), any later ack may drop it
            self.repairs[chunk.repair][:] = [changes[-1], None] if changes else [None, -1]
        log.info("pipeline=%s stage=select table=%s position=%s repair %s: %d row(s) copied again, %d deleted",
                 self.pipeline, chunk.table, position, chunk.repair, len(chunk.rows), len(chunk.deletes))
        frontier = self.book.merge.frontier
        return Transaction(changes, frontier if frontier is not None else position)

    def acked(self, batch: Batch) -> None:
        """Drop the requests whose repairs `batch` (acked) or an earlier batch holds. A crash before
        a drop serves the request again after the restart: a repeat of an idempotent repair."""
        with self.book.lock:
            done = [(rid, carrier) for rid, (carrier, held) in self.repairs.items()
                    if held is not None and held <= batch.id]
        for rid, carrier in done:
            failpoints.hit("repair_acked", batch.id, task=f"{carrier.schema}.{carrier.table}" if carrier else None)
            try:
                self.meta().drop_repair_request(self.pipeline, rid)
            except Exception:  # the ack is written: the next ack drops it (or a restart repeats the repair)
                log.exception("pipeline=%s stage=termin batch=%d dropping repair request %s failed", self.pipeline,
                              batch.id, rid)
                continue
            with self.book.lock:
                self.repairs.pop(rid, None)
                self.repaired.add(rid)
            log.info("pipeline=%s stage=termin batch=%d repair %s acked", self.pipeline, batch.id, rid)

    def handed_on(self, batch: Batch) -> None:
        """Note the id of `batch` for the repairs whose change it holds (dropped once it is acked)."""
        if self.repairs:
            with self.book.lock:
                carriers = {id(held[0]): held for held in self.repairs.values()
                            if held[0] is not None and held[1] is None}
                for change in batch.changes if carriers else ():
                    held = carriers.get(id(change))
                    if held is not None and held[0] is change:
                        held[1] = batch.id
