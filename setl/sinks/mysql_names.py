"""How the MySQL target quotes names in the statements it sends."""

from __future__ import annotations


def quote(name: str) -> str:
    """A backtick-quoted identifier, safe inside a PyMySQL %-format query string."""
    return "`" + name.replace("`", "``").replace("%", "%%") + "`"


def table_name(schema: str, table: str) -> str:
    return f"{quote(schema)}.{quote(table)}"


def plain_quote(name: str) -> str:
    """A backtick-quoted identifier for a statement sent without parameters (no ``%`` doubling)."""
    return "`" + name.replace("`", "``") + "`"
