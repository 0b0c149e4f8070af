"""A PostgreSQL database as the target, through psycopg 3.

Each batch is one transaction: ``DELETE ... WHERE (key) IN (...)`` for the merged deletes, then
multi-row ``INSERT ... ON CONFLICT (key) DO UPDATE`` of the full after-images (from `copy_rows`
rows of one shape on, as a snapshot chunk of reads is: ``COPY`` into a temporary table, then one
``INSERT ... SELECT ... ON CONFLICT``; runs of inserts and reads into a keyless table: ``COPY``
into it), then the batch's
end position, batch id and epoch in ``setl.setl_position`` (see `SqlLoad` for the guarantees).
Target tables must exist, or be made by replicated DDL: a change's ``schema`` is the PostgreSQL
schema, its ``table`` the table (in the configured database). Under ``pipeline.ddl: apply`` MySQL
table DDL is translated (`setl.sinks.postgresql_ddl` lists what is and what is refused with a
`LoadError`) and runs inside the batch's transaction. Tables without a primary key are matched on
every column with ``IS NOT DISTINCT FROM`` (one row per change, by ctid). Values go through
psycopg's adapters (bytes as bytea, Decimal as numeric, timedelta as interval); dicts and lists
are sent as jsonb. The session time zone is UTC. Zero and partial dates (`InvalidDate`) follow the
target's ``invalid_dates`` policy (`setl.sinks.invalid_dates`): refused by default, or NULL.
Spatial values (`setl.values.Geometry`) go as PostGIS geometry, WKB bytea or WKT text by the
target's ``spatial`` option (`setl.sinks.postgresql_spatial`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.types.json import Jsonb

from setl.config import SslConfig
from setl.ddl import with_table
from setl.errors import LoadError, RefusedLoadError, TransientLoadError
from setl.model import Batch
from setl.sinks import postgresql_spatial as spatial
from setl.sinks.invalid_dates import InvalidDatePolicy
from setl.sinks.merge import TableChanges
from setl.sinks.nul_text import HINT as NUL_HINT
from setl.sinks.nul_text import NulTextPolicy
from setl.sinks.postgresql_copy import copy_straight, unique_on_key
from setl.sinks.postgresql_ddl import Translator, UnsupportedDdl, pg_name, without_sequence_ddl
from setl.sinks.postgresql_positions import PostgresPositionStore
from setl.sinks.postgresql_staging import PostgresStaging
from setl.sinks.prepared import PreparedBatches
from setl.sinks.sql_common import (
    PROCESS_TOKEN,
    DdlStep,
    Segment,
    SqlLoad,
    TargetTableMissing,
    chunks,
    group_by_columns,
    insert_runs,
    reads_only,
)
from setl.tls import libpq_params


@attrs.frozen
class PostgresqlTargetConfig:
    type: Literal["postgresql"]
    host: str = "127.0.0.1"  # the PostgreSQL server written
    port: int = 5432  # its TCP port
    user: str = "postgres"  # needs the grants in docs/grants.md
    password: str = attrs.field(default="", repr=False)  # may be "${ENV_VAR}"; never logged
    database: str = "postgres"  # the database written; a change's schema is the PostgreSQL schema
    #: what to write for a zero or partial date (`setl.sinks.invalid_dates`): refuse or null
    invalid_dates: Literal["refuse", "null"] = "refuse"
    #: what to do with text holding NUL (0x00), which PostgreSQL cannot store (`setl.sinks.nul_text`)
    nul_in_text: Literal["refuse", "strip", "escape"] = "refuse"
    #: spatial columns (`setl.sinks.postgresql_spatial`): PostGIS geometry, WKB bytea or WKT text;
    #: auto: postgis when the extension is in the target database, else wkb
    spatial: Literal["auto", "postgis", "wkb", "wkt"] = "auto"
    #: a partitioned source table: plain (a plain table holding the same rows) or refuse (stop:
    #: `setl.sinks.postgresql_ddl`, `setl.schema.postgresql`)
    partitions: Literal["plain", "refuse"] = "plain"
    ssl: SslConfig | None = None  # TLS: sslmode verify-full (require with verify false); none: libpq's prefer


log = logging.getLogger(__name__)

MAX_PARAMS = 65535  # the protocol's limit on bind parameters per statement

# SQLSTATE classes and codes worth a reconnect and replay.
TRANSIENT_STATES = ("08", "40", "57P01", "57P02", "57P03", "53300", "55P03")
MISSING_TABLE_STATES = ("42P01", "3F000")  # undefined table, invalid schema name


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


def _ident(*names: str) -> sql.Identifier:
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


def _marks(count: int) -> str:
    return "(" + ", ".join(["%s"] * count) + ")"


#: One shape of a table's upserts: its columns, its images, and their ``COPY`` rows (None: too few
#: to go by ``COPY``).
_Group = tuple[tuple[str, ...], list[Mapping[str, Any]], list[Sequence[Any]] | None]


@attrs.frozen(eq=False)
class _Prepared:
    """What `PostgresqlLoad.prepare` worked out for one batch object."""

    segments: list[Segment]
    #: id(TableChanges) -> (that TableChanges, its upsert groups)
    groups: dict[int, tuple[TableChanges, list[_Group]]]
    #: the batch holds snapshot reads only: its COPY groups are tried straight into their tables
    #: (`setl.sinks.postgresql_copy`)
    reads_only: bool = False


class PostgresqlLoad(SqlLoad[psycopg.Connection]):
    """Loads batches into PostgreSQL (see the module docstring and `SqlLoad`)."""

    dialect = "postgresql"
    config: PostgresqlTargetConfig
    _prepared: PreparedBatches[_Prepared]  # what `prepare` worked out (the base makes it and drops after load)

    def __init__(self, config: PostgresqlTargetConfig, *, connect_timeout: int = 10, copy_rows: int = 1000,
                 **options: Any) -> None:
        """`copy_rows`: from how many rows of one shape (a table's upserts, or a keyless table's run
        of inserts and reads) a batch sends them with ``COPY`` rather than multi-row INSERTs.
        `options` are `SqlLoad`'s (pipeline, ddl, position table, chunking, retries)."""
        super().__init__(config, **options)
        if copy_rows < 1:
            raise ValueError("copy_rows must be at least 1")
        self.connect_timeout = connect_timeout
        self.copy_rows = copy_rows
        self._statements: dict[tuple[Any, ...], str] = {}
        self._invalid_dates = InvalidDatePolicy(getattr(config, "invalid_dates", "refuse"),
                                                pipeline=self.pipeline, target="PostgreSQL")
        self._nul_text = NulTextPolicy(getattr(config, "nul_in_text", "refuse"), pipeline=self.pipeline,
                                       target="PostgreSQL")
        #: the form of spatial values the last connection opened resolved `config.spatial` to
        self._spatial: spatial.SpatialForm = "wkb"
        #: tables where a straight COPY of snapshot reads met a row already there: not tried again
        self._collided: set[tuple[str, str]] = set()

    def _segments(self, batch: Batch) -> list[Segment]:
        """Sequence DDL left out, zero and partial dates handled by the ``invalid_dates`` policy and
        text holding NUL by ``nul_in_text`` first. A prepared batch's segments are those `prepare`
        worked out."""
        prepared = self._prepared.get(batch)
        if prepared is not None:
            return prepared.segments
        batch = self._invalid_dates.apply(without_sequence_ddl(batch, self.pipeline))
        return super()._segments(self._nul_text.apply(batch))

    def prepare(self, batch: Batch) -> None:
        """Merge `batch` and group each keyed table's upserts by shape now (on the calling worker),
        with the ``COPY`` rows of the groups that go by ``COPY``, so that `load` only sends them.
        None of it depends on the target, so `load` of this batch object always uses it."""
        segments = self._segments(batch)
        groups: dict[int, tuple[TableChanges, list[_Group]]] = {}
        for segment in segments:
            if isinstance(segment, list):
                for table in segment:
                    if table.primary_key and table.upserts:
                        groups[id(table)] = (table, self._groups(table))
        self._prepared.put(batch, _Prepared(segments, groups, reads_only(batch)))

    def _groups(self, table: TableChanges) -> list[_Group]:
        """`table`'s upserts by column list, with their ``COPY`` rows when there are `copy_rows` or more."""
        return [(columns, images, self._copy_rows(columns, images) if len(images) >= self.copy_rows else None)
                for columns, images in group_by_columns(table.upserts).items()]

    def __repr__(self) -> str:
        return f"<PostgresqlLoad {self.pipeline} -> {self.config.host}:{self.config.port}/{self.config.database}>"

    # -- connection

    def _make_positions(self) -> PostgresPositionStore:
        return PostgresPositionStore(pipeline=self.pipeline, schema=self.position_schema, table=self.position_table,
                                     token=PROCESS_TOKEN, lock_timeout=self.fence_lock_timeout,
                                     describe=self._describe, on_table=self._name_table, text=self._text)

    def _make_staging(self) -> PostgresStaging:
        return PostgresStaging(self.pipeline)

    def _connect(self) -> psycopg.Connection:
        conn = self._open()
        try:
            form = spatial.resolve(conn, getattr(self.config, "spatial", "auto"))
            spatial.register(conn, form)
        except BaseException:
            conn.close()
            raise
        self._spatial = form
        return conn

    def _open(self) -> psycopg.Connection:
        return psycopg.connect(
            host=self.config.host,
            port=self.config.port,
            user=self.config.user,
            password=self.config.password or None,
            dbname=self.config.database,
            connect_timeout=self.connect_timeout,
            autocommit=False,
            application_name=f"setl:{self.pipeline}"[:63],
            options="-c TimeZone=UTC",
            client_encoding="UTF8",  # an SQL_ASCII database would hand names and text back as bytes
            **libpq_params(getattr(self.config, "ssl", None)),
        )

    def _disconnect(self, conn: psycopg.Connection) -> None:
        conn.close()

    def _commit(self, conn: psycopg.Connection) -> None:
        conn.commit()

    def _rollback(self, conn: psycopg.Connection) -> None:
        if not conn.closed:
            conn.rollback()

    def _text(self, conn: psycopg.Connection, key: tuple[Any, ...], build: Callable[[], sql.Composable],
              *, raw: bool = False) -> str:
        """A statement rendered once per shape and cached (composing is slow for wide rows). `raw`:
        with ``$1, $2, ...`` placeholders (`native`), for a `psycopg.RawCursor`."""
        key = (raw, *key)
        text = self._statements.get(key)
        if text is None:
            text = build().as_string(conn)
            if raw:
                text = native(text)
            if len(self._statements) > 1000:
                self._statements.clear()
            self._statements[key] = text
        return text

    # -- rows

    def _apply_keyed(self, conn: psycopg.Connection, table: TableChanges) -> None:
        if table.patches:  # keys none of the deletes and upserts touch: any order
            self._apply_patches(conn, table)
        name = _TableName(table.schema, table.table)
        key = table.primary_key
        size = max(1, min(self.chunk_rows, MAX_PARAMS // len(key)))
        with psycopg.RawCursor(conn) as cur:
            for part in chunks(table.deletes, size):
                text = self._text(conn, ("delete", table.schema, table.table, key, len(part)),
                                  functools.partial(self._delete_sql, name, key, len(part)), raw=True)
                cur.execute(text, values_of(part, key))
            prepared, straight = None, False
            for entry in self._prepared.values():
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

    def _apply_patches(self, conn: psycopg.Connection, table: TableChanges) -> None:
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
        if ident in self._collided:
            return False
        name = _ident(table.schema, table.table)
        if not unique_on_key(conn, name.as_string(conn), table.primary_key):
            return False
        if copy_straight(cur, lambda: self._copy(cur, name, columns, rows)):
            return True
        self._collided.add(ident)
        return False

    def _copy_upsert(self, conn: psycopg.Connection, cur: psycopg.Cursor, table: TableChanges,
                     columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Many upserts of one shape: ``COPY`` them into a temporary table with the target's column
        types (no constraints), then one ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE``.
        The values go through the column types' input functions, as a bound parameter's text does."""
        # No bind parameters in these statements: names go as plain identifiers (no doubled %).
        name = _ident(table.schema, table.table)
        key = table.primary_key
        stage = sql.Identifier("setl_copy_stage")
        listed = sql.SQL(", ").join(map(_ident, columns))
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
        names = sql.SQL(", ").join(_ident(c) for c in columns)
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
        if adapted.isdisjoint(set(map(type, itertools.chain.from_iterable(rows)))):
            return rows
        return [row if adapted.isdisjoint(map(type, row)) else [to_db(v) for v in row] for row in rows]

    @staticmethod
    def _upsert_select_sql(name: sql.Identifier, stage: sql.Identifier, key: Sequence[str],
                           columns: Sequence[str]) -> sql.Composable:
        others = [c for c in columns if c not in key]
        action: sql.Composable
        if others:
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(_ident(c)) for c in others))
        else:
            action = sql.SQL("DO NOTHING")
        listed = sql.SQL(", ").join(map(_ident, columns))
        return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
            name, listed, listed, stage, sql.SQL(", ").join(map(_ident, key)), action)

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
        others = [c for c in columns if c not in key]
        action: sql.Composable
        if others:
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(column(c)) for c in others))
        else:
            action = sql.SQL("DO NOTHING")
        values = ", ".join([_marks(len(columns))] * rows)
        return sql.SQL("INSERT INTO {} ({}) VALUES " + values + " ON CONFLICT ({}) {}").format(
            name,
            sql.SQL(", ").join(map(column, columns)),
            sql.SQL(", ").join(map(column, key)),
            action,
        )

    def _apply_sequence(self, conn: psycopg.Connection, table: TableChanges) -> None:
        name = _TableName(table.schema, table.table)
        with conn.cursor() as cur:
            for change, added in insert_runs(table.sequence):
                if change is None:  # a run of inserts and reads: COPY, or multi-row INSERTs
                    for columns, images in group_by_columns(added).items():
                        if len(images) >= self.copy_rows:
                            self._copy(cur, _ident(table.schema, table.table), columns,
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

    # -- DDL

    def _apply_ddl(self, conn: psycopg.Connection, batch: Batch, step: DdlStep) -> None:
        """Translate the MySQL DDL (see `setl.sinks.postgresql_ddl`) and run it in the batch's
        transaction: PostgreSQL DDL is transactional, so a replay finds it undone or committed
        with the batch's position. A statement it cannot translate fails the batch."""
        change = step.change
        translator = Translator(change.schema, spatial=self._spatial,
                                partitions=getattr(self.config, "partitions", "plain"))
        try:
            statements = translator.translate(step.statement)
        except (UnsupportedDdl, ValueError) as exc:
            raise LoadError(f"cannot translate this DDL for PostgreSQL ({exc}): {change.statement}",
                            **{**self._context(batch, table=change.qualified_table),
                               "position": change.position or batch.end}) from exc
        if not statements:
            log.warning("pipeline=%s stage=load table=%s position=%s: index DDL is not applied to "
                        "PostgreSQL: %s", self.pipeline, change.qualified_table, change.position or batch.end,
                        change.statement)
        if step.statement.kind == "create_table":
            ref = step.statement.tables[0]
            schema = ref.schema or change.schema
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(_ident(schema)))
            name = _ident(schema, ref.table).as_string(conn)
            plain = not {"REPLACE", "EXISTS"} & {t.upper for t in step.statement.tokens[:ref.start]}
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
            if plain and exists and exists[0]:
                if not self._same_shape(conn, step, name):
                    raise LoadError(f"table {schema}.{ref.table} already exists with another shape: "
                                    f"{change.statement}",
                                    **{**self._context(batch, table=change.qualified_table),
                                       "position": change.position or batch.end})
                log.info("pipeline=%s stage=load table=%s: table exists with the same shape; CREATE "
                         "TABLE counts as applied", self.pipeline, change.qualified_table)
                return
        for table, why in translator.needs_empty:
            row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()
            if row and row[0]:
                raise RefusedLoadError(f"cannot apply this DDL exactly on PostgreSQL: {table} has rows and {why}: "
                                       f"{change.statement}",
                                       **{**self._context(batch, table=change.qualified_table),
                                          "position": change.position or batch.end})
        for statement in statements:
            conn.execute(statement)

    def _same_shape(self, conn: psycopg.Connection, step: DdlStep, name: str) -> bool:
        """Whether table `name` has the columns (names, types, NOT NULL, primary key) the CREATE
        TABLE gives, checked against a scratch temporary table inside a savepoint."""
        scratch = with_table(step.statement, "pg_temp", "setl_shape_check")
        shape = ("SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, i.indrelid IS NOT NULL"
                 " FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary"
                 " AND a.attnum = ANY(i.indkey)"
                 " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum")
        conn.execute("SAVEPOINT setl_shape_check")
        try:
            for statement in Translator(step.change.schema, spatial=self._spatial).translate(scratch):
                conn.execute(statement)
            return (conn.execute(shape, (name,)).fetchall()
                    == conn.execute(shape, ("pg_temp.setl_shape_check",)).fetchall())
        finally:
            conn.execute("ROLLBACK TO SAVEPOINT setl_shape_check")

    # -- errors

    def _classify(self, exc: BaseException) -> type[LoadError] | type[TargetTableMissing] | None:
        if _nul_refused(exc):
            return RefusedLoadError  # the same rows fail the same way: pause at once
        if isinstance(exc, psycopg.Error):
            state = exc.sqlstate or ""
            if state in MISSING_TABLE_STATES:
                return TargetTableMissing
            if state and state.startswith(TRANSIENT_STATES):
                return TransientLoadError
            if not state and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                return TransientLoadError  # the connection broke before the server answered
            return LoadError
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return TransientLoadError
        return LoadError

    def _describe(self, exc: BaseException) -> str:
        if _nul_refused(exc):
            return NUL_HINT
        if isinstance(exc, spatial.NoPostgis):
            return str(exc)
        if isinstance(exc, psycopg.Error):
            text = " ".join(str(exc).split())
            return f"{text} (SQLSTATE {exc.sqlstate})" if exc.sqlstate else text
        return super()._describe(exc)


def _nul_refused(exc: BaseException) -> bool:
    """Whether `exc` is psycopg refusing text that holds NUL (it checks before sending)."""
    return isinstance(exc, psycopg.DataError) and "NUL (0x00)" in str(exc)


__all__ = ["PostgresqlLoad", "to_db"]
