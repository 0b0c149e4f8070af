"""What a target that can create tables implements (`SchemaTarget`), and the fit check of an
existing target table against the table a pipeline needs."""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from setl.errors import ConfigError
from setl.model import TableName
from setl.schema.plan import TargetColumn, TargetTable, unsupported

log = logging.getLogger(__name__)

_INTEGERS = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year", "bit", "bool", "boolean")
_TEXTS = ("char", "varchar", "nchar", "nvarchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set",
          "inet4", "inet6", "uuid")
_BINARIES = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")

#: Which kinds of values a target column of each family takes (a family missing here takes anything).
ACCEPTS: dict[str, frozenset[str]] = {
    "integer": frozenset({"integer", "boolean"}),
    "decimal": frozenset({"integer", "decimal", "boolean"}),
    "float": frozenset({"integer", "decimal", "float", "boolean"}),
    "boolean": frozenset({"integer", "boolean"}),
    "date": frozenset({"date"}),
    "datetime": frozenset({"date", "datetime"}),
    "time": frozenset({"time"}),
    "binary": frozenset({"binary", "text"}),
    "json": frozenset({"json", "text"}),
}


def mysql_family(base: str) -> str | None:
    """The family of values (integer, decimal, float, date, datetime, time, text, binary, json) of
    a MySQL type name; None for one this check does not judge (spatial types, ...)."""
    base = base.lower()
    if base in _INTEGERS:
        return "integer"
    if base in ("decimal", "numeric", "dec", "fixed"):
        return "decimal"
    if base in ("float", "double", "real"):
        return "float"
    if base in ("date",):
        return "date"
    if base in ("datetime", "timestamp"):
        return "datetime"
    if base == "time":
        return "time"
    if base in _TEXTS:
        return "text"
    if base in _BINARIES:
        return "binary"
    if base == "json":
        return "json"
    return None


def spark_family(kind: str) -> str | None:
    """The family of a Spark type (``simpleString``)."""
    base = kind.split("(")[0]
    if base in ("tinyint", "smallint", "int", "bigint"):
        return "integer"
    return {"boolean": "boolean", "decimal": "decimal", "float": "float", "double": "float", "date": "date",
            "timestamp": "datetime", "timestamp_ntz": "datetime", "string": "text", "binary": "binary"}.get(base)


def added_column(pipeline: str, table: TargetTable, column: TargetColumn, *, quote: Callable[[str], str],
                 types: Callable[[str], str | None], product: str) -> str:
    """The definition of a column a transform adds (no source column): its Spark type as `types`
    maps it on the target (`product`), refused when it has no mapping there."""
    kind = types(column.spark_type or "")
    if kind is None:
        raise unsupported(pipeline, table, column, product, "has no type mapping (add a cast step)")
    return f"{quote(column.name)} {kind}" + ("" if column.nullable else " NOT NULL")


def create_table(name: str, columns: Sequence[str], primary_key: Sequence[str], quote: Callable[[str], str]) -> str:
    """``CREATE TABLE IF NOT EXISTS name (column, ..., PRIMARY KEY (...))``: the statement every
    dialect shares, given its quoted `name`, its column definitions and its identifier `quote`."""
    elements = list(columns)
    if primary_key:
        elements.append(f"PRIMARY KEY ({', '.join(map(quote, primary_key))})")
    return f"CREATE TABLE IF NOT EXISTS {name} (\n  " + ",\n  ".join(elements) + "\n)"


def column_family(column: TargetColumn) -> str | None:
    """The family of the values a planned column carries."""
    if column.source is not None:
        if column.source.json:
            return "json"
        if column.source.charset == "binary" and column.source.base in ("char", "varchar"):
            return "binary"
        return mysql_family(column.source.base)
    return spark_family(column.spark_type or "")


@attrs.frozen
class ExistingColumn:
    """A column of an existing target table: its declared type, the family of that type (None
    when not judged), whether it takes NULL and whether it fills itself (a default, an identity,
    a computed column)."""

    name: str
    type: str
    family: str | None
    nullable: bool = True
    fills_itself: bool = False


class SchemaTarget(abc.ABC):
    """A target that can create its tables (declared by its connector: ``TargetConnector.schema``).

    It has a connection of its own, opened by `open` and released by `close`; `existing` reads an
    existing table's columns, `statements` gives the DDL that creates a table (idempotent: it
    creates only what is missing, ``IF NOT EXISTS``, so a table created meanwhile by replicated
    DDL or by another node is not created twice), and `execute` runs DDL.
    """

    dialect = ""
    #: Whether column names compare case-insensitively (MySQL, SQLite).
    fold_case = False

    def __init__(self, connect: Callable[[], Any], *, pipeline: str) -> None:
        self._connect = connect
        self.pipeline = pipeline
        self._conn: Any = None

    @property
    def conn(self) -> Any:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def open(self) -> None:
        self.conn  # noqa: B018 - connects

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.debug("pipeline=%s closing the schema connection: %s", self.pipeline, exc)

    def target_name(self, name: str) -> str:
        """The name this target gives a table or column named `name` (PostgreSQL maps names over
        63 bytes: `setl.sinks.postgresql_ddl.pg_name`)."""
        return name

    def mapped_names(self, table: TargetTable) -> list[str]:
        """``'name' -> 'target name'`` for each name of `table` (schema, table, columns) this target
        gives another name, for `setl schema` and `setl check` to show."""
        names = [table.table.schema, table.table.table, *(c.name for c in table.columns)]
        return [f"{n!r} -> {self.target_name(n)!r}" for n in dict.fromkeys(names) if self.target_name(n) != n]

    @abc.abstractmethod
    def existing(self, table: TableName) -> list[ExistingColumn] | None:
        """The columns of target table `table` in order, or None when it does not exist."""

    @abc.abstractmethod
    def statements(self, table: TargetTable) -> list[str]:
        """The DDL that creates `table` (and its schema) where missing; raises `ConfigError` for a
        column this target has no type for."""

    @abc.abstractmethod
    def execute(self, statements: Sequence[str]) -> None:
        """Run DDL statements, in order."""

    def misfit(self, table: TargetTable, existing: Sequence[ExistingColumn]) -> ConfigError | None:
        """Why the existing target table cannot take the rows the pipeline writes into `table`, as a
        one-line error naming pipeline, table and column; None when it fits.

        It does not fit when a column the rows carry is missing, when a column's type takes another
        kind of value (text into an integer, a date into a time, ...; length and precision are not
        compared), or when a column the rows do not carry is NOT NULL without a default.
        """
        def key(name: str) -> str:
            return name.casefold() if self.fold_case else name

        have = {key(c.name): c for c in existing}
        for column in table.columns:
            found = have.get(key(self.target_name(column.name)))
            if found is None:
                return self._misfit(table, column.name, f"is missing (the rows carry it as {column.described})")
            wanted = column_family(column)
            accepted = ACCEPTS.get(found.family or "")
            if wanted is not None and accepted is not None and wanted not in accepted:
                return self._misfit(table, column.name, f"is {found.type}, which cannot hold {wanted} values "
                                                        f"(the rows carry it as {column.described})")
        carried = {key(self.target_name(c.name)) for c in table.columns}
        for other in existing:
            if key(other.name) not in carried and not other.nullable and not other.fills_itself:
                return self._misfit(table, other.name, "is NOT NULL without a default, and the rows do not carry it")
        return None

    def _misfit(self, table: TargetTable, column: str, why: str) -> ConfigError:
        return ConfigError(f"existing target table {table.table} does not fit: column {column!r} {why}; alter or "
                           "drop the table, or set pipeline.create_tables: false to skip this check",
                           pipeline=self.pipeline, stage="load", table=str(table.table))
