"""Signal rows: how an upstream job declares a batch DDL task (`Signal`, parsed and checked).

`setl.ddltask.select.DdlTaskSelect` reads them from the source; `setl.ddltask.tasks` declares them.

The job inserts one row into the signal table (``pipeline.ddl_tasks.signal_table``) before its
data, or first in the same transaction::

    CREATE TABLE setl_signal (
        task_id      VARCHAR(191) NOT NULL PRIMARY KEY,
        op_type      VARCHAR(32)  NOT NULL,   -- see OP_TYPES
        op_db        VARCHAR(64)  NOT NULL,   -- the source table the job writes
        op_table     VARCHAR(64)  NOT NULL,
        op_partition VARCHAR(255) NOT NULL DEFAULT '',
        overwrite    BOOLEAN      NOT NULL DEFAULT FALSE
    );
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from setl.model import Position

#: op_type → what op_partition holds ("" when it must be empty).
OP_TYPES: Mapping[str, str] = {
    "truncate_table": "",
    "drop_partition": "a partition name",
    "truncate_partition": "a partition name",
    "add_range_partition": "NAME:BOUND (VALUES LESS THAN BOUND)",
    "delete_where": "COLUMN=VALUE",
    "none": "anything (it only names the slice)",
}
_NAME = re.compile(r"^[A-Za-z0-9_$]{1,64}$")
_WHERE = re.compile(r"^\s*([A-Za-z0-9_$]{1,64})\s*=\s*(.*?)\s*$", re.S)


@attrs.frozen
class Signal:
    """One parsed signal row, in source names."""

    task_id: str
    op_type: str
    op_db: str
    op_table: str
    op_partition: str
    overwrite: bool
    position: Position

    @classmethod
    def from_row(cls, image: Mapping[str, Any], position: Position) -> "Signal":
        """Parse and check a signal row; a bad row raises ValueError saying what is wrong."""

        def text(column: str, required: bool = True) -> str:
            value = image.get(column)
            if isinstance(value, bytes):
                value = value.decode("utf-8")
            value = "" if value is None else str(value).strip()
            if required and not value:
                raise ValueError(f"column {column} is empty")
            return value

        task_id, op_type = text("task_id"), text("op_type").lower()
        op_db, op_table = text("op_db"), text("op_table")
        partition = text("op_partition", required=False)
        if op_type not in OP_TYPES:
            raise ValueError(f"op_type {op_type!r} is not one of {', '.join(OP_TYPES)}")
        check_partition(op_type, partition)
        overwrite = image.get("overwrite")
        if isinstance(overwrite, str):
            overwrite = overwrite.strip().lower() in ("1", "true", "yes", "y")
        return cls(task_id, op_type, op_db, op_table, partition, bool(overwrite), position)


def check_partition(op_type: str, partition: str) -> None:
    """Raise ValueError if `partition` is not what `op_type` needs (see `OP_TYPES`)."""
    if op_type == "truncate_table" and partition:
        raise ValueError("truncate_table takes no op_partition")
    if op_type in ("drop_partition", "truncate_partition") and not _NAME.match(partition):
        raise ValueError(f"{op_type} needs a partition name in op_partition, got {partition!r}")
    if op_type == "add_range_partition":
        name, sep, bound = partition.partition(":")
        if not sep or not _NAME.match(name) or not bound.strip():
            raise ValueError(f"add_range_partition needs NAME:BOUND in op_partition, got {partition!r}")
    if op_type == "delete_where" and not _WHERE.match(partition):
        raise ValueError(f"delete_where needs COLUMN=VALUE in op_partition, got {partition!r}")


def split_where(partition: str) -> tuple[str, str]:
    """``COLUMN=VALUE`` of a delete_where task as (column, value)."""
    match = _WHERE.match(partition)
    assert match is not None
    return match.group(1), match.group(2)


__all__ = ["OP_TYPES", "Signal", "check_partition", "split_where"]
