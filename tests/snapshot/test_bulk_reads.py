"""`setl.reads` builds exactly the snapshot reads the `RowChange` constructor builds, compiled or not."""

from __future__ import annotations

import attrs
import pytest

from setl import reads
from setl.model import Op, Position, RowChange, TableName

ROWS = [{"id": 1, "c": "a"}, {"id": 2, "c": None}, {"id": 3, "c": "\u00e9"}]
AT = Position("mysql-bin.000001", 120, gtid="0-1-5")


def fields(change: RowChange) -> tuple[object, ...]:
    """Every field, those left out of equality included."""
    return tuple(getattr(change, f.name) for f in attrs.fields(RowChange))


def test_the_compiled_constructors_are_built_and_used():
    assert reads.COMPILED
    from setl import _reads
    assert _reads.DIRECT  # every field a plain object slot: written at its offset


def test_slots_written_in_c_hold_their_own_references():
    """Each value a compiled read stores is referenced once more while the read lives, once less
    after, and seen by the garbage collector: what the descriptor's own store does."""
    import gc
    import sys

    image, where, source = {"id": 7}, Position("mysql-bin.000002", 4), TableName("s", "t")
    counts = [sys.getrefcount(v) for v in (image, where, source)]
    made = reads.mapped_reads("s", "t", ("id",), reads.new_reads("s", "t", ("id",), [image] * 500, where), source)
    assert [sys.getrefcount(v) for v in (image, where, source)] == [c + 500 for c in counts]
    assert all(image in gc.get_referents(c) and where in gc.get_referents(c) for c in made[:3])
    assert made[0].before is None and made[0].sequence is None and made[0].source is source
    del made
    gc.collect()
    assert [sys.getrefcount(v) for v in (image, where, source)] == counts


@pytest.mark.parametrize("compiled", [True, False])
def test_new_reads_are_the_constructors(monkeypatch, compiled):
    monkeypatch.setattr(reads, "COMPILED", compiled)
    made = reads.new_reads("s", "t", ("id",), ROWS, AT)
    expected = [RowChange(Op.READ, "s", "t", ("id",), None, row, AT) for row in ROWS]
    assert [fields(c) for c in made] == [fields(c) for c in expected]
    assert made == expected
    assert all(type(c) is RowChange for c in made)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made[0].op = Op.DELETE  # type: ignore[misc]


@pytest.mark.parametrize("compiled", [True, False])
def test_mapped_reads_keep_each_reads_image_position_and_time(monkeypatch, compiled):
    monkeypatch.setattr(reads, "COMPILED", compiled)
    source = [RowChange(Op.READ, "s", "t", ("id",), None, row, Position("b.1", 4 + i), commit_time=10.0 + i)
              for i, row in enumerate(ROWS)]
    made = reads.mapped_reads("s2", "t2", ("id",), source, TableName("s", "t"))
    expected = [RowChange(Op.READ, "s2", "t2", ("id",), None, r.after, r.position, r.commit_time, TableName("s", "t"))
                for r in source]
    assert [fields(c) for c in made] == [fields(c) for c in expected]
    assert made[1].after is ROWS[1] and made[2].commit_time == 12.0


def test_a_changed_row_change_falls_back_to_the_constructor(monkeypatch):
    """A field the compiled code does not know turns it off, rather than building half a change."""
    monkeypatch.setattr(reads, "FIELDS", (*reads.FIELDS, "extra"))
    assert not reads._plain_fields()


@pytest.mark.parametrize("compiled", [True, False])
def test_reads_made_with_their_source_pass_a_route_that_changes_nothing_as_they_are(monkeypatch, compiled):
    """A snapshot read made with its source table (`new_reads(..., source)`) is already what a route
    that keeps its schema, table and key makes of it: compiled, the same object comes back; any
    difference (another table, key or source, a sequence's row) makes a new read. Equal either way."""
    monkeypatch.setattr(reads, "COMPILED", compiled)
    source = TableName("s", "t")
    made = reads.new_reads("s", "t", ("id",), ROWS, AT, source)
    assert all(c.source is source and c.commit_time is None for c in made)
    same = reads.mapped_reads("s", "t", ("id",), made, TableName("s", "t"))  # an equal, other object
    assert same == made and [fields(c) for c in same] == [fields(c) for c in made]
    assert all(a is b for a, b in zip(same, made)) is compiled
    sequence = attrs.evolve(made[0], sequence="CREATE SEQUENCE s.t")
    other = TableName("s", "u")
    for schema, table, key, to, given in (("s", "t2", ("id",), source, made), ("s2", "t", ("id",), source, made),
                                          ("s", "t", ("c",), source, made), ("s", "t", ("id",), other, made),
                                          ("s", "t", ("id",), source, [sequence])):
        mapped = reads.mapped_reads(schema, table, key, given, to)
        assert not any(a is b for a, b in zip(mapped, given))
        assert [fields(c) for c in mapped] == [
            (Op.READ, schema, table, key, None, c.after, c.position, c.commit_time, to, None) for c in given]


def test_a_run_of_reads_ends_where_a_change_is_not_a_read_of_the_same_table_and_key():
    """`read_run_end` (compiled and not) ends a chunk's run at the first change that is no read, or
    a read of another schema, table or key; equal names and keys in other objects continue it."""
    from setl.model import DdlChange

    def read(schema: str = "s", table: str = "t", key: tuple[str, ...] = ("id",), op: Op = Op.READ) -> RowChange:
        return RowChange(op, schema, table, key, None if op is not Op.DELETE else {"id": 1},
                         None if op is Op.DELETE else {"id": 1}, AT)

    same = read("".join(["s"]), "".join(["t"]), tuple(["id"]))  # equal, not identical
    changes = (read(), read(), same, read(), read(table="u"), read(table="u"), read(key=("c",)),
               read(schema="s2"), read(op=Op.INSERT), DdlChange("s", "t", "TRUNCATE TABLE t", AT), read())
    expected = {0: 4, 1: 4, 3: 4, 4: 6, 6: 7, 7: 8, 10: 11}
    for compiled in (True, False):
        found = {start: (reads.read_run_end(changes, start) if compiled else reads._read_run_end(changes, start))
                 for start in expected}
        assert found == expected, compiled
    assert reads.read_run_end(list(changes), 0) == 4  # any sequence
