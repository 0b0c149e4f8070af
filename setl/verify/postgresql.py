"""PostgreSQL's side of `setl verify` (a PostgreSQL target): the same canonical texts as
`setl.verify.mariadb`, from the column types the documented mapping gives (docs/schema.md):
integers, BIT and YEAR in integer types (BOOL in smallint, or boolean as 0/1), DECIMAL(p,s) in
numeric(p,s) (its text keeps the scale), DATE in date, DATETIME in timestamp, TIMESTAMP in
timestamptz (printed in UTC), TIME in interval (signed seconds, six decimals), strings in
varchar/text, bytes in bytea (upper-case hex), UUID in uuid. Other pairs have no exact text
here and are compared in Python (`setl.verify.canonical`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from setl.sinks.postgresql_ddl import pg_name as target_name
from setl.values import SPATIAL_TYPES, as_text
from setl.verify.canonical import BINARIES, INTEGERS, STRINGS

dialect = "postgresql"

#: source types whose PostgreSQL form (PostGIS geometry, WKB or WKT by the target's option) is not compared
UNCOMPARED = SPATIAL_TYPES

_INTS = frozenset({"smallint", "integer", "bigint", "numeric"})
_TEXTS = frozenset({"character varying", "character", "text"})


def quote(name: str) -> str:
    """`name` as the PostgreSQL identifier setl gives it (`target_name`: names over 63 bytes mapped)."""
    return ('"' + target_name(name).replace('"', '""') + '"').replace("%", "%%")


def text_sql(kind: str, own: str, column: str) -> str | None:
    """The SQL text of `column`, of PostgreSQL type `own`, holding a value replicated from a
    MariaDB column of type `kind`; None when there is no exact one."""
    if kind in INTEGERS:
        if own in _INTS:
            return f"({column})::text"
        if own == "boolean":
            return f"(({column})::int)::text"
        return None
    if kind == "decimal" and own == "numeric":
        return f"({column})::text"
    if kind == "date" and own == "date":
        return f"to_char({column}, 'YYYY-MM-DD')"
    if kind == "datetime" and own == "timestamp without time zone":
        return f"to_char({column}, 'YYYY-MM-DD HH24:MI:SS.US')"
    if kind == "timestamp" and own == "timestamp with time zone":
        return f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
    if kind == "time" and own in ("interval", "time without time zone"):
        return f"((extract(epoch FROM {column}))::numeric(20,6))::text"
    if kind in STRINGS and own in _TEXTS:
        return f"({column})::text"
    if kind in BINARIES and own == "bytea":
        return f"upper(encode({column}, 'hex'))"
    if kind == "uuid" and own == "uuid":
        return f"({column})::text"
    return None


def plain_sql(own: str, column: str) -> str | None:
    """None: PostgreSQL's `row_sql` tests and measures the texts themselves."""
    return None


def recode(conn: Any) -> bool:
    """Whether `conn`'s server keeps text in another encoding than UTF-8 (SQL_ASCII, LATIN1, ...):
    then `row_sql` and `hash_sql` count and hash the texts as UTF-8, what MariaDB's side does
    (length() counts bytes in an SQL_ASCII database, md5(text) hashes a LATIN1 database's bytes);
    a UTF8 server's texts are UTF-8 already (the conversion would cost a third of the hashing)."""
    return bool(conn.info.parameter_status("server_encoding") != "UTF8")


def row_sql(texts: Sequence[str], counted: Sequence[bool], plain: Sequence[str | None] | None = None,
            recoded: bool = False) -> str:
    """`setl.verify.mariadb.row_sql`'s text, in PostgreSQL (`plain` is not used); `recoded`: see `recode`."""
    if not texts:
        return "''"
    nulls = f"concat({', '.join(f'({t} IS NULL)::int' for t in texts)})"
    lengths = [f"length(convert_to({t}, 'UTF8'), 'UTF8')" if recoded else f"length({t})"
               for t, c in zip(texts, counted) if c]
    parts = [nulls, *([f"concat_ws(',', {', '.join(lengths)})"] if lengths else []), *texts]
    return f"concat_ws('|', {', '.join(parts)})"


def hash_sql(row: str, recoded: bool = False) -> str:
    return f"md5(convert_to({row}, 'UTF8'))" if recoded else f"md5({row})"


def summary_sql(hashed: str, table: str, where: str) -> str:
    return f"SELECT count(*), sum(('x' || left({hashed}, 15))::bit(60)::bigint) FROM {table}{where}"


def table_sql(schema: str, table: str) -> str:
    return f"{quote(schema)}.{quote(table)}"


def prepare(conn: Any) -> None:
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET DateStyle = 'ISO, YMD'")
    conn.execute("SET IntervalStyle = 'postgres'")
    conn.commit()


def begin(conn: Any) -> None:
    conn.rollback()  # psycopg opens the next transaction with the next statement: this one
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def end(conn: Any) -> None:
    conn.rollback()


def columns(conn: Any, schema: str, table: str) -> dict[str, str] | None:
    rows = conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                        "AND table_name = %s ORDER BY ordinal_position",
                        (target_name(schema), target_name(table))).fetchall()
    conn.rollback()
    return {as_text(name): as_text(kind).lower() for name, kind in rows} or None
