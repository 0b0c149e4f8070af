"""An SQLite database as the target: the embedded demo target, with the batch position in it.

Tables are named ``"schema.table"`` (`setl.routing.flat_name`: a ``.`` or ``%`` inside either part is
%XX-quoted) and created on first sight from the row
images (primary key from the change); columns that appear later are added.
Each batch is one transaction that also records the batch's end position in
`setl_position`, so a replay after a crash is recognised by `committed()`.
Under ``load.mode: per_table`` each part records its table's end position in
`setl_table_position` in its own transaction and skips the changes that table
holds already, so replays apply each change to each table once.
"""

from __future__ import annotations

import operator
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from setl.errors import LoadError, RefusedLoadError, TransientLoadError
from setl.model import Batch, Change, DdlChange, InvalidDate, Position, RowChange, partial_image_refusal
from setl.routing import flat_name
from setl.sinks.merge import TableChanges, merge
from setl.stages.load import Load, LoadCapabilities
from setl.values import Geometry


@attrs.frozen
class SqliteTargetConfig:
    """An SQLite database file (the embedded demo target)."""

    type: Literal["sqlite"]
    path: str  # the database file (relative to the conf directory)

# A zero or partial date is stored as its text, as SQLite stores every date.
sqlite3.register_adapter(InvalidDate, str)
sqlite3.register_adapter(Geometry, operator.attrgetter("data"))


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteLoad(Load):
    """Loads batches into an SQLite file (see the module docstring)."""

    capabilities = LoadCapabilities(per_table=True, stores_position=True, creates_tables=True)

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
            " offset INTEGER NOT NULL, gtid TEXT, batch_id INTEGER NOT NULL, epoch INTEGER NOT NULL,"
            " row INTEGER NOT NULL DEFAULT 0)"
        )
        # Files made before positions had a row: add it.
        if "row" not in {r[1] for r in self._db.execute("PRAGMA table_info(setl_position)")}:
            self._db.execute("ALTER TABLE setl_position ADD COLUMN row INTEGER NOT NULL DEFAULT 0")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS setl_table_position (pipeline TEXT NOT NULL, target_table TEXT NOT NULL,"
            " log TEXT NOT NULL, offset INTEGER NOT NULL, row INTEGER NOT NULL DEFAULT 0,"
            " PRIMARY KEY (pipeline, target_table))"
        )

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self.open()
        assert self._db is not None
        return self._db

    def committed(self) -> Position | None:
        row = self.db.execute(
            "SELECT log, offset, gtid, row FROM setl_position WHERE pipeline = ?", (self.pipeline,)
        ).fetchone()
        return Position(row[0], row[1], row[2], row=row[3]) if row else None

    def _ensure_table(self, name: str, key: tuple[str, ...], images: Iterable[Mapping[str, Any]]) -> None:
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
        """One table's share of a batch (load.mode per_table): its rows and the table's position in
        one transaction, skipping the changes the table holds already (after the pipeline's
        recorded position, at or before the table's), so a replay applies each change once."""
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
                    if isinstance(change, DdlChange) and change.snapshot and change.table:
                        # a snapshot's TRUNCATE (the copy that follows replaces the table)
                        name = flat_name(change.schema, change.table)
                        if self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                           (name,)).fetchone():
                            self.db.execute(f'DELETE FROM "{name}"')
                    elif isinstance(change, DdlChange) and change.copy_end:
                        pass  # a copy's end: the copy went into the table itself
                    elif isinstance(change, DdlChange) and change.refused is not None:
                        raise change.refusal(self.pipeline, batch.id, change.position or batch.end)
                    elif isinstance(change, DdlChange):
                        raise LoadError("the SQLite target does not apply DDL",
                                        table=change.qualified_table)
                batch = batch.replace(tuple(c for c in batch.changes if not isinstance(c, DdlChange)))
                changes = batch.changes if record else self._unapplied(batch)
                for table in merge(changes):
                    if table.patches:
                        name = f"{table.schema}.{table.table}"
                        raise RefusedLoadError(partial_image_refusal("a partial update", name, "the SQLite target "
                                                                     "does not apply partial row images"), table=name)
                    table_name = flat_name(table.schema, table.table)
                    # A table first seen through deletes alone (its insert merged away in this
                    # batch) is created from the deletes' images: they name its key at least.
                    self._ensure_table(table_name, table.primary_key,
                                       [*table.upserts, *(c.after for c in table.sequence if c.after)]
                                       or [*table.deletes, *(c.before for c in table.sequence if c.before)])
                    self._apply(table_name, table)
                if record:
                    self.db.execute(
                        "INSERT INTO setl_position (pipeline, log, offset, gtid, batch_id, epoch, row)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE"
                        " SET log = excluded.log, offset = excluded.offset, gtid = excluded.gtid,"
                        " batch_id = excluded.batch_id, epoch = excluded.epoch, row = excluded.row",
                        (self.pipeline, batch.end.log, batch.end.offset, batch.end.gtid, batch.id, batch.epoch,
                         batch.end.row),
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

    def _unapplied(self, batch: Batch) -> tuple[Change, ...]:
        """In the open transaction: `batch`'s changes its tables do not hold yet; records each
        table's new position (never moved back)."""
        row = self.db.execute("SELECT log, offset, row FROM setl_position WHERE pipeline = ?",
                              (self.pipeline,)).fetchone()
        pipeline_at = Position(row[0], row[1], row=row[2]) if row else None
        tables: dict[str, Position | None] = {}
        keep = []
        for change in batch.changes:
            name = flat_name(change.schema, change.table or "")
            if name not in tables:
                found = self.db.execute("SELECT log, offset, row FROM setl_table_position WHERE pipeline = ?"
                                        " AND target_table = ?", (self.pipeline, name)).fetchone()
                tables[name] = Position(found[0], found[1], row=found[2]) if found else None
            table_at = tables[name]
            if (isinstance(change, RowChange) and change.position is not None and table_at is not None
                    and change.position <= table_at and (pipeline_at is None or change.position > pipeline_at)):
                continue
            keep.append(change)
        for name, table_at in tables.items():
            if table_at is None or batch.end > table_at:
                self.db.execute(
                    "INSERT INTO setl_table_position VALUES (?, ?, ?, ?, ?) ON CONFLICT (pipeline, target_table)"
                    " DO UPDATE SET log = excluded.log, offset = excluded.offset, row = excluded.row",
                    (self.pipeline, name, batch.end.log, batch.end.offset, batch.end.row))
        return tuple(keep)

    def _apply(self, name: str, table: TableChanges) -> None:
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
                    f"INSERT INTO {_q(name)} ({', '.join(map(_q, columns))}) "
                    f"VALUES ({', '.join('?' for _ in columns)})",
                    tuple(change.after.values()),
                )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
