"""The SQLite target: merged idempotent loads with the position in the same transaction."""

from __future__ import annotations

import sqlite3

import attrs
import pytest

from setl.connectors import BuildContext, registry
from setl.errors import LoadError
from setl.model import Batch, DdlChange, Position
from setl.sinks.sqlite import SqliteLoad, SqliteTargetConfig
from setl.testing.connectors import LoadContract, TargetProbe
from setl.testing.harness import delete, insert, update


def batch(n, *changes):
    return Batch("p", n, 1, Position("f", n - 1), Position("f", n), tuple(changes))


def rows(path, table="demo.t"):
    return sorted(sqlite3.connect(path).execute(f'SELECT * FROM "{table}"').fetchall())


def test_loads_merge_per_key_are_idempotent_and_record_the_position(tmp_path):
    """Insert+update, key change and delete apply as their net effect, twice the same, with the position."""
    sink = SqliteLoad(tmp_path / "t.db", pipeline="p")
    b1 = batch(1, insert("t", {"id": 1, "v": "a"}), update("t", {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
               insert("t", {"id": 2, "v": "c"}), update("t", {"id": 2, "v": "c"}, {"id": 3, "v": "c"}))
    sink.load(b1)
    sink.load(b1)
    assert rows(tmp_path / "t.db") == [(1, "b"), (3, "c")]
    sink.load(batch(2, delete("t", {"id": 1, "v": "b"}), insert("t", {"id": 4, "v": "d", "extra": 1})))
    assert rows(tmp_path / "t.db") == [(3, "c", None), (4, "d", 1)]
    assert sink.committed() == Position("f", 2)


def test_a_failing_batch_leaves_nothing_behind(tmp_path):
    """A batch that fails half-way (a DDL it cannot apply) rolls back its rows and its position."""
    sink = SqliteLoad(tmp_path / "t.db", pipeline="p")
    sink.load(batch(1, insert("t", {"id": 1})))
    with pytest.raises(LoadError, match="does not apply DDL"):
        sink.load(batch(2, insert("t", {"id": 2}), DdlChange("demo", "t", "DROP TABLE t")))
    assert rows(tmp_path / "t.db") == [(1,)]
    assert sink.committed() == Position("f", 1)


def test_table_without_key_applies_changes_in_order(tmp_path):
    """Without a primary key, deletes remove one matching row and inserts append, in order."""
    sink = SqliteLoad(tmp_path / "t.db", pipeline="p")
    sink.load(batch(1, insert("n", {"a": 1}, key=()), insert("n", {"a": 1}, key=()), delete("n", {"a": 1}, key=())))
    assert rows(tmp_path / "t.db", "demo.n") == [(1,)]


def test_a_table_first_seen_through_a_delete_is_created_and_stays_empty(tmp_path):
    """A batch whose changes to a new table merge to one delete (insert, update, delete) leaves it empty, and
    the next batch's rows land in it."""
    sink = SqliteLoad(tmp_path / "t.db", pipeline="p")
    sink.load(batch(1, insert("t", {"id": 0, "v": "a"}), update("t", {"id": 0, "v": "a"}, {"id": 0, "v": "a"}),
                    delete("t", {"id": 0, "v": "a"})))
    assert rows(tmp_path / "t.db") == []
    assert sink.committed() == Position("f", 1)
    sink.load(batch(2, insert("t", {"id": 1, "v": "b"})))
    assert rows(tmp_path / "t.db") == [(1, "b")]


class SqliteProbe(TargetProbe):
    """A fresh SQLite file, through the sqlite connector."""

    def __init__(self, path):
        self.path = path

    def make_load(self, pipeline="p"):
        return registry().target("sqlite").create(SqliteTargetConfig("sqlite", str(self.path)), BuildContext(pipeline))

    def state(self, table):
        db = sqlite3.connect(self.path)
        db.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in db.execute(f'SELECT * FROM "{table.qualified}"')]
        except sqlite3.OperationalError:
            return {}
        finally:
            db.close()
        return {tuple(r[k] for k in table.key): r for r in rows}

    def rows(self, table):
        db = sqlite3.connect(self.path)
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute(f'SELECT * FROM "{table.qualified}"')]
        except sqlite3.OperationalError:
            return []
        finally:
            db.close()


class TestSqliteLoadContract(LoadContract):
    """The connector kit's Load contract, on the SQLite target."""

    @pytest.fixture
    def probe(self, tmp_path):
        return SqliteProbe(tmp_path / "kit.db")


def test_a_position_inside_a_split_transaction_round_trips(tmp_path):
    """A batch ending at a piece of a split transaction records its row; committed() returns it."""
    sink = SqliteLoad(tmp_path / "t.db", pipeline="p")
    piece = Position("f", 7, row=3)
    sink.load(Batch("p", 1, 1, Position("f", 7), piece, (insert("t", {"id": 1}),)))
    assert sink.committed() == piece and sink.committed().row == 3


def test_a_position_table_without_row_is_migrated(tmp_path):
    """A position table made before positions had a row gains the column and keeps its position."""
    db = sqlite3.connect(tmp_path / "t.db")
    db.execute("CREATE TABLE setl_position (pipeline TEXT PRIMARY KEY, log TEXT NOT NULL, offset INTEGER NOT NULL,"
               " gtid TEXT, batch_id INTEGER NOT NULL, epoch INTEGER NOT NULL)")
    db.execute("INSERT INTO setl_position VALUES ('p', 'f', 5, NULL, 5, 1)")
    db.commit()
    db.close()
    sink = SqliteLoad(tmp_path / "t.db", pipeline="p")
    assert sink.committed() == Position("f", 5)
    sink.load(Batch("p", 6, 1, Position("f", 5), Position("f", 9, row=2), (insert("t", {"id": 1}),)))
    assert sink.committed() == Position("f", 9, row=2)


def test_per_table_replay_applies_each_change_to_a_keyless_table_once(tmp_path):
    """per_table: a keyless table's parts of batches 1 and 2 commit; replaying both batches (the
    other table's part had failed) adds no duplicate rows."""
    sink = SqliteLoad(tmp_path / "t.db", pipeline="p")

    def at(change, offset):
        return attrs.evolve(change, position=Position("f", offset))

    first = Batch("p", 1, 1, Position("f", 0), Position("f", 2),
                  (at(insert("n", {"a": 1}, key=()), 1), at(insert("n", {"a": 1}, key=()), 2)))
    second = Batch("p", 2, 1, Position("f", 2), Position("f", 3), (at(insert("n", {"a": 2}, key=()), 3),))
    sink.load_part(first)
    sink.load_part(second)
    for batch in (attrs.evolve(first, epoch=2), attrs.evolve(second, epoch=2)):
        sink.load_part(batch)
        sink.mark_loaded(batch)
    assert rows(tmp_path / "t.db", "demo.n") == [(1,), (1,), (2,)]
    assert sink.committed() == Position("f", 3)
