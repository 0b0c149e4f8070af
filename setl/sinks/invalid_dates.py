"""What a target without zero or partial dates does with an `InvalidDate` (``invalid_dates``).

MySQL and MariaDB hold dates no calendar has (``0000-00-00``, ``2024-00-15``, a zero TIMESTAMP);
the binlog source hands them on as `setl.model.InvalidDate`. A MySQL/MariaDB target writes them
exactly and SQLite stores their text; PostgreSQL and Parquet have no such value, so their target
config chooses:

* ``refuse`` (the default): the batch fails with a permanent `RefusedLoadError` (the scheduler
  pauses the pipeline, no retries) naming the table, column, position and value;
* ``null``: the value is written as NULL, and a WARNING per table and batch gives the count in the
  batch and the running count since the process started.

A primary-key column holding an invalid date is refused under either policy (a NULL key would
merge distinct rows). A before-image (used to match rows of tables without a primary key) gets the
same NULL, so the row written as NULL is found again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from setl.errors import RefusedLoadError
from setl.model import Batch, InvalidDate, RowChange, partial_like
from setl.sinks import rewrites
from setl.sinks.sql_rows import holds_type

log = logging.getLogger(__name__)

POLICIES = ("refuse", "null")


class InvalidDatePolicy:
    """Applies an ``invalid_dates`` policy to the row images of a batch (see the module docstring)."""

    def __init__(self, policy: str, *, pipeline: str, target: str) -> None:
        if policy not in POLICIES:
            raise ValueError(f"invalid_dates must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.policy = policy
        self.pipeline = pipeline
        self.target = target
        self._counts: dict[str, int] = {}

    def apply(self, batch: Batch) -> Batch:
        """`batch` with its invalid dates replaced by None (policy null), or the batch itself when
        it has none; raises `RefusedLoadError` for the first one under policy refuse."""
        if not holds_type(batch, InvalidDate):  # the common case first: a batch without any
            return batch
        changes: list[Any] = []
        found: dict[str, int] = {}
        for change in batch.changes:
            if isinstance(change, RowChange):
                before = self._clean(batch, change, change.before, found)
                after = self._clean(batch, change, change.after, found)
                if before is not change.before or after is not change.after:
                    change = attrs.evolve(change, before=before, after=after)
            changes.append(change)
        if not found:
            return batch
        for table, count in found.items():
            self._counts[table] = self._counts.get(table, 0) + count
            rewrites.count(self.pipeline or batch.pipeline, table, "invalid_date_null", count)
            log.warning("pipeline=%s stage=load table=%s batch=%s position=%s: %d invalid date value(s) "
                        "written as NULL to the %s target (invalid_dates: null; %d since start)",
                        self.pipeline, table, batch.id, batch.end, count, self.target, self._counts[table])
        return batch.replace(tuple(changes))

    def _clean(self, batch: Batch, change: RowChange, image: Mapping[str, Any] | None,
               found: dict[str, int]) -> Mapping[str, Any] | None:
        if image is None or InvalidDate not in map(type, image.values()):  # the common case, at C speed
            return image
        bad = [column for column, value in image.items() if isinstance(value, InvalidDate)]
        if not bad:
            return image
        for column in bad:
            if self.policy == "refuse" or column in change.primary_key:
                why = ("a primary-key column" if column in change.primary_key and self.policy == "null"
                       else "invalid_dates is refuse; set it to null to write NULL instead")
                raise RefusedLoadError(
                    f"column {column} holds {image[column].text!r}, a date the {self.target} target "
                    f"cannot store ({why})",
                    pipeline=self.pipeline or batch.pipeline, stage="load", table=change.qualified_table,
                    batch=batch.id, position=change.position or batch.end)
        table = change.qualified_table
        found[table] = found.get(table, 0) + len(bad)
        return partial_like(image, {column: None if isinstance(value, InvalidDate) else value
                                    for column, value in image.items()})


__all__ = ["POLICIES", "InvalidDatePolicy"]
