"""A two-way channel's marker-row loop guard (docs/bidirectional.md): the mark table that a loader
writes first in each of its target transactions, the comment its DDL carries, and how a reader
recognises both. The loader's side is `setl.sinks.mysql_loop_guard`, the reader's the assembler.
"""

from __future__ import annotations

import re

#: the schema and table of the marks: one row per (mark, loader session), its `seq` bumped by each
#: transaction of that session, so that every transaction logs a rows event on it
MARK_SCHEMA, MARK_TABLE = "setl", "setl_channel_mark"
MARK_DDL = (f"CREATE TABLE IF NOT EXISTS `{MARK_SCHEMA}`.`{MARK_TABLE}` (`mark` VARCHAR(190) NOT NULL, "
            "`session` BIGINT UNSIGNED NOT NULL, `seq` BIGINT UNSIGNED NOT NULL DEFAULT 0, "
            "PRIMARY KEY (`mark`, `session`)) ENGINE=InnoDB")
#: the loop guards a channel may use: `auto` takes server_id where the loader's user may set it
LOOP_GUARDS = ("auto", "server_id", "marker")

_COMMENT = re.compile(r"/\* setl-channel:([A-Za-z0-9_.:-]{1,190}) \*/")


def mark_name(channel: str, source: str, target: str) -> str:
    """The mark of the writes of a channel's direction from site `source` into site `target`."""
    return f"{channel}:{source}-to-{target}"


def ddl_comment(mark: str) -> str:
    """The comment a marked loader puts before each statement that MariaDB logs as a query (DDL)."""
    return f"/* setl-channel:{mark} */"


def statement_mark(statement: str) -> str | None:
    """The mark a query event's statement carries (`ddl_comment`), or None."""
    if "setl-channel:" not in statement:
        return None
    found = _COMMENT.search(statement)
    return found[1] if found else None


def row_mark(row: dict[str, object]) -> str | None:
    """The `mark` column of one decoded row of the mark table (its after image, else its image)."""
    values = row.get("after_values") or row.get("values")
    value = values.get("mark") if isinstance(values, dict) else None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def row_session(row: dict[str, object]) -> int:
    """The `session` column (the loader's connection id) of one decoded row of the mark table, or 0."""
    values = row.get("after_values") or row.get("values")
    value = values.get("session") if isinstance(values, dict) else None
    return value if isinstance(value, int) else 0


__all__ = ["LOOP_GUARDS", "MARK_DDL", "MARK_SCHEMA", "MARK_TABLE", "ddl_comment", "mark_name", "row_mark",
           "row_session", "statement_mark"]
