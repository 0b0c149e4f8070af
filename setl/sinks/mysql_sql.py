"""How the MySQL target writes names and values in the statements it sends, and the sql_mode its
sessions run under."""

from __future__ import annotations

import json
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
