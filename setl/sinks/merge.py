"""Collapse a batch's row changes to the last state of each (table, primary key).

Applying the result (deletes first, then upserts of full after-images) leaves a
target as applying every change in order would, and applying it twice changes
nothing more: this is what makes loads idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from setl.model import Change, DdlChange, Op, RowChange


@attrs.frozen
class TableChanges:
    """The net effect of a batch on one target table.

    For a table with a primary key, `deletes` holds before-images of keys to
    remove and `upserts` the last after-image of every other touched key; both
    in first-touch order. A snapshot read (`Op.READ`) counts as an upsert of its
    after-image: it replaces what an earlier change of the batch left under its
    key, and a later delete removes it. A table without a key cannot be merged safely, so
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


def _reads_of_one_table(changes: Sequence[Change]) -> list[TableChanges] | None:
    """`merge` of a snapshot chunk: snapshot reads of one keyed table, each key once, merge to
    their after-images as they are, in order; None for anything else (`merge` then does it)."""
    if not changes:
        return None
    first = changes[0]
    if type(first) is not RowChange or not first.primary_key:
        return None
    read = Op.READ
    schema, table, pk = first.schema, first.table, first.primary_key
    afters: list[Any] = []  # a read's after-image: never None
    add = afters.append
    for change in changes:
        if type(change) is not RowChange or change.op is not read or change.table != table or change.schema != schema:
            return None
        add(change.after)
    if len(pk) == 1:
        column = pk[0]
        keys = len({after[column] for after in afters})
    else:
        keys = len({tuple([after[c] for c in pk]) for after in afters})
    if keys != len(afters):
        return None
    return [TableChanges(schema, table, pk, (), tuple(afters))]


def merge(changes: Iterable[Change]) -> list[TableChanges]:
    """Net row changes per table, tables in first-touch order. DDL changes are refused."""
    if isinstance(changes, (list, tuple)):
        chunk = _reads_of_one_table(changes)
        if chunk is not None:
            return chunk
    # The hot loop of every load: per table, key -> (is_upsert, image). Keys are computed here
    # rather than through `RowChange.key`/`old_key`, without a generator for a one-column key.
    keyed: dict[tuple[str, str], dict[tuple[Any, ...], tuple[bool, Mapping[str, Any]]]] = {}
    keys: dict[tuple[str, str], tuple[str, ...]] = {}
    unkeyed: dict[tuple[str, str], list[RowChange]] = {}
    insert, read, delete = Op.INSERT, Op.READ, Op.DELETE
    ident = ("", "")
    first = True
    for change in changes:
        if isinstance(change, DdlChange):
            raise TypeError("merge() takes row changes only; a DDL is its own batch")
        if first or change.table != ident[1] or change.schema != ident[0]:
            first = False
            ident = (change.schema, change.table)
            if ident not in keys:
                keys[ident] = change.primary_key
        pk = change.primary_key
        if not pk:
            unkeyed.setdefault(ident, []).append(change)
            continue
        state = keyed.get(ident)
        if state is None:
            state = keyed[ident] = {}
        op = change.op
        if op is insert or op is read:
            # A snapshot read is "insert, or replace the row with the same key": an upsert.
            after: Any = change.after
            state[(after[pk[0]],) if len(pk) == 1 else tuple([after[c] for c in pk])] = (True, after)
        elif op is delete:
            before: Any = change.before
            state[(before[pk[0]],) if len(pk) == 1 else tuple([before[c] for c in pk])] = (False, before)
        else:
            before, after = change.before, change.after
            if before is None or after is None:  # not an update's two images: the general rule
                old = change.old_key
                if old is not None and old != change.key:
                    state[old] = (False, before)
                state[change.key] = (True, after)
                continue
            if len(pk) == 1:
                new, old = (after[pk[0]],), (before[pk[0]],)
            else:
                new, old = tuple([after[c] for c in pk]), tuple([before[c] for c in pk])
            if old != new:
                state[old] = (False, before)
            state[new] = (True, after)
    result = []
    for ident, primary_key in keys.items():
        schema, table = ident
        if ident in unkeyed:
            result.append(TableChanges(schema, table, (), sequence=tuple(unkeyed[ident])))
            continue
        deletes: list[Mapping[str, Any]] = []
        upserts: list[Mapping[str, Any]] = []
        for upsert, image in keyed[ident].values():
            (upserts if upsert else deletes).append(image)
        result.append(TableChanges(schema, table, primary_key, tuple(deletes), tuple(upserts)))
    return result
