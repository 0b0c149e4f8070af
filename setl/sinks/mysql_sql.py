"""How the MySQL target writes names and values in the statements it sends, and the sql_mode its
sessions run under.

Compiled by Cython as it is (setup.py; the .py serves where it is not built): `value_lists`
turns every row a batch writes into statement text, `load_data_text` a chunk of snapshot rows
into ``LOAD DATA`` input.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from setl.model import InvalidDate
from setl.values import Geometry


def quote(name: str) -> str:
    """A backtick-quoted identifier, safe inside a PyMySQL %-format query string."""
    return "`" + name.replace("`", "``").replace("%", "%%") + "`"


def table_name(schema: str, table: str) -> str:
    return f"{quote(schema)}.{quote(table)}"


def plain_quote(name: str) -> str:
    """A backtick-quoted identifier for a statement sent without parameters (no ``%`` doubling)."""
    return "`" + name.replace("`", "``") + "`"


# Without NO_ZERO_DATE and NO_ZERO_IN_DATE, and with ALLOW_INVALID_DATES, the zero and partial dates
# the source holds (InvalidDate: '0000-00-00', '2024-00-15', '2024-02-30') are stored as they are.
SQL_MODE = ("STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO,ERROR_FOR_DIVISION_BY_ZERO,"
            "ALLOW_INVALID_DATES")


def to_db(value: Any) -> Any:
    """A row value as PyMySQL can send it: JSON documents dumped, SET members joined, zero and
    partial dates as the server's own text, spatial values as the server's own bytes."""
    if isinstance(value, InvalidDate):
        return value.text
    if isinstance(value, Geometry):
        return value.data
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, (set, frozenset)):
        return ",".join(sorted(map(str, value)))
    return value


def value_lists(images: Sequence[Mapping[str, Any]], literal: Callable[[Any], str],
                escape_string: Callable[[str], str], limit: int, max_rows: int) -> Iterator[str]:
    """The VALUES lists of multi-row statements for `images` (which share one column order), at
    most `max_rows` rows and about `limit` bytes each: plain str, int and None written here,
    every other value by the connection's `literal` (its ``escape``) after `to_db`; text escaped
    by `escape_string` only when it holds one of the seven characters PyMySQL escapes."""
    rows: list[str] = []
    size = 0
    for image in images:
        parts: list[str] = []
        add = parts.append
        for value in image.values():
            kind = type(value)
            if kind is str:
                # Most text holds nothing to escape: seven scans at C speed cost half a translate.
                if ("'" in value or "\\" in value or '"' in value or "\n" in value or "\r" in value
                        or "\x00" in value or "\x1a" in value):
                    value = escape_string(value)
                add("'" + value + "'")
            elif kind is int:
                add(str(value))
            elif value is None:
                add("NULL")
            else:
                add(literal(to_db(value)))
        text = "(" + ",".join(parts) + ")"
        rows.append(text)
        size += len(text) if text.isascii() else 4 * len(text)  # at most 4 bytes a character in utf8mb4
        if size >= limit or len(rows) >= max_rows:
            yield ",".join(rows)
            rows, size = [], 0
    if rows:
        yield ",".join(rows)


#: The input format `load_data_text` writes, as a ``LOAD DATA`` clause (a session with backslash
#: escapes: the target's sessions never set ``NO_BACKSLASH_ESCAPES``).
LOAD_DATA_FORMAT = "CHARACTER SET utf8mb4 FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n'"


def _escaped_field(value: str) -> str:
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r").replace("\x00", "\\0"))


def _other_field(value: Any) -> str | None:
    """The ``LOAD DATA`` field of a value that is neither text, a plain int nor None (no character
    of it needs escaping); None when its type is written otherwise in a statement."""
    kind = type(value)
    if kind is datetime.datetime:
        return None if value.tzinfo is not None else value.isoformat(" ")
    if kind is datetime.date:
        return value.isoformat()
    if kind is decimal.Decimal:
        return format(value, "f") if value.is_finite() else None
    if kind is float:
        return repr(value) if math.isfinite(value) else None
    return None


_LoadData: Any
try:  # text and integers written in C (built by pip install); the loop below where it is not built
    from setl.sinks._loaddata import load_data_text as _LoadData
except ImportError:
    _LoadData = None
#: whether `load_data_text` runs in C (the tests turn it off to compare)
COMPILED = _LoadData is not None


def load_data_text(images: Sequence[Mapping[str, Any]]) -> bytes | None:
    """`images` (which share one column order) as ``LOAD DATA`` input in `LOAD_DATA_FORMAT`: one
    line a row, fields as the text a statement's literal holds (NULL as ``\\N``; backslash, tab,
    newline, carriage return and NUL escaped), so that the server converts each the same way.
    None when a value is of a type written otherwise in a statement (bytes, JSON, SET, TIME,
    zero dates, spatial values, an aware datetime, a float or decimal that is not finite...),
    or when a row would be an empty line: those rows go by statements."""
    if COMPILED:
        found: bytes | None = _LoadData(images, _other_field)
        return found
    lines: list[str] = []
    for image in images:
        parts: list[str] = []
        add = parts.append
        for value in image.values():
            kind = type(value)
            if kind is str:
                if "\\" in value or "\t" in value or "\n" in value or "\r" in value or "\x00" in value:
                    value = _escaped_field(value)
                add(value)
            elif kind is int:
                add(str(value))
            elif value is None:
                add("\\N")
            else:
                text = _other_field(value)
                if text is None:
                    return None
                add(text)
        line = "\t".join(parts)
        if not line:
            return None  # one column holding '': an empty line
        lines.append(line)
    lines.append("")
    try:
        return "\n".join(lines).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: left to a statement, which refuses it clearly
        return None
