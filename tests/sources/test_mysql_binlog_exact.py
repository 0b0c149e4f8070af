"""MysqlBinlogSource on the binlog forms that used to lose or repeat data silently (issue 13)."""

from __future__ import annotations

import datetime
import subprocess
import sys

import attrs
import pytest

from setl.errors import SourceError
from setl.model import InvalidDate, RowChange, Transaction
from setl.sources.mysql_binlog import MysqlBinlogSource
from tests.helpers.wait import wait_until
from tests.sources.binlog import execute, head, next_server_id

pytestmark = pytest.mark.timeout(120)

def read_until_complete(src: MysqlBinlogSource, schema: str, count: int = 1, timeout: float = 30
                        ) -> list[Transaction]:
    """Poll until `count` complete transactions touching `schema` arrived, with the pieces before them."""
    got: list[Transaction] = []

    def more() -> bool:
        tx = src.poll(0.2)
        if tx is not None and any(c.schema == schema for c in tx.changes):  # position marks are left out
            got.append(tx)
        return sum(t.complete for t in got) >= count

    wait_until(more, timeout=timeout, interval=0, message=f"{count} complete transactions (got {len(got)})")
    return got


def rows(transactions: list[Transaction]) -> list[RowChange]:
    return [c for tx in transactions for c in tx.changes if isinstance(c, RowChange)]


def test_split_transaction_resumes_from_every_piece_end_with_exactly_the_rest(mariadb_source, source_db, sources):
    """A 1,000-row keyless transaction in pieces of 100: each piece end resumes with exactly the later rows."""
    execute(mariadb_source, source_db, "CREATE TABLE k (v INT)", "CREATE TABLE other (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO other VALUES (1)",
            "INSERT INTO k SELECT seq % 7 FROM seq_1_to_1000", "INSERT INTO other VALUES (2)")
    everything = read_until_complete(sources(mariadb_source, start, max_rows_in_memory=100), source_db, 2)
    # the commit after the last full piece carries no rows: a position mark the next transaction supersedes
    assert [(len(tx.changes), tx.complete) for tx in everything] == [(1, True)] + [(100, False)] * 10 + [(1, True)]
    pieces = everything[1:11]
    tx_start = attrs.evolve(pieces[0].end, row=0)
    assert tx_start == everything[0].end  # the big transaction starts where the one before it ends
    assert [p.end for p in pieces] == [attrs.evolve(tx_start, row=100 * i) for i in range(1, 11)]
    big = rows(pieces)
    assert [c.position for c in big] == [attrs.evolve(tx_start, row=i) for i in range(1, 1001)]
    assert [c.after["v"] for c in big] == [i % 7 for i in range(1, 1001)]
    ends = [tx.end for tx in everything]
    positions = [c.position for c in rows(everything)]
    assert ends == sorted(set(ends)) and positions == sorted(set(positions))  # strictly increasing
    for k, piece in enumerate(pieces, start=1):
        resumed = read_until_complete(sources(mariadb_source, piece.end, max_rows_in_memory=100), source_db, 1)
        assert rows(resumed) == big[100 * k:] + rows(everything[-1:])
        assert [tx.end for tx in resumed] == ends[k + 1:]


def test_split_transaction_with_a_partial_last_piece_ends_complete_at_its_commit(mariadb_source, source_db, sources):
    """250 rows in pieces of 100: two pieces, then a complete last piece of 50 ending at the commit (row 0)."""
    execute(mariadb_source, source_db, "CREATE TABLE k (v INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO k SELECT seq FROM seq_1_to_250")
    got = read_until_complete(sources(mariadb_source, start, max_rows_in_memory=100), source_db)
    assert [(len(tx.changes), tx.complete) for tx in got] == [(100, False), (100, False), (50, True)]
    assert got[-1].end.row == 0 and got[-1].end.offset == head(mariadb_source).offset
    assert [c.position.row for c in rows(got)] == list(range(1, 251))
    resumed = read_until_complete(sources(mariadb_source, got[1].end, max_rows_in_memory=100), source_db)
    expected = [(tx.changes, tx.end, tx.complete) for tx in got[2:]]
    assert [(tx.changes, tx.end, tx.complete) for tx in resumed] == expected


def changes_of(transactions: list[Transaction], schema: str) -> list[tuple[str, str, object]]:
    return [(c.table, c.op.value, c.image.get("id")) for c in rows(transactions) if c.schema == schema]


def xa_prepare(server, db: str, xid: str, *statements: str) -> None:
    """Run `statements` in XA transaction `xid`, prepare it and disconnect (leaving it prepared)."""
    execute(server, db, f"XA START '{xid}'", *statements, f"XA END '{xid}'", f"XA PREPARE '{xid}'")


def test_two_phase_xa_commit_is_applied_once_in_commit_order(mariadb_source, source_db, sources):
    """XA PREPARE + XA COMMIT applies the rows at the commit, after what committed in between; XA ROLLBACK none."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    start = head(mariadb_source)
    xa_prepare(mariadb_source, source_db, "x", "INSERT INTO t VALUES (1, 1)", "UPDATE t SET v = 2 WHERE id = 1")
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (2, 2)")
    xa_prepare(mariadb_source, source_db, "y", "INSERT INTO t VALUES (3, 3)")
    execute(mariadb_source, source_db, "XA COMMIT 'x'", "XA ROLLBACK 'y'",
            "XA START 'z'", "INSERT INTO t VALUES (4, 4)", "XA END 'z'", "XA COMMIT 'z' ONE PHASE",
            "INSERT INTO t VALUES (5, 5)")
    src = sources(mariadb_source, start)
    got = read_until_complete(src, source_db, 4)
    assert src.reconnects == 0  # reading the XA PREPARE again did not displace the stream
    assert changes_of(got, source_db) == [("t", "insert", 2), ("t", "insert", 1), ("t", "update", 1),
                                          ("t", "insert", 4), ("t", "insert", 5)]
    assert [len(tx.changes) for tx in got] == [1, 2, 1, 1]
    assert rows(got)[2].after == {"id": 1, "v": 2}
    assert [tx.end for tx in got] == sorted(tx.end for tx in got)


def test_restart_between_xa_prepare_and_commit_applies_the_prepared_rows_once(mariadb_factory, sources):
    """A reader opened after an XA PREPARE it never saw finds the prepared rows when the XA COMMIT arrives."""
    # A server of its own: the search for the prepare reads binlog files newest first, and the shared
    # source server's files hold everything earlier tests wrote.
    mariadb_source = mariadb_factory()
    source_db = "xa_restart"
    mariadb_source.query(f"CREATE DATABASE {source_db}")
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "CREATE TABLE v (id INT PRIMARY KEY) WITH SYSTEM VERSIONING",
            "INSERT INTO v VALUES (1)")
    start = head(mariadb_source)
    xa_prepare(mariadb_source, source_db, "r", *[f"INSERT INTO t VALUES ({i}, {i})" for i in range(1, 6)],
               "UPDATE v SET id = 2")  # a history row the XA COMMIT must not hand on
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (10, 10)")
    (before,) = read_until_complete(sources(mariadb_source, start), source_db)
    assert changes_of([before], source_db) == [("t", "insert", 10)]
    mariadb_source.query("FLUSH BINARY LOGS")  # the XA PREPARE is now in an older binlog file
    execute(mariadb_source, source_db, "XA COMMIT 'r'", "INSERT INTO t VALUES (11, 11)")
    resumed = read_until_complete(sources(mariadb_source, before.end, max_rows_in_memory=4), source_db, 2)
    assert changes_of(resumed, source_db) == [*[("t", "insert", i) for i in (1, 2, 3, 4, 5)], ("v", "update", 2),
                                              ("t", "insert", 11)]
    assert [(len(tx.changes), tx.complete) for tx in resumed] == [(4, False), (2, True), (1, True)]
    # a piece of the XA COMMIT resumes like any split transaction
    again = read_until_complete(sources(mariadb_source, resumed[0].end, max_rows_in_memory=4), source_db, 2)
    assert changes_of(again, source_db) == [("t", "insert", 5), ("v", "update", 2), ("t", "insert", 11)]


def test_rollback_to_savepoint_drops_the_undone_transactional_rows(mariadb_source, source_db, sources):
    """ROLLBACK TO SAVEPOINT after touching MyISAM: the undone InnoDB rows are dropped, the MyISAM row kept."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE m (id INT) ENGINE=MyISAM")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "BEGIN", "INSERT INTO t VALUES (1, 1)", "SAVEPOINT sp",
            "INSERT INTO t VALUES (2, 2)", "SAVEPOINT later", "INSERT INTO m VALUES (7)",
            "UPDATE t SET v = 9 WHERE id = 1", "DELETE FROM t WHERE id = 1",
            "ROLLBACK TO SAVEPOINT sp", "INSERT INTO t VALUES (3, 3)", "COMMIT", "INSERT INTO t VALUES (4, 4)")
    got = read_until_complete(sources(mariadb_source, start), source_db, 3)
    assert sorted(changes_of(got, source_db)) == sorted([("m", "insert", 7), ("t", "insert", 1),
                                                        ("t", "insert", 3), ("t", "insert", 4)])
    assert [c.after for c in rows(got) if c.table == "t"] == [{"id": 1, "v": 1}, {"id": 3, "v": 3},
                                                              {"id": 4, "v": 4}]


def test_rollback_to_savepoint_of_rows_already_handed_on_stops_clearly(mariadb_source, source_db, sources):
    """A ROLLBACK TO undoing InnoDB rows already handed on in a piece is a SourceError naming its position."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE m (id INT) ENGINE=MyISAM")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "BEGIN", "INSERT INTO t VALUES (0)", "SAVEPOINT sp",
            "INSERT INTO t SELECT seq FROM seq_1_to_10", "INSERT INTO m VALUES (1)", "ROLLBACK TO sp", "COMMIT")
    src = sources(mariadb_source, start, max_rows_in_memory=4)
    with pytest.raises(SourceError) as caught:
        read_until_complete(src, source_db, 2)  # the MyISAM row comes first, as its own transaction
    message = str(caught.value)
    assert "ROLLBACK TO" in message and "already handed on" in message and "mysql-bin" in message


def test_a_split_transaction_does_not_bar_a_later_transaction_s_rollback_to_savepoint(mariadb_source, source_db,
                                                                                     sources):
    """A transaction split into pieces, then another that writes MyISAM and rolls back to a savepoint:
    the later one's undone InnoDB rows are dropped, not refused as rows of the split one handed on."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE m (id INT) ENGINE=MyISAM")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t SELECT seq FROM seq_1_to_10",
            "BEGIN", "INSERT INTO t VALUES (100)", "SAVEPOINT sp", "INSERT INTO m VALUES (1)",
            "INSERT INTO t VALUES (101)", "ROLLBACK TO sp", "COMMIT")
    got = read_until_complete(sources(mariadb_source, start, max_rows_in_memory=4), source_db, 3)
    assert [c for c in changes_of(got, source_db) if c[0] == "m"] == [("m", "insert", 1)]
    assert sorted(c.after["id"] for c in rows(got) if c.table == "t") == [*range(1, 11), 100]


def test_rolled_back_transaction_with_a_myisam_write_hands_on_no_innodb_row(mariadb_source, source_db, sources):
    """A transaction logged with ROLLBACK (it wrote MyISAM) hands on its MyISAM rows but none of its InnoDB rows."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE m (id INT) ENGINE=MyISAM")
    start = head(mariadb_source)
    # the server logs the undone InnoDB rows as a transaction ending in ROLLBACK
    execute(mariadb_source, source_db, "BEGIN", "SAVEPOINT sp", "INSERT INTO m VALUES (1)",
            "INSERT INTO t VALUES (1), (2)", "ROLLBACK TO sp", "COMMIT", "INSERT INTO t VALUES (3)")
    got = read_until_complete(sources(mariadb_source, start), source_db, 2)
    assert changes_of(got, source_db) == [("m", "insert", 1), ("t", "insert", 3)]


def test_a_rollback_to_savepoint_of_a_skipped_table_since_dropped_does_not_stop_the_reader(mariadb_source, source_db,
                                                                                           sources):
    """A ROLLBACK TO SAVEPOINT (logged: the transaction wrote MyISAM) of rows of an InnoDB table the
    rules skip and which was dropped since: the reader need not know that table's engine, and goes on."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE gone (id INT PRIMARY KEY)",
            "CREATE TABLE m (id INT) ENGINE=MyISAM")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "BEGIN", "INSERT INTO m VALUES (1)", "SAVEPOINT sp",
            "INSERT INTO gone VALUES (1)", "ROLLBACK TO sp", "COMMIT", "DROP TABLE gone", "INSERT INTO t VALUES (2)")
    src = sources(mariadb_source, start, selects=lambda schema, table: table != "gone")
    # MyISAM's row, the DROP, the insert: the savepoint group held only the skipped table's rows,
    # passed over unread (`skipping`), so it is a position mark
    got = read_until_complete(src, source_db, 3)
    assert [c for c in changes_of(got, source_db) if c[0] != "gone"] == [("m", "insert", 1), ("t", "insert", 2)]


@pytest.mark.parametrize("fmt", ["STATEMENT", "MIXED"])
def test_statement_logged_dml_on_a_selected_table_stops_naming_table_and_position(mariadb_source, source_db,
                                                                                  sources, fmt):
    """DML a session logged as a statement stops the source for a selected table and passes for a skipped one."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE skipped (id INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, f"SET SESSION binlog_format = {fmt}", "INSERT INTO skipped VALUES (1)",
            "SET SESSION binlog_format = ROW", "INSERT INTO t VALUES (1)",
            f"SET SESSION binlog_format = {fmt}", "UPDATE t SET id = 2 WHERE id = 1")
    src = sources(mariadb_source, start, selects=lambda schema, table: table != "skipped")
    (first,) = read_until_complete(src, source_db)
    assert changes_of([first], source_db) == [("t", "insert", 1)]
    with pytest.raises(SourceError) as caught:
        read_until_complete(src, source_db)
    message = str(caught.value)
    assert f"{source_db}.t " in message and "binlog_format STATEMENT or MIXED" in message and "mysql-bin." in message
    assert "\n" not in message


def test_a_statement_on_a_skipped_table_whose_trigger_writes_a_read_table_stops_naming_the_trigger(
        mariadb_source, source_db, sources):
    """A STATEMENT-logged write to a skipped table with a trigger (which may write a read table setl then
    never sees) stops the source naming the trigger, in one line; one on a skipped table without passes."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE skipped (id INT)",
            "CREATE TABLE plain (id INT)",
            "CREATE TRIGGER copy_to_t AFTER INSERT ON skipped FOR EACH ROW INSERT INTO t VALUES (NEW.id + 100)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "SET SESSION binlog_format = STATEMENT", "INSERT INTO plain VALUES (1)",
            "SET SESSION binlog_format = ROW", "INSERT INTO t VALUES (1)",
            "SET SESSION binlog_format = STATEMENT", "INSERT INTO skipped VALUES (2)")
    src = sources(mariadb_source, start, selects=lambda schema, table: table not in ("skipped", "plain"))
    got = read_until_complete(src, source_db)  # the statement on `plain` passed over; the insert into t
    assert changes_of(got, source_db) == [("t", "insert", 1)]
    with pytest.raises(SourceError) as caught:
        read_until_complete(src, source_db)
    message = str(caught.value)
    assert "copy_to_t" in message and "which the rules skip" in message and "mysql-bin." in message, message
    assert "\n" not in message
    assert mariadb_source.query(f"SELECT id FROM `{source_db}`.t ORDER BY id") == [(1,), (102,)]  # what was missed


def test_a_selected_table_with_a_cascading_foreign_key_is_refused_at_open(mariadb_factory):
    """A selected child table with ON DELETE CASCADE is refused at open, naming table and constraint."""
    server = mariadb_factory()
    server.query("CREATE DATABASE d")
    server.query("CREATE TABLE d.parent (id INT PRIMARY KEY)")
    server.query("CREATE TABLE d.child (id INT PRIMARY KEY, p INT, "
                 "CONSTRAINT fk_parent FOREIGN KEY (p) REFERENCES d.parent (id) ON DELETE CASCADE)")
    server.query("CREATE TABLE d.plain (id INT PRIMARY KEY, p INT, "
                 "CONSTRAINT fk_plain FOREIGN KEY (p) REFERENCES d.parent (id))")
    refused = MysqlBinlogSource.from_config(server.source_config(next_server_id()), pipeline="t",
                                            selects=lambda schema, table: table != "other")
    with pytest.raises(SourceError) as caught:
        refused.open(None)
    message = str(caught.value)
    assert "d.child" in message and "fk_parent" in message and "ON DELETE CASCADE" in message
    assert "fk_plain" not in message
    allowed = MysqlBinlogSource.from_config(server.source_config(next_server_id()), pipeline="t",
                                            selects=lambda schema, table: table != "child")
    try:
        allowed.open(None)
        assert allowed.tell() is not None
    finally:
        allowed.close()


def test_names_with_dots_percent_and_backticks_keep_schema_and_table_apart(mariadb_source, source_db, sources):
    """`dot.table`, `p%` and `b``q` arrive as table names of their schema, in row changes and in DDL."""
    execute(mariadb_source, source_db, "CREATE TABLE `dot.table` (`a%` INT PRIMARY KEY, `b``q` INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO `dot.table` VALUES (1, 2)",
            f"ALTER TABLE `{source_db}`.`dot.table` ADD COLUMN c INT", "CREATE TABLE `p%` (id INT)",
            "CREATE TABLE `b``q.x` (id INT)")
    got = read_until_complete(sources(mariadb_source, start), source_db, 4)
    row = got[0].changes[0]
    assert (row.schema, row.table, row.primary_key, row.after) == (source_db, "dot.table", ("a%",), {"a%": 1, "b`q": 2})
    assert [(c.schema, c.table) for tx in got[1:] for c in tx.changes] == [
        (source_db, "dot.table"), (source_db, "p%"), (source_db, "b`q.x")]


def test_drop_database_drops_each_table_it_held(mariadb_source, source_db, sources):
    """DROP DATABASE becomes one transaction of a DROP TABLE per table: those known at open and those created after."""
    other = f"{source_db}_gone"
    mariadb_source.query(f"CREATE DATABASE `{other}`")
    execute(mariadb_source, other, "CREATE TABLE old1 (id INT)", "CREATE TABLE `old.2` (id INT)")
    src = sources(mariadb_source)
    execute(mariadb_source, other, "CREATE TABLE new1 (id INT)", "RENAME TABLE old1 TO renamed",
            "DROP TABLE `old.2`", f"DROP DATABASE `{other}`")
    got = read_until_complete(src, other, 4)
    drop = got[-1]
    assert [(c.schema, c.table) for c in drop.changes] == [(other, "new1"), (other, "renamed")]
    assert [c.statement for c in drop.changes] == [f"DROP TABLE IF EXISTS `{other}`.`new1`",
                                                   f"DROP TABLE IF EXISTS `{other}`.`renamed`"]
    assert all(c.position == drop.end for c in drop.changes)


def test_zero_and_partial_dates_arrive_as_invalid_dates_with_the_servers_text(mariadb_source, source_db, sources):
    """0000-00-00, 2024-00-15, a zero DATETIME(3) and TIMESTAMP 0 arrive as InvalidDate, not None; real dates stay."""
    execute(mariadb_source, source_db, "SET SESSION sql_mode = ''",
            "CREATE TABLE d (id INT PRIMARY KEY, d DATE, dt DATETIME, dt3 DATETIME(3), ts TIMESTAMP NULL, "
            "ts6 TIMESTAMP(6) NULL)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "SET SESSION sql_mode = ''",
            "INSERT INTO d VALUES (1, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00.000', 0, 0)",
            "INSERT INTO d VALUES (2, '2024-00-15', '2024-02-00 10:11:12', '2024-00-00 01:02:03.456', NULL, NULL)",
            "INSERT INTO d VALUES (3, '2024-02-29', '2024-02-29 10:11:12', '2024-02-29 01:02:03.456', "
            "'2024-02-29 10:11:12', '2024-02-29 10:11:12.5')")
    got = read_until_complete(sources(mariadb_source, start), source_db, 3)
    images = [c.after for c in rows(got)]
    assert images[0] == {"id": 1, "d": InvalidDate("0000-00-00"), "dt": InvalidDate("0000-00-00 00:00:00"),
                         "dt3": InvalidDate("0000-00-00 00:00:00.000"), "ts": InvalidDate("0000-00-00 00:00:00"),
                         "ts6": InvalidDate("0000-00-00 00:00:00.000000")}
    assert images[1] == {"id": 2, "d": InvalidDate("2024-00-15"), "dt": InvalidDate("2024-02-00 10:11:12"),
                         "dt3": InvalidDate("2024-00-00 01:02:03.456"), "ts": None, "ts6": None}
    assert images[2]["d"] == datetime.date(2024, 2, 29)
    assert images[2]["dt3"] == datetime.datetime(2024, 2, 29, 1, 2, 3, 456000)
    assert isinstance(images[2]["ts"], datetime.datetime) and images[2]["ts6"].microsecond == 500000


def test_sequence_state_is_not_handed_on_and_drawn_values_arrive(mariadb_source, source_db, sources, caplog):
    """NEXTVAL's write to a sequence's row is not handed on; the value it drew arrives in the table that uses it."""
    execute(mariadb_source, source_db, "CREATE SEQUENCE s", "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    caplog.set_level("INFO", logger="setl.sources.mysql_binlog")
    execute(mariadb_source, source_db, "SELECT NEXTVAL(s)", "INSERT INTO t VALUES (NEXTVAL(s))",
            "INSERT INTO t SELECT NEXTVAL(s) FROM seq_1_to_1500")
    got = read_until_complete(sources(mariadb_source, start), source_db, 2)
    assert {c.table for c in rows(got)} == {"t"}
    assert [c.after["id"] for c in rows(got)] == list(range(2, 1503))
    assert caplog.text.count(f"{source_db}.s is a sequence") == 1


def test_system_versioned_table_hands_on_current_rows_without_period_columns(mariadb_source, source_db, sources):
    """Insert, update, delete of a system-versioned table arrive as such, without history rows or row_start/row_end."""
    execute(mariadb_source, source_db, "CREATE TABLE v (id INT PRIMARY KEY, x INT) WITH SYSTEM VERSIONING",
            "CREATE TABLE w (id INT, x INT, rs TIMESTAMP(6) GENERATED ALWAYS AS ROW START, "
            "re TIMESTAMP(6) GENERATED ALWAYS AS ROW END, PERIOD FOR SYSTEM_TIME (rs, re)) WITH SYSTEM VERSIONING")
    start = head(mariadb_source)
    statements = ["INSERT INTO {t} (id, x) VALUES (1, 1)", "INSERT INTO {t} (id, x) VALUES (2, 2)",
                  "UPDATE {t} SET x = 10", "DELETE FROM {t} WHERE id = 1"]
    execute(mariadb_source, source_db, *[s.format(t="v") for s in statements], *[s.format(t="w") for s in statements])
    got = read_until_complete(sources(mariadb_source, start), source_db, 8)
    for table, key in (("v", ("id",)), ("w", ())):
        changes = [c for c in rows(got) if c.table == table]
        assert [(c.op.value, c.before, c.after) for c in changes] == [
            ("insert", None, {"id": 1, "x": 1}), ("insert", None, {"id": 2, "x": 2}),
            ("update", {"id": 1, "x": 1}, {"id": 1, "x": 10}), ("update", {"id": 2, "x": 2}, {"id": 2, "x": 10}),
            ("delete", {"id": 1, "x": 10}, None)]
        assert all(c.primary_key == key for c in changes)


def test_column_names_and_enum_values_of_128_bytes_and_more_decode(mariadb_source, source_db, sources):
    """A 64-character column name of two-byte letters (128 bytes) and a 200-byte ENUM value arrive intact."""
    long_name, long_value = "é" * 64, "v" * 200
    execute(mariadb_source, source_db,
            f"CREATE TABLE t (id INT PRIMARY KEY, `{long_name}` INT, e ENUM('a', '{long_value}'))")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, f"INSERT INTO t VALUES (1, 2, '{long_value}')")
    (tx,) = read_until_complete(sources(mariadb_source, start), source_db)
    assert tx.changes[0].after == {"id": 1, long_name: 2, "e": long_value}


def test_neither_importing_nor_building_a_source_patches_the_library():
    """python-mysql-replication's classes keep their own functions, at import and once sources are built:
    setl decodes rows itself and reads table-map strings through its own packet class."""
    code = ("import setl.sources.mysql_binlog as m\n"
            "from pymysqlreplication import packet, row_event\n"
            "def own():\n"
            "    return all(getattr(f, '__module__', None) in (None, c.__module__) for c in (row_event.RowsEvent,"
            " row_event.TableMapEvent, packet.BinLogPacketWrapper) for f in vars(c).values() if callable(f))\n"
            "assert own()\n"
            "m.MysqlBinlogSource(); m.MysqlBinlogSource()\n"
            "assert own()\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
