"""What the SQL targets (MySQL/MariaDB and PostgreSQL) share: one transaction per batch, position
and epoch kept in the target, in-place retries of transient errors, and error context.

A dialect subclass says how to connect, how to write rows and DDL, and which driver errors are
transient; `SqlLoad.load` does the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, Union

import attrs

from setl.errors import LoadError, RefusedLoadError, SetlError, TransientLoadError
from setl.model import Batch, DdlChange, Position, RowChange
from setl.retry import call_with_retries
from setl.ddl import Statement, parse
from setl.sinks.merge import TableChanges, merge
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


@attrs.frozen
class DdlStep:
    """A DDL to apply: the `index`-th change of its batch, and its parse."""

    index: int
    change: DdlChange
    statement: Statement


#: What `SqlLoad` applies in order: the merged row changes between DDLs, or one DDL.
Segment = Union[list[TableChanges], DdlStep]


class TargetTableMissing(Exception):
    """Raised by a dialect's error classifier: the statement named a table that does not exist."""


class SqlLoad(Load, Generic[C]):
    """Applies each batch in one target transaction: per table, the merged deletes, then
    multi-row upserts of the full after-images, then an upsert of the batch's end position (with
    its batch id and epoch) into the target's own position table, and COMMIT.

    * `committed()` reads that position back, so a target that committed a batch whose ack was
      lost is never re-read from before it.
    * Fencing: a batch whose epoch is lower than the epoch the target holds for the pipeline is
      refused with a `LoadError` (the position row is locked while it is checked, so a deposed
      writer cannot slip in between). A newer or equal epoch is accepted and stored.
      `committed_epoch()` reads it back: a scheduler takes its first epoch above it, so a meta
      store rebuilt with fresh epochs (or a switch from SQLite to ZooKeeper) is not refused.
    * Transient errors (deadlock, lock wait timeout, lost connection) are retried in place up to
      `max_attempts` times: the connection is dropped and the whole batch transaction replayed,
      which is safe because the transaction either committed or did not, and replays are
      idempotent. When the attempts run out a `TransientLoadError` is raised; any other failure
      is a `LoadError`. Both name the pipeline, table, batch id and position.
    * Tables without a primary key cannot be merged: each change is applied as it comes (an
      update or delete removes one row equal to the before-image in every column, NULLs equal to
      NULLs; an insert or update then inserts the after-image). A batch replayed after it
      committed (its ack was lost) inserts those rows again; a warning is logged once per table.
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
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be at least 1")
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
        self._sleep = sleep
        self._conn: C | None = None
        self._lock = threading.RLock()
        self._position_table_ready = False
        self._warned_unkeyed: set[tuple[str, str]] = set()
        self._table: str | None = None  # the table being written, for error messages

    @classmethod
    def from_config(cls, config: Any, *, pipeline: str, **options: Any) -> "SqlLoad[C]":
        return cls(config, pipeline=pipeline, **options)

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
        """Create the position schema and table if missing, and commit."""
        raise NotImplementedError

    def _locked_epoch(self, conn: C) -> int | None:
        """In the open transaction: lock the pipeline's position row; return its epoch."""
        raise NotImplementedError

    def _read_position(self, conn: C) -> tuple[str, int, str | None, int] | None:
        """The stored (log, offset, gtid, epoch) of the pipeline, outside any batch transaction."""
        raise NotImplementedError

    def _write_position(self, conn: C, batch: Batch) -> None:
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
        LoadError for other driver errors, None for errors that are not the driver's."""
        raise NotImplementedError

    def _describe(self, exc: BaseException) -> str:
        """One line for a driver error."""
        return f"{type(exc).__name__}: {exc}"

    # -- the Load contract

    def open(self) -> None:
        """Connect and create the position table if needed. Retries transient errors."""
        with self._lock:
            self._retrying(self._ensure_ready, None)

    def load(self, batch: Batch) -> None:
        """Apply `batch` in one transaction with its position (see the class docstring)."""
        segments = self._segments(batch)
        with self._lock:
            self._retrying(lambda: self._apply_batch(batch, segments), batch)

    def load_part(self, batch: Batch) -> None:
        """One target table's share of a batch (load.mode per_table): fenced, without the position."""
        segments = self._segments(batch)
        with self._lock:
            self._retrying(lambda: self._apply_batch(batch, segments, record=False), batch)

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
            if self.ddl == "fail":
                raise RefusedLoadError(f"DDL refused (pipeline.ddl is fail): {change.statement}",
                                **{**self._context(batch, table=change.qualified_table), "position": position})
            if self.ddl == "skip" or statement.kind == "other":
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
        if not table.primary_key and ident not in self._warned_unkeyed:
            self._warned_unkeyed.add(ident)
            log.warning("pipeline %s: table %s.%s has no primary key; a change is applied to one row "
                        "equal to its before-image in every column, and a batch replayed after it "
                        "committed inserts its rows again", self.pipeline, *ident)

    def committed(self) -> Position | None:
        """The end position of the last batch this pipeline committed in the target."""
        with self._lock:
            row = self._retrying(self._committed_row, None)
        return Position(log=row[0], offset=int(row[1]), gtid=row[2]) if row else None

    def committed_epoch(self) -> int | None:
        """The epoch of the last batch this pipeline committed in the target (older ones are refused)."""
        with self._lock:
            row = self._retrying(self._committed_row, None)
        return row[3] if row else None

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

    # -- the machinery

    def _connection(self, batch: Batch | None = None) -> C:
        if self._conn is None:
            try:
                self._conn = self._connect()
            except Exception as exc:
                kind = TransientLoadError if self._classify(exc) is TransientLoadError else LoadError
                raise kind(f"cannot connect to the {self.dialect} target: {self._describe(exc)}",
                           **self._context(batch)) from exc
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                self._disconnect(conn)
            except Exception:  # the connection is likely dead already; nothing to save
                log.debug("closing a %s connection failed", self.dialect, exc_info=True)

    def _ensure_ready(self, batch: Batch | None = None) -> C:
        conn = self._connection(batch)
        if not self._position_table_ready:
            self._guarded(conn, lambda: self._create_position_table(conn), batch)
            self._position_table_ready = True
        return conn

    def _committed_row(self) -> tuple[str, int, str | None, int] | None:
        conn = self._ensure_ready()
        return self._guarded(conn, lambda: self._read_position(conn), None)

    def _apply_batch(self, batch: Batch, segments: list[Segment], record: bool = True) -> None:
        conn = self._ensure_ready(batch)

        def transaction() -> None:
            self._fence(conn, batch)
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
            self._table = None
            if record:
                self._write_position(conn, batch)
            self._commit(conn)

        self._guarded(conn, transaction, batch)

    def _fence(self, conn: C, batch: Batch) -> None:
        """In the open transaction: lock the position row and refuse a batch of an older epoch."""
        stored = self._locked_epoch(conn)
        if stored is not None and batch.epoch < stored:
            raise LoadError(
                f"refused: batch epoch {batch.epoch} is older than epoch {stored} the target "
                f"holds for this pipeline (a newer writer owns it)",
                **self._context(batch),
            )

    def _guarded(self, conn: C, work: Callable[[], T], batch: Batch | None) -> T:
        """Run `work` on `conn`; on any failure roll back and raise it as a setl error."""
        self._table = None
        try:
            return work()
        except BaseException as exc:
            try:
                self._rollback(conn)
            except Exception:  # a dead connection cannot roll back; the server already did
                self._drop_connection()
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
            self._drop_connection()
            return TransientLoadError(self._describe(exc), **self._context(batch, table=table))
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
            self._drop_connection()

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


__all__ = ["DdlStep", "SqlLoad", "TargetTableMissing", "chunks", "group_by_columns"]
