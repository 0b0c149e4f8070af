"""Staging tables of re-copies on a PostgreSQL target (`PostgresStaging`, for
`setl.sinks.sql_staging.StagedCopies`)."""

from __future__ import annotations

import logging

import psycopg
import psycopg.errors
from psycopg import sql

from setl.errors import RefusedLoadError
from setl.model import TableName
from setl.sinks.postgresql_ddl import pg_name
from setl.sinks.sql_staging import StagingDialect

log = logging.getLogger(__name__)


def _ident(schema: str, table: str) -> sql.Identifier:
    return sql.Identifier(pg_name(schema), pg_name(table))


class PostgresStaging(StagingDialect[psycopg.Connection]):
    """``CREATE TABLE ... (LIKE ... INCLUDING ALL)`` (defaults, generated and identity columns,
    constraints but foreign keys, indexes) and the switch as ``DELETE`` then ``INSERT ... SELECT``,
    all in the batch's transaction (PostgreSQL DDL is transactional). The switch runs with
    ``session_replication_role = replica`` (set for the transaction only), so that no trigger and
    no foreign-key action fires; a role that may not set it switches without when no foreign key
    refers to the table, and is refused with one line when one does (the DELETE would cascade)."""

    transactional_ddl = True

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline

    def has_rows(self, conn: psycopg.Connection, schema: str, table: str) -> bool | None:
        name = _ident(schema, table)
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name.as_string(conn),)).fetchone()
        if not (found and found[0]):
            return None
        row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(name)).fetchone()
        return bool(row and row[0])

    def create(self, conn: psycopg.Connection, schema: str, table: str, staging: str) -> None:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(schema, staging)))
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
            _ident(schema, staging), _ident(schema, table)))

    def switch(self, conn: psycopg.Connection, schema: str, table: str, staging: str) -> int:
        name = _ident(schema, table)
        regclass = name.as_string(conn)
        conn.execute("SAVEPOINT setl_copy_switch")
        try:
            conn.execute("SET LOCAL session_replication_role = replica")
        except psycopg.errors.InsufficientPrivilege:
            conn.execute("ROLLBACK TO SAVEPOINT setl_copy_switch")
            referred = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE contype = 'f'"
                                    " AND confrelid = %s::regclass)", (regclass,)).fetchone()
            if referred and referred[0]:
                raise RefusedLoadError(
                    f"cannot switch {schema}.{table} to its re-copied rows: a foreign key refers to it, and the "
                    "target role may not set session_replication_role (the DELETE would fire its actions); "
                    "grant it SET on session_replication_role, or drop the foreign key",
                    pipeline=self.pipeline, stage="load", table=f"{schema}.{table}") from None
        conn.execute("RELEASE SAVEPOINT setl_copy_switch")
        rows = conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                            " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", (regclass,)).fetchall()
        columns = sql.SQL(", ").join(sql.Identifier(str(row[0])) for row in rows)
        conn.execute(sql.SQL("DELETE FROM {}").format(name))
        cur = conn.execute(sql.SQL("INSERT INTO {} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}").format(
            name, columns, columns, _ident(schema, staging)))
        return cur.rowcount

    def exists(self, conn: psycopg.Connection, schema: str, staging: str) -> bool:
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                             (_ident(schema, staging).as_string(conn),)).fetchone()
        return bool(found and found[0])

    def drop(self, conn: psycopg.Connection, schema: str, staging: str) -> None:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(schema, staging)))

    def named(self, conn: psycopg.Connection, prefix: str) -> list[TableName]:
        rows = conn.execute("SELECT table_schema, table_name FROM information_schema.tables"
                            " WHERE left(table_name, %s) = %s", (len(prefix), prefix)).fetchall()
        return [TableName(str(s), str(t)) for s, t in rows]
