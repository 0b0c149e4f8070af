"""The end-of-copy marker (`DdlChange.copy_end`): the ledger finishes a copy only at its marker, Extract
routes it as the table's TRUNCATE, the SQL planner keeps it whatever ``pipeline.ddl`` says, targets
that do not take it ignore it, and staging names fit every target."""

from __future__ import annotations

import pytest

from setl.config import TableRule
from setl.model import Batch, DdlChange, Op, Position, RowChange, TableName
from setl.sinks.parquet import ParquetLoad
from setl.sinks.sql_segments import DdlStep, SegmentPlanner
from setl.sinks.sql_staging import staging_name, staging_prefix
from setl.sinks.sqlite import SqliteLoad
from setl.snapshot import CopyStatus, TableProgress
from setl.snapshot.ledger import ProgressLedger, Record
from setl.stages import TableExtract
from tests.snapshot.test_ledger import AT, T, batch, chunk, commit


def test_with_copy_end_a_copy_is_done_at_its_marker_not_at_its_last_chunk():
    """The last chunk acked leaves the copy COPYING (a restart reads it again and hands the marker on
    again); the marker's ack makes it DONE and names the copy finished."""
    ledger = ProgressLedger(copy_end=True)
    ledger.reset({T: TableProgress("s", "t", CopyStatus.PENDING)})
    truncate = DdlChange("s", "t", "TRUNCATE TABLE `s`.`t`", snapshot=True)
    ledger.remember(Record(T, "truncate", truncate, estimate=4, copy=3))
    (c0, last0), (c1, last1) = chunk(0, 10), chunk(1, None)
    ledger.remember(Record(T, "chunk", last0, chunk=c0))
    ledger.remember(Record(T, "chunk", last1, chunk=c1))
    marker = DdlChange.end_of_copy(T, AT)
    ledger.remember(Record(T, "copied", marker, copy=3))
    for batch_id, change in ((1, truncate), (2, last0), (3, last1), (4, marker)):
        ledger.handed_on(batch(batch_id, change))
    commit(ledger, batch(1))
    commit(ledger, batch(2))
    (last,) = commit(ledger, batch(3))
    assert (last.status, last.last_key, last.rows, last.chunks) == (CopyStatus.COPYING, (10,), 4, 2)
    prepared = ledger.prepare(batch(4))
    assert prepared.finished == {T: 3}
    (done,) = ledger.apply(prepared)
    assert (done.status, done.rows) == (CopyStatus.DONE, 4)


def test_with_copy_end_an_empty_table_is_done_at_its_marker():
    """The TRUNCATE of a table found empty leaves it COPYING until its marker is acked."""
    ledger = ProgressLedger(copy_end=True)
    ledger.reset({T: TableProgress("s", "t", CopyStatus.PENDING)})
    truncate = DdlChange("s", "t", "TRUNCATE TABLE `s`.`t`", snapshot=True)
    marker = DdlChange.end_of_copy(T, AT)
    ledger.remember(Record(T, "truncate", truncate, empty=True, copy=1))
    ledger.remember(Record(T, "copied", marker, copy=1))
    ledger.handed_on(batch(1, truncate))
    ledger.handed_on(batch(2, marker))
    assert [p.status for p in commit(ledger, batch(1))] == [CopyStatus.COPYING]
    assert [p.status for p in commit(ledger, batch(2))] == [CopyStatus.DONE]


def test_without_copy_end_the_last_chunk_finishes_the_copy():
    """A target that does not take the marker: the last chunk's ack finishes the copy, as before."""
    ledger = ProgressLedger()
    ledger.reset({T: TableProgress("s", "t", CopyStatus.COPYING)})
    c0, last0 = chunk(0, None)
    ledger.remember(Record(T, "chunk", last0, chunk=c0))
    ledger.handed_on(batch(1, last0))
    assert [p.status for p in commit(ledger, batch(1))] == [CopyStatus.DONE]


def test_extract_routes_the_marker_like_the_tables_truncate():
    """The marker goes to the rule's target schema and table, keeps its flag and no statement."""
    extract = TableExtract([TableRule(source=r"shop\.orders", target="replica.o_{table}")])
    marker = DdlChange.end_of_copy(TableName("shop", "orders"), Position("log", 5))
    other = DdlChange.end_of_copy(TableName("shop", "unrouted"), Position("log", 5))
    out = extract.extract(Batch("p", 1, 1, Position("log", 0), Position("log", 10), (marker, other)))
    (routed,) = out.changes
    assert isinstance(routed, DdlChange) and routed.copy_end and routed.statement == ""
    assert (routed.schema, routed.table, routed.source) == ("replica", "o_orders", TableName("shop", "orders"))


@pytest.mark.parametrize("policy", ["apply", "skip", "fail"])
def test_the_sql_planner_keeps_the_marker_whatever_the_ddl_policy(policy):
    """``pipeline.ddl: skip`` or ``fail`` never drop or refuse a copy's marker."""
    planner = SegmentPlanner("p", policy, lambda batch, table=None: {"pipeline": "p"})
    marker = DdlChange.end_of_copy(TableName("db", "t"), Position("log", 5))
    (step,) = planner.segments(Batch("p", 1, 1, Position("log", 0), Position("log", 10), (marker,)))
    assert isinstance(step, DdlStep) and step.change is marker


def test_targets_that_do_not_take_the_marker_ignore_it(tmp_path):
    """The SQLite and Parquet targets load a batch holding a marker as if it were not there."""
    marker = DdlChange.end_of_copy(TableName("db", "t"), Position("log", 5))
    row = RowChange(Op.INSERT, "db", "t", ("id",), None, {"id": 1, "v": "a"}, Position("log", 5))
    sqlite = SqliteLoad(tmp_path / "t.db", pipeline="p")
    sqlite.open()
    try:
        sqlite.load(Batch("p", 1, 1, Position("log", 0), Position("log", 10), (row, marker)))
        assert sqlite.db.execute('SELECT id, v FROM "db.t"').fetchall() == [(1, "a")]
    finally:
        sqlite.close()
    parquet = ParquetLoad(tmp_path / "pq", pipeline="p", fsync=False)
    parquet.open()
    try:
        parquet.load(Batch("p", 1, 1, Position("log", 0), Position("log", 10), (marker, row)))
    finally:
        parquet.close()
    assert list((tmp_path / "pq").rglob("*.parquet"))


def test_staging_names_fit_every_target_and_tell_pipelines_apart():
    """31 characters (within PostgreSQL's 63), stable, under the pipeline's own prefix."""
    name = staging_name("p1", "shop", "orders" * 20)
    assert len(name) <= 63 and name == staging_name("p1", "shop", "orders" * 20)
    assert name.startswith(staging_prefix("p1")) and not name.startswith(staging_prefix("p2"))
    assert staging_name("p1", "shop", "a") != staging_name("p1", "shop2", "a") != staging_name("p2", "shop", "a")
