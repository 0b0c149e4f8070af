"""The embedded meta store: one SQLite file in WAL mode, shared by a node and the CLI."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from setl.errors import MetaStoreError
from setl.meta.base import MetaStore, PipelineState, Status
from setl.model import Ack, Position

_SCHEMA = """
CREATE TABLE IF NOT EXISTS position (
    pipeline TEXT PRIMARY KEY,
    batch_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    log TEXT NOT NULL,
    offset INTEGER NOT NULL,
    gtid TEXT,
    origin TEXT NOT NULL DEFAULT 'ack',
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ack_history (
    pipeline TEXT NOT NULL,
    batch_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    log TEXT NOT NULL,
    offset INTEGER NOT NULL,
    gtid TEXT,
    rows INTEGER NOT NULL,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ack_history_by_pipeline ON ack_history (pipeline, time);
CREATE TABLE IF NOT EXISTS pipeline_state (
    pipeline TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    error TEXT,
    epoch INTEGER NOT NULL DEFAULT 0,
    node TEXT,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ddl_task (
    task_id TEXT PRIMARY KEY,
    task_status TEXT NOT NULL,
    overwrite INTEGER NOT NULL DEFAULT 0,
    op_id TEXT NOT NULL,
    create_time REAL NOT NULL,
    update_time REAL NOT NULL
);
"""

#: How many history rows to keep per pipeline.
HISTORY_KEEP = 1000


class SqliteMetaStore(MetaStore):
    """Meta store in one SQLite file.

    WAL mode lets the CLI read while a node writes. `synchronous=NORMAL` may
    lose the last acks on a power failure, never corrupt them: a lost ack only
    replays batches, which loads make harmless.
    """

    def __init__(self, path: str | Path, *, clock=time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        self._acks = 0
        try:
            if str(self.path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise MetaStoreError(f"cannot open meta store {self.path}: {exc}") from exc

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise MetaStoreError(f"meta store {self.path}: {exc}") from exc

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise MetaStoreError(f"meta store {self.path}: {exc}") from exc

    def position(self, pipeline: str) -> Ack | None:
        rows = self._query(
            "SELECT batch_id, epoch, log, offset, gtid, time FROM position WHERE pipeline = ?",
            (pipeline,),
        )
        if not rows:
            return None
        batch_id, epoch, log, offset, gtid, when = rows[0]
        return Ack(pipeline, batch_id, epoch, Position(log, offset, gtid), when)

    def ack(self, pipeline: str, batch_id: int, epoch: int, position: Position, rows: int = 0) -> Ack:
        now = self._clock()
        with self._tx() as db:
            db.execute(
                "INSERT INTO position (pipeline, batch_id, epoch, log, offset, gtid, origin, time)"
                " VALUES (?, ?, ?, ?, ?, ?, 'ack', ?)"
                " ON CONFLICT (pipeline) DO UPDATE SET batch_id = excluded.batch_id,"
                " epoch = excluded.epoch, log = excluded.log, offset = excluded.offset,"
                " gtid = excluded.gtid, origin = 'ack', time = excluded.time",
                (pipeline, batch_id, epoch, position.log, position.offset, position.gtid, now),
            )
            db.execute(
                "INSERT INTO ack_history VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (pipeline, batch_id, epoch, position.log, position.offset, position.gtid, rows, now),
            )
            self._acks += 1
            if self._acks % 200 == 0:
                db.execute(
                    "DELETE FROM ack_history WHERE pipeline = ? AND rowid NOT IN (SELECT rowid FROM"
                    " ack_history WHERE pipeline = ? ORDER BY rowid DESC LIMIT ?)",
                    (pipeline, pipeline, HISTORY_KEEP),
                )
        return Ack(pipeline, batch_id, epoch, position, now)

    def reset_position(self, pipeline: str, position: Position | None) -> None:
        with self._tx() as db:
            if position is None:
                db.execute("DELETE FROM position WHERE pipeline = ?", (pipeline,))
                return
            current = self.position(pipeline)
            db.execute(
                "INSERT INTO position (pipeline, batch_id, epoch, log, offset, gtid, origin, time)"
                " VALUES (?, ?, ?, ?, ?, ?, 'reset', ?)"
                " ON CONFLICT (pipeline) DO UPDATE SET log = excluded.log, offset = excluded.offset,"
                " gtid = excluded.gtid, origin = 'reset', time = excluded.time",
                (
                    pipeline,
                    current.batch_id if current else 0,
                    current.epoch if current else 0,
                    position.log,
                    position.offset,
                    position.gtid,
                    self._clock(),
                ),
            )

    def position_was_reset(self, pipeline: str) -> bool:
        rows = self._query("SELECT origin FROM position WHERE pipeline = ?", (pipeline,))
        return bool(rows) and rows[0][0] == "reset"

    def history(self, pipeline: str, limit: int = 20) -> list[Ack]:
        rows = self._query(
            "SELECT batch_id, epoch, log, offset, gtid, time FROM ack_history WHERE pipeline = ?"
            " ORDER BY rowid DESC LIMIT ?",
            (pipeline, limit),
        )
        return [Ack(pipeline, b, e, Position(lg, off, g), t) for b, e, lg, off, g, t in rows]

    def state(self, pipeline: str) -> PipelineState:
        rows = self._query(
            "SELECT status, error, epoch, node, updated FROM pipeline_state WHERE pipeline = ?",
            (pipeline,),
        )
        if not rows:
            return PipelineState(pipeline)
        status, error, epoch, node, updated = rows[0]
        return PipelineState(pipeline, Status(status), error, epoch, node, updated)

    def set_state(
        self, pipeline: str, status: Status, error: str | None = None, node: str | None = None
    ) -> PipelineState:
        now = self._clock()
        with self._tx() as db:
            db.execute(
                "INSERT INTO pipeline_state (pipeline, status, error, epoch, node, updated)"
                " VALUES (?, ?, ?, 0, ?, ?) ON CONFLICT (pipeline) DO UPDATE SET"
                " status = excluded.status, error = excluded.error, node = excluded.node,"
                " updated = excluded.updated",
                (pipeline, Status(status).value, error, node, now),
            )
        return self.state(pipeline)

    def next_epoch(self, pipeline: str) -> int:
        with self._tx() as db:
            db.execute(
                "INSERT INTO pipeline_state (pipeline, status, epoch, updated) VALUES (?, ?, 1, ?)"
                " ON CONFLICT (pipeline) DO UPDATE SET epoch = epoch + 1",
                (pipeline, Status.STOPPED.value, self._clock()),
            )
            (epoch,) = db.execute(
                "SELECT epoch FROM pipeline_state WHERE pipeline = ?", (pipeline,)
            ).fetchone()
        return int(epoch)

    def pipelines(self) -> list[str]:
        rows = self._query(
            "SELECT pipeline FROM pipeline_state UNION SELECT pipeline FROM position ORDER BY 1"
        )
        return [r[0] for r in rows]

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
