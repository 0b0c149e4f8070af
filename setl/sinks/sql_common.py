"""What the SQL targets (MySQL/MariaDB and PostgreSQL) share: one transaction per batch, position
and epoch kept in the target, in-place retries of transient errors, and error context.

`SqlLoad` runs each batch's transaction on a pooled connection, retried in place; the transaction
itself is the load path of `setl.sinks.sql_load_path`, and what differs between targets is the
target's `setl.sinks.sql_dialect.SqlDialect`.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from setl.errors import ConfigError, LoadError, SetlError, TableRefused
from setl.model import Batch, Position
from setl.routing import flat_name
from setl.sinks.conflicts import ConflictPolicy, ConflictStep
from setl.sinks.prepared import PreparedBatches
from setl.sinks.sql_dialect import SqlDialect
from setl.sinks.sql_failures import CurrentTable, LoadFailures
from setl.sinks.sql_fence import TargetFence
from setl.sinks.sql_load_path import (
    LoadPath,
    divert_ahead,
    load_batch,
    load_part,
    replay_kept,
    split_tables,
    without_tables,
)
from setl.sinks.sql_pool import ConnectionPool
from setl.sinks.sql_quarantine import Quarantine, Quarantined, QuarantineEnded, QuarantineStore
from setl.sinks.sql_segments import Segment, SegmentPlanner
from setl.sinks.sql_staging import StagedCopies
from setl.stages.load import Load, LoadCapabilities

log = logging.getLogger(__name__)

C = TypeVar("C")  # a driver connection
T = TypeVar("T")

#: Names this process in the target's session registry, so a fence never kills its own sessions.
PROCESS_TOKEN = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class SqlLoad(Load, Generic[C]):
    """Applies each batch in one target transaction: per table, the merged deletes, then
    multi-row upserts of the full after-images, then an upsert of the batch's end position (with
    its batch id and epoch) into the target's own position table, and COMMIT. The transaction is
    the load path's steps (`setl.sinks.sql_load_path`), on a pooled connection, retried in place;
    what differs between targets is the `SqlDialect` given.

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
    capabilities = LoadCapabilities(per_table=True, stores_position=True, copy_end=True, quarantine=True)

    def __init__(
        self,
        config: Any,
        sql: SqlDialect[C],
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
        on_table_error: str = "pause",
        quarantine_max_rows: int = 1_000_000,
        quarantine_max_bytes: int = 1 << 30,
        sleep: Callable[[float], None] = time.sleep,
        conflicts: ConflictPolicy | None = None,
    ) -> None:
        """`sql`: the target's dialect (its session, row writer, DDL and driver errors);
        `on_table_error`: pause, or quarantine a table whose change the target refuses
        (docs/quarantine.md), keeping at most `quarantine_max_rows` changes / `_bytes` per table;
        `conflicts`: detect, settle and record conflicts (a MySQL target: `setl.sinks.conflicts`)."""
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be at least 1")
        if connections < 1:
            raise ValueError("connections must be at least 1")
        if ddl not in ("apply", "skip", "fail"):
            raise ValueError(f"ddl must be apply, skip or fail, not {ddl!r}")
        if on_table_error not in ("pause", "quarantine"):
            raise ValueError(f"on_table_error must be pause or quarantine, not {on_table_error!r}")
        self.on_table_error = on_table_error
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
        self.sql = sql
        self.writing = CurrentTable()  # per thread: the table written, for error messages
        self.failures = LoadFailures(pipeline=pipeline, errors=sql, max_attempts=max_attempts,
                                     initial_backoff=initial_backoff, max_backoff=max_backoff, sleep=sleep)
        self._lock = threading.Lock()  # guards the table setup
        self._position_table_ready = False
        self.positions = sql.position_store(pipeline=pipeline, schema=position_schema, table=position_table,
                                            token=PROCESS_TOKEN, lock_timeout=fence_lock_timeout,
                                            writing=self.writing)
        self.fence = TargetFence(self.positions, sql, self.failures, timeout=fence_timeout, writing=self.writing)
        self.planner = SegmentPlanner(pipeline, ddl, self.failures.context)
        self.staged: StagedCopies[C] = StagedCopies(pipeline, self.positions, sql.staging())
        self.pool: ConnectionPool[C] = ConnectionPool(connections, self._open_connection, self._close)
        if conflicts is not None and sql.name != "mysql":
            raise ConfigError(f"pipeline {pipeline}: conflicts: needs a mysql target, not {sql.name}")
        self.conflicts = None if conflicts is None else ConflictStep(pipeline, conflicts, position_schema)
        # Always read: a table quarantined under an earlier `on_table_error: quarantine` stays so.
        self.quarantine: Quarantine[C] | None = Quarantine(QuarantineStore(
            pipeline=pipeline, schema=position_schema, table=position_table, dialect=self.dialect,
            max_rows=quarantine_max_rows, max_bytes=quarantine_max_bytes)) if QuarantineStore.supports(
                self.dialect) else None
        #: per prepared batch object: the tables its prepared segments leave out (quarantined then)
        self._planned_without: PreparedBatches[frozenset[str]] = PreparedBatches()
        #: per prepared batch object: those tables' changes, encoded as kept (`sql_quarantine.encode_runs`)
        self._encoded: PreparedBatches[dict[str, list[tuple[int, bytes]]]] = PreparedBatches()
        self.path = LoadPath(pipeline, sql, self.fence, self.positions, self.staged, self.writing,
                             conflicts=self.conflicts, quarantine=self.quarantine)

    @classmethod
    def from_config(cls, config: Any, *, pipeline: str, **options: Any) -> "SqlLoad[C]":
        return cls(config, pipeline=pipeline, **options)

    @property
    def token(self) -> str:
        """Names this process in the target's session table (`PROCESS_TOKEN`; a test may pose as another)."""
        return self.positions.token

    @token.setter
    def token(self, token: str) -> None:
        self.positions.token = token

    # -- the Load contract

    def open(self) -> None:
        """Connect and create the position tables if needed. A transient failure is raised at once
        (a `TransientLoadError`): the node retries the start with its backoff, shown by `setl
        status` as ``retrying`` with the cause, and a stop ends the wait."""
        self._with_connection(self.conflicts.guard_all if self.conflicts else lambda conn: None, None)

    def prepare(self, batch: Batch) -> None:
        """Work out ahead, on the calling worker, what the dialect's row writer can (`RowWriter.prepare`),
        without the tables quarantined as last seen (`divert_quarantined` takes the work as it is when
        the same tables are diverted at load, and cuts the segments again otherwise)."""
        if (ahead := divert_ahead(batch, self._quarantined())) is None:
            self.sql.rows.prepare(batch, self._plan)
            return
        without, encoded, narrowed = ahead
        self._encoded.put(batch, encoded)
        self._planned_without.put(batch, without)
        self.sql.rows.prepare(batch, lambda whole: self._plan(narrowed if whole is batch
                                                              else without_tables(whole, without)))

    def _quarantined(self) -> frozenset[str]:
        """The tables quarantined (or refused) as this sink last saw them."""
        if self.quarantine is None:
            return frozenset()
        return frozenset({q.table for q in self.quarantine.view()} | set(self.quarantine.refused()))

    def load(self, batch: Batch) -> None:
        """Apply `batch` in one transaction with its position (`setl.sinks.sql_load_path.load_batch`,
        retried in place); what `prepare` kept for it is dropped then, loaded or not."""
        try:
            prepared = self.sql.rows.prepared.get(batch)
            segments = prepared.segments if prepared is not None else None
            planned_without = (self._planned_without.get(batch) if prepared is not None else None) or frozenset()
            encoded = self._encoded.get(batch) if planned_without else None
            ended = 0
            for attempt in itertools.count(1):  # each attempt quarantines one more table, or raises
                try:
                    if segments is None:  # cut here, so that a refusal the plan raises (a policy's) quarantines too
                        planned_without = frozenset(split_tables(batch.changes, self._quarantined())[0])
                        segments = self._plan(without_tables(batch, planned_without) if planned_without else batch)
                    work = functools.partial(self._load_on, batch=batch, segments=segments, without=planned_without,
                                             encoded=encoded)
                    self._retrying(functools.partial(self._with_connection, work, batch), batch)
                    return
                except TableRefused as exc:
                    if attempt > len(batch.tables) + ended or not self._quarantines(exc):
                        raise
                except QuarantineEnded:
                    ended += 1  # a replay or re-copy elsewhere ended a quarantine: read the set again
                    if self.quarantine is None or ended > len(batch.tables):
                        raise
                    self.quarantine.forget()
        finally:
            self.sql.rows.prepared.drop(batch)
            self._planned_without.drop(batch)
            self._encoded.drop(batch)

    def _load_on(self, conn: C, *, batch: Batch, segments: list[Segment], without: frozenset[str],
                 encoded: Mapping[str, Sequence[tuple[int, bytes]]] | None) -> None:
        """`load_batch` of `batch` on `conn`, its `segments` cut without the tables `without` (their
        changes `encoded` ahead, or None)."""
        load_batch(self.path, conn, batch, segments, self._plan, without, encoded)

    def _quarantines(self, exc: TableRefused) -> bool:
        """Under ``on_table_error: quarantine``: the refused table is to be quarantined when `batch`
        is loaded again (`divert_quarantined`); False: pause (the policy, or no table named)."""
        table = exc.context.get("table")
        if self.on_table_error != "quarantine" or not table or self.quarantine is None:
            return False
        log.warning("pipeline=%s stage=load table=%s batch=%s: the target refuses this table's change (%s); "
                    "quarantining it and loading the batch again without it", self.pipeline, table,
                    exc.context.get("batch"), exc.message)
        return self.quarantine.refuse(str(table), exc.message)

    # -- quarantined tables (docs/quarantine.md)

    def quarantined(self) -> list[Quarantined]:
        """The pipeline's quarantined tables, as the target records them."""
        found = self._retrying(lambda: self._with_connection(self._read_quarantine, None), None)
        return [found[name] for name in sorted(found)]

    def quarantine_view(self) -> list[Quarantined]:
        """The quarantined tables as the last batch transaction saw them (no I/O)."""
        return self.quarantine.view() if self.quarantine is not None else []

    def _read_quarantine(self, conn: C) -> dict[str, Quarantined]:
        if self.quarantine is None or not self.quarantine.store.available:
            return {}
        found = self.quarantine.store.read(conn)
        self.sql.commit(conn)
        return found

    def replay(self, table: str, *, chunk: int = 1000,
               progress: Callable[[int, int], None] | None = None) -> int:
        """Apply the changes kept for quarantined `table` in order, `chunk` per transaction, each
        with its kept rows dropped; the transaction that finds none left ends the quarantine, so the
        table's next change in the stream applies as any table's (no gap, no duplicate). Each
        transaction holds the fence row exclusively: no batch of the pipeline commits meanwhile.
        Returns the number applied; a change the target still refuses raises (nothing of that
        transaction applied, the table stays quarantined). `progress(applied, left)` after each."""
        applied = 0
        for number in itertools.count():
            work = functools.partial(replay_kept, self.path, table=table, chunk=chunk, number=number, plan=self._plan)
            done, count, left = self._retrying(functools.partial(self._with_connection, work, None), None)
            applied += count
            if progress is not None:
                progress(applied, left)
            if done:
                break
        return applied

    def load_part(self, batch: Batch) -> None:
        """One target table's share of a batch (load.mode per_table), in its own transaction on
        its own connection (`setl.sinks.sql_load_path.load_part`): fenced, skipping the changes
        its table holds already, and recording the table's position (see the class docstring)."""
        first = flat_name(batch.changes[0].schema, batch.changes[0].table or "") if batch.changes else None
        self._retrying(lambda: self._with_connection(lambda conn: load_part(self.path, conn, batch, self.segments),
                                                     batch, first), batch)

    def mark_loaded(self, batch: Batch) -> None:
        """Every part of `batch` is in: record its position, fenced (a transaction with no rows)."""
        self.load(batch.replace(()))

    def segments(self, batch: Batch) -> list[Segment]:
        """The segments `prepare` worked out for this batch object, else `_plan`'s."""
        prepared = self.sql.rows.prepared.get(batch)
        return prepared.segments if prepared is not None else self._plan(batch)

    def _plan(self, batch: Batch) -> list[Segment]:
        """The merged row changes of each run between DDLs, and the DDLs to apply, in batch order
        (`SegmentPlanner`), of the batch as the dialect narrows it (`SqlDialect.narrow`)."""
        return self.planner.segments(self.sql.narrow(batch))

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
                self.staged.sweep(conn, self.sql.commit)  # staging tables an earlier leader left behind
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

    # -- connections, rollback and retries around the load path

    def _with_connection(self, work: Callable[[C], T], batch: Batch | None, table: str | None = None) -> T:
        """Run `work` on a pooled connection of this thread's own (`ConnectionPool.run`), guarded
        (`_guarded`); re-entered from inside work, on the connection this thread holds."""
        held = self.pool.held
        if held is not None:
            return work(held)
        return self.pool.run(lambda conn: self._guarded(conn, lambda: work(conn), batch), batch, table)

    def _open_connection(self, batch: Batch | None) -> C:
        """A new connection, prepared (`_register`); a connect error as a setl error naming `batch`."""
        try:
            conn = self.sql.connect()
        except Exception as exc:
            raise self.failures.connect_failed(exc, batch, self.config) from exc
        try:
            self._guarded(conn, lambda: self._register(conn), batch)
        except BaseException:
            self._close(conn)
            raise
        return conn

    def _register(self, conn: C) -> None:
        """Create the position tables once per sink, then register the new connection."""
        with self._lock:
            ready = self._position_table_ready
        if not ready:
            self.positions.create_tables(conn)
            if self.quarantine is not None:
                self._quarantine_tables(conn)
            with self._lock:
                self._position_table_ready = True
        self.positions.register(conn, self.fence.epoch)

    def _quarantine_tables(self, conn: C) -> None:
        """The quarantine's tables (`QuarantineStore.create_tables`). An account that may not create
        them: under ``on_table_error: pause`` nothing can have been quarantined, so the sink goes on
        without (logged); under ``quarantine`` the policy cannot be honoured: a clear error."""
        assert self.quarantine is not None
        try:
            self.quarantine.store.create_tables(conn)
        except Exception as exc:
            if self.on_table_error == "quarantine":
                raise LoadError(f"on_table_error: quarantine needs the tables {self.position_table}_quarantine and "
                                f"_kept in schema {self.position_schema} on the target, and they cannot be created "
                                f"({self.sql.describe(exc)}): grant the target account CREATE there (docs/grants.md)",
                                pipeline=self.pipeline, stage="load") from exc
            log.warning("pipeline=%s stage=load: cannot create the quarantine tables in %s (%s); under "
                        "on_table_error: pause none is needed", self.pipeline, self.position_schema,
                        self.sql.describe(exc))

    def _close(self, conn: C) -> None:
        try:
            self.sql.disconnect(conn)
        except Exception:  # the connection is likely dead already; nothing to save
            log.debug("closing a %s connection failed", self.dialect, exc_info=True)

    def _guarded(self, conn: C, work: Callable[[], T], batch: Batch | None) -> T:
        """Run `work` on `conn`; on any failure roll back and raise it as a setl error."""
        self.writing.table = None
        try:
            return work()
        except BaseException as exc:
            self.staged.discard()
            try:
                self.sql.rollback(conn)
            except Exception:  # noqa: BLE001 - a dead connection cannot roll back; the server already did
                self.pool.mark_broken()
            if isinstance(exc, SetlError) or not isinstance(exc, Exception):
                raise
            raise self.failures.translate(exc, batch, self.writing.table) from exc

    def _retrying(self, fn: Callable[[], T], batch: Batch | None) -> T:
        return self.failures.retrying(fn, batch)


__all__ = ["PROCESS_TOKEN", "SqlLoad"]
