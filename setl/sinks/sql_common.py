"""What the SQL targets (MySQL/MariaDB and PostgreSQL) share: one transaction per batch, position
and epoch kept in the target, in-place retries of transient errors, and error context.

A dialect subclass says how to connect, how to write rows and DDL, and which driver errors are
transient; `SqlLoad.load` does the rest.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from setl.errors import LoadError, SetlError
from setl.model import Batch, Change, Op, Position, RowChange
from setl.routing import flat_name
from setl.sinks.merge import TableChanges
from setl.sinks.prepared import PreparedBatches
from setl.sinks.sql_failures import LoadFailures, TargetTableMissing
from setl.sinks.sql_fence import TargetFence
from setl.sinks.sql_pool import ConnectionPool
from setl.sinks.sql_positions import FenceBusy, PositionStore
from setl.sinks.sql_segments import DdlStep, Segment, SegmentPlanner
from setl.sinks.sql_staging import StagedCopies, StagingDialect
from setl.stages.load import Load, LoadCapabilities

log = logging.getLogger(__name__)

C = TypeVar("C")  # a driver connection
T = TypeVar("T")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in consecutive slices of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def group_by_columns(images: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Row images grouped by their column lists, so each group is one multi-row statement."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for image in images:
        groups.setdefault(tuple(image), []).append(image)
    return groups


def reads_only(batch: Batch) -> bool:
    """Whether every change of `batch` is a snapshot read (`Op.READ`): a chunk, whose rows the
    target is not expected to hold yet (what a sink's straight bulk path may assume first)."""
    read = Op.READ
    return all(type(c) is RowChange and c.op is read for c in batch.changes)


def insert_runs(sequence: Sequence[RowChange]) -> Iterator[tuple[RowChange | None, list[Mapping[str, Any]]]]:
    """A keyless table's changes in order, each run of changes that only add a row (inserts and
    snapshot reads) gathered: ``(None, after-images)`` for such a run, ``(change, [])`` for any
    other change. A run can go to the target as one multi-row statement: rows of a table without
    a key have no order the target keeps, so only the runs' order with the other changes matters."""
    run: list[Mapping[str, Any]] = []
    for change in sequence:
        if change.before is None and change.after is not None:
            run.append(change.after)
            continue
        if run:
            yield None, run
            run = []
        yield change, []
    if run:
        yield None, run


def not_yet_applied(batch: Batch, names: Mapping[tuple[str, str], str],
                    tables: Mapping[str, tuple[Position | None, Position | None]]) -> Sequence[Change]:
    """The changes of a per-table part `batch` its tables do not hold yet. `names` maps each
    (schema, table) of the batch to its target table; `tables` gives the (pipeline position,
    table position) recorded for the target tables to check (the others are kept whole). A row
    change is in already when its position is after the pipeline's recorded position and at or
    before its table's: an earlier part of a discarded batch committed it. A snapshot row (READ)
    is the table's state at its place in the stream: never skipped."""
    keep: list[Change] = []
    for change in batch.changes:
        pipeline_at, table_at = tables.get(names[(change.schema, change.table or "")], (None, None))
        if (table_at is not None and isinstance(change, RowChange) and change.position is not None
                and change.op is not Op.READ and change.position <= table_at
                and (pipeline_at is None or change.position > pipeline_at)):
            continue
        keep.append(change)
    return keep


#: Names this process in the target's session registry, so a fence never kills its own sessions.
PROCESS_TOKEN = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class SqlLoad(Load, Generic[C]):
    """Applies each batch in one target transaction: per table, the merged deletes, then
    multi-row upserts of the full after-images, then an upsert of the batch's end position (with
    its batch id and epoch) into the target's own position table, and COMMIT.

    * `committed()` reads that position back (``row`` included, for a batch that ends inside a
      transaction delivered in pieces), so a target that committed a batch whose ack was lost is
      never re-read from before it.
    * Fencing (`TargetFence`, on the ``<position_table>_fence`` and ``_session`` tables): every
      batch or part transaction holds the fence row shared to COMMIT and refuses a batch of an
      older epoch; the first batch of a newer epoch kills the other processes' sessions of the
      pipeline and raises the fence. `committed_epoch()` reads the stored epoch back: a scheduler
      takes its first epoch above it, so a meta store rebuilt with fresh epochs (or a switch from
      SQLite to ZooKeeper) is not refused.
    * Per-table parts (``load.mode: per_table``): each part runs in its own transaction on its
      own connection from a pool of at most `connections` (the one that loaded its table last,
      when idle), fenced like a batch (its table's position is read with the fence), and records the
      part's end position for its target table (``<position_table>_table``, never moved back) in
      the same transaction. A part skips every change whose `RowChange.position` is after the pipeline's
      recorded position and at or before its table's recorded one: those are in already, so a
      replay (whatever the batches it is cut into) applies each change to each table once, tables
      without a primary key included. `mark_loaded` records the pipeline position when every part
      is in.
    * Transient errors (deadlock, lock wait timeout, serialization failure, lost or refused
      connection, server shutting down) are retried in place (`LoadFailures`) up to
      `max_attempts` times: the connection is dropped and the whole transaction replayed, which
      is safe because the transaction either committed or did not, and replays are idempotent.
      When the attempts run out a `TransientLoadError` is raised; any other failure is a
      `LoadError`. Both name the pipeline, table, batch id and position.
    * Snapshot reads (`Op.READ`, after-image only) are "insert, or replace the row with the same
      key": merged as upserts, so a chunk applied twice leaves the target as once, a read replaces
      what an insert or update of the same key earlier in the batch left, and a later delete
      removes it. Runs of reads (and of inserts) go in bulk: multi-row statements, or the
      dialect's bulk path (PostgreSQL ``COPY``), never row by row.
    * Tables without a primary key cannot be merged: each change is applied as it comes (an
      update or delete removes one row equal to the before-image in every column, NULLs equal to
      NULLs; an insert, read or update then inserts the after-image; consecutive inserts and
      reads go as one multi-row insert). Each change is applied once all
      the same: the batch's position commits in its transaction, and a rollback or a restart
      replays from the position the target holds when it is past the ack (`committed`); a
      warning is logged once per table.
    * DDL (`ddl`, the pipeline's ``pipeline.ddl``): ``apply`` runs each DDL in batch order with
      the rows around it (see the dialect for how, and how a replay is recognised); ``skip``
      logs it and applies the rest of the batch; ``fail`` refuses the batch with a `LoadError`
      naming the table, position and statement, so the pipeline pauses before it. Statements
      that are not table DDL (CREATE DATABASE, GRANT, views, ...) are logged and not applied.
    * Re-copies (`StagedCopies`, `setl.sinks.sql_staging`): a snapshot's TRUNCATE of a table that
      holds rows copies into a staging table beside it instead (recorded in the target, in
      ``<position_table>_copy``); the table's row changes go there until the copy's end marker
      (`DdlChange.copy_end`), whose batch replaces the table's rows by the staging table's in its
      one transaction. Readers of the table see its old rows until that COMMIT.
    """

    dialect = "sql"
    capabilities = LoadCapabilities(per_table=True, stores_position=True, copy_end=True)

    def __init__(
        self,
        config: Any,
        *,
        pipeline: str,
        ddl: str = "apply",
        position_schema: str = "setl",
        position_table: str = "setl_position",
        chunk_rows: int = 500,
        max_attempts: int = 5,
        initial_backoff: float = 0.1,
        max_backoff: float = 5.0,
        connections: int = 8,
        fence_timeout: float = 60.0,
        fence_lock_timeout: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be at least 1")
        if connections < 1:
            raise ValueError("connections must be at least 1")
        if ddl not in ("apply", "skip", "fail"):
            raise ValueError(f"ddl must be apply, skip or fail, not {ddl!r}")
        self.config = config
        self.pipeline = pipeline
        self.ddl = ddl
        self.position_schema = position_schema
        self.position_table = position_table
        self.chunk_rows = chunk_rows
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.connections = connections
        self.fence_timeout = fence_timeout
        self.fence_lock_timeout = fence_lock_timeout
        self.failures = LoadFailures(pipeline=pipeline, dialect=self.dialect, classify=self._classify,
                                     describe=self._describe, max_attempts=max_attempts,
                                     initial_backoff=initial_backoff, max_backoff=max_backoff, sleep=sleep)
        self._lock = threading.Lock()  # guards the table setup
        self._local = threading.local()  # per thread: the table written
        self._position_table_ready = False
        self.positions = self._make_positions()
        self.fence = TargetFence(self.positions, commit=self._commit, rollback=self._rollback,
                                 context=self._context, dialect=self.dialect, timeout=fence_timeout,
                                 on_table=self._name_table)
        self.planner = SegmentPlanner(pipeline, ddl, self._context)
        self.staged: StagedCopies[C] = StagedCopies(pipeline, self.positions, self._make_staging())
        self.pool: ConnectionPool[C] = ConnectionPool(connections, self._open_connection, self._close)
        self._prepared: PreparedBatches[Any] = PreparedBatches()  # what a dialect's `prepare` worked out

    @classmethod
    def from_config(cls, config: Any, *, pipeline: str, **options: Any) -> "SqlLoad[C]":
        return cls(config, pipeline=pipeline, **options)

    @property
    def _table(self) -> str | None:
        """The table the calling thread is writing, for error messages."""
        return getattr(self._local, "table", None)

    @_table.setter
    def _table(self, table: str | None) -> None:
        self._local.table = table

    def _name_table(self, table: str | None) -> None:
        self._table = table

    @property
    def token(self) -> str:
        """Names this process in the target's session table (`PROCESS_TOKEN`; a test may pose as another)."""
        return self.positions.token

    @token.setter
    def token(self, token: str) -> None:
        self.positions.token = token

    # -- what a dialect provides

    def _make_positions(self) -> PositionStore[C]:
        """The dialect's store of the position, fence, session and identity tables."""
        raise NotImplementedError

    def _make_staging(self) -> StagingDialect[C]:
        """The dialect's handling of staging tables (re-copies, `setl.sinks.sql_staging`)."""
        raise NotImplementedError

    def _connect(self) -> C:
        raise NotImplementedError

    def _disconnect(self, conn: C) -> None:
        raise NotImplementedError

    def _commit(self, conn: C) -> None:
        raise NotImplementedError

    def _rollback(self, conn: C) -> None:
        raise NotImplementedError

    def _apply_keyed(self, conn: C, table: TableChanges) -> None:
        raise NotImplementedError

    def _apply_sequence(self, conn: C, table: TableChanges) -> None:
        raise NotImplementedError

    def _apply_ddl(self, conn: C, batch: Batch, step: DdlStep) -> None:
        """Run one table DDL of `batch` in its place among the batch's rows."""
        raise NotImplementedError

    def _classify(self, exc: BaseException) -> type[LoadError] | type[TargetTableMissing] | None:
        """TransientLoadError for errors worth a replay, TargetTableMissing for a missing table,
        RefusedLoadError for rows the target refuses whatever the retry, LoadError for other driver
        errors, None for errors that are not the driver's."""
        raise NotImplementedError

    def _describe(self, exc: BaseException) -> str:
        """One line for a driver error."""
        return f"{type(exc).__name__}: {exc}"

    # -- the Load contract

    def open(self) -> None:
        """Connect and create the position tables if needed. A transient failure is raised at once
        (a `TransientLoadError`): the node retries the start with its backoff, shown by `setl
        status` as ``retrying`` with the cause, and a stop ends the wait."""
        self._with_connection(lambda conn: None, None)

    def load(self, batch: Batch) -> None:
        """Apply `batch` in one transaction with its position (see the class docstring); what
        `prepare` kept for it is dropped then, loaded or not."""
        try:
            segments = self._segments(batch)
            self._retrying(lambda: self._with_connection(
                lambda conn: self._apply_batch(conn, batch, segments), batch), batch)
        finally:
            self._prepared.drop(batch)

    def load_part(self, batch: Batch) -> None:
        """One target table's share of a batch (load.mode per_table), in its own transaction on
        its own connection: fenced, skipping the changes its table holds already, and recording
        the table's position (see the class docstring)."""
        first = flat_name(batch.changes[0].schema, batch.changes[0].table or "") if batch.changes else None
        self._retrying(lambda: self._with_connection(lambda conn: self._apply_part(conn, batch), batch, first),
                       batch)

    def mark_loaded(self, batch: Batch) -> None:
        """Every part of `batch` is in: record its position, fenced (a transaction with no rows)."""
        self.load(batch.replace(()))

    def _segments(self, batch: Batch) -> list[Segment]:
        """The merged row changes of each run between DDLs, and the DDLs to apply, in batch order
        (`SegmentPlanner`); a dialect narrows the batch first."""
        return self.planner.segments(batch)

    def committed(self) -> Position | None:
        """The end position of the last batch this pipeline committed in the target.

        When the target's fence is not this sink's own (a sink that has not loaded yet, or one
        whose pipeline another process has written since: what a new leader meets at start), it
        takes the fence first, one epoch above the stored one: it kills the other processes'
        sessions of the pipeline and raises the fence row, so no deposed writer can commit after
        the position is read. The scheduler then takes its epoch above `committed_epoch()`, which
        reads it back.
        """
        def read(conn: C) -> tuple[Position | None, int | None]:
            if not self.fence.epoch or (self.positions.read_position(conn)[1] or 0) != self.fence.epoch:
                self.fence.take(conn, None)
                self.staged.sweep(conn, self._commit)  # staging tables an earlier leader left behind
            return self.positions.read_position(conn)

        return self._retrying(lambda: self._with_connection(read, None), None)[0]

    def identity(self) -> dict[str, Any] | None:
        """The identity stored next to the pipeline's position (`setl.pipeline.identity`); None: none stored."""
        text = self._retrying(lambda: self._with_connection(self.positions.read_identity, None), None)
        return json.loads(text) if text else None

    def server_identity(self) -> dict[str, Any]:
        """Which target server this is (`PositionStore.read_server`), for the pipeline's identity."""
        return self._retrying(lambda: self._with_connection(self.positions.read_server, None), None)

    def copies_under_way(self) -> list[str]:
        """The target tables (``schema.table``) being re-copied into a staging table (`setl.sinks.sql_staging`)."""
        found = self._retrying(lambda: self._with_connection(self.positions.read_copies, None), None)
        return sorted(f"{schema}.{table}" for schema, table in found)

    def save_identity(self, identity: dict[str, Any]) -> None:
        """Store `identity` next to the pipeline's position (replacing the one stored)."""
        text = json.dumps(identity, sort_keys=True)
        self._retrying(lambda: self._with_connection(
            lambda conn: self.positions.write_identity(conn, text), None), None)

    def committed_epoch(self) -> int | None:
        """The epoch of the last batch this pipeline committed in the target (older ones are refused)."""
        return self._retrying(lambda: self._with_connection(self.positions.read_position, None), None)[1]

    def close(self) -> None:
        self.pool.close()

    # -- the machinery

    def _with_connection(self, work: Callable[[C], T], batch: Batch | None, table: str | None = None) -> T:
        """Run `work` on a pooled connection of this thread's own (`ConnectionPool.run`), guarded
        (`_guarded`); re-entered from inside work, on the connection this thread holds."""
        held = self.pool.held
        if held is not None:
            return work(held)
        return self.pool.run(lambda conn: self._guarded(conn, lambda: work(conn), batch), batch, table)

    def _open_connection(self, batch: Batch | None) -> C:
        """A new connection, prepared (`_prepare`); a connect error as a setl error naming `batch`."""
        try:
            conn = self._connect()
        except Exception as exc:
            raise self.failures.connect_failed(exc, batch, self.config) from exc
        try:
            self._guarded(conn, lambda: self._prepare(conn), batch)
        except BaseException:
            self._close(conn)
            raise
        return conn

    def _prepare(self, conn: C) -> None:
        """Create the position tables once per sink, then register the new connection."""
        with self._lock:
            ready = self._position_table_ready
        if not ready:
            self.positions.create_tables(conn)
            with self._lock:
                self._position_table_ready = True
        self.positions.register(conn, self.fence.epoch)

    def _close(self, conn: C) -> None:
        try:
            self._disconnect(conn)
        except Exception:  # the connection is likely dead already; nothing to save
            log.debug("closing a %s connection failed", self.dialect, exc_info=True)

    def _apply_batch(self, conn: C, batch: Batch, segments: list[Segment]) -> None:
        self.fence.check(conn, batch)
        ddl = any(isinstance(segment, DdlStep) for segment in segments)
        if ddl:  # a batch holding a DDL runs alone: it may start or end a re-copy
            self.staged.forget()
        self._apply_segments(conn, batch, segments)
        self.positions.record_and_commit(conn, batch, (), pipeline=True)
        self.staged.after_commit(conn)
        if ddl:
            self.staged.forget()

    def _apply_segments(self, conn: C, batch: Batch, segments: list[Segment]) -> None:
        for segment in segments:
            if isinstance(segment, list):
                for table in segment:
                    self._table = f"{table.schema}.{table.table}"
                    table = self.staged.redirect(conn, table)  # a table being re-copied: its staging table
                    if table.primary_key:
                        self._apply_keyed(conn, table)
                    else:
                        self._apply_sequence(conn, table)
            elif self._apply_staged(conn, batch, segment):
                continue
            else:
                self._table = segment.change.qualified_table
                self._apply_ddl(conn, batch, segment)
                if self.staged.altered(conn, segment.change, segment.statement):
                    self._staging_ddl_done(conn, batch)
                log.info("pipeline=%s stage=load batch=%d table=%s position=%s DDL applied: %s", self.pipeline,
                         batch.id, segment.change.qualified_table, segment.change.position or batch.end,
                         " ".join(segment.change.statement.split()))
        self._table = None

    def _apply_staged(self, conn: C, batch: Batch, step: DdlStep) -> bool:
        """A re-copy's start (a snapshot TRUNCATE of a table holding rows) or end (`copy_end`), applied
        (`StagedCopies`); False for any other DDL, and for a TRUNCATE to apply as it is."""
        change = step.change
        self._table = change.qualified_table
        if change.copy_end:
            self.staged.end(conn, batch, change)
        elif not (change.snapshot and step.statement.kind == "truncate_table"
                  and self.staged.start(conn, batch, change)):
            return False
        self._staging_ddl_done(conn, batch)
        return True

    def _staging_ddl_done(self, conn: C, batch: Batch) -> None:
        """After a re-copy's staging table was created or dropped: a dialect whose DDL commits takes
        the fence again, as after any DDL."""
        if not self.staged.dialect.transactional_ddl:
            self.fence.check(conn, batch)

    def _apply_part(self, conn: C, batch: Batch) -> None:
        """One part: fence, drop what each of its tables holds already, apply, record, COMMIT.

        Its round trips besides the rows': the fence and its table's position read together
        (`PositionStore.fence_and_table_position`), then the table's position written and the
        COMMIT (`PositionStore.record_and_commit`, one round trip on MariaDB). A part of more than
        one table reads the others' positions apart."""
        # unambiguous with dots in names; in the order the part names them
        names = {ident: flat_name(*ident) for ident in dict.fromkeys((c.schema, c.table or "") for c in batch.changes)}
        first = next(iter(names.values()), None)
        first_at = self.fence.check(conn, batch, first)
        tables: dict[str, tuple[Position | None, Position | None]] = {}
        check: dict[str, bool] = {}  # may this table hold some of the batch's changes already?
        for table in names.values():
            self._table = table
            table_at = first_at if table == first else self.positions.table_position_locked(conn, table)
            # Every change of the batch lies after its start: a table at or before the start
            # holds none of them, and its changes need no comparison each (nor the pipeline's
            # position, read only then: a round trip less per part in the common case).
            check[table] = table_at is not None and table_at > batch.start
            tables[table] = (self.positions.pipeline_position(conn) if check[table] else None, table_at)
        self._table = None
        checked = {table: at for table, at in tables.items() if check[table]}
        keep = not_yet_applied(batch, names, checked) if checked else batch.changes
        if len(keep) < len(batch.changes):
            log.info("pipeline=%s stage=load batch=%s: %d of %d changes of %s are in the target "
                     "already; skipped", self.pipeline, batch.id, len(batch.changes) - len(keep),
                     len(batch.changes), ", ".join(tables))
        if keep is not batch.changes:
            batch = batch.replace(tuple(keep))
        self._apply_segments(conn, batch, self._segments(batch))
        # Never backwards: after a rollback, a replay's first batches end before what parts of
        # the discarded batches after them committed already.
        moved = [table for table, (_, table_at) in tables.items() if table_at is None or batch.end > table_at]
        self.positions.record_and_commit(conn, batch, moved, pipeline=False)

    def _guarded(self, conn: C, work: Callable[[], T], batch: Batch | None) -> T:
        """Run `work` on `conn`; on any failure roll back and raise it as a setl error."""
        self._table = None
        try:
            return work()
        except BaseException as exc:
            self.staged.discard()
            try:
                self._rollback(conn)
            except Exception:  # noqa: BLE001 - a dead connection cannot roll back; the server already did
                self.pool.mark_broken()
            if isinstance(exc, SetlError) or not isinstance(exc, Exception):
                raise
            raise self.failures.translate(exc, batch, self._table) from exc

    def _context(self, batch: Batch | None, table: str | None = None) -> dict[str, Any]:
        return self.failures.context(batch, table)

    def _retrying(self, fn: Callable[[], T], batch: Batch | None) -> T:
        return self.failures.retrying(fn, batch)


__all__ = ["PROCESS_TOKEN", "DdlStep", "FenceBusy", "SqlLoad", "TargetTableMissing", "chunks", "group_by_columns",
           "insert_runs", "reads_only"]
