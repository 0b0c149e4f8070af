"""Writing into MySQL/MariaDB the values a non-strict source session stored, and nothing looser.

The MySQL sink's sessions are strict (`setl.sinks.mysql.SQL_MODE`): a value the target cannot
hold as it is fails the batch instead of being cut. But a source session without strict mode
(the default of many older applications) can store a value that strict mode refuses to write:
the ENUM error value, ``''`` (index 0), which MariaDB stores for a string that is not a member.
The binlog row image holds exactly that value, and a replica applies it.

A row holding the error value in an ENUM column is therefore written on its own in a non-strict
statement (`LENIENT_SQL_MODE`), and every warning the server gives for it is checked: only "Data
truncated for column C" where C is an ENUM column holding ``''`` in that row is the expected one.
Any other warning (a value cut, out of range, NULL into NOT NULL, ...) is raised as the error
strict mode would have raised, so nothing lands differently from the row image.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pymysql

#: The ENUM error value, as the binlog and a snapshot read both hand it on.
ENUM_ERROR_VALUE = ""
#: `setl.sinks.mysql.SQL_MODE` without strict mode, for a row holding the ENUM error value.
LENIENT_SQL_MODE = "NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO,ALLOW_INVALID_DATES"

_TRUNCATED = 1265
_TRUNCATED_COLUMN = re.compile(r"Data truncated for column '((?:[^']|'')+)' at row 1\Z")


def holds_error_value(image: Mapping[str, Any], enums: Collection[str]) -> bool:
    """Whether the row holds the ENUM error value in one of the `enums` (lower-cased names); a
    column's name is looked at only where its value is the empty string."""
    return any(value == ENUM_ERROR_VALUE and name.lower() in enums for name, value in image.items())


def split_error_values(images: Sequence[Mapping[str, Any]], enums: Collection[str]
                       ) -> tuple[Sequence[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """`images` as (rows written as usual, rows holding the ENUM error value), each in order.

    The ordered load runs this on every row it writes: a table without ENUM columns costs nothing
    (`holds_error_value` runs only for a table that has some)."""
    if not enums:
        return images, []
    usual: list[Mapping[str, Any]] = []
    lenient: list[Mapping[str, Any]] = []
    for image in images:
        (lenient if holds_error_value(image, enums) else usual).append(image)
    return usual, lenient


def execute_one_row(cur: Any, sql: str, args: Sequence[Any], image: Mapping[str, Any], enums: Collection[str],
                    strict_mode: str) -> None:
    """Run `sql` (which writes the one row `image`) with `LENIENT_SQL_MODE`, then put the session
    back to `strict_mode`; raise the error strict mode would have raised for any warning other
    than the ENUM error value's."""
    cur.execute("SET SESSION sql_mode = %s", (LENIENT_SQL_MODE,))
    try:
        cur.execute(sql, args)
        warnings: list[Any] = []
        if cur.warning_count:
            cur.execute("SHOW WARNINGS")
            warnings = list(cur.fetchall())
    finally:
        cur.execute("SET SESSION sql_mode = %s", (strict_mode,))
    for level, code, message in warnings:
        if str(level).lower() == "note":
            continue
        if int(code) == _TRUNCATED:
            match = _TRUNCATED_COLUMN.match(str(message))
            column = match[1].replace("''", "'").lower() if match else None
            if column in enums and any(name.lower() == column and value == ENUM_ERROR_VALUE
                                       for name, value in image.items()):
                continue
        raise pymysql.err.DataError(int(code), str(message))
