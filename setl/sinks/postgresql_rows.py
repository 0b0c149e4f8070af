"""How the PostgreSQL target writes a table's merged changes (`PostgresqlRows`, its `RowWriter`):
multi-row ``DELETE`` and ``INSERT ... ON CONFLICT (key) DO UPDATE``, ``COPY`` from `copy_rows` rows of
one shape on (into a temporary table then one ``INSERT ... SELECT``, or straight into the table for
a chunk of snapshot reads: `setl.sinks.postgresql_copy`), patches as ``UPDATE``, a keyless table's
changes one by one; and its statements rendered once per shape (`StatementCache`)."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from setl.model import Batch
from setl.sinks.merge import TableChanges
from setl.sinks.postgresql_copy import copy_straight, unique_on_key
from setl.sinks.postgresql_ddl import pg_name
from setl.sinks.prepared import PreparedBatches
from setl.sinks.sql_rows import chunks, group_by_columns, holds_one_of, insert_runs, reads_only
from setl.sinks.sql_segments import Segment

MAX_PARAMS = 65535  # the protocol's limit on bind parameters per statement
CHUNK_ROWS = 500  # rows per multi-row statement unless ``chunk_rows`` is given


#: The value types `to_db` changes.
_ADAPTED = frozenset({dict, list, set, frozenset})
_CHANGED = (dict, list, set, frozenset)  # and their subclasses


def to_db(value: Any) -> Any:
    """A row value as psycopg should send it: dicts and lists as jsonb, SET members joined."""
    if isinstance(value, (dict, list)):
        return Jsonb(value)
    if isinstance(value, (set, frozenset)):
        return ",".join(sorted(map(str, value)))
    return value


def values_of(images: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[Any]:
    """The `columns` of each image in turn, as `to_db` has them: the parameters of a multi-row
    statement. Gathered and type-checked at C speed; `to_db` runs only when a value needs it."""
    if len(columns) == 1:
        values = list(map(operator.itemgetter(columns[0]), images))
    else:
        values = list(itertools.chain.from_iterable(map(operator.itemgetter(*columns), images)))
    if any(issubclass(kind, _CHANGED) for kind in set(map(type, values))):  # a few distinct types
        return [to_db(v) for v in values]
    return values


def identifier(*names: str) -> sql.Identifier:
    """A (qualified) name as a PostgreSQL identifier, each part mapped by `pg_name`."""
    return sql.Identifier(*map(pg_name, names))


class _TableName(sql.Identifier):
    """A table's (schema, table) identifier in a query with ``%s`` parameters, mapped by `pg_name`:
    psycopg reads the whole text for placeholders, so a ``%`` in a name is doubled."""

    def __init__(self, *strings: str) -> None:
        super().__init__(*map(pg_name, strings))

    def as_bytes(self, context: Any = None) -> bytes:
        return super().as_bytes(context).replace(b"%", b"%%")


def column(name: str) -> sql.Composable:
    """A column name as a quoted identifier (mapped by `pg_name`), its ``%`` doubled: the statements
    carry ``%s`` placeholders, so psycopg would read a ``%`` in the name as one."""
    return sql.SQL('"' + pg_name(name).replace('"', '""').replace("%", "%%") + '"')


def native(text: str) -> str:
    """A statement with ``%s`` placeholders (and ``%%`` for a ``%``) in PostgreSQL's own ``$n`` form.
    psycopg converts a statement's placeholders on every execute, and caches that only for
    statements under 4 KB: a multi-row statement sent through a `psycopg.RawCursor` in this form
    skips that parse (most of the client's CPU time per row otherwise)."""
    pieces = text.split("%%")
    count = 0
    for index, piece in enumerate(pieces):
        parts = piece.split("%s")
        if "%" in "".join(parts):
            raise ValueError(f"a placeholder other than %s in {text[:200]!r}")
        for at in range(1, len(parts)):
            count += 1
            parts[at] = f"${count}" + parts[at]
        pieces[index] = "".join(parts)
    return "%".join(pieces)


def _on_conflict(key: Sequence[str], columns: Sequence[str], name: Callable[[str], sql.Composable]) -> sql.Composable:
    """An upsert's ``ON CONFLICT (key)`` action: every column but the key's set from the row
    proposed (``EXCLUDED``), or nothing when the row is only its key; `name` quotes a column."""
    others = [c for c in columns if c not in key]
    if not others:
        return sql.SQL("DO NOTHING")
    return sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{0} = EXCLUDED.{0}").format(name(c)) for c in others))


def _marks(count: int) -> str:
    return "(" + ", ".join(["%s"] * count) + ")"


#: One shape of a table's upserts: its columns, its images, and their ``COPY`` rows (None: too few
#: to go by ``COPY``).
_Group = tuple[tuple[str, ...], list[Mapping[str, Any]], list[Sequence[Any]] | None]


@attrs.frozen(eq=False)
class _Prepared:
    """What `PostgresqlRows.prepare` worked out for one batch object."""

    segments: list[Segment]
    #: id(TableChanges) -> (that TableChanges, its upsert groups)
    groups: dict[int, tuple[TableChanges, list[_Group]]]
    #: the batch holds snapshot reads only: its COPY groups are tried straight into their tables
    #: (`setl.sinks.postgresql_copy`)
    reads_only: bool = False


class StatementCache:
    """Statements rendered once per shape (composing is slow for wide rows), for the rows and the
    position store of one sink; at most about 1000 kept. Safe for the sink's threads."""

    def __init__(self) -> None:
        self._texts: dict[tuple[Any, ...], str] = {}

    def text(self, conn: psycopg.Connection, key: tuple[Any, ...], build: Callable[[], sql.Composable],
             *, raw: bool = False) -> str:
        """The statement `build` makes for `key`. `raw`: with ``$1, $2, ...`` placeholders
        (`native`), for a `psycopg.RawCursor`."""
        key = (raw, *key)
        text = self._texts.get(key)
        if text is None:
            text = build().as_string(conn)
            if raw:
                text = native(text)
            if len(self._texts) > 1000:
                self._texts.clear()
            self._texts[key] = text
        return text


class PostgresqlRows:
    """The PostgreSQL target's `RowWriter` (see `setl.sinks.sql_dialect`): statements of at most
    `chunk_rows` rows (and the protocol's 65535 parameters); from `copy_rows` rows of one shape on,
    ``COPY``. `prepare` groups a batch's upserts by shape ahead, with their ``COPY`` rows: none of
    it depends on the target, so `upsert` of that batch object always uses it. Safe for the sink's
    threads."""

    def __init__(self, *, chunk_rows: int, copy_rows: int, statements: StatementCache) -> None:
        if copy_rows < 1:
            raise ValueError("copy_rows must be at least 1")
        self.chunk_rows = chunk_rows
        self.copy_rows = copy_rows
        self.statements = statements
        self.prepared: PreparedBatches[_Prepared] = PreparedBatches()
        #: tables where a straight COPY of snapshot reads met a row already there: not tried again
        self.collided: set[tuple[str, str]] = set()

    def prepare(self, batch: Batch, plan: Callable[[Batch], list[Segment]]) -> None:
        """Merge `batch` (`plan`) and group each keyed table's upserts by shape now (on the calling
        worker), with the ``COPY`` rows of the groups that go by ``COPY``, so that `upsert` only
        sends them."""
        segments = plan(batch)
        groups: dict[int, tuple[TableChanges, list[_Group]]] = {}
        for segment in segments:
            if isinstance(segment, list):
                for table in segment:
                    if table.primary_key and table.upserts:
                        groups[id(table)] = (table, self._groups(table))
        self.prepared.put(batch, _Prepared(segments, groups, reads_only(batch)))

    def _groups(self, table: TableChanges) -> list[_Group]:
        """`table`'s upserts by column list, with their ``COPY`` rows when there are `copy_rows` or more."""
        return [(columns, images, self._copy_rows(columns, images) if len(images) >= self.copy_rows else None)
                for columns, images in group_by_columns(table.upserts).items()]

    def _text(self, conn: psycopg.Connection, key: tuple[Any, ...], build: Callable[[], sql.Composable],
              *, raw: bool = False) -> str:
        return self.statements.text(conn, key, build, raw=raw)

    def delete(self, conn: psycopg.Connection, table: TableChanges) -> None:
        """``DELETE ... WHERE (key) IN (...)``, as many keys a statement as the parameters allow."""
        name = _TableName(table.schema, table.table)
        key = table.primary_key
        size = max(1, min(self.chunk_rows, MAX_PARAMS // len(key)))
        with psycopg.RawCursor(conn) as cur:
            for part in chunks(table.deletes, size):
                text = self._text(conn, ("delete", table.schema, table.table, key, len(part)),
                                  functools.partial(self._delete_sql, name, key, len(part)), raw=True)
                cur.execute(text, values_of(part, key))

    def upsert(self, conn: psycopg.Connection, table: TableChanges) -> None:
        """Multi-row ``INSERT ... ON CONFLICT (key) DO UPDATE`` per shape (as `prepare` grouped them);
        a shape of `copy_rows` rows or more by ``COPY``: straight into the table for a batch of
        snapshot reads with no delete (`_copy_straight`), else through a temporary table."""
        name = _TableName(table.schema, table.table)
        key = table.primary_key
        with psycopg.RawCursor(conn) as cur:
            prepared, straight = None, False
            for entry in self.prepared.values():
                found = entry.groups.get(id(table))
                if found is not None and found[0] is table:
                    prepared, straight = found[1], entry.reads_only and not table.deletes
                    break
            for columns, images, rows in prepared if prepared is not None else self._groups(table):
                if rows is not None:
                    if not (straight and self._copy_straight(conn, cur, table, columns, rows)):
                        self._copy_upsert(conn, cur, table, columns, rows)
                    continue
                size = max(1, min(self.chunk_rows, MAX_PARAMS // len(columns)))
                for part in chunks(images, size):
                    text = self._text(conn, ("upsert", table.schema, table.table, columns, len(part)),
                                      functools.partial(self._upsert_sql, name, key, columns, len(part)), raw=True)
                    cur.execute(text, values_of(part, columns))

    def patch(self, conn: psycopg.Connection, table: TableChanges) -> None:
        """`table.patches` (rows updated only in part: `setl.sinks.merge`) as ``UPDATE ... SET <the
        patch's other columns> WHERE <key>``, one statement shape per column list; never an insert."""
        name = _TableName(table.schema, table.table)
        key = table.primary_key
        with conn.cursor() as cur:
            for columns, images in group_by_columns(table.patches).items():
                sets = [c for c in columns if c not in key]
                if not sets:
                    continue  # only the key: nothing to set
                text = sql.SQL("UPDATE {} SET {} WHERE {}").format(
                    name, sql.SQL(", ").join(sql.SQL("{} = %s").format(column(c)) for c in sets),
                    sql.SQL(" AND ").join(sql.SQL("{} = %s").format(column(c)) for c in key))
                cur.executemany(text, [values_of([image], [*sets, *key]) for image in images])

    def _copy_straight(self, conn: psycopg.Connection, cur: psycopg.Cursor, table: TableChanges,
                       columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> bool:
        """A group of snapshot reads ``COPY``'d into its table itself, when its key is unique there
        and none of its rows is there yet (`setl.sinks.postgresql_copy`); False: not done, nothing written."""
        ident = (table.schema, table.table)
        if ident in self.collided:
            return False
        name = identifier(table.schema, table.table)
        if not unique_on_key(conn, name.as_string(conn), table.primary_key):
            return False
        if copy_straight(cur, lambda: self._copy(cur, name, columns, rows)):
            return True
        self.collided.add(ident)
        return False

    def _copy_upsert(self, conn: psycopg.Connection, cur: psycopg.Cursor, table: TableChanges,
                     columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Many upserts of one shape: ``COPY`` them into a temporary table with the target's column
        types (no constraints), then one ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE``.
        The values go through the column types' input functions, as a bound parameter's text does."""
        # No bind parameters in these statements: names go as plain identifiers (no doubled %).
        name = identifier(table.schema, table.table)
        key = table.primary_key
        stage = sql.Identifier("setl_copy_stage")
        listed = sql.SQL(", ").join(map(identifier, columns))
        cur.execute(sql.SQL("CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA")
                    .format(stage, listed, name))
        self._copy(cur, stage, columns, rows)
        text = self._text(conn, ("copy-upsert", table.schema, table.table, columns),
                          functools.partial(self._upsert_select_sql, name, stage, key, columns))
        cur.execute(text)
        cur.execute(sql.SQL("DROP TABLE {}").format(stage))

    @staticmethod
    def _copy(cur: psycopg.Cursor, into: sql.Composable, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """``COPY`` `rows` (`_copy_rows`) into `into`."""
        names = sql.SQL(", ").join(identifier(c) for c in columns)
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(into, names)) as copy:
            write = copy.write_row
            for row in rows:
                write(row)

    @staticmethod
    def _copy_rows(columns: Sequence[str], images: Sequence[Mapping[str, Any]]) -> list[Sequence[Any]]:
        """The ``COPY`` rows of `images`: their values in `columns` order, as `to_db` converts them."""
        get = operator.itemgetter(*columns)
        # Gathered at C speed; most batches hold no value to_db changes (one scan of their types).
        rows: list[Sequence[Any]] = list(map(get, images)) if len(columns) > 1 else [(get(i),) for i in images]
        adapted = _ADAPTED
        if not holds_one_of(rows, adapted):
            return rows
        return [row if adapted.isdisjoint(map(type, row)) else [to_db(v) for v in row] for row in rows]

    @staticmethod
    def _upsert_select_sql(name: sql.Identifier, stage: sql.Identifier, key: Sequence[str],
                           columns: Sequence[str]) -> sql.Composable:
        listed = sql.SQL(", ").join(map(identifier, columns))
        return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
            name, listed, listed, stage, sql.SQL(", ").join(map(identifier, key)),
            _on_conflict(key, columns, identifier))

    @staticmethod
    def _delete_sql(name: sql.Identifier, key: Sequence[str], rows: int) -> sql.Composable:
        if len(key) == 1:
            marks = ", ".join(["%s"] * rows)
            return sql.SQL("DELETE FROM {} WHERE {} IN (" + marks + ")").format(name, column(key[0]))
        columns = sql.SQL(", ").join(map(column, key))
        values = ", ".join([_marks(len(key))] * rows)
        return sql.SQL("DELETE FROM {} WHERE ({}) IN (" + values + ")").format(name, columns)

    @staticmethod
    def _upsert_sql(name: sql.Identifier, key: Sequence[str], columns: Sequence[str], rows: int) -> sql.Composable:
        values = ", ".join([_marks(len(columns))] * rows)
        return sql.SQL("INSERT INTO {} ({}) VALUES " + values + " ON CONFLICT ({}) {}").format(
            name,
            sql.SQL(", ").join(map(column, columns)),
            sql.SQL(", ").join(map(column, key)),
            _on_conflict(key, columns, column),
        )

    def in_order(self, conn: psycopg.Connection, table: TableChanges) -> None:
        """A keyless table's changes one by one, in order (an update or delete removes one row equal
        to the before-image, ``IS NOT DISTINCT FROM``, by ctid); runs of inserts and reads by ``COPY``
        or multi-row INSERTs."""
        name = _TableName(table.schema, table.table)
        with conn.cursor() as cur:
            for change, added in insert_runs(table.sequence):
                if change is None:  # a run of inserts and reads: COPY, or multi-row INSERTs
                    for columns, images in group_by_columns(added).items():
                        if len(images) >= self.copy_rows:
                            self._copy(cur, identifier(table.schema, table.table), columns,
                                       self._copy_rows(columns, images))
                            continue
                        size = max(1, min(self.chunk_rows, MAX_PARAMS // len(columns)))
                        for part in chunks(images, size):
                            cur.execute(sql.SQL("INSERT INTO {} ({}) VALUES " + ", ".join(
                                [_marks(len(columns))] * len(part))).format(
                                    name, sql.SQL(", ").join(map(column, columns))),
                                [to_db(image[c]) for image in part for c in columns])
                    continue
                if change.before is not None:
                    where = sql.SQL(" AND ").join(
                        sql.SQL("{} IS NOT DISTINCT FROM %s").format(column(c))
                        for c in change.before)
                    cur.execute(sql.SQL("DELETE FROM {0} WHERE ctid = (SELECT ctid FROM {0} WHERE {1}"
                                        " LIMIT 1)").format(name, where),
                                [to_db(v) for v in change.before.values()])
                if change.after is not None:
                    self._insert(cur, name, change.after)

    @staticmethod
    def _insert(cur: psycopg.Cursor, name: sql.Identifier, image: Mapping[str, Any]) -> None:
        cur.execute(sql.SQL("INSERT INTO {} ({}) VALUES " + _marks(len(image))).format(
            name, sql.SQL(", ").join(map(column, image))),
            [to_db(v) for v in image.values()])


__all__ = ["PostgresqlRows", "StatementCache", "column", "identifier", "native", "to_db", "values_of"]
