"""What differs between the SQL targets, behind one small interface per target: `SqlDialect` (the
session, the batch as the target plans it, DDL, driver errors, the position and staging tables)
and its `RowWriter` (how one table's merged changes are written). `setl.sinks.sql_load_path`
calls them in its steps; `setl.sinks.mysql` and `setl.sinks.postgresql` implement them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from setl.model import Batch
from setl.sinks.merge import TableChanges
from setl.sinks.prepared import PreparedBatches
from setl.sinks.sql_failures import CurrentTable, DriverErrors
from setl.sinks.sql_positions import PositionStore
from setl.sinks.sql_segments import DdlStep, Segment
from setl.sinks.sql_staging import StagingDialect

C = TypeVar("C")  # a driver connection
C_contra = TypeVar("C_contra", contravariant=True)


class RowWriter(Protocol[C_contra]):
    """Writes one table's merged changes (`TableChanges`) on a connection, in the batch's open
    transaction; never commits. A keyed table gets `patch`, `delete` and `upsert`, in that order;
    a table without a primary key (or a sequence's state rows) gets `in_order`. A writer may work
    out a batch's statements ahead (`prepare`, on a scheduler worker), kept in `prepared` by batch
    object (each value's ``segments`` are the batch's, as `plan` cut them) until the batch is loaded."""

    @property
    def prepared(self) -> PreparedBatches[Any]: ...

    def prepare(self, batch: Batch, plan: Callable[[Batch], list[Segment]]) -> None:
        """Cut `batch` (`plan`) and build what can be built before its transaction; may do nothing."""

    def patch(self, conn: C_contra, table: TableChanges) -> None:
        """`table.patches` (rows updated only in part, on keys no delete or upsert touches) as
        updates of the patched columns, never an insert."""

    def delete(self, conn: C_contra, table: TableChanges) -> None:
        """`table.deletes` (key images) removed, in multi-row statements."""

    def upsert(self, conn: C_contra, table: TableChanges) -> None:
        """`table.upserts` (full after-images) inserted or replacing the row of their key: multi-row
        statements, or the target's bulk path (``LOAD DATA``, ``COPY``) where it applies exactly."""

    def in_order(self, conn: C_contra, table: TableChanges) -> None:
        """`table.sequence`, a keyless table's changes, each applied as it comes (runs of inserts
        in bulk); a sequence's state rows as its last state."""


class SqlDialect(DriverErrors, Protocol[C]):
    """One SQL target's session and differences (`name`, `classify` and `describe` of its driver's
    errors: `DriverErrors`). Safe for the threads of one sink."""

    #: Whether DDL stays in the batch's transaction (PostgreSQL), or commits it (MySQL: the load
    #: path then takes the fence again after each DDL).
    transactional_ddl: bool

    @property
    def rows(self) -> RowWriter[C]: ...

    def connect(self) -> C:
        """A new connection with the session settings setl writes under; raises the driver's error."""

    def disconnect(self, conn: C) -> None: ...

    def commit(self, conn: C) -> None: ...

    def rollback(self, conn: C) -> None:
        """Roll back the open transaction; may raise on a dead connection."""

    def narrow(self, batch: Batch) -> Batch:
        """`batch` as this target plans it (`setl.sinks.sql_segments`): what it leaves out (sequence
        DDL) or changes by its policies (dates, NUL in text) done."""

    def apply_ddl(self, conn: C, batch: Batch, step: DdlStep) -> None:
        """Run one table DDL of `batch` in its place among the batch's rows."""

    def position_store(self, *, pipeline: str, schema: str, table: str, token: str, lock_timeout: float,
                       writing: CurrentTable) -> PositionStore[C]:
        """The store of the pipeline's position, fence, session and identity tables."""

    def staging(self) -> StagingDialect[C]:
        """The handling of re-copies' staging tables (`setl.sinks.sql_staging`)."""


__all__ = ["RowWriter", "SqlDialect"]
