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

import attrs

from setl.ddl import Statement, parse
from setl.errors import LoadError, RefusedLoadError, SetlError, TransientLoadError
from setl.model import Batch, Change, DdlChange, Op, Position, RowChange
from setl.retry import call_with_retries
from setl.routing import flat_name
from setl.sinks.merge import TableChanges, merge
from setl.sinks.prepared import PreparedBatches
from setl.stages.load import Load, LoadCapabilities
from setl.tls import tls_failure

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


@attrs.frozen
class DdlStep:
    """A DDL to apply: the `index`-th change of its batch, and its parse."""

    index: int
    change: DdlChange
    statement: Statement


#: What `SqlLoad` applies in order: the merged row changes between DDLs, or one DDL.
Segment = list[TableChanges] | DdlStep


class TargetTableMissing(Exception):
    """Raised by a dialect's error classifier: the statement named a table that does not exist."""


#: Names this process in the target's session registry, so a fence never kills its own sessions.
PROCESS_TOKEN = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class FenceBusy(Exception):
    """Raised by a dialect's `_raise_fence`: the fence row stayed locked past the short lock timeout."""


class SqlLoad(Load, Generic[C]):
    """Applies each batch in one target transaction: per table, the merged deletes, then
    multi-row upserts of the full after-images, then an upsert of the batch's end position (with
    its batch id and epoch) into the target's own position table, and COMMIT.

    * `committed()` reads that position back (``row`` included, for a batch that ends inside a
      transaction delivered in pieces), so a target that committed a batch whose ack was lost is
      never re-read from before it.
    * Fencing. Every connection registers itself (server session id, this process's token, the
      pipeline) in the ``<position_table>_session`` table when it connects, in its own committed
      transaction, before it writes anything. The pipeline's fence row (``<position_table>_fence``)
      holds the highest epoch that took the target. Every batch or part transaction first reads it
      under a shared lock and refuses a batch of an older epoch with a `LoadError`; the lock is
      held to COMMIT, so the fence cannot move under a running transaction. The first batch of an
      epoch higher than any this sink has fenced takes the fence: it kills every registered
      session of the pipeline that belongs to another process (MariaDB ``KILL CONNECTION``,
      PostgreSQL ``pg_terminate_backend``), then raises the fence row's epoch with a short lock
      timeout, killing and retrying until it holds (at most `fence_timeout` seconds). A killed
      session's transaction is rolled back by the server, so a deposed leader frozen at any point
      of its transaction (GC, SIGSTOP, VM pause) never commits after the takeover, and the new
      leader does not wait for the freeze to end. The account needs the right to kill those
      sessions (its own sessions need none; otherwise MariaDB ``CONNECTION ADMIN``/``SUPER``,
      PostgreSQL membership of the same role or ``pg_signal_backend``). `committed_epoch()` reads
      the stored epoch back: a scheduler takes its first epoch above it, so a meta store rebuilt
      with fresh epochs (or a switch from SQLite to ZooKeeper) is not refused.
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
      connection, server shutting down) are retried in place up to `max_attempts` times: the
      connection is dropped and the whole transaction replayed, which is safe because the
      transaction either committed or did not, and replays are idempotent. When the attempts run
      out a `TransientLoadError` is raised; any other failure is a `LoadError`. Both name the
      pipeline, table, batch id and position.
    * Snapshot reads (`Op.READ`, after-image only) are "insert, or replace the row with the same
      key": merged as upserts, so a chunk applied twice leaves the target as once, a read replaces
      what an insert or update of the same key earlier in the batch left, and a later delete
      removes it. Runs of reads (and of inserts) go in bulk: multi-row statements, or the
      dialect's bulk path (PostgreSQL ``COPY``), never row by row.
    * Tables without a primary key cannot be merged: each change is applied as it comes (an
      update or delete removes one row equal to the before-image in every column, NULLs equal to
      NULLs; an insert, read or update then inserts the after-image; consecutive inserts and
      reads go as one multi-row insert). In ``ordered`` mode a batch
      replayed after it committed (its ack was lost) inserts those rows again; a warning is
      logged once per table.
    * DDL (`ddl`, the pipeline's ``pipeline.ddl``): ``apply`` runs each DDL in batch order with
      the rows around it (see the dialect for how, and how a replay is recognised); ``skip``
      logs it and applies the rest of the batch; ``fail`` refuses the batch with a `LoadError`
      naming the table, position and statement, so the pipeline pauses before it. Statements
      that are not table DDL (CREATE DATABASE, GRANT, views, ...) are logged and not applied.
    """

    dialect = "sql"
    capabilities = LoadCapabilities(per_table=True, stores_position=True)

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
        self.token = PROCESS_TOKEN
        self._sleep = sleep
        self._lock = threading.Lock()  # guards the pool and the table setup
        self._fence_lock = threading.Lock()  # one thread takes the fence for an epoch
        self._slots = threading.BoundedSemaphore(connections)
        self._idle: list[C] = []
        self._affinity: dict[str, C] = {}  # target table -> the connection that last loaded a part of it
        self._local = threading.local()  # per thread: the connection in use, the table written
        self._fenced_epoch = 0  # the highest epoch this sink has taken the fence for
        self._position_table_ready = False
        self._warned_unkeyed: set[tuple[str, str]] = set()
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

    # -- what a dialect provides

    def _connect(self) -> C:
        raise NotImplementedError

    def _disconnect(self, conn: C) -> None:
        raise NotImplementedError

    def _commit(self, conn: C) -> None:
        raise NotImplementedError

    def _rollback(self, conn: C) -> None:
        raise NotImplementedError

    def _create_position_table(self, conn: C) -> None:
        """Create (or migrate) the position, fence, session and per-table position tables, and commit."""
        raise NotImplementedError

    def _register(self, conn: C) -> None:
        """Record `conn`'s server session for this pipeline and process in the session table; commit."""
        raise NotImplementedError

    def _kill_others(self, conn: C) -> int:
        """Kill every registered live session of the pipeline not of this process, forget the dead
        ones, commit; the number killed. Raises `LoadError` when the account may not kill them."""
        raise NotImplementedError

    def _raise_fence(self, conn: C, epoch: int | None) -> int:
        """In a transaction with a short lock timeout (`fence_lock_timeout`): lock the pipeline's
        fence row; if neither it nor the position row holds an epoch above `epoch`, store `epoch`
        (None: one above the highest stored). Commit and return the highest epoch found, or the
        one stored. `FenceBusy` if the lock timed out."""
        raise NotImplementedError

    def _shared_epoch(self, conn: C) -> int | None:
        """In the open transaction: the fence row's epoch, read under a lock shared to COMMIT."""
        raise NotImplementedError

    def _read_position(self, conn: C) -> tuple[Position | None, int | None]:
        """The stored position and epoch of the pipeline, outside any batch transaction."""
        raise NotImplementedError

    def _write_position(self, conn: C, batch: Batch) -> None:
        raise NotImplementedError

    def _read_identity(self, conn: C) -> str | None:
        """The pipeline's identity record (JSON text) in ``<position_table>_identity``, committed."""
        raise NotImplementedError

    def _write_identity(self, conn: C, text: str) -> None:
        """Store the pipeline's identity record (JSON text) and commit."""
        raise NotImplementedError

    def _table_position_locked(self, conn: C, table: str) -> Position | None:
        """In the open transaction: `table`'s recorded position, read under a lock held to COMMIT
        (None when there is none)."""
        raise NotImplementedError

    def _fence_and_table_position(self, conn: C, table: str) -> tuple[int | None, Position | None]:
        """In the open transaction, first the fence row's epoch under a lock shared to COMMIT (as
        `_shared_epoch`), then `table`'s recorded position under a lock held to COMMIT (as
        `_table_position_locked`). A dialect sends both in one round trip where it can; an error
        in either is raised."""
        return self._shared_epoch(conn), self._table_position_locked(conn, table)

    def _pipeline_position(self, conn: C) -> Position | None:
        """In the open transaction: the pipeline's recorded position (None when there is none)."""
        raise NotImplementedError

    def _write_table_position(self, conn: C, table: str, batch: Batch) -> None:
        """In the open transaction: record `batch.end` as `table`'s position."""
        raise NotImplementedError

    def _record_and_commit(self, conn: C, batch: Batch, tables: Sequence[str], pipeline: bool) -> None:
        """Record `batch.end` as the position of each of `tables` (`_write_table_position`), and as
        the pipeline's if `pipeline` (`_write_position`), then COMMIT. A dialect sends them in one
        round trip where it can, provided that a write that fails stops the rest (COMMIT
        included) and raises: the caller then rolls the transaction back."""
        for table in tables:
            self._table = table
            self._write_table_position(conn, table, batch)
        self._table = None
        if pipeline:
            self._write_position(conn, batch)
        self._commit(conn)

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
        """Connect and create the position tables if needed. Retries transient errors."""
        self._retrying(lambda: self._with_connection(lambda conn: None, None), None)

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
        """The merged row changes of each run between DDLs, and the DDLs to apply, in batch order."""
        segments: list[Segment] = []
        run: list[RowChange] = []
        for index, change in enumerate(batch.changes):
            if not isinstance(change, DdlChange):
                run.append(change)
                continue
            position = change.position or batch.end
            statement = parse(change.statement)
            if change.snapshot and statement.kind == "truncate_table":
                pass  # a snapshot's TRUNCATE comes with the copy that replaces the table: always applied
            elif self.ddl == "fail":
                raise RefusedLoadError(f"DDL refused (pipeline.ddl is fail): {change.statement}",
                                **{**self._context(batch, table=change.qualified_table), "position": position})
            elif self.ddl == "skip" or statement.kind == "other":
                log.warning("pipeline=%s stage=load table=%s position=%s DDL not applied (%s): %s",
                            self.pipeline, change.qualified_table, position,
                            "pipeline.ddl is skip" if self.ddl == "skip" else "not a table DDL",
                            change.statement)
                continue
            if run:
                segments.append(merge(run))
                run = []
            segments.append(DdlStep(index, change, statement))
        if run:
            segments.append(merge(run))
        for segment in segments:
            if isinstance(segment, list):
                for table in segment:
                    self._warn_unkeyed(table)
        return segments

    def _warn_unkeyed(self, table: TableChanges) -> None:
        ident = (table.schema, table.table)
        if table.sequence and table.sequence[0].sequence is not None:
            return  # a sequence's state rows: written as its whole state, never matched row by row
        if not table.primary_key and ident not in self._warned_unkeyed:
            self._warned_unkeyed.add(ident)
            log.warning("pipeline %s: table %s.%s has no primary key; a change is applied to one row "
                        "equal to its before-image in every column, and a batch replayed after it "
                        "committed inserts its rows again", self.pipeline, *ident)

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
            if not self._fenced_epoch or (self._read_position(conn)[1] or 0) != self._fenced_epoch:
                self._take_fence(conn, None)
            return self._read_position(conn)

        return self._retrying(lambda: self._with_connection(read, None), None)[0]

    def identity(self) -> dict[str, Any] | None:
        """The identity stored next to the pipeline's position (`setl.pipeline.identity`): the source
        server and the rules fingerprint of the run that wrote it; None when none was stored (a
        position written before identities were)."""
        text = self._retrying(lambda: self._with_connection(self._read_identity, None), None)
        return json.loads(text) if text else None

    def save_identity(self, identity: dict[str, Any]) -> None:
        """Store `identity` next to the pipeline's position (replacing the one stored)."""
        text = json.dumps(identity, sort_keys=True)
        self._retrying(lambda: self._with_connection(lambda conn: self._write_identity(conn, text), None), None)

    def committed_epoch(self) -> int | None:
        """The epoch of the last batch this pipeline committed in the target (older ones are refused)."""
        return self._retrying(lambda: self._with_connection(self._read_position, None), None)[1]

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._affinity.clear()
        for conn in idle:
            self._close(conn)

    # -- the machinery

    def _with_connection(self, work: Callable[[C], T], batch: Batch | None, table: str | None = None) -> T:
        """Run `work` on a pooled connection of this thread's own (at most `connections` at once).
        The connection goes back to the pool unless it failed in a way that may have broken it.

        With a `table` (a per-table part), the connection that loaded that table last is taken
        when it is idle: each table's statements then go to few connections, which a server
        keeping prepared statements per session (PostgreSQL) parses and plans once each, not
        once on every connection of the pool."""
        held = getattr(self._local, "conn", None)
        if held is not None:  # re-entered from inside work on this thread
            return work(held)
        with self._slots:
            conn = self._checkout(batch, table)
            self._local.conn = conn
            healthy = False
            try:
                result = self._guarded(conn, lambda: work(conn), batch)
                healthy = True
                return result
            except LoadError as exc:
                healthy = not isinstance(exc, TransientLoadError) and not getattr(self._local, "broken", False)
                raise
            finally:
                self._local.conn = None
                self._local.broken = False
                if healthy:
                    with self._lock:
                        self._idle.append(conn)
                        if table is not None:
                            self._affinity[table] = conn
                else:
                    with self._lock:
                        for name in [n for n, c in self._affinity.items() if c is conn]:
                            del self._affinity[name]
                    self._close(conn)

    def _checkout(self, batch: Batch | None, table: str | None = None) -> C:
        """An idle connection (for a `table`: the one that loaded it last, else one no table has
        loaded last, else any), or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(self._pick(table))
        try:
            conn = self._connect()
        except Exception as exc:
            cause = tls_failure(exc)
            if cause is not None:  # permanent (setl.retry.classify): no reconnecting
                host = f"{getattr(self.config, 'host', '?')}:{getattr(self.config, 'port', '?')}"
                raise LoadError(f"cannot connect to the {self.dialect} target {host} over TLS: {cause} "
                                "(see target.ssl)", **self._context(batch)) from exc
            kind = TransientLoadError if self._classify(exc) is TransientLoadError else LoadError
            raise kind(f"cannot connect to the {self.dialect} target: {self._describe(exc)}",
                       **self._context(batch)) from exc
        try:
            self._guarded(conn, lambda: self._prepare(conn), batch)
        except BaseException:
            self._close(conn)
            raise
        return conn

    def _pick(self, table: str | None) -> int:
        """Under the lock: the index in the non-empty `_idle` of the connection to check out."""
        if table is None:
            return -1
        mine = self._affinity.get(table)
        claimed = {id(c) for c in self._affinity.values()}
        spare = -1
        for index in range(len(self._idle) - 1, -1, -1):
            conn = self._idle[index]
            if conn is mine:
                return index
            if spare == -1 and id(conn) not in claimed:
                spare = index
        return spare

    def _prepare(self, conn: C) -> None:
        """Create the position tables once per sink, then register the new connection."""
        with self._lock:
            ready = self._position_table_ready
        if not ready:
            self._create_position_table(conn)
            with self._lock:
                self._position_table_ready = True
        self._register(conn)

    def _close(self, conn: C) -> None:
        try:
            self._disconnect(conn)
        except Exception:  # the connection is likely dead already; nothing to save
            log.debug("closing a %s connection failed", self.dialect, exc_info=True)

    def _apply_batch(self, conn: C, batch: Batch, segments: list[Segment]) -> None:
        self._fence(conn, batch)
        self._apply_segments(conn, batch, segments)
        self._record_and_commit(conn, batch, (), pipeline=True)

    def _apply_segments(self, conn: C, batch: Batch, segments: list[Segment]) -> None:
        for segment in segments:
            if isinstance(segment, list):
                for table in segment:
                    self._table = f"{table.schema}.{table.table}"
                    if table.primary_key:
                        self._apply_keyed(conn, table)
                    else:
                        self._apply_sequence(conn, table)
            else:
                self._table = segment.change.qualified_table
                self._apply_ddl(conn, batch, segment)
                log.info("pipeline=%s stage=load batch=%d table=%s position=%s DDL applied: %s", self.pipeline,
                         batch.id, segment.change.qualified_table, segment.change.position or batch.end,
                         " ".join(segment.change.statement.split()))
        self._table = None

    def _apply_part(self, conn: C, batch: Batch) -> None:
        """One part: fence, drop what each of its tables holds already, apply, record, COMMIT.

        Its round trips besides the rows': the fence and its table's position read together
        (`_fence_and_table_position`), then the table's position written and the COMMIT
        (`_record_and_commit`, one round trip on MariaDB). A part of more than one table reads
        the others' positions apart."""
        # unambiguous with dots in names; in the order the part names them
        names = {ident: flat_name(*ident) for ident in dict.fromkeys((c.schema, c.table or "") for c in batch.changes)}
        first = next(iter(names.values()), None)
        first_at = self._fence(conn, batch, first)
        tables: dict[str, tuple[Position | None, Position | None]] = {}
        check: dict[str, bool] = {}  # may this table hold some of the batch's changes already?
        for table in names.values():
            self._table = table
            table_at = first_at if table == first else self._table_position_locked(conn, table)
            # Every change of the batch lies after its start: a table at or before the start
            # holds none of them, and its changes need no comparison each (nor the pipeline's
            # position, read only then: a round trip less per part in the common case).
            check[table] = table_at is not None and table_at > batch.start
            tables[table] = (self._pipeline_position(conn) if check[table] else None, table_at)
        self._table = None
        keep: Sequence[Change] = batch.changes
        if any(check.values()):
            keep = []
            for change in batch.changes:
                table = names[(change.schema, change.table or "")]
                # A snapshot row (READ) is the table's state at its place in the stream: never skipped.
                if (check[table] and isinstance(change, RowChange) and change.position is not None
                        and change.op is not Op.READ):
                    pipeline_at, table_at = tables[table]
                    if (table_at is not None and change.position <= table_at
                            and (pipeline_at is None or change.position > pipeline_at)):
                        continue  # this table committed it in an earlier part
                keep.append(change)
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
        self._record_and_commit(conn, batch, moved, pipeline=False)

    def _fence(self, conn: C, batch: Batch, table: str | None = None) -> Position | None:
        """In the open transaction: take the fence first if `batch` has a newer epoch than any
        taken, then hold the fence row shared to COMMIT and refuse a batch of an older epoch.
        With a `table`, its position is read with the fence (`_fence_and_table_position`) and
        returned, locked to COMMIT."""
        if batch.epoch > self._fenced_epoch:
            self._commit(conn)  # nothing is written yet; the fence is taken outside this transaction
            self._take_fence(conn, batch)
        table_at = None
        if table is None:
            stored = self._shared_epoch(conn)
        else:
            self._table = table
            stored, table_at = self._fence_and_table_position(conn, table)
            self._table = None
        if stored is not None and batch.epoch < stored:
            raise LoadError(
                f"refused: batch epoch {batch.epoch} is older than epoch {stored} the target "
                f"holds for this pipeline (a newer writer owns it)",
                **self._context(batch),
            )
        return table_at

    def _take_fence(self, conn: C, batch: Batch | None) -> None:
        """Kill the other processes' sessions of the pipeline and raise the fence row to the
        batch's epoch (without a batch: one above the stored epoch), retrying both until the row
        lock is ours (see the class docstring)."""
        with self._fence_lock:
            if batch is not None and batch.epoch <= self._fenced_epoch:
                return  # another thread of this sink took it meanwhile
            stored_epoch = self._read_position(conn)[1]
            if batch is not None and stored_epoch is not None and stored_epoch > batch.epoch:
                # A newer writer owns the target: refuse before killing anything of it.
                raise LoadError(
                    f"refused: batch epoch {batch.epoch} is older than epoch {stored_epoch} the target "
                    f"holds for this pipeline (a newer writer owns it)", **self._context(batch))
            deadline = time.monotonic() + self.fence_timeout
            killed = 0
            while True:
                killed += self._kill_others(conn)
                try:
                    stored = self._raise_fence(conn, batch.epoch if batch is not None else None)
                    break
                except FenceBusy:
                    self._rollback(conn)
                    if time.monotonic() > deadline:
                        raise TransientLoadError(
                            f"could not take the fence for epoch "
                            f"{batch.epoch if batch else 'above the stored one'} within "
                            f"{self.fence_timeout:.0f} s: its row stays locked by a session setl "
                            f"cannot kill", **self._context(batch)) from None
            if batch is not None and stored > batch.epoch:
                raise LoadError(
                    f"refused: batch epoch {batch.epoch} is older than epoch {stored} the target "
                    f"holds for this pipeline (a newer writer owns it)", **self._context(batch))
            self._fenced_epoch = stored
            log.info("pipeline=%s stage=load: took the %s target's fence for epoch %d (%d other "
                     "session(s) killed)", self.pipeline, self.dialect, stored, killed)

    def _guarded(self, conn: C, work: Callable[[], T], batch: Batch | None) -> T:
        """Run `work` on `conn`; on any failure roll back and raise it as a setl error."""
        self._table = None
        try:
            return work()
        except BaseException as exc:
            try:
                self._rollback(conn)
            except Exception:  # a dead connection cannot roll back; the server already did
                self._local.broken = True
            if isinstance(exc, SetlError) or not isinstance(exc, Exception):
                raise
            raise self._translate(exc, batch) from exc

    def _translate(self, exc: Exception, batch: Batch | None) -> LoadError:
        kind = self._classify(exc)
        table = self._table
        if kind is TargetTableMissing:
            return LoadError(f"target table {table} does not exist ({self._describe(exc)})",
                             **self._context(batch, table=table))
        if kind is TransientLoadError:
            return TransientLoadError(self._describe(exc), **self._context(batch, table=table))
        if kind is RefusedLoadError:  # the same rows would fail the same way: no retries
            return RefusedLoadError(self._describe(exc), **self._context(batch, table=table))
        return LoadError(self._describe(exc), **self._context(batch, table=table))

    def _context(self, batch: Batch | None, table: str | None = None) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "stage": "load",
            "table": table,
            "batch": batch.id if batch is not None else None,
            "position": batch.end if batch is not None else None,
        }

    def _retrying(self, fn: Callable[[], T], batch: Batch | None) -> T:
        def before_retry(exc: BaseException) -> None:
            log.warning("pipeline %s: %s target: %s; reconnecting and replaying", self.pipeline,
                        self.dialect, exc)

        try:
            return call_with_retries(
                fn,
                attempts=self.max_attempts,
                initial=self.initial_backoff,
                maximum=self.max_backoff,
                retry_on=(TransientLoadError,),
                sleep=self._sleep,
                before_retry=before_retry,
            )
        except TransientLoadError as exc:
            raise TransientLoadError(f"gave up after {self.max_attempts} attempts: {exc.message}",
                                     **exc.context) from exc


__all__ = ["PROCESS_TOKEN", "DdlStep", "FenceBusy", "SqlLoad", "TargetTableMissing", "chunks", "group_by_columns",
           "insert_runs"]
