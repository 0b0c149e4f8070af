"""Where an SQL target keeps its own position: the position, per-table position, fence, session
and identity tables of a pipeline, as a dialect writes and reads them (`PositionStore`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from setl.model import Batch, Position
from setl.sinks.sql_failures import CurrentTable

C = TypeVar("C")  # a driver connection


def end_values(batch: Batch) -> tuple[Any, ...]:
    """`batch`'s end as a position row stores it after its key: log, offset, row, gtid, batch id, epoch."""
    end = batch.end
    return (end.log, end.offset, end.row, end.gtid, batch.id, batch.epoch)


def stored_position(row: Sequence[Any] | None) -> Position | None:
    """The position a row read as (log, offset, row) holds; None for no row."""
    return Position(row[0], int(row[1]), row=int(row[2])) if row else None


class FenceBusy(Exception):
    """Raised by `PositionStore.raise_fence`: the fence row stayed locked past the short lock timeout."""


class PositionStore(Generic[C]):
    """The tables ``<position_table>`` (the pipeline's position and epoch), ``_table`` (each target
    table's position, for per-table parts), ``_fence`` (the highest epoch that took the target),
    ``_session`` (the server sessions of each process writing the pipeline), ``_identity`` and
    ``_copy`` (each target table being re-copied into a staging table, `setl.sinks.sql_staging`), in
    ``position_schema``; a dialect subclass writes the SQL.

    Every method runs on a connection the caller holds. The ones documented as "in the open
    transaction" neither commit nor roll back; the others commit what they did. None retries:
    `SqlLoad` replays the whole transaction. `token` names this process in the session table; a
    session registered with another token belongs to another process, which the fence may kill.
    """

    def __init__(self, *, pipeline: str, schema: str, table: str, token: str, lock_timeout: float,
                 describe: Callable[[BaseException], str], writing: CurrentTable | None = None) -> None:
        """`lock_timeout`: how long `raise_fence` waits for the fence row's lock (seconds);
        `describe`: one line for a driver error; `writing`: set to the target table whose position
        is being written (None when done), for error messages."""
        self.pipeline = pipeline
        self.schema = schema
        self.table = table
        self.token = token
        self.lock_timeout = lock_timeout
        self._describe = describe
        self._writing = writing if writing is not None else CurrentTable()

    def create_tables(self, conn: C) -> None:
        """Create (or migrate) the position, fence, session and per-table position tables, and commit."""
        raise NotImplementedError

    def register(self, conn: C, epoch: int) -> None:
        """Record `conn`'s server session for this pipeline and process (with the highest `epoch`
        this process fenced) in the session table; commit."""
        raise NotImplementedError

    def kill_others(self, conn: C) -> int:
        """Kill every registered live session of the pipeline not of this process, forget the dead
        ones, commit; the number killed. Raises `LoadError` when the account may not kill them."""
        raise NotImplementedError

    def raise_fence(self, conn: C, epoch: int | None) -> int:
        """In a transaction with a short lock timeout (`lock_timeout`): lock the pipeline's fence
        row; if neither it nor the position row holds an epoch above `epoch`, store `epoch` (None:
        one above the highest stored). Commit and return the highest epoch found, or the one
        stored. `FenceBusy` if the lock timed out."""
        raise NotImplementedError

    def shared_epoch(self, conn: C) -> int | None:
        """In the open transaction: the fence row's epoch, read under a lock shared to COMMIT."""
        raise NotImplementedError

    def read_position(self, conn: C) -> tuple[Position | None, int | None]:
        """The stored position and epoch of the pipeline, outside any batch transaction."""
        raise NotImplementedError

    def has_tables(self, conn: C) -> bool:
        """Whether the position and fence tables exist (a read only: `setl check` creates nothing)."""
        raise NotImplementedError

    def peek_position(self, conn: C) -> Position | None:
        """The stored position of the pipeline, None when there is none or no position table; reads
        only (`setl check`)."""
        return self.read_position(conn)[0] if self.has_tables(conn) else None

    def write_position(self, conn: C, batch: Batch) -> None:
        """In the open transaction: record `batch.end`, its id and epoch as the pipeline's position."""
        raise NotImplementedError

    def read_identity(self, conn: C) -> str | None:
        """The pipeline's identity record (JSON text) in ``<position_table>_identity``, committed."""
        raise NotImplementedError

    def write_identity(self, conn: C, text: str) -> None:
        """Store the pipeline's identity record (JSON text) and commit."""
        raise NotImplementedError

    def read_server(self, conn: C) -> dict[str, Any]:
        """Which server `conn` is on, as the server reports it (`setl.pipeline.identity`: a position
        table copied to another server is not taken for its own); reads only."""
        raise NotImplementedError

    def table_position_locked(self, conn: C, table: str) -> Position | None:
        """In the open transaction: `table`'s recorded position, read under a lock held to COMMIT
        (None when there is none)."""
        raise NotImplementedError

    def fence_and_table_position(self, conn: C, table: str) -> tuple[int | None, Position | None]:
        """In the open transaction, first the fence row's epoch under a lock shared to COMMIT (as
        `shared_epoch`), then `table`'s recorded position under a lock held to COMMIT (as
        `table_position_locked`). A dialect sends both in one round trip where it can; an error
        in either is raised."""
        return self.shared_epoch(conn), self.table_position_locked(conn, table)

    def pipeline_position(self, conn: C) -> Position | None:
        """In the open transaction: the pipeline's recorded position (None when there is none)."""
        raise NotImplementedError

    def write_table_position(self, conn: C, table: str, batch: Batch) -> None:
        """In the open transaction: record `batch.end` as `table`'s position."""
        raise NotImplementedError

    def read_copies(self, conn: C) -> dict[tuple[str, str], str]:
        """In the open transaction: the pipeline's target tables being re-copied, (schema, table) ->
        the staging table beside them (`setl.sinks.sql_staging`)."""
        raise NotImplementedError

    def record_copy(self, conn: C, schema: str, table: str, staging: str) -> None:
        """In the open transaction: `schema`.`table` is re-copied into `staging` (replacing a record)."""
        raise NotImplementedError

    def forget_copy(self, conn: C, schema: str, table: str) -> None:
        """In the open transaction: `schema`.`table` is no longer re-copied (no record: nothing)."""
        raise NotImplementedError

    def commit(self, conn: C) -> None:
        raise NotImplementedError

    def record_and_commit(self, conn: C, batch: Batch, tables: Sequence[str], pipeline: bool) -> None:
        """Record `batch.end` as the position of each of `tables` (`write_table_position`), and as
        the pipeline's if `pipeline` (`write_position`), then COMMIT. A dialect sends them in one
        round trip where it can, provided that a write that fails stops the rest (COMMIT
        included) and raises: the caller then rolls the transaction back."""
        for table in tables:
            self._writing.table = table
            self.write_table_position(conn, table, batch)
        self._writing.table = None
        if pipeline:
            self.write_position(conn, batch)
        self.commit(conn)
