"""Re-copies that keep a target table's old rows visible (`StagedCopies`): a snapshot's TRUNCATE
of a table holding rows copies into a staging table beside it instead, and the copy's end marker
(`setl.model.DdlChange.copy_end`) switches the table to the copied rows in one transaction
(docs/snapshot.md, "Re-copying one table")."""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Generic, TypeVar

import attrs

from setl.ddl import Statement
from setl.errors import RefusedLoadError, SetlError
from setl.model import Batch, DdlChange, TableName
from setl.sinks.merge import TableChanges
from setl.sinks.sql_positions import PositionStore

log = logging.getLogger(__name__)

C = TypeVar("C")  # a driver connection

#: Every staging table's name starts so (then a hash of the pipeline, and one of the table).
PREFIX = "setl_copy_"


def staging_prefix(pipeline: str) -> str:
    """The start of the names of `pipeline`'s staging tables (`staging_name`)."""
    return PREFIX + hashlib.sha1(pipeline.encode()).hexdigest()[:8] + "_"


def staging_name(pipeline: str, schema: str, table: str) -> str:
    """The staging table of `schema`.`table` for `pipeline`, in the table's schema: 31 characters
    (within MySQL's 64 and PostgreSQL's 63) that no user names a table."""
    digest = hashlib.sha1("\0".join((pipeline, schema, table)).encode()).hexdigest()[:12]
    return staging_prefix(pipeline) + digest


class StagingDialect(Generic[C]):
    """How a dialect handles staging tables. Each method runs on a connection in a batch's open
    transaction; `transactional_ddl` says whether CREATE and DROP TABLE stay in it (PostgreSQL)
    or commit it (MySQL: then the caller takes the fence again after them, and drops a staging
    table only after the COMMIT that forgets it)."""

    transactional_ddl = True

    def has_rows(self, conn: C, schema: str, table: str) -> bool | None:
        """Whether the table holds a row; None when it does not exist."""
        raise NotImplementedError

    def create(self, conn: C, schema: str, table: str, staging: str) -> None:
        """(Re)create `staging` empty, beside and like `table` (columns, defaults, generated columns,
        keys and indexes; no foreign keys)."""
        raise NotImplementedError

    def switch(self, conn: C, schema: str, table: str, staging: str) -> int:
        """Replace the table's rows by the staging table's (every column the server does not
        compute), with no foreign-key action or trigger where the session can avoid them; the
        rows now in the table."""
        raise NotImplementedError

    def exists(self, conn: C, schema: str, staging: str) -> bool:
        raise NotImplementedError

    def drop(self, conn: C, schema: str, staging: str) -> None:
        """Drop `staging` if it exists."""
        raise NotImplementedError

    def named(self, conn: C, prefix: str) -> list[TableName]:
        """Every table whose name starts with `prefix`, in any schema."""
        raise NotImplementedError


class StagedCopies(Generic[C]):
    """A pipeline's target tables being re-copied (`targets`: (schema, table) -> staging table),
    kept in the target (`PositionStore.read_copies`, ``<position_table>_copy``) and cached here.

    * `start`: a snapshot TRUNCATE of a table holding rows (re)creates its staging table and records
      it, in the batch's transaction; of an empty or missing table it is applied as a TRUNCATE.
    * `redirect`: while a table is recorded, its row changes (chunks and streamed changes alike) go
      to its staging table; the table keeps its old rows.
    * `end` (the copy's end marker): in the batch's transaction, the table's rows are replaced by
      the staging table's and the record is dropped; the staging table is dropped in it too
      (transactional DDL) or right after its COMMIT (`after_commit`). Replayed, it finds no record:
      a no-op (a staging table left over is dropped). A recorded staging table that is gone (only
      a hand outside setl drops one) is refused with a `RefusedLoadError`: the copy's rows are lost.
    * `altered`: a DDL applied to a recorded table (the source copies the table again after it,
      from a new TRUNCATE) drops its staging table and its record.
    * `sweep`: a leader taking the target drops the pipeline's staging tables that no record names
      (a crash between a MySQL COMMIT and the DROP after it).

    The cache is read in a batch's transaction and forgotten whenever a batch holding a DDL runs
    (those batches run alone), or a leader takes the target; safe for the sink's threads."""

    def __init__(self, pipeline: str, positions: PositionStore[C], dialect: StagingDialect[C]) -> None:
        self.pipeline = pipeline
        self.positions = positions
        self.dialect = dialect
        self._lock = threading.Lock()
        self._targets: dict[tuple[str, str], str] | None = None
        self._local = threading.local()  # per thread: staging tables to drop after the COMMIT

    def forget(self) -> None:
        """Read the records again at next use."""
        with self._lock:
            self._targets = None

    def targets(self, conn: C) -> dict[tuple[str, str], str]:
        """The tables being re-copied, read in `conn`'s open transaction when not cached."""
        with self._lock:
            found = self._targets
        if found is None:
            found = self.positions.read_copies(conn)
            with self._lock:
                self._targets = found
        return found

    def redirect(self, conn: C, table: TableChanges) -> TableChanges:
        """`table`'s changes, aimed at its staging table while it is being re-copied."""
        staging = self.targets(conn).get((table.schema, table.table))
        if staging is None:
            return table
        return attrs.evolve(table, table=staging)

    def start(self, conn: C, batch: Batch, change: DdlChange) -> bool:
        """A snapshot TRUNCATE of `change`'s table: True when its copy goes to a staging table
        (created and recorded here), False when the TRUNCATE is to be applied (an empty or missing
        table, nothing staged)."""
        schema, table = change.schema, str(change.table)
        self.forget()
        recorded = self.targets(conn).get((schema, table))
        if recorded is None and not self.dialect.has_rows(conn, schema, table):
            return False
        staging = staging_name(self.pipeline, schema, table)
        self.dialect.create(conn, schema, table, staging)
        self.positions.record_copy(conn, schema, table, staging)
        log.info("pipeline=%s stage=load batch=%d table=%s position=%s copying into %s.%s: the table keeps its "
                 "rows until the copy is done", self.pipeline, batch.id, change.qualified_table,
                 change.position or batch.end, schema, staging)
        return True

    def end(self, conn: C, batch: Batch, change: DdlChange) -> None:
        """A copy's end marker: switch its table to the staging table's rows (see the class)."""
        schema, table = change.schema, str(change.table)
        self.forget()
        staging = self.targets(conn).get((schema, table))
        if staging is None:
            left = staging_name(self.pipeline, schema, table)
            if self.dialect.exists(conn, schema, left):
                self._drop(conn, schema, left)
            return
        if not self.dialect.exists(conn, schema, staging):
            # Only a hand outside setl drops a recorded staging table: the copy's rows are gone, and
            # switching nothing (or keeping the old rows) would leave the table wrong.
            raise RefusedLoadError(
                f"the staging table {schema}.{staging} of this re-copy is gone (dropped outside setl), with the "
                f"rows copied: delete its row from the target's {self.positions.table}_copy table, resume, and "
                "copy the table again (setl snapshot --table)", pipeline=self.pipeline, stage="load",
                table=change.qualified_table, batch=batch.id, position=change.position or batch.end)
        try:
            rows = self.dialect.switch(conn, schema, table, staging)
        except SetlError as exc:  # a dialect's refusal: name the batch and position too
            exc.with_context(batch=batch.id, position=change.position or batch.end)
            raise
        log.info("pipeline=%s stage=load batch=%d table=%s position=%s copy done: the table switches to "
                 "the %d rows copied", self.pipeline, batch.id, change.qualified_table,
                 change.position or batch.end, rows)
        self.positions.forget_copy(conn, schema, table)
        self._drop(conn, schema, staging)

    def altered(self, conn: C, change: DdlChange, statement: Statement) -> bool:
        """After a DDL applied: drop the staging table and record of each recorded table it names;
        whether there was one."""
        names = {(ref.schema or change.schema, ref.table) for ref in statement.tables}
        if change.table:
            names.add((change.schema, change.table))
        self.forget()
        recorded = self.targets(conn)
        hit = [name for name in names if name in recorded]
        for schema, table in hit:
            self.positions.forget_copy(conn, schema, table)
            self._drop(conn, schema, recorded[(schema, table)])
            log.info("pipeline=%s stage=load table=%s.%s: its re-copy is dropped by a DDL (the copy starts "
                     "again after it)", self.pipeline, schema, table)
        return bool(hit)

    def _drop(self, conn: C, schema: str, staging: str) -> None:
        if self.dialect.transactional_ddl:
            self.dialect.drop(conn, schema, staging)
        else:
            pending: list[tuple[str, str]] = getattr(self._local, "pending", None) or []
            pending.append((schema, staging))
            self._local.pending = pending

    def after_commit(self, conn: C) -> None:
        """The batch committed: drop the staging tables it forgot (a dialect without transactional
        DDL); a failure here leaves them to `sweep`."""
        pending: list[tuple[str, str]] = getattr(self._local, "pending", None) or []
        self._local.pending = []
        for schema, staging in pending:
            try:
                self.dialect.drop(conn, schema, staging)
            except Exception:  # committed already: the next leader's sweep drops it
                log.warning("pipeline=%s stage=load dropping the staging table %s.%s failed; it is dropped at "
                            "the next start", self.pipeline, schema, staging, exc_info=True)

    def discard(self) -> None:
        """The batch did not commit: nothing to drop after it."""
        self._local.pending = []
        self.forget()

    def sweep(self, conn: C, commit: Any) -> None:
        """Drop the pipeline's staging tables no record names, then `commit(conn)`."""
        self.forget()
        found = self.targets(conn)
        for (schema, table), staging in sorted(found.items()):
            log.info("pipeline=%s stage=load table=%s.%s is being re-copied into %s: it switches to the copied rows "
                     "when its copy ends (if the meta store lost that copy, copy the table again: setl snapshot "
                     "--table)", self.pipeline, schema, table, staging)
        recorded = set(found.values())  # a staging name holds its table's schema and name
        for name in self.dialect.named(conn, staging_prefix(self.pipeline)):
            if name.table not in recorded:
                log.info("pipeline=%s stage=load dropping the staging table %s left by an earlier run",
                         self.pipeline, name)
                self.dialect.drop(conn, name.schema, name.table)
        commit(conn)
        self.forget()


__all__ = ["PREFIX", "StagedCopies", "StagingDialect", "staging_name", "staging_prefix"]
