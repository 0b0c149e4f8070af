"""Target table DDL for MySQL and MariaDB targets.

A column holding a source column keeps the source's definition: its ``COLUMN_TYPE`` (UNSIGNED,
precision, ENUM and SET members), CHARACTER SET and COLLATE, NOT NULL and DEFAULT. A generated
source column becomes a plain column (the rows carry its values); MariaDB's JSON (a checked
LONGTEXT) stays JSON; an INVISIBLE column stays invisible; an expression default is kept as an
expression. A column a transform adds takes the type of its Spark type (see
`SPARK_TYPES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from setl.model import TableName
from setl.schema.plan import TargetColumn, TargetTable
from setl.schema.target import ExistingColumn, SchemaTarget, added_column, create_table, mysql_family

#: Spark type -> MySQL type, for columns a transform adds.
SPARK_TYPES = {
    "boolean": "tinyint(1)", "tinyint": "tinyint", "smallint": "smallint", "int": "int", "bigint": "bigint",
    "float": "float", "double": "double", "date": "date", "timestamp": "datetime(6)",
    "timestamp_ntz": "datetime(6)", "string": "longtext", "binary": "longblob",
}

_CHARACTER = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set")


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_type(kind: str) -> str | None:
    if kind.startswith("decimal("):
        return kind
    return SPARK_TYPES.get(kind)


class MysqlSchema(SchemaTarget):
    """Creates and inspects tables on a MySQL or MariaDB target."""

    dialect = "mysql"
    fold_case = True

    def column(self, table: TargetTable, column: TargetColumn) -> str:
        if column.source is None:
            return added_column(self.pipeline, table, column, quote=quote, types=spark_type, product="MySQL")
        source = column.source
        text = f"{quote(column.name)} {'json' if source.json else source.type}"
        if source.charset and source.base in _CHARACTER and not source.json:
            text += f" CHARACTER SET {source.charset}"
            if source.collation:
                text += f" COLLATE {source.collation}"
        if not column.nullable:
            text += " NOT NULL"
        if source.default is not None and not source.default.startswith("'0000-00-00"):
            text += f" DEFAULT {source.default}"
        if source.invisible:
            text += " INVISIBLE"
        return text

    def statements(self, table: TargetTable) -> list[str]:
        name = f"{quote(table.table.schema)}.{quote(table.table.table)}"
        return [f"CREATE DATABASE IF NOT EXISTS {quote(table.table.schema)}",
                create_table(name, [self.column(table, c) for c in table.columns], table.primary_key, quote)]

    def existing(self, table: TableName) -> list[ExistingColumn] | None:
        rows = self._query("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
                           "TABLE_NAME = %s", (table.schema, table.table))
        if not rows or not rows[0][0]:
            return None
        rows = self._query("SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE, IS_NULLABLE, COLUMN_DEFAULT, EXTRA, "
                           "GENERATION_EXPRESSION FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
                           "TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (table.schema, table.table))
        return [ExistingColumn(str(name), str(column_type), mysql_family(str(data_type)), nullable == "YES",
                               default is not None or "auto_increment" in str(extra).lower() or bool(generated))
                for name, column_type, data_type, nullable, default, extra, generated in rows]

    def _query(self, query: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        conn = self.conn
        with conn.cursor() as cur:
            cur.execute(query, args)
            rows = list(cur.fetchall())
        conn.commit()  # end the read's snapshot: a later look sees tables created since
        return rows

    def execute(self, statements: Sequence[str]) -> None:
        conn = self.conn
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)  # no arguments: a % in a name is not a placeholder
        conn.commit()
