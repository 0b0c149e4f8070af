"""`setl.snapshot.rows.fetch_dicts` reads exactly the values PyMySQL's own cursor reads: every type,
NULLs, lengths on each side of the wire format's 1-, 2-, 3- and 8-byte length prefixes, a row in
several packets, errors in the middle of a result; and the connection stays usable after it."""

from __future__ import annotations

import contextlib
import threading

import pymysql
import pytest

from setl.snapshot import rows
from setl.snapshot.reader import ChunkReader

pytestmark = pytest.mark.timeout(300)

COLUMNS = ("id", "b", "st", "e", "j", "bl", "dc", "f", "dbl", "t", "ts6", "yr", "ch", "u", "d", "dt", "vb", "ti",
           "big", "neg")


def _table(server, db: str) -> None:
    with contextlib.closing(server.connect(database=db)) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("CREATE TABLE kinds (id BIGINT UNSIGNED PRIMARY KEY, b BIT(10), st SET('a','b','c'), "
                    "e ENUM('x','y'), j JSON, bl LONGBLOB, dc DECIMAL(30,10), f FLOAT, dbl DOUBLE, t TIME(6), "
                    "ts6 TIMESTAMP(6) NULL, yr YEAR, ch CHAR(3) CHARACTER SET latin1, u LONGTEXT CHARACTER SET "
                    "utf8mb4, d DATE, dt DATETIME, vb VARBINARY(300), ti TINYINT, big BIGINT, neg INT)")
        values = []
        for i, size in enumerate((0, 1, 250, 251, 252, 65535, 65536, 70000, 16_777_215, 16_777_216)):
            text = ("é" * (size // 2)) + ("x" * (size % 2))
            blob = bytes([0xFE, 0xFF, 0xFB, 0x00, 0x27, 0x5C] * (size // 6 + 1))[:size]
            values.append((i + 1, i, "a,c" if i % 2 else "", "y", '{"k": [1, "é"]}', blob, "-12345.0000000001",
                           1.5, 2.25e-300, "-838:59:59.000000", "2038-01-19 03:14:07.999999", 2024, "abc",
                           text, "0000-00-00" if i % 3 == 0 else "2024-02-29", "2024-00-15 10:00:00",
                           blob[:300], -128, -(2 ** 63), None))
        values.append((99, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
                       None, None, None, None, None))
        for row in values:
            cur.execute("INSERT INTO kinds VALUES (" + ", ".join(["%s"] * len(row)) + ")", row)


@pytest.fixture
def kinds(mariadb_source, source_db):
    with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL max_allowed_packet = 64 * 1024 * 1024")
    _table(mariadb_source, source_db)
    return mariadb_source, source_db


def _connect(server, db: str) -> pymysql.connections.Connection:
    conn = server.connect(database=db, charset="utf8mb4")
    ChunkReader.prepare(conn)
    return conn


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_same_values_as_the_cursor(kinds, monkeypatch, compiled) -> None:
    """Every row and value equals what PyMySQL's cursor returns, large rows and NULLs included,
    and the connection answers the next query: rows parsed in C, and by the Python loop."""
    assert rows.COMPILED, "the compiled row parser is not built"
    monkeypatch.setattr(rows, "COMPILED", compiled)
    server, db = kinds
    with contextlib.closing(_connect(server, db)) as conn:
        assert rows.supported(conn)
        query = "SELECT " + ", ".join(f"`{c}`" for c in COLUMNS) + " FROM kinds WHERE id > %s ORDER BY id"
        got = rows.fetch_dicts(conn, query, [0], COLUMNS)
        with conn.cursor() as cur:
            cur.execute(query, [0])
            expected = [dict(zip(COLUMNS, row)) for row in cur.fetchall()]
            assert got == expected
            assert [{k: type(v) for k, v in row.items()} for row in got] == \
                [{k: type(v) for k, v in row.items()} for row in expected]
            assert len(got) == 11 and max(len(row["bl"] or b"") for row in got) == 16_777_216
            cur.execute("SELECT 1")
            assert cur.fetchall() == ((1,),)


def test_no_rows_and_percent_in_names(kinds) -> None:
    """An empty result is an empty list; `%` doubled in the statement is a plain `%` to the server."""
    server, db = kinds
    with contextlib.closing(_connect(server, db)) as conn:
        assert rows.fetch_dicts(conn, "SELECT id AS `a%%b` FROM kinds WHERE id < %s", [0], ["a%b"]) == []
        assert rows.fetch_dicts(conn, "SELECT id AS `a%%b` FROM kinds WHERE id = %s", [99], ["a%b"]) == \
            [{"a%b": 99}]


def test_error_in_the_result_is_raised_and_the_connection_recovers(kinds) -> None:
    """A server error while rows stream (a failing expression in a later row) is PyMySQL's error, and
    the connection answers the next query."""
    server, db = kinds
    with contextlib.closing(_connect(server, db)) as conn:
        with pytest.raises(pymysql.err.MySQLError, match="more than 1 row"):
            rows.fetch_dicts(conn, "SELECT id, IF(id = 5, (SELECT id FROM kinds), 0) FROM kinds ORDER BY id", [],
                             ["id", "x"])
        assert rows.fetch_dicts(conn, "SELECT %s AS x", [7], ["x"]) == [{"x": 7}]


def test_lost_connection_is_an_operational_error(kinds) -> None:
    """The connection killed while a result streams raises PyMySQL's lost-connection error."""
    server, db = kinds
    with contextlib.closing(_connect(server, db)) as conn:
        ident = conn.thread_id()
        with contextlib.closing(server.connect()) as killer, killer.cursor() as cur:
            timer = threading.Timer(1.0, lambda: cur.execute(f"KILL CONNECTION {ident}"))
            timer.start()
            try:
                with pytest.raises(pymysql.err.OperationalError):
                    rows.fetch_dicts(conn, "SELECT `bl`, SLEEP(IF(id = 8, 30, 0)) FROM kinds ORDER BY id", [],
                                     ["bl", "s"])
            finally:
                timer.join()


def test_fallback_reads_the_same(kinds, monkeypatch) -> None:
    """Through PyMySQL's cursor (a connection without the internals read) the rows are the same."""
    server, db = kinds
    query = "SELECT " + ", ".join(f"`{c}`" for c in COLUMNS) + " FROM kinds WHERE id IN (%s, %s) ORDER BY id"
    with contextlib.closing(_connect(server, db)) as conn:
        fast = rows.fetch_dicts(conn, query, [2, 99], COLUMNS)
        monkeypatch.setattr(rows, "supported", lambda conn: False)
        assert rows.fetch_dicts(conn, query, [2, 99], COLUMNS) == fast
        assert len(fast) == 2


def test_a_connection_without_the_packet_internals_reads_through_the_cursor(kinds, monkeypatch) -> None:
    """A connection without one of the PyMySQL internals the reader uses (another release) is read
    through PyMySQL's cursor, with the same rows."""
    server, db = kinds
    with contextlib.closing(_connect(server, db)) as conn:
        assert rows.supported(conn)
        fast = rows.fetch_dicts(conn, "SELECT id FROM kinds WHERE id = %s", [2], ["id"])
        monkeypatch.setattr(rows.pymysql_io, "_PACKET_INTERNALS", (*rows.pymysql_io._PACKET_INTERNALS, "_gone"))
        assert not rows.supported(conn)
        read: list[str] = []
        through = rows._through_cursor
        monkeypatch.setattr(rows, "_through_cursor", lambda conn, query, names: read.append(query) or
                            through(conn, query, names))
        assert rows.fetch_dicts(conn, "SELECT id FROM kinds WHERE id = %s", [2], ["id"]) == fast == [{"id": 2}]
        assert read == ["SELECT id FROM kinds WHERE id = 2"]


def test_the_compiled_parser_reads_integers_and_refuses_short_packets() -> None:
    """Integer text as int() reads it (signs, leading zeros, past 18 digits); a packet shorter
    than its columns or a value running past its end is an error, not a short value."""
    from setl.snapshot._rowparse import RowParser

    parser = RowParser([("a", None, int), ("b", "utf8", None), ("c", None, None), ("d", "ascii", float)])
    numbers = [b"0", b"-0", b"007", b"-9223372036854775808", b"18446744073709551615", b"123456789012345678",
               b"-12345678901234567890123"]
    for text in numbers:
        packet = bytes([len(text)]) + text + b"\x02\xc3\xa9" + b"\xfb" + b"\x031.5"
        assert parser.parse(packet) == {"a": int(text), "b": "\u00e9", "c": None, "d": 1.5}
        assert type(parser.parse(packet)["a"]) is int
    with pytest.raises(ValueError):
        parser.parse(b"\x011")
    with pytest.raises(ValueError):
        parser.parse(b"\x011\x05ab")
    with pytest.raises(UnicodeDecodeError):
        parser.parse(b"\x011\x01\xff\xfb\x011")
