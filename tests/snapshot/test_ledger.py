"""Snapshot progress commits only what acked batches hold, in key order, so a resume skips nothing."""

from __future__ import annotations

import attrs
import pytest

from setl import ddl
from setl.model import Batch, DdlChange, Op, Position, RowChange, TableName
from setl.snapshot import CopyStatus, TableProgress
from setl.snapshot.ledger import Chunk, ProgressLedger, Record
from setl.snapshot.restarts import removed_and_renamed

T = TableName("s", "t")
AT = Position("mysql-bin.000001", 100)


def chunk(index: int, upper: int | None, rows: int = 2) -> tuple[Chunk, RowChange | None]:
    images = tuple({"id": index * 10 + n} for n in range(rows))
    changes = [RowChange(Op.READ, "s", "t", ("id",), None, image, position=AT) for image in images]
    return (Chunk(T, 1, index, images, AT, (index * 10,) if index else None, (upper,) if upper else None,
                  upper is None), changes[-1] if changes else None)


def batch(batch_id: int, *changes: object) -> Batch:
    return Batch("p", batch_id, 1, AT, AT, tuple(c for c in changes if c is not None))  # type: ignore[misc]


def commit(ledger: ProgressLedger, acked: Batch) -> list[TableProgress]:
    """The ack of `acked` wrote what `prepare` said: the ledger applies it."""
    return ledger.apply(ledger.prepare(acked))


def test_chunks_acked_out_of_key_order_commit_as_a_run_from_the_start():
    """Chunk 1's batch acked before chunk 0's: nothing moves until chunk 0 is in, then both do."""
    ledger = ProgressLedger()
    ledger.reset({T: TableProgress("s", "t", CopyStatus.PENDING)})
    truncate = DdlChange("s", "t", "TRUNCATE TABLE `s`.`t`", snapshot=True)
    ledger.remember(Record(T, "truncate", truncate, estimate=50))
    (c1, last1), (c0, last0), (c2, _) = chunk(1, 20), chunk(0, 10), chunk(2, None, rows=0)
    for c, last in ((c1, last1), (c0, last0), (c2, None)):
        ledger.remember(Record(T, "chunk", last, chunk=c))
    for batch_id, changes in ((1, [truncate]), (2, [last1]), (3, [last0])):
        ledger.handed_on(batch(batch_id, *changes))
    (after_truncate,) = commit(ledger, batch(1))
    assert (after_truncate.status, after_truncate.estimate, after_truncate.rows) == (CopyStatus.COPYING, 50, 0)
    assert commit(ledger, batch(2)) == []  # chunk 1 waits for chunk 0
    (done,) = commit(ledger, batch(3))  # chunk 0, then 1, then the empty final chunk 2
    assert (done.status, done.last_key, done.rows, done.chunks) == (CopyStatus.DONE, (20,), 4, 3)


def test_a_commit_is_applied_only_after_its_write_and_a_stale_one_is_ignored():
    """`prepare` changes nothing (the ack's write may fail, and the same ack is prepared again);
    `apply` makes it the committed state; a commit prepared before a rewind or an abandon is ignored."""
    ledger = ProgressLedger()
    ledger.reset({T: TableProgress("s", "t", CopyStatus.COPYING)})
    (c0, last0), (c1, last1) = chunk(0, 10), chunk(1, 20)
    ledger.remember(Record(T, "chunk", last0, chunk=c0))
    ledger.remember(Record(T, "chunk", last1, chunk=c1))
    ledger.handed_on(batch(5, last0))
    ledger.handed_on(batch(6, last1))
    failed = ledger.prepare(batch(5))  # its write fails: never applied
    assert [(p.rows, p.chunks) for p in failed.progress] == [(2, 1)]
    assert ledger.get(T).rows == 0 and ledger.pending
    again = ledger.prepare(batch(5))
    assert [attrs.evolve(p, updated=0.0) for p in again.progress] == [
        attrs.evolve(p, updated=0.0) for p in failed.progress]
    assert [p.last_key for p in ledger.apply(again)] == [(10,)]
    assert ledger.get(T).last_key == (10,)
    stale = ledger.prepare(batch(6))
    ledger.reset({T: TableProgress("s", "t", CopyStatus.COPYING)})  # a rewind in between
    assert ledger.apply(stale) == [] and ledger.get(T).rows == 0 and not ledger.pending


def test_an_abandoned_copy_commits_none_of_its_records_and_keeps_its_key():
    """A DDL started the table's copy again: chunks of the old copy acked afterwards commit nothing,
    and the new copy's TRUNCATE records the key columns it splits on; other tables are untouched."""
    other = TableName("s", "u")
    ledger = ProgressLedger()
    ledger.reset({T: TableProgress("s", "t", CopyStatus.COPYING, key=("id",)),
                  other: TableProgress("s", "u", CopyStatus.COPYING)})
    c0, last0 = chunk(0, 10)
    ledger.remember(Record(T, "chunk", last0, chunk=c0))
    o0 = Chunk(other, 1, 0, ({"id": 1},), AT, None, (1,), False)
    last_o = RowChange(Op.READ, "s", "u", ("id",), None, {"id": 1}, position=AT)
    ledger.remember(Record(other, "chunk", last_o, chunk=o0))
    ledger.handed_on(batch(1, last0, last_o))
    ledger.abandon(TableProgress("s", "t", CopyStatus.PENDING))
    truncate = DdlChange("s", "t", "TRUNCATE TABLE `s`.`t`", snapshot=True)
    ledger.remember(Record(T, "truncate", truncate, key=("c",)))
    ledger.handed_on(batch(2, truncate))
    (moved,) = commit(ledger, batch(1))
    assert moved.name == other and moved.rows == 1
    assert ledger.get(T).status is CopyStatus.PENDING  # chunk 0 of the old copy counted for nothing
    (again,) = commit(ledger, batch(2))
    assert (again.status, again.rows, again.key) == (CopyStatus.COPYING, 0, ("c",))
    assert TableProgress.from_dict(again.to_dict()) == again


@pytest.mark.parametrize("statement, removed, renamed", [
    ("ALTER TABLE t RENAME COLUMN a TO b", [], []),
    ("ALTER TABLE t RENAME INDEX i TO j", [], []),
    ("ALTER TABLE t ADD FOREIGN KEY (a) REFERENCES p (id)", [], []),
    ("ALTER TABLE t ADD COLUMN c INT, RENAME TO u", ["t"], [("t", "u")]),
    ("ALTER TABLE t RENAME AS x.u", ["t"], [("t", "x.u")]),
    ("ALTER TABLE t ADD c INT COMMENT 'rename me', ADD FOREIGN KEY (c) REFERENCES o (id)", [], []),
    ("ALTER TABLE t ADD FOREIGN KEY (c) REFERENCES o (id), RENAME TO u", ["t"], [("t", "u")]),
    ("RENAME TABLE a TO b, c TO d", ["a", "c"], [("a", "b"), ("c", "d")]),
    ("DROP TABLE IF EXISTS a, b", ["a", "b"], []),
    ("TRUNCATE TABLE t", [], []),
])
def test_which_tables_a_ddl_removes_and_renames(statement, removed, renamed):
    """What ends a copy (a table removed) and what starts one (a table's new name), never a column
    or index rename."""
    parsed = ddl.parse(statement)
    names = [TableName(ref.schema or "s", ref.table) for ref in parsed.tables]
    gone, pairs = removed_and_renamed(parsed, names)

    def name(text: str) -> TableName:
        schema, _, table = text.rpartition(".")
        return TableName(schema or "s", table)

    assert gone == [name(n) for n in removed]
    assert pairs == [(name(a), name(b)) for a, b in renamed]


def test_a_copy_ended_by_a_ddl_is_committed_with_the_ddls_ack_and_names_the_copies_it_finishes():
    """A RENAME ends one table's copy and starts another's: both progresses are the ledger's at once
    (a copy of the new name begins from its start) but commit only with the ack of the batch holding
    the RENAME, one change carrying both; a finished copy is named with its serial, an ended one is
    not (it was not copied to its end)."""
    new = TableName("s", "t2")
    ledger = ProgressLedger()
    ledger.reset({T: TableProgress("s", "t", CopyStatus.COPYING, rows=2, chunks=1, last_key=(10,)),
                  new: TableProgress("s", "t2", CopyStatus.DONE)})
    c1, last1 = chunk(1, 20)
    ledger.remember(Record(T, "chunk", last1, chunk=attrs.evolve(c1, copy=7)))
    rename = DdlChange("s", "t", "RENAME TABLE t TO t2")
    ended = attrs.evolve(ledger.get(T), status=CopyStatus.DONE)
    pending = TableProgress("s", "t2", CopyStatus.PENDING)
    ledger.abandon(ended, rename)
    ledger.abandon(pending, rename)
    assert ledger.get(T) == ended and ledger.get(new) == pending  # at once, for the copy of t2
    ledger.handed_on(batch(1, last1))
    ledger.handed_on(batch(2, rename))
    assert commit(ledger, batch(1)) == []  # chunk 1 was abandoned; the RENAME is not acked yet
    prepared = ledger.prepare(batch(2))
    assert {p.name: p.status for p in prepared.progress} == {T: CopyStatus.DONE, new: CopyStatus.PENDING}
    assert prepared.finished == {}
    assert ledger.apply(prepared) and not ledger.pending
    truncate = DdlChange("s", "t2", "TRUNCATE TABLE `s`.`t2`", snapshot=True)
    ledger.remember(Record(new, "truncate", truncate, empty=True, copy=9))
    ledger.handed_on(batch(3, truncate))
    finished = ledger.prepare(batch(3))
    assert finished.finished == {new: 9} and finished.progress[0].status is CopyStatus.DONE
