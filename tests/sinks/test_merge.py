"""`merge` against a plain reading of its contract: the last image per (table, key), in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from setl.model import DdlChange, Op, RowChange
from setl.sinks.merge import TableChanges, _reads_of_one_table, merge

TABLES = {("a", "one"): ("id",), ("a", "two"): ("k1", "k2"), ("b", "loose"): ()}


def reference(changes: Sequence[RowChange]) -> list[TableChanges]:
    """The contract spelled out with `RowChange.key`/`old_key`, as merge was first written."""
    state: dict[tuple[str, str], dict[tuple[Any, ...], tuple[Op, Mapping[str, Any]]]] = {}
    unkeyed: dict[tuple[str, str], list[RowChange]] = {}
    keys: dict[tuple[str, str], tuple[str, ...]] = {}
    for change in changes:
        ident = (change.schema, change.table)
        keys.setdefault(ident, change.primary_key)
        if not change.primary_key:
            unkeyed.setdefault(ident, []).append(change)
            continue
        table = state.setdefault(ident, {})
        if change.op in (Op.INSERT, Op.READ):
            table[change.key] = (Op.INSERT, change.after)  # type: ignore[assignment]
        elif change.op is Op.DELETE:
            table[change.key] = (Op.DELETE, change.before)  # type: ignore[assignment]
        else:
            if change.old_key != change.key:
                table[change.old_key] = (Op.DELETE, change.before)  # type: ignore[index,assignment]
            table[change.key] = (Op.INSERT, change.after)  # type: ignore[assignment]
    result = []
    for ident, key in keys.items():
        if ident in unkeyed:
            result.append(TableChanges(*ident, (), sequence=tuple(unkeyed[ident])))
            continue
        images = state[ident].values()
        result.append(TableChanges(*ident, key, tuple(i for op, i in images if op is Op.DELETE),
                                   tuple(i for op, i in images if op is Op.INSERT)))
    return result


@st.composite
def change_lists(draw: st.DrawFn) -> list[RowChange]:
    changes = []
    for _ in range(draw(st.integers(0, 40))):
        schema, table = draw(st.sampled_from(sorted(TABLES)))
        key = TABLES[(schema, table)]
        op = draw(st.sampled_from([Op.INSERT, Op.READ, Op.UPDATE, Op.DELETE]))

        def image(key: tuple[str, ...] = key) -> dict[str, Any]:
            row = {"id": draw(st.integers(0, 4)), "k1": draw(st.integers(0, 2)), "k2": draw(st.sampled_from("xy")),
                   "v": draw(st.integers(0, 9))}
            return row if key != ("k1", "k2") else {c: row[c] for c in ("k1", "k2", "v")}

        before = image() if op in (Op.UPDATE, Op.DELETE) else None
        after = image() if op is not Op.DELETE else None
        changes.append(RowChange(op, schema, table, key, before, after))
    return changes


@settings(max_examples=300, deadline=None)
@given(change_lists())
def test_merge_matches_the_reference(changes):
    """Random inserts, reads, key-changing updates and deletes over one-column, two-column and keyless
    tables merge to exactly what the reference gives, images, order and all."""
    assert merge(changes) == reference(changes)


def test_ddl_is_refused():
    """A DDL change in merge's input is a TypeError."""
    with pytest.raises(TypeError):
        merge([DdlChange("a", "one", "DROP TABLE one")])


@st.composite
def read_lists(draw: st.DrawFn) -> list[RowChange]:
    """Snapshot reads as a chunk hands them on: mostly one keyed table with each key once, sometimes
    a key read twice, a second table or a keyless one (what the chunk shortcut must leave to merge)."""
    tables = draw(st.lists(st.sampled_from(sorted(TABLES)), min_size=1, max_size=2, unique=True))
    ids = draw(st.lists(st.integers(0, 30), max_size=30, unique=not draw(st.integers(0, 3)) == 0))
    changes = []
    for n, key_value in enumerate(ids):
        schema, table = tables[n % len(tables)] if draw(st.integers(0, 4)) == 0 else tables[0]
        key = TABLES[(schema, table)]
        row = {"id": key_value, "k1": key_value // 2, "k2": "xy"[key_value % 2], "v": n}
        after = row if key != ("k1", "k2") else {c: row[c] for c in ("k1", "k2", "v")}
        changes.append(RowChange(Op.READ, schema, table, key, None, after))
    return changes


@settings(max_examples=300, deadline=None)
@given(read_lists())
def test_a_chunk_of_reads_merges_as_the_reference_does(changes):
    """A chunk of reads (one keyed table, each key once) takes merge's shortcut; reads of a key twice,
    of two tables or of a keyless table do not: all merge exactly as the reference, as list or tuple."""
    assert merge(changes) == reference(changes)
    assert merge(tuple(changes)) == reference(changes)
    one_table = len({(c.schema, c.table) for c in changes}) == 1 and changes[0].primary_key
    chunk = one_table and len({c.key for c in changes}) == len(changes)
    assert (_reads_of_one_table(changes) is not None) == bool(chunk)
