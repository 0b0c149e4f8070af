"""What the binlog source reads from SQL text: the table a DDL or DML statement acts on, savepoints, XA.
"""

from __future__ import annotations

import re

from setl import ddl

_IGNORED_IN_TX = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO|RELEASE\s+SAVEPOINT|XA\s)", re.I)
# How the server logs the second phase of a prepared XA transaction (its own event group).
_XA_END = re.compile(r"^\s*XA\s+(?P<verb>COMMIT|ROLLBACK)\s+X'(?P<gtrid>[0-9a-f]*)'\s*,\s*X'(?P<bqual>[0-9a-f]*)'"
                     r"\s*,\s*(?P<format>\d+)\s*;?\s*$", re.I)

_NAME = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_QUALIFIED = rf"(?P<name>{_NAME}(?:\s*\.\s*{_NAME})?)"
_DDL_DATABASE = re.compile(rf"^(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:DATABASE|SCHEMA)\s+"
                           rf"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?P<name>{_NAME})", re.I)
_SAVEPOINT = re.compile(rf"^\s*(?P<verb>SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO(?:\s+SAVEPOINT)?|RELEASE\s+SAVEPOINT)\s+"
                        rf"(?P<name>{_NAME})\s*;?\s*$", re.I)
_LEADING_COMMENTS = re.compile(r"^\s*(?:/\*(?!!).*?\*/\s*|#[^\n]*\n\s*|--\s[^\n]*\n\s*)*", re.S)


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def ddl_target(statement: str, default_schema: str, parsed: ddl.Statement | None = None) -> tuple[str, str | None]:
    """``(schema, table or None)`` a DDL statement acts on: the database of CREATE/ALTER/DROP
    DATABASE, else the first table of its model `parsed` (`setl.ddl`; parsed here when not given;
    None for a statement that is not a table DDL)."""
    match = _DDL_DATABASE.match(_LEADING_COMMENTS.sub("", statement, count=1))
    if match:
        return _unquote(match["name"]), None
    if parsed is None:
        parsed = ddl.parse(statement)
    if not parsed.tables:
        return default_schema, None
    first = parsed.tables[0]
    return first.schema or default_schema, first.table


_DML = re.compile(r"^\s*(?:INSERT|REPLACE|UPDATE|DELETE|LOAD\s+(?:DATA|XML)|WITH\s|CALL\s)", re.I)
_DML_TARGETS = [
    re.compile(rf"^\s*(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*(?:INTO\s+)?"
               rf"{_QUALIFIED}", re.I),
    re.compile(rf"^\s*UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*{_QUALIFIED}\s+SET\s", re.I),
    re.compile(rf"^\s*DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*FROM\s+{_QUALIFIED}"
               rf"\s*(?:$|;|WHERE\s|ORDER\s|LIMIT\s|RETURNING\s|PARTITION\s)", re.I),
    re.compile(rf"^\s*LOAD\s+(?:DATA|XML)\s.*?\sINTO\s+TABLE\s+{_QUALIFIED}", re.I | re.S),
]


def dml_target(statement: str, default_schema: str) -> tuple[str, str] | None:
    """``(schema, table)`` a single-table DML statement writes, or None when it cannot be told
    (a multi-table UPDATE or DELETE, a CTE, a procedure call)."""
    for pattern in _DML_TARGETS:
        match = pattern.match(statement)
        if match:
            parts = re.split(rf"\s*\.\s*(?={_NAME}$)", match["name"], maxsplit=1)
            if len(parts) == 2:
                return _unquote(parts[0]), _unquote(parts[1])
            return default_schema, _unquote(parts[0])
    return None
