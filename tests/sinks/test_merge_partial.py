"""`merge` of partial row images (binlog_row_image NOBLOB/MINIMAL): exact column by column, or refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from setl.errors import RefusedLoadError
from setl.model import Batch, Op, PartialImage, Position, RowChange
from setl.sinks.merge import TableChanges, merge
from setl.sinks.parquet import ParquetLoad

AT = Position("mysql-bin.000001", 400)
KEY = ("id",)
COLUMNS = ("id", "a", "b", "t")


def change(op: Op, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None,
           key: tuple[str, ...] = KEY) -> RowChange:
    return RowChange(op, "s", "t", key, before, after, AT)


def part(**values: Any) -> PartialImage:
    return PartialImage(values)


def apply(rows: dict[Any, dict[str, Any]], tables: Sequence[TableChanges]) -> None:
    """What an SQL target does with merged changes: deletes, upserts, then patches of rows it holds."""
    for table in tables:
        for image in table.deletes:
            rows.pop(image["id"], None)
        for image in table.upserts:
            rows[image["id"]] = dict(image)
        for image in table.patches:
            if image["id"] in rows:
                rows[image["id"]].update(image)


def replay(rows: dict[Any, dict[str, Any]], changes: Sequence[RowChange]) -> None:
    """The source's own effect of `changes`, one by one: a partial image sets the columns it holds."""
    for c in changes:
        if c.op is Op.DELETE:
            assert c.before is not None
            rows.pop(c.before["id"])
        elif c.op is Op.INSERT:
            assert c.after is not None
            rows[c.after["id"]] = dict(c.after)
        else:
            assert c.before is not None and c.after is not None
            row = rows.pop(c.before["id"])
            row.update(c.after)
            rows[row["id"]] = row


def test_partial_update_without_the_row_is_a_patch_of_its_columns() -> None:
    """A MINIMAL update (before: key only; after: the set column) merges to a patch with the key."""
    tables = merge([change(Op.UPDATE, part(id=1), part(a=9))])
    assert tables[0].patches == ({"id": 1, "a": 9},) and tables[0].upserts == () and tables[0].deletes == ()


def test_two_partial_updates_of_one_row_union_later_wins() -> None:
    """Two partial updates of one key give one patch holding both columns, the later value winning."""
    tables = merge([change(Op.UPDATE, part(id=1), part(a=1, b=2)), change(Op.UPDATE, part(id=1), part(b=3, t="x"))])
    assert tables[0].patches == ({"id": 1, "a": 1, "b": 3, "t": "x"},)


def test_snapshot_read_then_partial_update_is_a_whole_upsert() -> None:
    """A snapshot read followed by a NOBLOB update of the row merges to its whole, updated image."""
    read = change(Op.READ, None, {"id": 1, "a": 0, "b": 0, "t": "long"})
    update = change(Op.UPDATE, part(id=1, a=0, b=0), part(id=1, a=5, b=0))
    tables = merge([read, update])
    assert tables[0].upserts == ({"id": 1, "a": 5, "b": 0, "t": "long"},) and tables[0].patches == ()


def test_whole_update_after_partial_one_is_whole() -> None:
    """A full-image update after a partial one of the same key leaves the full image only."""
    full = {"id": 1, "a": 2, "b": 2, "t": "y"}
    tables = merge([change(Op.UPDATE, part(id=1), part(a=1)), change(Op.UPDATE, dict(full), dict(full))])
    assert tables[0].upserts == (full,) and tables[0].patches == ()


def test_delete_after_partial_update_deletes() -> None:
    """A MINIMAL delete (key only) after a partial update of the key leaves a delete of that key."""
    tables = merge([change(Op.UPDATE, part(id=1), part(a=1)), change(Op.DELETE, part(id=1), None)])
    assert tables[0].deletes == ({"id": 1},) and tables[0].patches == () and tables[0].upserts == ()


def test_partial_key_change_of_a_whole_row_moves_it() -> None:
    """A MINIMAL key change of a row inserted in the batch gives a whole upsert under the new key."""
    tables = merge([change(Op.INSERT, None, {"id": 1, "a": 1, "b": 1, "t": "z"}),
                    change(Op.UPDATE, part(id=1), part(id=10))])
    assert tables[0].upserts == ({"id": 10, "a": 1, "b": 1, "t": "z"},) and tables[0].deletes == ({"id": 1},)


@pytest.mark.parametrize(("changes", "cause"), [
    ([change(Op.UPDATE, part(id=1), part(id=10))], "changes the row's key"),
    ([change(Op.INSERT, None, part(id=1, a=1))], "the insert's image lacks the columns"),
    ([change(Op.UPDATE, part(a=1), part(a=2))], "lacks key column(s) id"),
    ([change(Op.DELETE, part(a=1), None)], "lacks key column(s) id"),
    ([change(Op.UPDATE, part(a=1), part(a=2), key=())], "has no primary key"),
], ids=["key-change", "insert", "update-without-key", "delete-without-key", "keyless"])
def test_inexact_partial_changes_are_refused_in_one_line(changes: list[RowChange], cause: str) -> None:
    """What a partial image cannot apply exactly is refused, non-retryable, naming table, position, cause and fix."""
    with pytest.raises(RefusedLoadError) as caught:
        merge(changes)
    text = str(caught.value)
    assert "\n" not in text and not caught.value.retryable
    assert cause in text and "table=s.t" in text and f"position={AT}" in text
    assert "binlog_row_image=NOBLOB or MINIMAL" in text and "SET GLOBAL binlog_row_image=FULL" in text
    assert "--table s.t" in text and "a partial " in text
    assert "setl snapshot" in text


def test_partial_insert_made_whole_by_a_later_full_update_is_applied() -> None:
    """An insert lacking columns that a later full-image update of the batch replaces is exact: an upsert."""
    full = {"id": 1, "a": 2, "b": 2, "t": "y"}
    tables = merge([change(Op.INSERT, None, part(id=1, a=1)), change(Op.UPDATE, part(id=1, a=1), dict(full))])
    assert tables[0].upserts == (full,)


_values = st.integers(0, 3)


@st.composite
def histories(draw: st.DrawFn) -> tuple[dict[Any, dict[str, Any]], list[RowChange]]:
    """A target's rows and a valid log of changes to them: whole inserts and deletes (partial ones
    holding the key only), updates with whole or partial images, key changes only with whole images."""
    count = draw(st.integers(0, 4))
    rows = {k: {"id": k, "a": draw(_values), "b": draw(_values), "t": draw(_values)} for k in range(count)}
    source = {k: dict(v) for k, v in rows.items()}
    changes: list[RowChange] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["insert", "delete", "update", "partial", "move"]))
        free = [k for k in range(8) if k not in source]
        if kind == "insert" or not source:
            if not free:
                continue
            new = {"id": draw(st.sampled_from(free)), "a": draw(_values), "b": draw(_values), "t": draw(_values)}
            changes.append(change(Op.INSERT, None, dict(new)))
            source[new["id"]] = new
            continue
        k = draw(st.sampled_from(sorted(source)))
        row = source[k]
        if kind == "delete":
            minimal = draw(st.booleans())
            changes.append(change(Op.DELETE, part(id=k) if minimal else dict(row), None))
            del source[k]
        elif kind == "move" and free:
            moved = {**row, "id": draw(st.sampled_from(free)), "a": draw(_values)}
            changes.append(change(Op.UPDATE, dict(row), dict(moved)))
            del source[k]
            source[moved["id"]] = moved
        elif kind == "partial":
            columns = draw(st.lists(st.sampled_from(COLUMNS[1:]), min_size=1, unique=True))
            after = {c: draw(_values) for c in columns}
            before = part(id=k) if draw(st.booleans()) else part(id=k, **{c: row[c] for c in ("a", "b")})
            changes.append(change(Op.UPDATE, before, part(**after)))
            row.update(after)
        else:
            new_row = {**row, "a": draw(_values), "t": draw(_values)}
            changes.append(change(Op.UPDATE, dict(row), dict(new_row)))
            source[k] = new_row
    return rows, changes


@settings(max_examples=300, deadline=None)
@given(histories())
def test_merged_partial_changes_leave_the_target_as_the_source(history: tuple[dict[Any, dict[str, Any]],
                                                                               list[RowChange]]) -> None:
    """Applying the merge of any valid mix of whole and partial changes leaves what applying them one by one does."""
    rows, changes = history
    expected = {k: dict(v) for k, v in rows.items()}
    replay(expected, changes)
    got = {k: dict(v) for k, v in rows.items()}
    apply(got, merge(changes))
    assert got == expected


def test_parquet_target_refuses_a_partial_change_before_writing(tmp_path) -> None:
    """The Parquet change log holds whole images: a partial update pauses the pipeline, no file written."""
    load = ParquetLoad(tmp_path / "out", pipeline="pq")
    whole = change(Op.INSERT, None, {"id": 2, "a": 1, "b": 1, "t": "x"})
    batch = Batch("pq", 1, 1, Position("mysql-bin.000001", 4), AT, (whole, change(Op.UPDATE, part(id=1), part(a=1))))
    try:
        with pytest.raises(RefusedLoadError) as caught:
            load.load(batch)
    finally:
        load.close()
    text = str(caught.value)
    assert "\n" not in text and "pipeline=pq stage=load table=s.t" in text and f"position={AT}" in text
    assert "Parquet change log holds whole row images" in text and "SET GLOBAL binlog_row_image=FULL" in text
    assert not list((tmp_path / "out").rglob("*.parquet"))
