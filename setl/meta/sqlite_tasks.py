"""The batch DDL tasks of the SQLite meta store: the seed's ``ddl_task`` table, scoped by pipeline."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from setl.errors import MetaStoreError
from setl.meta.base import OVERWRITTEN_BY, DdlClaim, DdlTask, DdlTaskStatus, finishing_status, never_declared
from setl.model import Position

# Batch DDL tasks (docs/batch-ddl-tasks.md): the seed's table, scoped by pipeline, with the
# declaring position, the claimant and the reason for a deprecation.
_DDL_TASK_SCHEMA = """
CREATE TABLE IF NOT EXISTS ddl_task (
    pipeline TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_status TEXT NOT NULL,
    overwrite INTEGER NOT NULL DEFAULT 0,
    op_id TEXT NOT NULL,
    op_system TEXT NOT NULL DEFAULT '',
    op_type TEXT NOT NULL,
    op_db TEXT NOT NULL,
    op_table TEXT NOT NULL,
    op_partition TEXT NOT NULL DEFAULT '',
    log TEXT NOT NULL,
    offset INTEGER NOT NULL,
    owner TEXT,
    reason TEXT,
    create_time REAL NOT NULL,
    update_time REAL NOT NULL,
    PRIMARY KEY (pipeline, task_id)
);
CREATE INDEX IF NOT EXISTS ddl_task_by_op ON ddl_task (pipeline, op_id, task_status);
"""
_DDL_TASK_COLUMNS = (
    "pipeline, task_id, task_status, overwrite, op_id, op_system, op_type, op_db, op_table,"
    " op_partition, log, offset, owner, reason, create_time, update_time"
)


class SqliteDdlTasks:
    """The ``ddl_task`` table of a `setl.meta.sqlite.SqliteMetaStore` at `path`, written in the
    store's transactions (`tx`, whose ``BEGIN IMMEDIATE`` makes a claim and its deprecations one
    write that no other process interleaves) and read under its lock (`query`). It keeps no state
    of its own.
    """

    def __init__(self, path: Path, tx: Callable[[], AbstractContextManager[sqlite3.Connection]],
                 query: Callable[[str, tuple], list[tuple]], clock: Callable[[], float]) -> None:
        self.path = path
        self._tx = tx
        self._query = query
        self._clock = clock

    def create_table(self, db: sqlite3.Connection) -> None:
        """Create the table, or replace the pipeline-less placeholder of earlier builds if empty."""
        columns = {row[1] for row in db.execute("PRAGMA table_info(ddl_task)")}
        if columns and "pipeline" not in columns:
            # The placeholder table of earlier builds had no pipeline scope and was never written.
            (rows,) = db.execute("SELECT count(*) FROM ddl_task").fetchone()
            if rows:
                raise MetaStoreError(f"meta store {self.path}: table ddl_task has an old layout and "
                                     f"{rows} rows; move them away and restart")
            db.execute("DROP TABLE ddl_task")
        db.executescript(_DDL_TASK_SCHEMA)

    @staticmethod
    def _ddl_task(row: tuple) -> DdlTask:
        (pipeline, task_id, status, overwrite, op_id, op_system, op_type, op_db, op_table,
         op_partition, log, offset, owner, reason, created, updated) = row
        return DdlTask(pipeline=pipeline, task_id=task_id, op_type=op_type, op_db=op_db,
                       op_table=op_table, position=Position(log, int(offset)),
                       op_partition=op_partition, op_system=op_system, overwrite=bool(overwrite),
                       op_id=op_id, status=DdlTaskStatus(status), owner=owner, reason=reason,
                       create_time=created, update_time=updated)

    @staticmethod
    def _get_ddl_task(db: sqlite3.Connection, pipeline: str, task_id: str) -> DdlTask | None:
        row = db.execute(f"SELECT {_DDL_TASK_COLUMNS} FROM ddl_task WHERE pipeline = ? AND task_id = ?",
                         (pipeline, task_id)).fetchone()
        return SqliteDdlTasks._ddl_task(row) if row else None

    def declare(self, task: DdlTask) -> DdlTask:
        now = self._clock()
        with self._tx() as db:
            db.execute(
                f"INSERT INTO ddl_task ({_DDL_TASK_COLUMNS}) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)"
                " ON CONFLICT (pipeline, task_id) DO NOTHING",
                (task.pipeline, task.task_id, DdlTaskStatus.DECLARED.value, int(task.overwrite),
                 task.op_id, task.op_system, task.op_type, task.op_db, task.op_table,
                 task.op_partition, task.position.log, task.position.offset, now, now),
            )
            stored = self._get_ddl_task(db, task.pipeline, task.task_id)
        assert stored is not None
        return stored

    def get(self, pipeline: str, task_id: str) -> DdlTask | None:
        rows = self._query(f"SELECT {_DDL_TASK_COLUMNS} FROM ddl_task WHERE pipeline = ? AND task_id = ?",
                                 (pipeline, task_id))
        return self._ddl_task(rows[0]) if rows else None

    def list(self, pipeline: str, op_id: str | None = None) -> list[DdlTask]:
        where, args = "pipeline = ?", [pipeline]
        if op_id is not None:
            where, args = where + " AND op_id = ?", [pipeline, op_id]
        rows = self._query(f"SELECT {_DDL_TASK_COLUMNS} FROM ddl_task WHERE {where}", tuple(args))
        tasks = [self._ddl_task(row) for row in rows]
        # Position orders binlog files by name, which the zero-padded sequence makes numeric.
        return sorted(tasks, key=lambda t: (t.position, t.task_id))

    def claim(self, pipeline: str, task_id: str, owner: str, *, expected_owner: str | None = None) -> DdlClaim:
        now = self._clock()
        with self._tx() as db:
            task = self._get_ddl_task(db, pipeline, task_id)
            if task is None:
                raise never_declared(pipeline, task_id)
            if not task.claimable(expected_owner):
                return DdlClaim(False, task)
            db.execute("UPDATE ddl_task SET task_status = ?, owner = ?, update_time = ?"
                       " WHERE pipeline = ? AND task_id = ?",
                       (DdlTaskStatus.RUNNING.value, owner, now, pipeline, task_id))
            if task.overwrite:
                for other in self._earlier_live(db, task):
                    db.execute(
                        "UPDATE ddl_task SET task_status = ?, owner = NULL, reason = ?, update_time = ?"
                        " WHERE pipeline = ? AND task_id = ?",
                        (DdlTaskStatus.DEPRECATED.value, OVERWRITTEN_BY + task_id, now,
                         pipeline, other.task_id),
                    )
            claimed = self._get_ddl_task(db, pipeline, task_id)
        assert claimed is not None
        return DdlClaim(True, claimed)

    def _earlier_live(self, db: sqlite3.Connection, task: DdlTask) -> builtins.list[DdlTask]:
        rows = db.execute(
            f"SELECT {_DDL_TASK_COLUMNS} FROM ddl_task WHERE pipeline = ? AND op_id = ?"
            " AND task_status != ? AND task_id != ?",
            (task.pipeline, task.op_id, DdlTaskStatus.DEPRECATED.value, task.task_id),
        ).fetchall()
        return [t for t in map(self._ddl_task, rows) if task.overwrites(t)]

    def finish(self, pipeline: str, task_id: str, owner: str, status: DdlTaskStatus,
               reason: str | None = None) -> DdlTask:
        status = finishing_status(status)
        with self._tx() as db:
            db.execute(
                "UPDATE ddl_task SET task_status = ?, owner = NULL, reason = ?, update_time = ?"
                " WHERE pipeline = ? AND task_id = ? AND task_status = ? AND owner = ?",
                (status.value, reason, self._clock(), pipeline, task_id,
                 DdlTaskStatus.RUNNING.value, owner),
            )
            task = self._get_ddl_task(db, pipeline, task_id)
        if task is None:
            raise never_declared(pipeline, task_id)
        return task
