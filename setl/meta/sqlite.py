"""The embedded meta store: one SQLite file in WAL mode, shared by a node and the CLI."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tenacity

from setl.errors import MetaStoreError
from setl.meta.base import (
    FORGOTTEN,
    STALE_AFTER,
    DdlTasksInPart,
    Liveness,
    PipelineState,
    RepairRequest,
    Status,
)
from setl.meta.sqlite_tasks import SqliteDdlTasks
from setl.model import Ack, Position, TableName
from setl.tablecopy import TableProgress

_SCHEMA = """
CREATE TABLE IF NOT EXISTS position (
    pipeline TEXT PRIMARY KEY,
    batch_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    log TEXT NOT NULL,
    offset INTEGER NOT NULL,
    gtid TEXT,
    origin TEXT NOT NULL DEFAULT 'ack',
    time REAL NOT NULL,
    row INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ack_history (
    pipeline TEXT NOT NULL,
    batch_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    log TEXT NOT NULL,
    offset INTEGER NOT NULL,
    gtid TEXT,
    rows INTEGER NOT NULL,
    time REAL NOT NULL,
    row INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ack_history_by_pipeline ON ack_history (pipeline, time);
CREATE TABLE IF NOT EXISTS liveness (
    pipeline TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    node TEXT,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started REAL NOT NULL,
    time REAL NOT NULL,
    figures TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS pipeline_state (
    pipeline TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    error TEXT,
    epoch INTEGER NOT NULL DEFAULT 0,
    node TEXT,
    updated REAL NOT NULL,
    retrying_since REAL
);
"""


# Snapshot progress (setl.snapshot): one row per pipeline and source table, and operators' requests.
_SNAPSHOT_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshot_table (
    pipeline TEXT NOT NULL,
    schema_name TEXT NOT NULL,
    table_name TEXT NOT NULL,
    progress TEXT NOT NULL,
    PRIMARY KEY (pipeline, schema_name, table_name)
);
CREATE TABLE IF NOT EXISTS snapshot_request (
    pipeline TEXT NOT NULL,
    schema_name TEXT NOT NULL,
    table_name TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (pipeline, schema_name, table_name)
);
CREATE TABLE IF NOT EXISTS verify_result (
    pipeline TEXT NOT NULL PRIMARY KEY,
    result TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reload_request (
    pipeline TEXT NOT NULL PRIMARY KEY,
    request TEXT NOT NULL,
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS repair_request (
    pipeline TEXT NOT NULL,
    id TEXT NOT NULL,
    request TEXT NOT NULL,
    PRIMARY KEY (pipeline, id)
);
"""

#: (table, column, type) added after the first release; `SqliteMetaStore` adds them to older files.
_ADDED_COLUMNS = (
    ("pipeline_state", "retrying_since", "REAL"),
    ("position", "row", "INTEGER NOT NULL DEFAULT 0"),  # Position.row; 0 for older positions
    ("ack_history", "row", "INTEGER NOT NULL DEFAULT 0"),
)

#: How many history rows to keep per pipeline.
HISTORY_KEEP = 1000

#: How long opening the file waits for other processes holding it (each statement and in all).
_BUSY_SECONDS = 30.0


def _is_busy(exc: BaseException) -> bool:
    """SQLite's "database is locked" / "database is busy": another connection holds the file."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


class SqliteMetaStore(DdlTasksInPart):
    """Meta store in one SQLite file.

    WAL mode lets the CLI read while a node writes. `synchronous=NORMAL` may
    lose the last acks on a power failure, never corrupt them: a lost ack only
    replays batches, which loads make harmless.
    """

    _tasks: SqliteDdlTasks

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        self._acks = 0
        self._tasks = SqliteDdlTasks(self.path, self._tx, self._query, clock)
        try:
            if str(self.path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), timeout=_BUSY_SECONDS, isolation_level=None, check_same_thread=False
            )
            for attempt in tenacity.Retrying(
                retry=tenacity.retry_if_exception(_is_busy),
                stop=tenacity.stop_after_delay(_BUSY_SECONDS),
                wait=tenacity.wait_random_exponential(multiplier=0.02, max=0.5),
                reraise=True,
            ):
                with attempt:
                    self._prepare()
        except sqlite3.Error as exc:
            raise MetaStoreError(f"cannot open meta store {self.path}: {exc}") from exc

    def _prepare(self) -> None:
        """WAL mode and every table and column; each step idempotent, so a busy one is run again.

        Some of these steps (switching the journal mode, the first look at a WAL file another
        process is just creating or recovering) fail with "database is locked" at once, without
        waiting on the connection's busy timeout; several processes opening one file together
        (a node and CLI commands starting at once) then need the retry around this.
        """
        (mode,) = self._db.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() != "wal" and str(self.path) != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._tasks.create_table(self._db)
        self._db.executescript(_SNAPSHOT_SCHEMA)
        self._add_columns()

    def _add_columns(self) -> None:
        """Columns newer than the file: added in place, so an older meta store keeps working."""
        for table, column, kind in _ADDED_COLUMNS:
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                try:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                except sqlite3.OperationalError as exc:
                    # Another process opening the same file added it between the look and the ALTER
                    # (a node and a CLI command starting together): then it is there, as wanted.
                    if not str(exc).startswith("duplicate column name"):
                        raise

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

    # -- liveness

    def _liveness(self, db: sqlite3.Connection, pipeline: str) -> Liveness | None:
        row = db.execute("SELECT token, node, host, pid, started, time, figures FROM liveness WHERE pipeline = ?",
                         (pipeline,)).fetchone()
        if row is None:
            return None
        token, node, host, pid, started, when, figures = row
        return Liveness(pipeline, token, node, host, pid, started, when, json.loads(figures or "{}"))

    def claim_run(self, live: Liveness, stale_after: float = STALE_AFTER) -> Liveness | None:
        now = self._clock()
        with self._tx() as db:
            holder = self._liveness(db, live.pipeline)
            if holder is not None and holder.token != live.token and stale_after > 0 \
                    and not holder.stale(now, stale_after):
                return holder
            db.execute(
                "INSERT INTO liveness (pipeline, token, node, host, pid, started, time, figures)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE SET token = excluded.token,"
                " node = excluded.node, host = excluded.host, pid = excluded.pid, started = excluded.started,"
                " time = excluded.time, figures = excluded.figures",
                (live.pipeline, live.token, live.node, live.host, live.pid, live.started, now,
                 json.dumps(dict(live.figures))),
            )
        return None

    def beat(self, live: Liveness) -> bool:
        with self._tx() as db:
            cursor = db.execute("UPDATE liveness SET time = ?, figures = ? WHERE pipeline = ? AND token = ?",
                                (self._clock(), json.dumps(dict(live.figures)), live.pipeline, live.token))
            return cursor.rowcount == 1

    def release_run(self, pipeline: str, token: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM liveness WHERE pipeline = ? AND token = ?", (pipeline, token))

    def liveness(self, pipeline: str) -> Liveness | None:
        with self._lock:
            try:
                return self._liveness(self._db, pipeline)
            except sqlite3.Error as exc:
                raise MetaStoreError(f"meta store {self.path}: {exc}") from exc

    def position(self, pipeline: str) -> Ack | None:
        rows = self._query(
            "SELECT batch_id, epoch, log, offset, gtid, time, row FROM position WHERE pipeline = ? AND origin <> ?",
            (pipeline, FORGOTTEN),
        )
        if not rows:
            return None
        batch_id, epoch, log, offset, gtid, when, row = rows[0]
        return Ack(pipeline, batch_id, epoch, Position(log, offset, gtid, row=row), when)

    def ack(self, pipeline: str, batch_id: int, epoch: int, position: Position, rows: int = 0, *,
            progress: Sequence[TableProgress] = ()) -> Ack:
        now = self._clock()
        with self._tx() as db:
            self._write_progress(db, pipeline, progress)
            db.execute(
                "INSERT INTO position (pipeline, batch_id, epoch, log, offset, gtid, origin, time, row)"
                " VALUES (?, ?, ?, ?, ?, ?, 'ack', ?, ?)"
                " ON CONFLICT (pipeline) DO UPDATE SET batch_id = excluded.batch_id,"
                " epoch = excluded.epoch, log = excluded.log, offset = excluded.offset,"
                " gtid = excluded.gtid, origin = 'ack', time = excluded.time, row = excluded.row",
                (pipeline, batch_id, epoch, position.log, position.offset, position.gtid, now, position.row),
            )
            db.execute(
                "INSERT INTO ack_history (pipeline, batch_id, epoch, log, offset, gtid, rows, time, row)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (pipeline, batch_id, epoch, position.log, position.offset, position.gtid, rows, now, position.row),
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
            current = self.position(pipeline)
            if position is None:  # a marker: no position, and the target's own record is ignored
                db.execute(
                    "INSERT INTO position (pipeline, batch_id, epoch, log, offset, gtid, origin, time)"
                    " VALUES (?, ?, ?, '', 0, NULL, ?, ?)"
                    " ON CONFLICT (pipeline) DO UPDATE SET log = '', offset = 0, gtid = NULL, row = 0,"
                    " origin = excluded.origin, time = excluded.time",
                    (pipeline, current.batch_id if current else 0, current.epoch if current else 0, FORGOTTEN,
                     self._clock()),
                )
                return
            db.execute(
                "INSERT INTO position (pipeline, batch_id, epoch, log, offset, gtid, origin, time, row)"
                " VALUES (?, ?, ?, ?, ?, ?, 'reset', ?, ?)"
                " ON CONFLICT (pipeline) DO UPDATE SET log = excluded.log, offset = excluded.offset,"
                " gtid = excluded.gtid, origin = 'reset', time = excluded.time, row = excluded.row",
                (
                    pipeline,
                    current.batch_id if current else 0,
                    current.epoch if current else 0,
                    position.log,
                    position.offset,
                    position.gtid,
                    self._clock(),
                    position.row,
                ),
            )

    def position_was_reset(self, pipeline: str) -> bool:
        rows = self._query("SELECT origin FROM position WHERE pipeline = ?", (pipeline,))
        return bool(rows) and rows[0][0] in ("reset", FORGOTTEN)

    def history(self, pipeline: str, limit: int = 20) -> list[Ack]:
        rows = self._query(
            "SELECT batch_id, epoch, log, offset, gtid, time, row FROM ack_history WHERE pipeline = ?"
            " ORDER BY rowid DESC LIMIT ?",
            (pipeline, limit),
        )
        return [Ack(pipeline, b, e, Position(lg, off, g, row=r), t) for b, e, lg, off, g, t, r in rows]

    def state(self, pipeline: str) -> PipelineState:
        rows = self._query(
            "SELECT status, error, epoch, node, updated, retrying_since FROM pipeline_state WHERE pipeline = ?",
            (pipeline,),
        )
        if not rows:
            return PipelineState(pipeline)
        status, error, epoch, node, updated, retrying_since = rows[0]
        return PipelineState(pipeline, Status(status), error, epoch, node, updated, retrying_since)

    def set_state(
        self, pipeline: str, status: Status, error: str | None = None, node: str | None = None,
        *, retrying_since: float | None = None,
    ) -> PipelineState:
        now = self._clock()
        with self._tx() as db:
            db.execute(
                "INSERT INTO pipeline_state (pipeline, status, error, epoch, node, updated, retrying_since)"
                " VALUES (?, ?, ?, 0, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE SET"
                " status = excluded.status, error = excluded.error, node = excluded.node,"
                " updated = excluded.updated, retrying_since = excluded.retrying_since",
                (pipeline, Status(status).value, error, node, now, retrying_since),
            )
        return self.state(pipeline)

    def next_epoch(self, pipeline: str, at_least: int = 1) -> int:
        with self._tx() as db:
            db.execute(
                "INSERT INTO pipeline_state (pipeline, status, epoch, updated) VALUES (?, ?, MAX(1, ?), ?)"
                " ON CONFLICT (pipeline) DO UPDATE SET epoch = MAX(epoch + 1, ?)",
                (pipeline, Status.STOPPED.value, at_least, self._clock(), at_least),
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

    # -- snapshots

    def snapshot_progress(self, pipeline: str) -> list[TableProgress]:
        rows = self._query("SELECT progress FROM snapshot_table WHERE pipeline = ? ORDER BY schema_name, table_name",
                           (pipeline,))
        return [TableProgress.from_dict(json.loads(row[0])) for row in rows]

    def save_snapshot_progress(self, pipeline: str, progress: list[TableProgress]) -> None:
        with self._tx() as db:
            self._write_progress(db, pipeline, progress)

    @staticmethod
    def _write_progress(db: sqlite3.Connection, pipeline: str, progress: Sequence[TableProgress]) -> None:
        """Within the caller's transaction: replace each table's stored copy progress."""
        for table in progress:
            db.execute("INSERT INTO snapshot_table (pipeline, schema_name, table_name, progress)"
                       " VALUES (?, ?, ?, ?) ON CONFLICT (pipeline, schema_name, table_name)"
                       " DO UPDATE SET progress = excluded.progress",
                       (pipeline, table.schema, table.table, json.dumps(table.to_dict())))

    def request_snapshot(self, pipeline: str, table: TableName) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO snapshot_request (pipeline, schema_name, table_name, time)"
                       " VALUES (?, ?, ?, ?)", (pipeline, table.schema, table.table, self._clock()))

    def snapshot_requests(self, pipeline: str) -> list[TableName]:
        rows = self._query("SELECT schema_name, table_name FROM snapshot_request WHERE pipeline = ?"
                           " ORDER BY time, schema_name, table_name", (pipeline,))
        return [TableName(str(schema), str(table)) for schema, table in rows]

    def drop_snapshot_request(self, pipeline: str, table: TableName) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM snapshot_request WHERE pipeline = ? AND schema_name = ? AND table_name = ?",
                       (pipeline, table.schema, table.table))

    def save_verify_result(self, pipeline: str, result: Mapping[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO verify_result (pipeline, result) VALUES (?, ?)",
                       (pipeline, json.dumps(dict(result))))

    def verify_result(self, pipeline: str) -> dict[str, Any] | None:
        rows = self._query("SELECT result FROM verify_result WHERE pipeline = ?", (pipeline,))
        return dict(json.loads(str(rows[0][0]))) if rows else None

    def request_reload(self, pipeline: str, request_id: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO reload_request (pipeline, request, time) VALUES (?, ?, ?)",
                       (pipeline, request_id, self._clock()))

    def reload_request(self, pipeline: str) -> str | None:
        rows = self._query("SELECT request FROM reload_request WHERE pipeline = ?", (pipeline,))
        return str(rows[0][0]) if rows else None

    def request_repair(self, pipeline: str, request: RepairRequest) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO repair_request (pipeline, id, request) VALUES (?, ?, ?)",
                       (pipeline, request.id, json.dumps(request.to_dict())))

    def repair_requests(self, pipeline: str) -> list[RepairRequest]:
        rows = self._query("SELECT request FROM repair_request WHERE pipeline = ? ORDER BY id", (pipeline,))
        return [RepairRequest.from_dict(json.loads(str(row[0]))) for row in rows]

    def drop_repair_request(self, pipeline: str, request_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM repair_request WHERE pipeline = ? AND id = ?", (pipeline, request_id))
