"""Repairs (`setl repair`): keys of a table copied again as one snapshot read placed at its binlog
position. A requested key the read finds becomes a READ of its row (replacing the target's); one
it does not find (the source has no such row) becomes a DELETE whose before image holds the key
columns only, so that the target loses it too.

Keys arrive as the key columns' canonical texts (`setl.verify.canonical`); `typed_keys` turns them
into the values the snapshot reader hands on for the same columns. Key types outside that list are
refused (`RepairRefused`): the caller copies the whole table instead.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from setl import values

_INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year", "bit"})
_STRINGS = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum"})
_BINARIES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})


class RepairRefused(ValueError):
    """A key that cannot be read back by value (its type, or columns that are no longer the key)."""


def key_value(kind: str, text: str) -> Any:
    """The value of a key column of source ``DATA_TYPE`` `kind` whose canonical text is `text`."""
    try:
        if kind in _INTEGERS:
            return int(text)
        if kind == "decimal":
            return decimal.Decimal(text)
        if kind == "date":
            return datetime.date.fromisoformat(text)
        if kind in ("datetime", "timestamp"):
            return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")
        if kind in _STRINGS:
            return text
        if kind in _BINARIES:
            return bytes.fromhex(text)
        if kind == "uuid":
            return values.uuid_from_text(text)
    except ValueError as exc:
        raise RepairRefused(f"key text {text!r} is not a {kind} value") from exc
    raise RepairRefused(f"a key column of type {kind} cannot be looked up by its text")


def typed_keys(types: Mapping[str, str], columns: Sequence[str], keys: Iterable[Sequence[str]]
               ) -> list[tuple[Any, ...]]:
    """`keys` (texts, in the order of `columns`) as values; `RepairRefused` for a type not covered."""
    kinds = [types[c] for c in columns]
    return [tuple(key_value(kind, text) for kind, text in zip(kinds, key)) for key in keys]


def query_value(value: Any) -> Any:
    """`value` as a statement argument (PyMySQL escapes the rest itself)."""
    return value if isinstance(value, (int, str, bytes, decimal.Decimal, datetime.date)) else str(value)


def _folded(value: Any) -> Any:
    # how a case- and trailing-space-insensitive collation (MariaDB's defaults) compares strings
    return value.rstrip(" ").casefold() if isinstance(value, str) else value


def absent(wanted: Sequence[tuple[Any, ...]], found: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The keys of `wanted` that no found key matches. A key matching a found one only as the
    server's collation may compare strings ('a' and 'A ') is not absent: the read of the found row
    replaces the target's row with that key, and a delete would remove it."""
    exact = set(found)
    folded = {tuple(_folded(v) for v in key) for key in exact}
    return [key for key in wanted if key not in exact and tuple(_folded(v) for v in key) not in folded]
