"""What a per-table part of an SQL target skips on a replay (`setl.sinks.sql_load_path.not_yet_applied`),
without a server: the target's recorded positions decide."""

from __future__ import annotations

import attrs

from setl.model import Op, Position, RowChange
from setl.sinks.sql_load_path import not_yet_applied
from tests.sinks.contract import Changes, at, span

ITEMS = Changes("s", "items")
LOOSE = Changes("s", "loose", key=())
NAMES = {("s", "items"): "s.items", ("s", "loose"): "s.loose"}


def _pos(offset: int) -> Position:
    return Position("mysql-bin.000001", offset)


def test_changes_between_the_pipeline_and_the_table_position_are_skipped():
    """A change after the pipeline's recorded position and at or before its table's is in already;
    the ones after the table's position are kept, in order."""
    changes = [at(ITEMS.insert(id=i), 100 + 10 * i) for i in range(1, 5)]  # at 110, 120, 130, 140
    kept = not_yet_applied(span(changes, 100, 150), NAMES, {"s.items": (_pos(100), _pos(120))})
    assert kept == changes[2:]


def test_changes_at_or_before_the_pipeline_position_are_kept():
    """What the pipeline's recorded position covers was replayed on purpose (an operator's reset,
    a rewind): only changes after it are candidates for skipping."""
    changes = [at(ITEMS.insert(id=i), 100 + 10 * i) for i in range(1, 4)]  # at 110, 120, 130
    kept = not_yet_applied(span(changes, 100, 140), NAMES, {"s.items": (_pos(120), _pos(130))})
    assert kept == changes[:2]


def test_snapshot_reads_and_unchecked_tables_are_never_skipped():
    """A READ is the table's state at its place in the stream, and a table left out of `tables`
    (one whose position lies before the batch) keeps every change, keyless tables included."""
    read = attrs.evolve(at(ITEMS.insert(id=1), 110), op=Op.READ, before=None)
    insert = at(ITEMS.insert(id=2), 120)
    loose = at(LOOSE.insert(name="a", qty=1), 115)
    kept = not_yet_applied(span([read, loose, insert], 100, 130), NAMES, {"s.items": (None, _pos(130))})
    assert kept == [read, loose]
    assert isinstance(kept[0], RowChange) and kept[0].op is Op.READ
