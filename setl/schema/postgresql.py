"""Target table DDL for PostgreSQL targets.

A column holding a source column gets the PostgreSQL type of its MySQL type by the same mapping
replicated DDL uses (`setl.sinks.postgresql_ddl`, tabled in docs/schema.md): integers widen to
hold UNSIGNED values, DECIMAL(p,s) -> numeric(p,s), DATETIME(n) -> timestamp(n), TIMESTAMP(n) ->
timestamptz(n), TIME -> interval, CHAR/VARCHAR(n) -> varchar(n) (``COLLATE "C"`` for a binary
collation), TEXT types, ENUM and SET -> text, BINARY/BLOB types -> bytea, JSON -> jsonb, spatial
types by the target's ``spatial`` option (PostGIS geometry, bytea or text:
`setl.sinks.postgresql_spatial`). NOT
NULL and simple DEFAULTs (numbers, plain strings, CURRENT_TIMESTAMP) are kept; other defaults,
charsets and case-insensitive collations are left out. A column a transform adds takes the
type of its Spark type (`SPARK_TYPES`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from setl.ddl import tokenize
from setl.errors import ConfigError
from setl.model import TableName
from setl.schema.mysql import quote as mysql_quote
from setl.schema.plan import TargetColumn, TargetTable, unsupported
from setl.schema.target import ExistingColumn, SchemaTarget, added_column, create_table
from setl.sinks import postgresql_spatial
from setl.sinks.postgresql_ddl import PARTITIONS_REFUSED, SPATIAL, UnsupportedDdl, column, ident, pg_name

#: Spark type -> PostgreSQL type, for columns a transform adds.
SPARK_TYPES = {
    "boolean": "boolean", "tinyint": "smallint", "smallint": "smallint", "int": "integer", "bigint": "bigint",
    "float": "real", "double": "double precision", "date": "date", "timestamp": "timestamptz",
    "timestamp_ntz": "timestamp", "string": "text", "binary": "bytea",
}

#: information_schema.columns.data_type -> family of values (see `setl.schema.target.ACCEPTS`).
_FAMILIES = {
    "smallint": "integer", "integer": "integer", "bigint": "integer", "numeric": "decimal", "real": "float",
    "double precision": "float", "boolean": "boolean", "date": "date", "timestamp without time zone": "datetime",
    "timestamp with time zone": "datetime", "interval": "time", "time without time zone": "time",
    "character varying": "text", "character": "text", "text": "text", "bytea": "binary", "json": "json",
    "jsonb": "json",
}


def spark_type(kind: str) -> str | None:
    if kind.startswith("decimal("):
        return "numeric" + kind[len("decimal"):]
    return SPARK_TYPES.get(kind)


class PostgresqlSchema(SchemaTarget):
    """Creates and inspects tables on a PostgreSQL target."""

    dialect = "postgresql"

    def __init__(self, connect: Callable[[], Any], *, pipeline: str, spatial: str = "auto",
                 partitions: str = "plain") -> None:
        """`spatial`: the target's ``spatial`` option, resolved on the first spatial column;
        `partitions`: its ``partitions`` option (``refuse``: a partitioned source table is refused)."""
        super().__init__(connect, pipeline=pipeline)
        self.spatial = spatial
        self.partitions = partitions
        self._spatial_form: str | None = None

    def spatial_form(self) -> str:
        """The form spatial columns take on this target (`setl.sinks.postgresql_spatial.resolve`)."""
        if self._spatial_form is None:
            try:
                self._spatial_form = postgresql_spatial.resolve(self.conn, self.spatial)
            except postgresql_spatial.NoPostgis as exc:
                raise ConfigError(str(exc), pipeline=self.pipeline, stage="load") from exc
        return self._spatial_form

    def column(self, table: TargetTable, target: TargetColumn) -> str:
        if target.source is None:
            return added_column(self.pipeline, table, target, quote=ident, types=spark_type, product="PostgreSQL")
        source = target.source
        definition = f"{mysql_quote(target.name)} {'json' if source.json else source.type}"
        if source.charset and not source.json:
            definition += f" CHARACTER SET {source.charset}"
            if source.collation:
                definition += f" COLLATE {source.collation}"
        if not target.nullable:
            definition += " NOT NULL"
        if source.default is not None:
            definition += f" DEFAULT {source.default}"
        form = self.spatial_form() if source.base.upper() in SPATIAL else "wkb"
        try:
            translated = column([t for t in tokenize(definition) if t.kind != "ws"], form)
        except (UnsupportedDdl, ValueError, IndexError) as exc:
            raise unsupported(self.pipeline, table, target, "PostgreSQL", f"has no type mapping ({exc})") from exc
        return translated.text()

    def statements(self, table: TargetTable) -> list[str]:
        if table.partitioned and self.partitions == "refuse":
            raise ConfigError(f"cannot create target table {table.table}: {PARTITIONS_REFUSED}",
                              pipeline=self.pipeline, stage="load", table=str(table.table))
        seen: dict[str, TargetColumn] = {}
        for target in table.columns:
            mapped = pg_name(target.name)
            if mapped in seen:  # a name over 63 bytes whose mapping is another column's own name
                raise unsupported(self.pipeline, table, target, "PostgreSQL",
                                  f"is column {seen[mapped].name!r} once mapped to PostgreSQL name "
                                  f"{mapped!r} (rename one with a rule's `rename`)")
            seen[mapped] = target
        name = f"{ident(table.table.schema)}.{ident(table.table.table)}"
        return [f"CREATE SCHEMA IF NOT EXISTS {ident(table.table.schema)}",
                create_table(name, [self.column(table, c) for c in table.columns], table.primary_key, ident)]

    def target_name(self, name: str) -> str:
        return pg_name(name)

    def existing(self, table: TableName) -> list[ExistingColumn] | None:
        conn = self.conn
        schema, name = pg_name(table.schema), pg_name(table.table)
        found = conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
                             (schema, name)).fetchone()
        if found is None:
            conn.rollback()
            return None
        rows = conn.execute("SELECT column_name, data_type, is_nullable, column_default, is_identity, is_generated "
                            "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                            "ORDER BY ordinal_position", (schema, name)).fetchall()
        conn.rollback()  # a read: end the transaction, so a later look sees tables created since
        return [ExistingColumn(str(found_name), str(data_type), _FAMILIES.get(str(data_type)), nullable == "YES",
                               default is not None or identity == "YES" or generated == "ALWAYS")
                for found_name, data_type, nullable, default, identity, generated in rows]

    def execute(self, statements: Sequence[str]) -> None:
        conn: Any = self.conn
        try:
            for statement in statements:
                conn.execute(statement)  # no parameters: a % in a name is not a placeholder
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
