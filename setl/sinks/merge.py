"""Collapse a batch's row changes to the last state of each (table, primary key).

Applying the result (deletes first, then upserts of full after-images) leaves a
target as applying every change in order would, and applying it twice changes
nothing more: this is what makes loads idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from setl.model import Change, DdlChange, Op, RowChange


@attrs.frozen
class TableChanges:
    """The net effect of a batch on one target table.

    For a table with a primary key, `deletes` holds before-images of keys to
    remove and `upserts` the last after-image of every other touched key; both
    in first-touch order. A table without a key cannot be merged safely, so
    `sequence` keeps its changes as they came, and replays may duplicate rows.
    """

    schema: str
    table: str
    primary_key: tuple[str, ...]
    deletes: tuple[Mapping[str, Any], ...] = ()
    upserts: tuple[Mapping[str, Any], ...] = ()
    sequence: tuple[RowChange, ...] = ()

    @property
    def rows(self) -> int:
        return len(self.deletes) + len(self.upserts) + len(self.sequence)


def merge(changes: Iterable[Change]) -> list[TableChanges]:
    """Net row changes per table, tables in first-touch order. DDL changes are refused."""
    keyed: dict[tuple[str, str], dict[tuple[Any, ...], tuple[Op, Mapping[str, Any]]]] = {}
    keys: dict[tuple[str, str], tuple[str, ...]] = {}
    unkeyed: dict[tuple[str, str], list[RowChange]] = {}
    order: list[tuple[str, str]] = []
    for change in changes:
        if isinstance(change, DdlChange):
            raise TypeError("merge() takes row changes only; a DDL is its own batch")
        ident = (change.schema, change.table)
        if ident not in keys:
            keys[ident] = change.primary_key
            order.append(ident)
        if not change.primary_key:
            if change.op is Op.READ:  # TEMPORARY (h-snap): a snapshot row of a keyless table is an insert
                change = attrs.evolve(change, op=Op.INSERT)
            unkeyed.setdefault(ident, []).append(change)
            continue
        state = keyed.setdefault(ident, {})
        if change.op is Op.INSERT:
            state[change.key] = (Op.INSERT, change.after)  # type: ignore[assignment]
        elif change.op is Op.DELETE:
            state[change.key] = (Op.DELETE, change.before)  # type: ignore[assignment]
        else:
            old = change.old_key
            if old is not None and old != change.key:
                state[old] = (Op.DELETE, change.before)  # type: ignore[assignment]
            state[change.key] = (Op.INSERT, change.after)  # type: ignore[assignment]
    result = []
    for ident in order:
        schema, table = ident
        if ident in unkeyed:
            result.append(TableChanges(schema, table, (), sequence=tuple(unkeyed[ident])))
            continue
        state = keyed[ident]
        deletes = tuple(image for op, image in state.values() if op is Op.DELETE)
        upserts = tuple(image for op, image in state.values() if op is Op.INSERT)
        result.append(TableChanges(schema, table, keys[ident], deletes, upserts))
    return result
