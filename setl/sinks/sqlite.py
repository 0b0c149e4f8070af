"""An SQLite database as the target: the embedded demo target, with the batch position in it.

Tables are named ``"schema.table"`` and created on first sight from the row
images (primary key from the change); columns that appear later are added.
Each batch is one transaction that also records the batch's end position in
`setl_position`, so a replay after a crash is recognised by `committed()`.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from setl.errors import LoadError, TransientLoadError
from setl.model import Batch, DdlChange, InvalidDate, Position
from setl.sinks.merge import merge
from setl.stages.load import Load

# A zero or partial date is stored as its text, as SQLite stores every date.
sqlite3.register_adapter(InvalidDate, str)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteLoad(Load):
    """Loads batches into an SQLite file (see the module docstring)."""

    def __init__(self, path: str | Path, *, pipeline: str) -> None:
        self.path = Path(path)
        self.pipeline = pipeline
        self._db: sqlite3.Connection | None = None
        self._columns: dict[str, set[str]] = {}
        self._lock = threading.Lock()  # per_table parts of different tables share the connection

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS setl_position (pipeline TEXT PRIMARY KEY, log TEXT NOT NULL,"
            " offset INTEGER NOT NULL, gtid TEXT, batch_id INTEGER NOT NULL, epoch INTEGER NOT NULL)"
        )

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self.open()
        assert self._db is not None
        return self._db

    def committed(self) -> Position | None:
        row = self.db.execute(
            "SELECT log, offset, gtid FROM setl_position WHERE pipeline = ?", (self.pipeline,)
        ).fetchone()
        return Position(*row) if row else None

    def _ensure_table(self, name: str, key: tuple[str, ...], images) -> None:
        known = self._columns.get(name)
        if known is None:
            rows = self.db.execute(f"PRAGMA table_info({_q(name)})").fetchall()
            known = {r[1] for r in rows}
            if not known:
                columns = list(dict.fromkeys(c for image in images for c in image))
                pk = f", PRIMARY KEY ({', '.join(map(_q, key))})" if key else ""
                self.db.execute(f"CREATE TABLE {_q(name)} ({', '.join(map(_q, columns))}{pk})")
                known = set(columns)
            self._columns[name] = known
        for image in images:
            for column in image:
                if column not in known:
                    self.db.execute(f"ALTER TABLE {_q(name)} ADD COLUMN {_q(column)}")
                    known.add(column)

    def load(self, batch: Batch) -> None:
        with self._lock:
            self._load(batch, record=True)

    def load_part(self, batch: Batch) -> None:
        """One table's share of a batch (load.mode per_table): its rows, without the position."""
        with self._lock:
            self._load(batch, record=False)

    def mark_loaded(self, batch: Batch) -> None:
        """Every part of `batch` is in: record its position (a batch with no rows)."""
        self.load(batch.replace(()))

    def _load(self, batch: Batch, *, record: bool) -> None:
        table_name = None
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for change in batch.changes:
                    if isinstance(change, DdlChange):
                        raise LoadError("the SQLite target does not apply DDL",
                                        table=change.qualified_table)
                for table in merge(batch.changes):
                    table_name = f"{table.schema}.{table.table}"
                    self._ensure_table(table_name, table.primary_key,
                                       [*table.upserts, *(c.after for c in table.sequence if c.after)])
                    self._apply(table_name, table)
                if record:
                    self.db.execute(
                        "INSERT INTO setl_position VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE"
                        " SET log = excluded.log, offset = excluded.offset, gtid = excluded.gtid,"
                        " batch_id = excluded.batch_id, epoch = excluded.epoch",
                        (self.pipeline, batch.end.log, batch.end.offset, batch.end.gtid, batch.id, batch.epoch),
                    )
            except BaseException:
                self.db.execute("ROLLBACK")
                self._columns.clear()
                raise
            self.db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise TransientLoadError(str(exc), table=table_name) from exc
            raise LoadError(str(exc), table=table_name) from exc
        except sqlite3.Error as exc:
            raise LoadError(f"{type(exc).__name__}: {exc}", table=table_name) from exc

    def _apply(self, name: str, table) -> None:
        key = table.primary_key
        if key:
            where = " AND ".join(f"{_q(c)} = ?" for c in key)
            self.db.executemany(
                f"DELETE FROM {_q(name)} WHERE {where}",
                [tuple(image[c] for c in key) for image in table.deletes],
            )
            by_columns: dict[tuple[str, ...], list] = {}
            for image in table.upserts:
                by_columns.setdefault(tuple(image), []).append(tuple(image.values()))
            for columns, rows in by_columns.items():
                self.db.executemany(
                    f"INSERT OR REPLACE INTO {_q(name)} ({', '.join(map(_q, columns))})"
                    f" VALUES ({', '.join('?' for _ in columns)})",
                    rows,
                )
            return
        for change in table.sequence:
            if change.before is not None:
                where = " AND ".join(f"{_q(c)} IS ?" for c in change.before)
                self.db.execute(
                    f"DELETE FROM {_q(name)} WHERE rowid = (SELECT rowid FROM {_q(name)} WHERE {where} LIMIT 1)",
                    tuple(change.before.values()),
                )
            if change.after is not None:
                columns = tuple(change.after)
                self.db.execute(
                    f"INSERT INTO {_q(name)} ({', '.join(map(_q, columns))}) VALUES ({', '.join('?' for _ in columns)})",
                    tuple(change.after.values()),
                )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
