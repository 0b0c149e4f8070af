"""Staging tables of re-copies on a MySQL or MariaDB target (`MysqlStaging`, for
`setl.sinks.sql_staging.StagedCopies`)."""

from __future__ import annotations

from collections.abc import Callable

import pymysql.err
from pymysql.connections import Connection

from setl.adapters import pymysql as pymysql_io
from setl.model import TableName
from setl.sinks.mysql_sql import plain_quote
from setl.sinks.sql_staging import StagingDialect

MISSING = frozenset({1146, 1049})  # no such table, unknown database
#: Seconds the switch's statements may run (they take as long as the table is large), instead of the
#: sink's read timeout.
SWITCH_TIMEOUT = 3600.0


def _name(schema: str, table: str) -> str:
    return f"{plain_quote(schema)}.{plain_quote(table)}"


class MysqlStaging(StagingDialect[Connection]):
    """``CREATE TABLE ... LIKE`` (keys and indexes, no foreign keys), and the switch as ``DELETE``
    then ``INSERT ... SELECT`` in the batch's transaction. The sink's sessions run with
    ``foreign_key_checks=0``: no foreign-key action fires on the DELETE (triggers on the table
    do, as for any change the sink applies). CREATE and DROP TABLE commit the open transaction.
    A table of a non-transactional engine (MyISAM, Aria) switches in two steps a reader may see
    between. `forget(schema, table)` drops what the sink cached about a table's columns."""

    transactional_ddl = False

    def __init__(self, forget: Callable[[str, str], None]) -> None:
        self._forget = forget

    def has_rows(self, conn: Connection, schema: str, table: str) -> bool | None:
        with conn.cursor() as cur:
            try:
                cur.execute(f"SELECT 1 FROM {_name(schema, table)} LIMIT 1")
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] in MISSING:
                    return None
                raise
            return cur.fetchone() is not None

    def create(self, conn: Connection, schema: str, table: str, staging: str) -> None:
        self._forget(schema, staging)
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {_name(schema, staging)}")
            cur.execute(f"CREATE TABLE {_name(schema, staging)} LIKE {_name(schema, table)}")

    def switch(self, conn: Connection, schema: str, table: str, staging: str) -> int:
        with pymysql_io.read_timeout_at_least(conn, SWITCH_TIMEOUT):
            return self._switch(conn, schema, table, staging)

    @staticmethod
    def _switch(conn: Connection, schema: str, table: str, staging: str) -> int:
        with conn.cursor() as cur:
            # Columns the server computes (generated, ROW START/END) take no value; MySQL 8's
            # DEFAULT_GENERATED (an expression DEFAULT) is a stored column like any other.
            cur.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                        " AND table_name = %s AND COALESCE(generation_expression, '') = ''"
                        " AND extra NOT IN ('ROW START', 'ROW END') ORDER BY ordinal_position", (schema, table))
            columns = ", ".join(plain_quote(str(row[0])) for row in cur.fetchall())
            cur.execute(f"DELETE FROM {_name(schema, table)}")
            return int(cur.execute(f"INSERT INTO {_name(schema, table)} ({columns}) SELECT {columns}"
                                   f" FROM {_name(schema, staging)}"))

    def exists(self, conn: Connection, schema: str, staging: str) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
                        (schema, staging))
            return cur.fetchone() is not None

    def drop(self, conn: Connection, schema: str, staging: str) -> None:
        self._forget(schema, staging)
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {_name(schema, staging)}")

    def named(self, conn: Connection, prefix: str) -> list[TableName]:
        with conn.cursor() as cur:
            cur.execute("SELECT table_schema, table_name FROM information_schema.tables"
                        " WHERE LEFT(table_name, %s) = %s", (len(prefix), prefix))
            return [TableName(str(s), str(t)) for s, t in cur.fetchall()]
