"""MysqlBinlogSource against real MariaDB servers: transactions, positions, settings, values."""

from __future__ import annotations

import datetime
import time
from decimal import Decimal

import pytest

from setl.errors import PositionPurged, SourceError
from setl.model import DdlChange, Op, Position, RowChange
from setl.sources.mysql_binlog import MysqlBinlogSource, ddl_target
from setl.testing.harness import MemorySink, run_pipeline
from tests.helpers.wait import wait_until
from tests.sources.binlog import bare, execute, head, make_source, next_server_id, read

pytestmark = pytest.mark.timeout(60)

def test_insert_update_delete_have_full_images_keys_and_positions(mariadb_source, source_db, sources):
    """Each autocommit statement is one transaction with full images, its key and its end position."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20), n INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (1, 'a', 10)",
            "UPDATE t SET n = 11 WHERE id = 1", "DELETE FROM t WHERE id = 1")
    src = sources(mariadb_source, start)
    ins, upd, dele = read(src, 3, source_db)
    assert [tx.changes[0].op for tx in (ins, upd, dele)] == [Op.INSERT, Op.UPDATE, Op.DELETE]
    assert ins.changes[0] == RowChange(Op.INSERT, source_db, "t", ("id",), None, {"id": 1, "name": "a", "n": 10},
                                       ins.end, ins.changes[0].commit_time)
    assert upd.changes[0].before == {"id": 1, "name": "a", "n": 10}
    assert upd.changes[0].after == {"id": 1, "name": "a", "n": 11}
    assert dele.changes[0].before == {"id": 1, "name": "a", "n": 11} and dele.changes[0].after is None
    assert start < ins.end < upd.end < dele.end and bare(dele.end) == head(mariadb_source) == bare(src.tell())
    assert all(tx.complete and tx.nbytes > 0 and tx.changes[0].position == tx.end for tx in (ins, upd, dele))


def test_text_in_every_unicode_charset_arrives_equal(mariadb_source, source_db, sources):
    """utf16 and utf32 (big-endian in MySQL) decode like utf8mb4, ucs2 and utf16le do, emoji included."""
    charsets = ["utf8mb4", "utf16", "utf16le", "utf32", "ucs2"]
    columns = ", ".join(f"c_{cs} VARCHAR(20) CHARACTER SET {cs}" for cs in charsets)
    execute(mariadb_source, source_db, f"CREATE TABLE u (id INT PRIMARY KEY, {columns})")
    start = head(mariadb_source)
    texts = {cs: ("Grüße ✓ 😀" if cs != "ucs2" else "Grüße ✓ ß") for cs in charsets}  # ucs2 has no emoji
    execute(mariadb_source, source_db,
            (f"INSERT INTO u VALUES (1, {', '.join(['%s'] * len(charsets))})", [texts[cs] for cs in charsets]))
    (tx,) = read(sources(mariadb_source, start), 1, source_db)
    assert tx.changes[0].after == {"id": 1, **{f"c_{cs}": texts[cs] for cs in charsets}}


def test_multi_statement_transaction_comes_whole(mariadb_source, source_db, sources):
    """A transaction over two tables arrives as one Transaction, ordered, with one end position."""
    execute(mariadb_source, source_db, "CREATE TABLE a (id INT PRIMARY KEY)",
            "CREATE TABLE b (k1 INT, k2 VARCHAR(5), v INT, PRIMARY KEY (k2, k1))")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "BEGIN", "INSERT INTO a VALUES (1), (2)",
            "INSERT INTO b VALUES (1, 'x', 0)", "UPDATE b SET v = 5", "DELETE FROM a WHERE id = 1", "COMMIT")
    (tx,) = read(sources(mariadb_source, start), 1, source_db)
    assert [(c.table, c.op) for c in tx.changes] == [
        ("a", Op.INSERT), ("a", Op.INSERT), ("b", Op.INSERT), ("b", Op.UPDATE), ("a", Op.DELETE)]
    assert tx.changes[2].primary_key == ("k2", "k1")
    assert {c.position for c in tx.changes} == {tx.end} and tx.complete


def test_ddl_is_its_own_transaction(mariadb_source, source_db, sources):
    """An ALTER between two inserts is a transaction of one DdlChange naming its schema and table."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (1)", "ALTER TABLE t ADD COLUMN c INT",
            "INSERT INTO t VALUES (2, 7)")
    first, ddl, last = read(sources(mariadb_source, start), 3, source_db)
    assert ddl.is_ddl and len(ddl.changes) == 1
    assert ddl.changes[0] == DdlChange(source_db, "t", "ALTER TABLE t ADD COLUMN c INT", ddl.end)
    assert first.end < ddl.end < last.end
    assert last.changes[0].after == {"id": 2, "c": 7}


def test_resume_mid_stream_yields_exactly_the_rest(mariadb_source, source_db, sources):
    """Opening at a transaction's end yields the transactions after it: none lost, none twice."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, *[f"INSERT INTO t VALUES ({i}, {i})" for i in range(6)])
    everything = read(sources(mariadb_source, start), 6, source_db)
    resumed = read(sources(mariadb_source, everything[2].end), 3, source_db)
    assert resumed == everything[3:]
    assert sources(mariadb_source, everything[-1].end).poll(0.3) is None


def test_earliest_and_latest_starts(mariadb_source, source_db, sources):
    """`earliest` starts at the first listed binlog; `latest` at the head and sees only new writes."""
    first = mariadb_source.query("SHOW BINARY LOGS")[0][0]
    assert sources(mariadb_source, start="earliest").tell() == Position(first, 4)
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    latest = sources(mariadb_source, start="latest")
    assert bare(latest.tell()) == head(mariadb_source) == latest.head()
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (2)")
    (tx,) = read(latest, 1, source_db)
    assert tx.changes[0].after == {"id": 2}
    mapped = sources(mariadb_source, start={"file": tx.end.log, "pos": tx.end.offset})
    assert mapped.tell() == tx.end


def test_position_from_open_wins_over_configured_start(mariadb_source, source_db, sources):
    """A position given to open() (the acked one) overrides the configured start."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES (1)")
    (tx,) = read(sources(mariadb_source, start, start="latest"), 1, source_db)
    assert tx.changes[0].after == {"id": 1}


@pytest.mark.parametrize(("setting", "value", "wanted"), [
    ("binlog_format", "STATEMENT", "ROW"),
    ("binlog_row_metadata", "MINIMAL", "FULL"),
    ("binlog_row_image", "MINIMAL", "FULL"),
])
def test_wrong_server_setting_is_refused_clearly(mariadb_factory, setting, value, wanted):
    """A server whose binlog settings lose data is refused with the setting, its value and the fix."""
    server = mariadb_factory(options={setting: value})
    src = make_source(server)
    with pytest.raises(SourceError) as caught:
        src.open(None)
    message = str(caught.value)
    assert f"{setting}={value}" in message and f"{setting}={wanted}" in message and "pipeline=t" in message


def test_purged_position_raises_naming_both_positions(mariadb_factory):
    """A position in a purged binlog raises PositionPurged naming it and the oldest available one."""
    server = mariadb_factory()
    server.query("CREATE DATABASE d")
    server.query("CREATE TABLE d.t (id INT PRIMARY KEY)")
    server.query("INSERT INTO d.t VALUES (1)")
    old = head(server)
    server.query("FLUSH BINARY LOGS")
    newest = head(server).log

    def purged() -> bool:  # the server keeps a binlog until its checkpoint moves on
        server.query(f"PURGE BINARY LOGS TO '{newest}'")
        return server.query("SHOW BINARY LOGS")[0][0] == newest

    wait_until(purged, timeout=10, interval=0.1, message=f"binlogs before {newest} to be purged")
    src = make_source(server)
    with pytest.raises(PositionPurged) as caught:
        src.open(old)
    assert str(old) in str(caught.value) and f"{newest}:4" in str(caught.value)
    src.open(Position(newest, 4))  # what is still there opens fine
    src.close()


def test_poll_honours_timeout_and_close_is_prompt(mariadb_source, sources):
    """An idle poll returns None after about its timeout, and close() returns promptly."""
    src = sources(mariadb_source)
    began = time.monotonic()
    assert src.poll(0.3) is None
    assert 0.25 <= time.monotonic() - began < 1.5
    thread = src._reader.thread if src._reader is not None else None
    began = time.monotonic()
    src.close()
    assert time.monotonic() - began < 2 and thread is not None and not thread.is_alive()
    src.close()  # idempotent


def test_large_transaction_comes_in_pieces(mariadb_source, source_db, sources):
    """A transaction over max_rows_in_memory arrives in pieces; only the last one is complete."""
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO t VALUES " + ", ".join(f"({i})" for i in range(7)))
    pieces = read(sources(mariadb_source, start, max_rows_in_memory=3), 3, source_db)
    assert [(len(p.changes), p.complete) for p in pieces] == [(3, False), (3, False), (1, True)]
    assert [c.after["id"] for p in pieces for c in p.changes] == list(range(7))
    assert pieces[0].end <= pieces[1].end < pieces[2].end and bare(pieces[2].end) == head(mariadb_source)


TYPES_TABLE = """CREATE TABLE types (
    id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, mi MEDIUMINT,
    dec65 DECIMAL(65,30), fl DOUBLE, dt DATETIME(6), d DATE, tm TIME(6), t1 TIME(1), t3 TIME(3), t0 TIME, yr YEAR,
    js JSON, bl BLOB,
    vb VARBINARY(16), bn BINARY(4), s VARCHAR(40) CHARACTER SET utf8mb4, tx TEXT CHARACTER SET utf8mb4,
    lat VARCHAR(10) CHARACTER SET latin1, e ENUM('red', 'green'), st SET('a', 'b', 'c'), bt BIT(12),
    nothing INT NULL)"""

TYPES_ROWS = [
    (1, -128, 255, -9223372036854775808, 18446744073709551615, -8388608,
     Decimal("-12345678901234567890123456789012345.123456789012345678901234567891"), 1.5,
     datetime.datetime(2024, 2, 29, 23, 59, 59, 123456), datetime.date(1000, 1, 1),
     datetime.timedelta(hours=-838, minutes=-59, seconds=-58, microseconds=-999999),
     datetime.timedelta(seconds=-1.5), datetime.timedelta(minutes=-3, milliseconds=-7),
     datetime.timedelta(hours=-838, minutes=-59, seconds=-59), 2155,
     '{"k": [1, 2, "ü"]}', bytes(range(256)), b"\x00\xff\x00", b"\x01", "emoji 😀 and é", "text 🚀" * 100,
     "café", "green", "a,c", 0b101000000001, None),
    (2, 127, 0, 9223372036854775807, 0, 8388607, Decimal("0.000000000000000000000000000001"), -0.0,
     datetime.datetime(1000, 1, 1, 0, 0, 0), datetime.date(9999, 12, 31), datetime.timedelta(0),
     datetime.timedelta(hours=838, minutes=59, seconds=58.9), datetime.timedelta(seconds=-0.001),
     datetime.timedelta(hours=-1), 1901,
     "[]", b"", b"", b"\x00\x00\x00\x01", "", "", "", "red", "", 0, None),
    (3, *([None] * 25)),
]


def expected_value(column: str, value):
    """What the source hands on for a value PyMySQL selects: SET is a set, BIT an int."""
    if value is None:
        return None
    if column == "st":
        return set(value.split(",")) if value else set()
    if column == "bt":
        return int.from_bytes(value, "big")
    return value


def test_values_round_trip_with_python_types(mariadb_source, source_db, sources):
    """Each type arrives as the Python value a SELECT returns (SET as a set, BIT as an int)."""
    execute(mariadb_source, source_db, TYPES_TABLE)
    start = head(mariadb_source)
    placeholders = ", ".join(["%s"] * len(TYPES_ROWS[0]))
    execute(mariadb_source, source_db, *[(f"INSERT INTO types VALUES ({placeholders})", row) for row in TYPES_ROWS])
    txs = read(sources(mariadb_source, start), len(TYPES_ROWS), source_db)
    conn = mariadb_source.connect(database=source_db)
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM types ORDER BY id")
        names = [d[0] for d in cur.description]
        selected = [dict(zip(names, row)) for row in cur.fetchall()]
    conn.close()
    for tx, row in zip(txs, selected):
        after = dict(tx.changes[0].after)
        assert after == {name: expected_value(name, value) for name, value in row.items()}
    first = txs[0].changes[0].after
    assert isinstance(first["s"], str) and isinstance(first["bl"], bytes) and first["bn"] == b"\x01\x00\x00\x00"


def test_run_pipeline_end_to_end_matches_the_source_tables(mariadb_source, source_db):
    """run_pipeline from a binlog into a MemorySink ends with the source tables' contents."""
    execute(mariadb_source, source_db, "CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(20), bal DECIMAL(10,2))",
            "CREATE TABLE pair (a INT, b INT, note TEXT, PRIMARY KEY (a, b))")
    start = head(mariadb_source)
    statements = []
    for i in range(40):
        statements.append(f"INSERT INTO acct VALUES ({i}, 'o{i}', {i}.50)")
        statements.append(f"INSERT INTO pair VALUES ({i % 7}, {i}, 'n{i}')")
    statements += ["BEGIN", "UPDATE acct SET bal = bal * 2 WHERE id % 3 = 0", "DELETE FROM pair WHERE a = 2",
                   "UPDATE acct SET id = id + 100 WHERE id < 5", "COMMIT",
                   "CREATE INDEX ix_owner ON acct (owner)", "UPDATE acct SET owner = 'late' WHERE id > 30",
                   "DELETE FROM acct WHERE id BETWEEN 10 AND 14"]
    execute(mariadb_source, source_db, *statements)
    src = MysqlBinlogSource.from_config(
        mariadb_source.source_config(next_server_id(), {"file": start.log, "pos": start.offset}), pipeline="e2e")
    sink = MemorySink()
    result = run_pipeline(src, sink, until_caught_up=True)
    assert result.outcome.value == "caught_up"
    conn = mariadb_source.connect(database=source_db)
    try:
        for table, key in (("acct", ("id",)), ("pair", ("a", "b"))):
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM {table}")
                names = [d[0] for d in cur.description]
                rows = [dict(zip(names, row)) for row in cur.fetchall()]
            expected = {tuple(r[k] for k in key): r for r in rows}
            assert sink.tables[f"{source_db}.{table}"] == expected
    finally:
        conn.close()


@pytest.mark.parametrize(("statement", "expected"), [
    ("ALTER TABLE t ADD COLUMN c INT", ("db", "t")),
    ("CREATE TABLE IF NOT EXISTS `s`.`we``ird` (id INT)", ("s", "we`ird")),
    ("DROP TABLE IF EXISTS `t` /* generated by server */", ("db", "t")),
    ("CREATE OR REPLACE TABLE x.y (i INT)", ("x", "y")),
    ("CREATE TEMPORARY TABLE x.y (i INT)", ("db", None)),  # never in a ROW binlog, never applied
    ("ALTER TABLE `s`.`dot.table` ADD c INT", ("s", "dot.table")),
    ("TRUNCATE TABLE s.t", ("s", "t")),
    ("RENAME TABLE a TO b", ("db", "a")),
    ("CREATE UNIQUE INDEX ix ON s.t (c)", ("s", "t")),
    ("CREATE DATABASE `shop`", ("shop", None)),
    ("DROP SCHEMA IF EXISTS shop", ("shop", None)),
    ("CREATE USER bob", ("db", None)),
    ("CREATE VIEW v AS SELECT 1", ("db", None)),
])
def test_ddl_target_extraction(statement, expected):
    """DDL statements name the schema and table they act on, as far as a regex can tell."""
    assert ddl_target(statement, "db") == expected
