"""Collapse a batch's row changes to the last state of each (table, primary key).

Applying the result (deletes first, then upserts of full after-images, then the
patches of rows known only in part) leaves a target as applying every change in
order would, and applying it twice changes nothing more: this is what makes loads
idempotent.

A partial image (`setl.model.PartialImage`: a session with ``binlog_row_image``
NOBLOB or MINIMAL) is merged column by column: onto a whole image of the batch
it gives a whole image (an upsert); without one it stays a patch, "set these
columns of the row with this key", the union of the key's partial updates (a
later one wins). What cannot be applied exactly that way is refused with a
`RefusedLoadError` naming the table, the change's position, the cause and the fix:
a table without a key, an image without the whole key, an insert lacking columns
(the source's defaults are not in the binlog) and a partial change of a key whose
whole row the batch does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from setl.errors import RefusedLoadError
from setl.model import Change, DdlChange, Op, PartialImage, RowChange, partial_image_refusal


@attrs.frozen
class TableChanges:
    """The net effect of a batch on one target table.

    For a table with a primary key, `deletes` holds before-images of keys to
    remove and `upserts` the last after-image of every other touched key; both
    in first-touch order. A snapshot read (`Op.READ`) counts as an upsert of its
    after-image: it replaces what an earlier change of the batch left under its
    key, and a later delete removes it. `patches` holds, for keys the batch only updated in part
    (partial images), the key's columns and the columns those updates set: a target applies each
    as ``UPDATE ... SET <its other columns> WHERE <key>``, never an insert. A table without a key
    cannot be merged safely, so `sequence` keeps its changes as they came, and replays may
    duplicate rows.
    """

    schema: str
    table: str
    primary_key: tuple[str, ...]
    deletes: tuple[Mapping[str, Any], ...] = ()
    upserts: tuple[Mapping[str, Any], ...] = ()
    sequence: tuple[RowChange, ...] = ()
    patches: tuple[Mapping[str, Any], ...] = ()

    @property
    def rows(self) -> int:
        return len(self.deletes) + len(self.upserts) + len(self.sequence) + len(self.patches)


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
    partial = PartialImage
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
            if change.partial:
                _refuse(change, "the table has no primary key, so the row cannot be found without its whole image")
            unkeyed.setdefault(ident, []).append(change)
            continue
        state = keyed.get(ident)
        if state is None:
            state = keyed[ident] = {}
        op = change.op
        if op is insert or op is read:
            # A snapshot read is "insert, or replace the row with the same key": an upsert.
            after: Any = change.after
            if type(after) is partial:
                _merge_partial(state, change)
                continue
            state[(after[pk[0]],) if len(pk) == 1 else tuple([after[c] for c in pk])] = (True, after)
        elif op is delete:
            before: Any = change.before
            if type(before) is partial:
                _key_of(change, before)  # a delete needs its key only
            state[(before[pk[0]],) if len(pk) == 1 else tuple([before[c] for c in pk])] = (False, before)
        else:
            before, after = change.before, change.after
            if type(before) is partial or type(after) is partial:
                _merge_partial(state, change)
                continue
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
        patches: list[Mapping[str, Any]] = []
        for entry in keyed[ident].values():
            kind = entry[0]
            if kind is True:
                upserts.append(entry[1])
            elif kind is False:
                deletes.append(entry[1])
            elif kind == _PATCH:
                patches.append(entry[1])
            else:
                _refuse(entry[2], "the insert's image lacks the columns the session did not log, whose values "
                        "(the source's defaults) the binlog does not hold")
        result.append(TableChanges(schema, table, primary_key, tuple(deletes), tuple(upserts), (), tuple(patches)))
    return result


#: Kinds of a key's merged state besides True (a whole image to upsert) and False (a delete):
#: a patch of a row the target holds, and an insert that lacks columns (refused at the end, unless
#: a whole image replaces it first). Their entries are (kind, image, the last change merged).
_PATCH = 2
_PARTIAL_INSERT = 3


def _refuse(change: RowChange, cause: str) -> None:
    raise RefusedLoadError(partial_image_refusal(f"a partial {change.op.value}", str(change.source or
                                                                                     change.qualified_table), cause),
                           table=change.qualified_table, position=change.position)


def _key_of(change: RowChange, image: Mapping[str, Any]) -> tuple[Any, ...]:
    """The key values of `image`, refusing an image that lacks one of them."""
    pk = change.primary_key
    missing = [c for c in pk if c not in image]
    if missing:
        _refuse(change, f"its image lacks key column(s) {', '.join(missing)}")
    return tuple([image[c] for c in pk])


def _merge_partial(state: dict[tuple[Any, ...], Any], change: RowChange) -> None:
    """Merge a change with a partial image (`merge`'s rules in the module docstring) into `state`."""
    before, after = change.before, change.after
    pk = change.primary_key
    assert after is not None
    if before is None:  # an insert (or read) lacking columns: whole only if a later change makes it so
        state[_key_of(change, after)] = (_PARTIAL_INSERT, dict(after), change)
        return
    old = _key_of(change, before)
    new = tuple([after[c] if c in after else value for c, value in zip(pk, old)])
    if type(after) is not PartialImage:  # a whole after-image (a partial before-image): as a whole update
        if old != new:
            state[old] = (False, before)
        state[new] = (True, after)
        return
    prev = state.get(old)
    if prev is not None and prev[0] is True:
        kind: Any = True
        merged = {**prev[1], **after}
    elif prev is not None and prev[0] is not False:  # a patch, or an insert lacking columns
        kind, merged = prev[0], {**prev[1], **after}
    else:
        kind, merged = _PATCH, {**dict(zip(pk, new)), **after}
    if old != new:
        if kind == _PATCH:
            _refuse(change, "it changes the row's key, and the batch does not hold the row's whole image")
        state[old] = (False, before)
    for column, value in zip(pk, new):
        merged[column] = value
    state[new] = (True, merged) if kind is True else (kind, merged, change)
