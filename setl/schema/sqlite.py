"""Target table DDL for the SQLite target: one table per target table, named ``schema.table``
(`setl.routing.flat_name`), with SQLite's type affinities (INTEGER, NUMERIC, REAL, TEXT, BLOB)
and the primary key. SQLite takes any value in any column, so the fit check only looks for
missing columns."""

from __future__ import annotations

from collections.abc import Sequence

from setl.model import TableName
from setl.routing import flat_name
from setl.schema.plan import TargetTable
from setl.schema.target import ExistingColumn, SchemaTarget, column_family, create_table

_AFFINITY = {"integer": "INTEGER", "boolean": "INTEGER", "decimal": "NUMERIC", "float": "REAL", "text": "TEXT",
             "json": "TEXT", "binary": "BLOB"}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteSchema(SchemaTarget):
    """Creates and inspects tables in the SQLite target's file."""

    dialect = "sqlite"
    fold_case = True

    def statements(self, table: TargetTable) -> list[str]:
        columns = []
        for column in table.columns:
            affinity = _AFFINITY.get(column_family(column) or "", "")
            columns.append(f"{_q(column.name)}{' ' + affinity if affinity else ''}"
                           + ("" if column.nullable else " NOT NULL"))
        return [create_table(_q(flat_name(table.table.schema, table.table.table)), columns, table.primary_key, _q)]

    def existing(self, table: TableName) -> list[ExistingColumn] | None:
        rows = self.conn.execute(f"PRAGMA table_info({_q(flat_name(table.schema, table.table))})").fetchall()
        if not rows:
            return None
        return [ExistingColumn(str(name), str(kind), None, not notnull, default is not None or bool(pk))
                for _cid, name, kind, notnull, default, pk in rows]

    def execute(self, statements: Sequence[str]) -> None:
        for statement in statements:
            self.conn.execute(statement)
