"""Reading a table's rows for a snapshot: chunk boundaries, and chunks in consistent snapshots.

Every query runs on the server, which compares keys with the columns' own collations: a boundary is
the key `chunk_rows` rows after the last one (``ORDER BY key LIMIT 1 OFFSET n-1``), never a value
computed or compared in Python. A chunk is read in its own short transaction, ``START TRANSACTION
WITH CONSISTENT SNAPSHOT, READ ONLY``, whose binlog position the server tells
(``Binlog_snapshot_file``/``Binlog_snapshot_position``, MariaDB): the chunk is the table's rows in
its key range exactly as they stood at that position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pymysql
import pymysql.cursors

from setl import ddl, failpoints
from setl import values as canonical
from setl.errors import SourceError
from setl.model import InvalidDate, Position, TableName
from setl.snapshot.rows import fetch_dicts

_DATES = frozenset({"date", "datetime", "timestamp"})
#: Engines whose reads in a consistent snapshot see the table as of the snapshot's position.
TRANSACTIONAL_ENGINES = frozenset({"innodb", "xtradb", "rocksdb", "tokudb"})
#: the types `ChunkReader.image` converts
_CONVERTED = _DATES | {"set", "bit"} | canonical.FROM_TEXT.keys()


@attrs.frozen
class TablePlan:
    """What copying a table needs: its columns in table order, their types, and its primary key."""

    name: TableName
    columns: tuple[str, ...]
    types: Mapping[str, str]  # column -> information_schema DATA_TYPE, lower case
    key: tuple[str, ...]
    estimate: int
    #: its engine is MVCC (InnoDB): a consistent snapshot covers it. MyISAM, Aria or MEMORY
    #: rows are read as they are when the SELECT runs, whatever the snapshot's position says.
    transactional: bool = True

    @property
    def keyless(self) -> bool:
        return not self.key

    @property
    def quoted(self) -> str:
        return f"{ddl.quote(self.name.schema)}.{ddl.quote(self.name.table)}"


def _q(name: str) -> str:
    """A quoted identifier for a statement sent with arguments (PyMySQL %-formats it: `%` doubled)."""
    return ddl.quote(name).replace("%", "%%")


def _after(columns: Sequence[str], strict: bool, quote: Callable[[str], str] = _q) -> str:
    """``(columns) > (%s, ...)`` (or ``<=`` when not `strict`), expanded so that the range
    optimizer uses the key: ``c1 > v1 OR (c1 = v1 AND (c2 > v2 ...))``."""
    first = quote(columns[0])
    if len(columns) == 1:
        return f"{first} > %s" if strict else f"{first} <= %s"
    rest = _after(columns[1:], strict, quote)
    return f"({first} {'>' if strict else '<'} %s OR ({first} = %s AND ({rest})))"


def _args(values: Sequence[Any]) -> list[Any]:
    """The arguments of `_after`'s placeholders: each value but the last twice."""
    out: list[Any] = []
    for value in values[:-1]:
        out.extend((value, value))
    out.append(values[-1])
    return out


def key_range(names: Sequence[str], lower: tuple[Any, ...] | None, upper: tuple[Any, ...] | None,
              quote: Callable[[str], str] = _q) -> tuple[list[str], list[Any]]:
    """Conditions (to join with AND) and their ``%s`` arguments for keys in (`lower`, `upper`]
    (an open end when None), each expanded as `_after` does so that a key index serves them;
    `quote` quotes a column name for the statement."""
    conditions: list[str] = []
    arguments: list[Any] = []
    if lower is not None:
        conditions.append(_after(names, True, quote))
        arguments.extend(_args(lower))
    if upper is not None:
        conditions.append(_after(names, False, quote))
        arguments.extend(_args(upper))
    return conditions, arguments


class ChunkReader:
    """Queries for one table copy, on connections `connect` opens (autocommit, UTC sessions)."""

    def __init__(self, connect: Callable[[], pymysql.connections.Connection], pipeline: str) -> None:
        self.connect = connect
        self.pipeline = pipeline

    def _error(self, message: str, table: TableName | None = None) -> SourceError:
        return SourceError(message, pipeline=self.pipeline, stage="select",
                           table=str(table) if table is not None else None)

    @staticmethod
    def prepare(conn: pymysql.connections.Connection) -> None:
        with conn.cursor() as cur:
            # TIMESTAMPs as UTC, as the binlog source decodes them; REPEATABLE READ for the snapshot.
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def check(self, conn: pymysql.connections.Connection, where: str) -> None:
        """Refuse a server that cannot tell a consistent snapshot's binlog position."""
        with conn.cursor() as cur:
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_position'")
            found = cur.fetchall()
        if not found:
            raise self._error(f"server {where} has no Binlog_snapshot_position status variable: a snapshot "
                              "(source.start: snapshot, setl snapshot) needs MariaDB 10.0 or later")

    def plan(self, conn: pymysql.connections.Connection, table: TableName) -> TablePlan | None:
        """The table's columns, types, key and row estimate; None if it does not exist."""
        with conn.cursor() as cur:
            cur.execute("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (table.schema, table.table))
            columns = [(str(name), str(kind).lower()) for name, kind in cur.fetchall()]
            if not columns:
                return None
            cur.execute("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
                        (table.schema, table.table))
            # a system-versioned table's key holds its row end, a column COLUMNS lists only when
            # declared; the current rows (all a SELECT reads) are unique by the rest of the key
            names = {name for name, _ in columns}
            key = tuple(str(row[0]) for row in cur.fetchall() if str(row[0]) in names)
            cur.execute("SELECT TABLE_ROWS, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
                        "TABLE_NAME = %s", (table.schema, table.table))
            found = cur.fetchone()
        engine = str(found[1] or "").lower() if found else ""
        return TablePlan(table, tuple(c for c, _ in columns), dict(columns), key,
                         int(found[0] or 0) if found else 0, engine in TRANSACTIONAL_ENGINES)

    def has_rows(self, conn: pymysql.connections.Connection, plan: TablePlan) -> bool:
        with conn.cursor() as cur:
            cur.execute(f"SELECT 1 FROM {plan.quoted} LIMIT 1")
            return cur.fetchone() is not None

    def boundary(self, conn: pymysql.connections.Connection, plan: TablePlan, after: tuple[Any, ...] | None,
                 rows: int) -> tuple[Any, ...] | None:
        """The key `rows` rows after `after` (from the start when None), or None when fewer are left."""
        failpoints.hit("snapshot_boundary", task=str(plan.name))
        keys = ", ".join(_q(c) for c in plan.key)
        where = f"WHERE {_after(plan.key, True)} " if after is not None else ""
        table = plan.quoted.replace("%", "%%")
        with conn.cursor() as cur:
            cur.execute(f"SELECT {keys} FROM {table} {where}ORDER BY {keys} LIMIT 1 OFFSET %s",
                        [*(_args(after) if after is not None else []), rows - 1])
            found = cur.fetchone()
        return tuple(found) if found is not None else None

    def _begin(self, cur: pymysql.cursors.Cursor) -> Position:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(name).lower(): value for name, value in cur.fetchall()}
        return Position(str(status["binlog_snapshot_file"]), int(status["binlog_snapshot_position"]))

    def read(self, conn: pymysql.connections.Connection, plan: TablePlan, after: tuple[Any, ...] | None,
             upper: tuple[Any, ...] | None, started: Callable[[Position], None]) -> tuple[list[dict[str, Any]],
                                                                                         Position]:
        """The rows with key in (`after`, `upper`] (open ends when None), in key order, read in one
        consistent snapshot; and its binlog position (also passed to `started` as soon as known)."""
        conditions, args = key_range(plan.key, after, upper)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return self._read_where(conn, plan, f"{where} ORDER BY {', '.join(_q(c) for c in plan.key)}", args, started)

    def read_keys(self, conn: pymysql.connections.Connection, plan: TablePlan, keys: Sequence[Sequence[Any]],
                  started: Callable[[Position], None]) -> tuple[list[dict[str, Any]], Position]:
        """The rows whose key is one of `keys` (values of the key columns, as statement arguments),
        read in one consistent snapshot; and its binlog position (also passed to `started`)."""
        if len(plan.key) == 1:
            where = f"{_q(plan.key[0])} IN ({', '.join(['%s'] * len(keys))})"
        else:
            one = f"({', '.join(['%s'] * len(plan.key))})"
            where = f"({', '.join(_q(c) for c in plan.key)}) IN ({', '.join([one] * len(keys))})"
        return self._read_where(conn, plan, f" WHERE {where}", [value for key in keys for value in key], started)

    def _read_where(self, conn: pymysql.connections.Connection, plan: TablePlan, where: str, args: list[Any],
                    started: Callable[[Position], None]) -> tuple[list[dict[str, Any]], Position]:
        """``SELECT`` the plan's columns with `where` (the rest of the statement, `%s` for `args`) in
        one consistent snapshot; the rows, and the snapshot's binlog position (passed to `started`
        as soon as known)."""
        columns, table = self._select(plan).replace("%", "%%"), plan.quoted.replace("%", "%%")
        with conn.cursor() as cur:
            position = self._begin(cur)
            try:
                started(position)
                failpoints.hit("snapshot_read", task=str(plan.name))
                # always with arguments (maybe none), so always %-formatted: `%` in names doubled
                rows = fetch_dicts(conn, f"SELECT {columns} FROM {table}{where}", args, plan.columns)
            finally:
                cur.execute("COMMIT")
        return self.converted(plan, rows), position

    def read_all(self, conn: pymysql.connections.Connection, plan: TablePlan, piece_rows: int,
                 started: Callable[[Position], None], piece: Callable[[list[dict[str, Any]], bool], None],
                 running: Callable[[], None] | None = None) -> None:
        """Every row of a (keyless) table in one consistent snapshot, handed to `piece` in pieces of
        `piece_rows` (the last with True), streamed from the server.

        A table the snapshot does not cover (`TablePlan.transactional` false: MyISAM, Aria) is read
        as it is when the SELECT takes its lock, somewhere after the snapshot's position: `running`
        is called right after that, so that the caller can note the binlog's head then and tell
        whether the table was written in between."""
        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            position = self._begin(cur)
            try:
                started(position)
                failpoints.hit("snapshot_read", task=str(plan.name))
                cur.execute(f"SELECT {self._select(plan)} FROM {plan.quoted}")
                if running is not None and not plan.transactional:
                    running()
                rows: Any = cur.fetchmany(piece_rows)
                while True:
                    following = cur.fetchmany(piece_rows) if len(rows) == piece_rows else []
                    piece(self.images(plan, rows), not following)
                    if not following:
                        break
                    rows = following
            finally:
                cur.execute("COMMIT")

    @staticmethod
    def _select(plan: TablePlan) -> str:
        return ", ".join(ddl.quote(c) for c in plan.columns)

    @classmethod
    def images(cls, plan: TablePlan, rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        """`image` of each row; plain dicts when no column needs a conversion."""
        if any(kind in _CONVERTED for kind in plan.types.values()):
            return [cls.image(plan, row) for row in rows]
        columns = plan.columns
        return [dict(zip(columns, row)) for row in rows]

    @classmethod
    def converted(cls, plan: TablePlan, images: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`images` (rows as PyMySQL reads them, keyed by column) with `convert`'s values, changed in
        place; as they are when no column needs a conversion."""
        if any(kind in _CONVERTED for kind in plan.types.values()):
            for image in images:
                cls.convert(plan, image)
        return images

    @classmethod
    def image(cls, plan: TablePlan, row: Sequence[Any]) -> dict[str, Any]:
        """A row with the values the binlog source hands on for the same row (`convert`)."""
        return cls.convert(plan, dict(zip(plan.columns, row)))

    @staticmethod
    def convert(plan: TablePlan, image: dict[str, Any]) -> dict[str, Any]:
        """`image` (changed in place) with the values the binlog source hands on for the same row
        (see `setl.sources.mysql_binlog.MysqlBinlogSource`): SETs as frozensets, BITs as ints, zero dates
        kept, UUID, INET, FLOAT and spatial values in `setl.values`' one form (so that a copied row and
        its later binlog changes merge by the same key)."""
        for name, kind in plan.types.items():
            value = image.get(name)
            if value is None:
                continue
            to_canonical = canonical.FROM_TEXT.get(kind)
            if to_canonical is not None:
                image[name] = to_canonical(value)
            elif kind == "set":
                image[name] = frozenset(value.split(",")) if value else frozenset()
            elif kind == "bit":
                image[name] = int.from_bytes(value, "big")
            elif kind in _DATES and isinstance(value, str):
                image[name] = InvalidDate(value)
        return image
