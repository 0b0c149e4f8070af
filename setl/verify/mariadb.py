"""MariaDB's side of `setl verify`: the canonical text of a column as SQL (the source, and a
MariaDB target), the row hash and the chunk aggregate, and reads in a consistent snapshot whose
binlog position the server tells.

A column's text is `setl.verify.canonical.text`'s form: integers and decimals as the server
prints them (a DECIMAL keeps its scale), dates ``YYYY-MM-DD``, DATETIME and TIMESTAMP (UTC
session) ``YYYY-MM-DD HH:MM:SS.ffffff``, TIME as signed seconds with six decimals, strings in
utf8mb4, bytes as upper-case hex. A row's text (`row_sql`) is ``NULLS|LENGTHS|TEXT|TEXT...``: a
digit per column (1: NULL), the lengths of the texts that may hold a ``|`` (strings,
comma-separated), then the texts of the columns that are not NULL: no two different rows share it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from setl import ddl
from setl.model import Position
from setl.values import SPATIAL_TYPES
from setl.verify.canonical import BINARIES, INTEGERS, STRINGS

dialect = "mysql"

_GROUPS: dict[str, frozenset[str]] = {
    "integer": INTEGERS, "decimal": frozenset({"decimal"}), "float": frozenset({"float", "double"}),
    "date": frozenset({"date"}), "datetime": frozenset({"datetime", "timestamp"}), "time": frozenset({"time"}),
    "string": STRINGS | {"set"}, "binary": BINARIES | SPATIAL_TYPES, "uuid": frozenset({"uuid"}),
    "inet": frozenset({"inet4", "inet6"}),
}


def group(kind: str) -> str | None:
    return next((name for name, kinds in _GROUPS.items() if kind in kinds), None)


def quote(name: str) -> str:
    """A quoted identifier for a statement sent with arguments (``%`` doubled)."""
    return ddl.quote(name).replace("%", "%%")


def text_sql(kind: str, own: str, column: str) -> str | None:
    """The SQL text of `column`, of MariaDB type `own`, holding a value replicated from a source
    column of type `kind`; None when there is no exact one (JSON: compared in Python)."""
    if group(kind) is None or group(kind) != group(own):
        return None
    if own == "bit":
        return f"CAST(CAST({column} AS UNSIGNED) AS CHAR)"
    if own in INTEGERS or own in ("decimal", "float", "double", "uuid", "inet4", "inet6"):
        return f"CAST({column} AS CHAR)"
    if own == "date":
        return f"DATE_FORMAT({column}, '%%Y-%%m-%%d')"
    if own in ("datetime", "timestamp"):
        return f"DATE_FORMAT({column}, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')"
    if own == "time":
        return f"CAST(CAST(TIME_TO_SEC({column}) AS DECIMAL(20,6)) AS CHAR)"
    if own in STRINGS or own == "set":
        return f"CONVERT({column} USING utf8mb4)"
    if own in BINARIES or own in SPATIAL_TYPES:
        return f"HEX({column})"
    return None


def plain_sql(own: str, column: str) -> str | None:
    """`column` itself where it stands for its `text_sql` text in `row_sql`'s NULL digit and length:
    NULL exactly when the text is, and of as many characters (a string converted to utf8mb4 keeps
    its characters; a number's or a byte string's text is NULL only when it is). The server then
    does not convert the value three times per row (about a sixth of a sysbench row's hash). None
    where the text is not such a plain conversion (temporal, BIT, UUID, INET, spatial types)."""
    if (own in STRINGS or own == "set" or (own in INTEGERS and own != "bit") or own in BINARIES
            or own in ("decimal", "float", "double")):
        return column
    return None


def recode(conn: Any) -> bool:
    """False: `text_sql` gives strings in utf8mb4 whatever the tables' charsets (a latin1 database too)."""
    return False


def row_sql(texts: Sequence[str], counted: Sequence[bool], plain: Sequence[str | None] | None = None,
            recoded: bool = False) -> str:
    """A row's text: which columns are NULL (a digit each), the lengths of the `counted` columns'
    texts (those that may hold the separator), then the non-NULL texts, ``|``-separated. `plain`
    gives each column's `plain_sql` (None: its text), tested for NULL and measured instead of its text."""
    if not texts:
        return "''"
    tested = [p or t for p, t in zip(plain, texts)] if plain is not None else list(texts)
    nulls = f"CONCAT({', '.join(f'ISNULL({t})' for t in tested)})"
    lengths = [f"CHAR_LENGTH({t})" for t, c in zip(tested, counted) if c]
    parts = [nulls, *([f"CONCAT_WS(',', {', '.join(lengths)})"] if lengths else []), *texts]
    return f"CONCAT_WS('|', {', '.join(parts)})"


def hash_sql(row: str, recoded: bool = False) -> str:
    return f"MD5({row})"


def summary_sql(hashed: str, table: str, where: str) -> str:
    """COUNT and the sum of the rows' hashes' first 60 bits (order-free; duplicates count)."""
    return f"SELECT COUNT(*), SUM(CAST(CONV(LEFT({hashed}, 15), 16, 10) AS UNSIGNED)) FROM {table}{where}"


def table_sql(schema: str, table: str) -> str:
    return f"{quote(schema)}.{quote(table)}"


def prepare(conn: Any) -> None:
    """UTC session (TIMESTAMPs as the binlog source reads them), REPEATABLE READ for snapshots."""
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def begin_snapshot(conn: Any) -> Position:
    """Start a consistent-snapshot transaction; its binlog position."""
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(name).lower(): value for name, value in cur.fetchall()}
    return Position(str(status["binlog_snapshot_file"]), int(status["binlog_snapshot_position"]))


def begin(conn: Any) -> None:
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")


def end(conn: Any) -> None:
    with conn.cursor() as cur:
        cur.execute("COMMIT")


def json_columns(conn: Any, schema: str, table: str) -> set[str]:
    """MariaDB's JSON columns of a table: LONGTEXT with a ``json_valid(`col`)`` CHECK (their
    information_schema DATA_TYPE says longtext)."""
    with conn.cursor() as cur:
        cur.execute("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = %s "
                    "AND TABLE_NAME = %s", (schema, table))
        clauses = [str(clause).strip() for clause, in cur.fetchall()]
    found = set()
    for clause in clauses:
        match = re.fullmatch(r"json_valid\(`((?:[^`]|``)+)`\)", clause)
        if match:
            found.add(match[1].replace("``", "`"))
    return found


def columns(conn: Any, schema: str, table: str) -> dict[str, str] | None:
    """A table's column -> DATA_TYPE (lower case), None when it does not exist."""
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (schema, table))
        found = {str(name): str(kind).lower() for name, kind in cur.fetchall()}
    return found or None
