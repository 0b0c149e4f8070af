"""The compiled row decoder (`setl.sources.mysql_binlog._rows`) hands on exactly what setl's Python
decoder (`rowcodec`) does.

Each test writes rows of every column type (edge values: extremes, NULLs, zero and partial dates,
negative times with fractions, DECIMAL(65,30), every charset family, SET of 64 members, BIT(1..64),
empty and long values, partial images) to a real MariaDB, reads the same binlog range with the
compiled decoder and with the Python one, and compares every value with its Python type
(``1 == 1.0 == True`` and ``Decimal('1.0') == Decimal('1.00')`` would hide a difference, so values
are compared by type and repr).
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
from typing import Any

import pytest

from setl import _compiled
from setl.errors import CorruptEvent
from setl.model import InvalidDate, Transaction
from setl.sources.mysql_binlog import fast
from tests.helpers.wait import wait_until
from tests.sources.binlog import bare, execute, head
from tests.sources.test_mysql_binlog_stream import drain

pytestmark = pytest.mark.timeout(120)

#: SETL_PURE_PYTHON=1 (.ci/run's second pass): nothing is compiled, both reads are the Python decoder's
#: and every test checks that no compiled decoder ran
PURE = _compiled.pure_python()

WIDE = """CREATE TABLE wide (
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, miu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  f FLOAT, d DOUBLE, f2 FLOAT(7,3),
  dc DECIMAL(65,30), dc2 DECIMAL(10,2), dc3 DECIMAL(5,5), dc4 DECIMAL(18,0), dc5 DECIMAL(9,4), dc6 DECIMAL(20,10),
  c CHAR(10), vc VARCHAR(300), vcs VARCHAR(20) CHARACTER SET latin1, vca VARCHAR(20) CHARACTER SET ascii,
  vc16 VARCHAR(10) CHARACTER SET utf16, vcu VARCHAR(10) CHARACTER SET ucs2, vc32 VARCHAR(10) CHARACTER SET utf32,
  vcg VARCHAR(10) CHARACTER SET gbk, vcsw VARCHAR(10) CHARACTER SET swe7,
  cb CHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  vcb VARBINARY(20), bn BINARY(8), t TEXT, mt MEDIUMTEXT, lb LONGBLOB, tb TINYBLOB, tt TINYTEXT,
  dt DATE, dtt DATETIME(6), dt0 DATETIME, dt3 DATETIME(3), dt1 DATETIME(1),
  ts TIMESTAMP(6) NULL DEFAULT NULL, ts0 TIMESTAMP NULL DEFAULT NULL, ts2 TIMESTAMP(2) NULL DEFAULT NULL,
  tm TIME(6), tm0 TIME, tm1 TIME(1), tm4 TIME(4), y YEAR,
  e ENUM('a','b','ccc'), u UUID, i6 INET6, i4 INET4
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

COLUMNS = ["id", "ti", "tiu", "si", "siu", "mi", "miu", "i", "iu", "bi", "biu", "f", "d", "f2",
           "dc", "dc2", "dc3", "dc4", "dc5", "dc6", "c", "vc", "vcs", "vca", "vc16", "vcu", "vc32", "vcg", "vcsw", "cb",
           "vcb", "bn", "t", "mt", "lb", "tb", "tt", "dt", "dtt", "dt0", "dt3", "dt1", "ts", "ts0", "ts2",
           "tm", "tm0", "tm1", "tm4", "y", "e", "u", "i6", "i4"]

_D = decimal.Decimal
ROWS: list[tuple[Any, ...]] = [
    (1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
     -3.4e38, -1.7976931348623157e308, -9999.999,
     _D("-" + "9" * 35 + "." + "9" * 30), _D("-99999999.99"), _D("-0.99999"), _D("-999999999999999999"),
     _D("-99999.9999"), _D("-1234567890.0123456789"),
     "", "", "", "", "", "", "", "", "", "", b"", b"", "", "", b"", b"", "",
     "1000-01-01", "1000-01-01 00:00:00.000000", "1000-01-01 00:00:00", "1000-01-01 00:00:00.001",
     "1000-01-01 00:00:00.1", "1970-01-01 00:00:01.000001", "1970-01-01 00:00:01", "1970-01-01 00:00:01.01",
     "-838:59:59.000000", "-838:59:59", "-00:00:01.5", "-00:00:00.0001", 1901, "a",
     "00000000-0000-0000-0000-000000000000", "::", "0.0.0.0"),
    (2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807,
     18446744073709551615, 3.4e38, 1.7976931348623157e308, 9999.999,
     _D("9" * 35 + "." + "9" * 30), _D("99999999.99"), _D("0.99999"), _D("999999999999999999"),
     _D("99999.9999"), _D("1234567890.0123456789"),
     "ünïcødé 😀", "x" * 300, "café", "plain", "𝄞 utf16", "ucs2 é", "😀 utf32", "中文", "abc", "Trail  ",
     b"\x00\x01\xff", b"\x01\x00\x00", "t" * 1000, "m" * 70000, b"\x00" * 10 + b"\xff" * 100000, b"\x80",
     "tiny text",
     "9999-12-31", "9999-12-31 23:59:59.999999", "9999-12-31 23:59:59", "9999-12-31 23:59:59.999",
     "9999-12-31 23:59:59.9", "2038-01-19 03:14:07.999999", "2038-01-19 03:14:07", "2038-01-19 03:14:07.99",
     "838:59:59.000000", "838:59:59", "00:00:01.5", "12:34:56.7891", 2155, "ccc",
     "ffffffff-ffff-ffff-ffff-ffffffffffff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "255.255.255.255"),
    (3, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0.0, -0.0, 0.0,
     _D("0"), _D("0.01"), _D("0.00001"), _D("0"), _D("-0.0001"), _D("0.0000000001"),
     "a", " lead", "ÿ", "~", "a", "b", "c", "d", "e", "a ",
     b"\x00", b"\x00" * 8, "", "", b"", b"", "",
     "0000-00-00", "0000-00-00 00:00:00.000000", "0000-00-00 00:00:00", "2024-02-29 12:00:00.5",
     "2024-00-15 00:00:00.0", None, None, None,
     "00:00:00.000000", "00:00:00", "-00:00:00.1", "00:00:00.0001", 0, "",
     "12345678-9abc-def0-1234-56789abcdef0", "2001:db8::1", "10.0.0.1"),
    (4,) + (None,) * (len(COLUMNS) - 1),
    (5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1.5, 2.25, 1.125,
     _D("12345.678901234567890123456789012345"), _D("-1.05"), _D("0.5"), _D("42"), _D("3.1415"), _D("-0.5"),
     "zzz", "yyy", "xxx", "www", "vvv", "uuu", "ttt", "sss", "rrr", "qqq",
     b"pp", b"oo", "nn", "mm", b"ll", b"kk", "jj",
     "2024-00-15", "2024-13-01 00:00:00.000000", "2024-01-01 25:00:00", "2024-02-30 00:00:00.000",
     "2024-01-01 00:00:00.0", "2001-09-09 01:46:40.123456", "2001-09-09 01:46:40", "2001-09-09 01:46:40.12",
     "-12:00:00.999999", "-00:00:01", "23:59:59.9", "-23:59:59.9999", 2000, "b",
     "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "fe80::1:2", "192.168.1.1"),
]


def typed(value: Any) -> Any:
    """A value with its type, so that equal-comparing values of different types differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    if isinstance(value, (frozenset, set)):
        return (type(value).__name__, sorted(map(repr, value)))
    return (type(value).__name__, repr(value))


def changes(transactions: list[Transaction]) -> list[Any]:
    return [typed((c.op, c.schema, c.table, c.before, c.after)) for tx in transactions for c in tx.changes
            if getattr(c, "op", None) is not None]


def read_both(server, sources, start, end, **kwargs) -> tuple[list[Transaction], list[Transaction], Any]:
    quick = sources(server, start, fast_decoder=True, **kwargs)
    plain = sources(server, start, fast_decoder=False, **kwargs)
    got_fast = drain(quick, lambda got: bool(got) and bare(got[-1].end) == end)
    got_plain = drain(plain, lambda got: bool(got) and bare(got[-1].end) == end)
    assert quick.row_decoders.compiled is not PURE and plain.row_decoders.compiled is False
    assert plain.row_decoders.fast == 0 and plain.row_decoders.slow > 0  # every rows event read in Python
    return got_fast, got_plain, quick.row_decoders


def decoded(decoders: Any) -> tuple[int, int]:
    """(rows events the decoder of this build read, those the other one read): the compiled one's, or
    under SETL_PURE_PYTHON=1 the Python one's, first."""
    return (decoders.slow, decoders.fast) if PURE else (decoders.fast, decoders.slow)


def test_the_decoder_is_built():
    """`pip install -e .` builds the compiled modules; a missing build would silently cost the fast path.
    Under SETL_PURE_PYTHON=1 every one of them runs from its .py instead."""
    from setl.sinks import merge, mysql_sql
    from setl.snapshot import rows
    from setl.sources.mysql_binlog import assembler, frames

    assert fast.available() is not PURE
    for module in (fast, assembler, frames, rows, merge, mysql_sql):
        assert str(module.__file__).endswith(".py") is PURE, module.__file__


def test_every_supported_type_decodes_exactly_as_the_python_decoder(mariadb_source, source_db, sources):
    """Every common type at its edges: the compiled decoder's rows equal the Python decoder's, value and type."""
    execute(mariadb_source, source_db, "SET SESSION sql_mode = ''", WIDE)
    start = head(mariadb_source)
    marks = ", ".join(["%s"] * len(COLUMNS))
    statements: list[Any] = ["SET SESSION sql_mode = ''"]
    statements += [(f"INSERT INTO wide VALUES ({marks})", row) for row in ROWS]
    statements += ["UPDATE wide SET vc = CONCAT(vc, '!'), dc = -dc, tm = '-01:02:03.456789' WHERE id IN (1, 2, 5)",
                   "UPDATE wide SET ti = NULL, e = 'b', u = NULL WHERE id = 3",
                   "UPDATE wide SET ti = 1 WHERE id = 4",
                   "DELETE FROM wide WHERE id IN (2, 4)",
                   "INSERT INTO wide (id, lb) VALUES (6, REPEAT('z', 4 * 1024 * 1024))"]
    execute(mariadb_source, source_db, *statements)
    end = head(mariadb_source)
    got_fast, got_plain, decoders = read_both(mariadb_source, sources, start, end)
    ours, others = decoded(decoders)
    assert ours >= len(statements) - 1 and others == 0, (decoders.fast, decoders.slow)
    # GTID and XID events (read by the fast path too) end the same transactions at the same positions
    assert [(tx.end, tx.complete) for tx in got_fast] == [(tx.end, tx.complete) for tx in got_plain]
    assert all(tx.end.gtid for tx in got_fast)
    expected, actual = changes(got_plain), changes(got_fast)
    assert len(expected) == len(ROWS) + 3 + 1 + 1 + 2 + 1
    for want, have in zip(expected, actual):
        assert have == want
    assert actual == expected
    # spot checks that the comparison compares something real
    first = got_fast[0].changes[0].after
    assert first["dc"] == _D("-" + "9" * 35 + "." + "9" * 30) and isinstance(first["dtt"], datetime.datetime)
    assert first["tm1"] == -datetime.timedelta(seconds=1, microseconds=500000)


SET64 = ", ".join(f"'m{i}'" for i in range(64))


def test_set_bit_json_and_spatial_columns_decode_the_same_both_ways(mariadb_source, source_db, sources):
    """SET (to 64 members), BIT(1..64), JSON and spatial columns: setl's decoders read them (never the
    library), into the same values, and the values are the ones written."""
    execute(mariadb_source, source_db,
            f"CREATE TABLE odd (id INT PRIMARY KEY, s SET('x','y','z'), s64 SET({SET64}), b BIT(10), b1 BIT(1), "
            "b64 BIT(64), j JSON, g POINT, gg GEOMETRY, dt0 DATETIME, v VARCHAR(5))",
            "CREATE TABLE plainer (id INT PRIMARY KEY, v VARCHAR(5))")
    start = head(mariadb_source)
    execute(mariadb_source, source_db,
            "INSERT INTO odd VALUES (1, 'x,z', 'm0,m63', b'1010101010', b'1', 0xFFFFFFFFFFFFFFFF, "
            "'{\"a\": [1, 2.5]}', POINT(1, 2), ST_GeomFromText('LINESTRING(0 0, 1 1)'), '2020-01-01', 'v')",
            "INSERT INTO odd VALUES (2, '', '', b'0', b'0', 0, NULL, NULL, NULL, NULL, NULL)",
            "INSERT INTO plainer VALUES (1, 'p')",
            "UPDATE odd SET s = 'y', s64 = 'm31,m32,m62' WHERE id = 1", "DELETE FROM odd WHERE id = 2")
    end = head(mariadb_source)
    got_fast, got_plain, decoders = read_both(mariadb_source, sources, start, end)
    assert decoded(decoders) == (5, 0), (decoders.fast, decoders.slow)
    assert changes(got_fast) == changes(got_plain) and len(changes(got_fast)) == 5
    first = got_fast[0].changes[0].after
    assert first["s"] == frozenset({"x", "z"}) and first["s64"] == frozenset({"m0", "m63"})
    assert (first["b"], first["b1"], first["b64"]) == (0b1010101010, 1, (1 << 64) - 1)
    assert first["j"] == '{"a": [1, 2.5]}' and first["dt0"] == datetime.datetime(2020, 1, 1)
    empty = got_fast[1].changes[0].after
    assert (empty["s"], empty["s64"], empty["b"], empty["b64"], empty["j"]) == (frozenset(), frozenset(), 0, 0, None)
    assert got_fast[3].changes[0].after["s64"] == frozenset({"m31", "m32", "m62"})


def test_minimal_row_images_decode_the_same_both_ways(mariadb_source, source_db, sources):
    """A session with binlog_row_image=MINIMAL logs partial images: both decoders read them, alike."""
    execute(mariadb_source, source_db, "CREATE TABLE mini (id INT PRIMARY KEY, a INT, b VARCHAR(5))",
            "INSERT INTO mini VALUES (1, 1, 'a')")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "SET SESSION binlog_row_image = 'MINIMAL'",
            "UPDATE mini SET a = 2 WHERE id = 1", "SET SESSION binlog_row_image = 'FULL'",
            "UPDATE mini SET a = 3 WHERE id = 1")
    end = head(mariadb_source)
    quick = sources(mariadb_source, start, fast_decoder=True)
    plain = sources(mariadb_source, start, fast_decoder=False)

    got = drain(quick, lambda got: bool(got) and bare(got[-1].end) == end)
    assert changes(got) == changes(drain(plain, lambda got: bool(got) and bare(got[-1].end) == end))
    minimal, full = (tx.changes[0] for tx in got)
    assert (dict(minimal.before), dict(minimal.after)) == ({"id": 1}, {"a": 2}) and minimal.partial
    assert (full.before, full.after) == ({"id": 1, "a": 2, "b": "a"}, {"id": 1, "a": 3, "b": "a"})
    assert decoded(quick.row_decoders) == (2, 0)


def test_an_event_larger_than_one_packet_is_joined_from_its_pieces(mariadb_source, source_db, sources):
    """A row event over 16 MiB arrives in several protocol packets: the reader's own framing joins
    them as PyMySQL does, and the rows that follow it are read in step."""
    big = bytes(range(256)) * (17 * 4096 + 3)  # 17 MiB and 768 bytes
    old = mariadb_source.query("SELECT @@GLOBAL.max_allowed_packet")[0][0]
    mariadb_source.query("SET GLOBAL max_allowed_packet = 64 * 1024 * 1024")
    try:
        execute(mariadb_source, source_db, "CREATE TABLE blobs (id INT PRIMARY KEY, b LONGBLOB, v VARCHAR(5))")
        start = head(mariadb_source)
        execute(mariadb_source, source_db, ("INSERT INTO blobs VALUES (1, %s, 'a')", (big,)),
                "INSERT INTO blobs VALUES (2, 'small', 'b')", "UPDATE blobs SET v = 'c' WHERE id = 1")
        end = head(mariadb_source)
    finally:
        mariadb_source.query(f"SET GLOBAL max_allowed_packet = {int(old)}")
    assert end.offset - start.offset > 2 * len(big)  # the insert and the update's two images
    got_fast, got_plain, decoders = read_both(mariadb_source, sources, start, end)
    assert decoded(decoders) == (3, 0), (decoders.fast, decoders.slow)
    fast_rows = [(c.op, c.after or c.before) for c in changes_of(got_fast)]
    plain_rows = [(c.op, c.after or c.before) for c in changes_of(got_plain)]
    assert fast_rows == plain_rows
    assert [row["b"] == big for _, row in fast_rows] == [True, False, True]
    assert [tx.end for tx in got_fast] == [tx.end for tx in got_plain]


def changes_of(transactions: list[Transaction]) -> list[Any]:
    return [c for tx in transactions for c in tx.changes]


def old_format_table(server: Any, db: str, create: str) -> None:
    """`create` run under ``mysql56_temporal_format=OFF`` (MariaDB 5.3-10.0's temporal formats), then a
    wait until the server's clock has left the second that wrote the table's definition (setl reads
    an old-format column only from events written after it)."""
    server.query("SET GLOBAL mysql56_temporal_format = OFF")
    try:
        execute(server, db, create)
    finally:
        server.query("SET GLOBAL mysql56_temporal_format = ON")
    table = create.split()[2]
    made = server.query("SELECT UNIX_TIMESTAMP(CREATE_TIME) FROM information_schema.TABLES "
                        f"WHERE TABLE_SCHEMA = '{db}' AND TABLE_NAME = '{table}'")[0][0]
    assert made is not None
    wait_until(lambda: server.query("SELECT UNIX_TIMESTAMP()")[0][0] > made, timeout=5, interval=0.05,
               message="the server's clock past the table's definition")


def source_rows(server: Any, db: str, table: str) -> dict[int, dict[str, Any]]:
    """The table's rows as the source holds them (TIMESTAMPs in UTC), by id; zero dates as their text."""
    with contextlib.closing(server.connect(database=db, init_command="SET time_zone = '+00:00'")) as conn:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{table}` ORDER BY id")
            names = [d[0] for d in cur.description]
            return {row[0]: dict(zip(names, row)) for row in cur.fetchall()}


def plain(image: dict[str, Any] | None) -> dict[str, Any] | None:
    """An image with `InvalidDate` as its text, as PyMySQL reads a zero date."""
    if image is None:
        return None
    return {k: v.text if isinstance(v, InvalidDate) else v for k, v in image.items()}


OLD_ROWS = [(1, "-838:59:59", "0000-00-00 00:00:00", "1970-01-01 00:00:01"),
            (2, "838:59:59", "9999-12-31 23:59:59", "2038-01-19 03:14:07"),
            (3, "00:00:00", "1000-01-01 00:00:00", None),
            (4, "-00:00:01", "2024-02-29 12:34:56", "2024-02-29 12:34:56"),
            (5, None, "2024-00-15 01:02:03", 0)]


@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "python"])
def test_mariadb_pre_10_1_whole_second_temporals_decode_as_the_source_holds_them(mariadb_source, source_db, sources,
                                                                                   fast_decoder):
    """A TIME, DATETIME and TIMESTAMP of MariaDB's pre-10.1 formats of precision 0 (information_schema)
    are MySQL 5.5's: both decoders read their inserts, updates and deletes equal to the source's values,
    at the edges (negative and 838-hour TIMEs, zero and partial dates, a zero TIMESTAMP)."""
    old_format_table(mariadb_source, source_db, "CREATE TABLE old0 (id INT PRIMARY KEY, tm TIME, dt DATETIME, "
                                                "ts TIMESTAMP NULL DEFAULT NULL)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "SET SESSION sql_mode = ''", "SET SESSION time_zone = '+00:00'",
            *[("INSERT INTO old0 VALUES (%s, %s, %s, %s)", row) for row in OLD_ROWS])
    inserted = source_rows(mariadb_source, source_db, "old0")
    execute(mariadb_source, source_db, "SET SESSION time_zone = '+00:00'",
            "UPDATE old0 SET tm = '-12:34:56', dt = '2001-02-03 04:05:06', ts = '2001-02-03 04:05:06' WHERE id = 3",
            "DELETE FROM old0 WHERE id = 1")
    end = head(mariadb_source)
    src = sources(mariadb_source, start, fast_decoder=fast_decoder)
    got = changes_of(drain(src, lambda got: bool(got) and bare(got[-1].end) == end))
    compiled = fast_decoder and not PURE
    assert (src.row_decoders.fast, src.row_decoders.slow) == ((7, 0) if compiled else (0, 7))
    now = source_rows(mariadb_source, source_db, "old0")
    assert [(c.op.value, plain(c.before), plain(c.after)) for c in got] == \
        [("insert", None, inserted[i]) for i in sorted(inserted)] + \
        [("update", inserted[3], now[3]), ("delete", inserted[1], None)]
    assert now[3]["tm"] == -datetime.timedelta(hours=12, minutes=34, seconds=56)  # the comparison compares values
    assert inserted[5]["ts"] == "0000-00-00 00:00:00" and inserted[1]["dt"] == "0000-00-00 00:00:00"


HIRES_COLUMNS = ", ".join(f"{name}{n} {kind}({n})" + (" NULL DEFAULT NULL" if kind == "TIMESTAMP" else "")
                          for name, kind in (("tm", "TIME"), ("dt", "DATETIME"), ("ts", "TIMESTAMP"))
                          for n in range(7))
HIRES_ROWS = [(1, "-838:59:59.999999", "9999-12-31 23:59:59.999999", "2038-01-19 03:14:07.999999"),
              (2, "-00:00:01.5", "0000-00-00 00:00:00", 0),
              (3, "-00:00:00.000001", "1000-01-01 00:00:00.000001", "1970-01-01 00:00:01.000001"),
              (4, "838:59:59.999999", "2024-00-15 01:02:03.5", "2024-02-29 12:34:56.654321"),
              (5, "00:00:00", "2024-02-29 12:34:56.654321", None)]


@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "python"])
def test_mariadb_pre_10_1_fractional_temporals_of_every_precision_decode_as_the_source_holds_them(
        mariadb_source, source_db, sources, fast_decoder):
    """MariaDB's pre-10.1 TIME, DATETIME and TIMESTAMP of every precision 0-6 (its own fractional formats,
    sized by the precision information_schema gives): both decoders read inserts, an update and a delete
    equal to the source's values (negative and extreme TIMEs, zero and partial dates, a zero TIMESTAMP)."""
    old_format_table(mariadb_source, source_db, f"CREATE TABLE hires (id INT PRIMARY KEY, {HIRES_COLUMNS})")
    start = head(mariadb_source)
    inserts = [(f"INSERT INTO hires VALUES (%s{', %s' * 21})", (key, *[t] * 7, *[d] * 7, *[ts] * 7))
               for key, t, d, ts in HIRES_ROWS]
    execute(mariadb_source, source_db, "SET SESSION sql_mode = ''", "SET SESSION time_zone = '+00:00'", *inserts)
    inserted = source_rows(mariadb_source, source_db, "hires")
    sets = ", ".join(f"tm{n} = '-12:34:56.123456', dt{n} = '2001-02-03 04:05:06.789012', "
                     f"ts{n} = '2001-02-03 04:05:06.789012'" for n in range(7))
    execute(mariadb_source, source_db, "SET SESSION time_zone = '+00:00'",
            f"UPDATE hires SET {sets} WHERE id = 5", "DELETE FROM hires WHERE id = 1")
    end = head(mariadb_source)
    src = sources(mariadb_source, start, fast_decoder=fast_decoder)
    got = changes_of(drain(src, lambda got: bool(got) and bare(got[-1].end) == end))
    compiled = fast_decoder and not PURE
    assert (src.row_decoders.fast, src.row_decoders.slow) == ((7, 0) if compiled else (0, 7))
    now = source_rows(mariadb_source, source_db, "hires")
    assert [(c.op.value, plain(c.before), plain(c.after)) for c in got] == \
        [("insert", None, inserted[i]) for i in sorted(inserted)] + \
        [("update", inserted[5], now[5]), ("delete", inserted[1], None)]
    # the comparison compares values of every width
    assert now[5]["tm6"] == -datetime.timedelta(hours=12, minutes=34, seconds=56, microseconds=123456)
    assert now[5]["dt3"] == datetime.datetime(2001, 2, 3, 4, 5, 6, 789000)
    assert inserted[1]["tm5"] == -datetime.timedelta(hours=838, minutes=59, seconds=59, microseconds=999990)
    assert inserted[2]["ts4"] == "0000-00-00 00:00:00.0000" and inserted[4]["dt2"] == "2024-00-15 01:02:03.50"


@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "python"])
def test_mariadb_pre_10_1_temporals_of_a_dropped_table_stop_the_reader_naming_the_column(mariadb_source, source_db,
                                                                                        sources, fast_decoder):
    """An old-format TIME whose table has since been dropped has no precision to read it by (its table
    map does not give it): the reader stops at the event, in one line naming the table, the column, the
    position and why, instead of guessing."""
    old_format_table(mariadb_source, source_db, "CREATE TABLE old_t (id INT PRIMARY KEY, tm TIME(3), v INT)")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO old_t VALUES (1, '-01:02:03.456', 7)", "DROP TABLE old_t")
    src = sources(mariadb_source, start, fast_decoder=fast_decoder)
    with pytest.raises(CorruptEvent) as caught:
        drain(src, lambda got: False, timeout=15)
    text = str(caught.value)
    assert f"table={source_db}.old_t" in text and f"{start.log}:" in text and "\n" not in text, text
    assert "tm: a TIME of MariaDB's pre-10.1 formats, whose precision neither its table map nor the server " \
        "(which has no such column there now) gives" in text, text


def test_mariadb_pre_10_1_temporals_of_a_prepared_xa_transaction_decode_at_its_commit(mariadb_source, source_db,
                                                                                      sources):
    """The rows of an XA PREPARE, read again from the binlog at its XA COMMIT, decode MariaDB's pre-10.1
    fractional temporals as the reader's own stream does: equal to the source's values."""
    old_format_table(mariadb_source, source_db, "CREATE TABLE old_x (id INT PRIMARY KEY, tm TIME(2), dt DATETIME(5))")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "XA START 'ox'", "INSERT INTO old_x VALUES (1, '-00:00:01.25', "
            "'2024-02-29 12:34:56.12345')", "XA END 'ox'", "XA PREPARE 'ox'")
    execute(mariadb_source, source_db, "XA COMMIT 'ox'")
    end = head(mariadb_source)
    src = sources(mariadb_source, start)
    got = changes_of(drain(src, lambda got: bool(got) and bare(got[-1].end) == end))
    assert [(c.op.value, c.after) for c in got] == [("insert", source_rows(mariadb_source, source_db, "old_x")[1])]
    assert got[0].after["tm"] == -datetime.timedelta(seconds=1, microseconds=250000)


def test_an_innodb_table_swapped_in_by_rename_after_the_event_stops_the_reader(mariadb_source, source_db, sources):
    """An old-format DATETIME(6) table renamed away after its rows were logged, and an older DATETIME
    (precision 0, the same table map) renamed into its name: InnoDB dates the rename (CREATE_TIME), so
    the reader stops at the event instead of reading the fractional bytes as MySQL 5.5's."""
    old_format_table(mariadb_source, source_db, "CREATE TABLE swap_b (id INT PRIMARY KEY, dt DATETIME)")
    old_format_table(mariadb_source, source_db, "CREATE TABLE swap_a (id INT PRIMARY KEY, dt DATETIME(6))")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO swap_a VALUES (1, '2024-02-29 12:34:56.654321')",
            "RENAME TABLE swap_a TO swap_old, swap_b TO swap_a")
    src = sources(mariadb_source, start)
    with pytest.raises(CorruptEvent) as caught:
        drain(src, lambda got: False, timeout=15)
    text = str(caught.value)
    assert f"table={source_db}.swap_a" in text and f"{start.log}:" in text and "\n" not in text, text
    assert "dt: a TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 formats, whose table the server redefined" \
        in text, text


@pytest.mark.parametrize("engine", ["MyISAM", "Aria"])
def test_mariadb_pre_10_1_temporals_of_a_table_a_rename_leaves_undated_stop_the_reader(mariadb_source, source_db,
                                                                                     sources, engine):
    """An old-format DATETIME in a MyISAM or Aria table, whose CREATE_TIME a RENAME TABLE keeps (a table
    swapped in under the name later would look as old as the event): the reader stops at the event in one
    line naming the table, the column, the engine and the fix, instead of trusting today's precision."""
    old_format_table(mariadb_source, source_db, f"CREATE TABLE old_m (id INT PRIMARY KEY, dt DATETIME) ENGINE={engine}")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO old_m VALUES (1, '2024-02-29 12:34:56')")
    src = sources(mariadb_source, start)
    with pytest.raises(CorruptEvent) as caught:
        drain(src, lambda got: False, timeout=15)
    text = str(caught.value)
    assert f"table={source_db}.old_m" in text and f"{start.log}:" in text and "\n" not in text, text
    assert f"dt: a TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 formats in a {engine} table" in text, text
    assert "ENGINE=InnoDB" in text, text


@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "python"])
def test_an_old_temporal_column_altered_after_its_event_stops_the_reader(mariadb_source, source_db, sources,
                                                                          fast_decoder):
    """An old-format DATETIME(6) whose rows were logged before an ALTER made it DATETIME (precision 0,
    still the old format: the same table map) is not read with today's precision: the reader stops at
    the first event older than the table's definition, naming the column and why, instead of reading
    the fractional format's bytes as MySQL 5.5's."""
    old_format_table(mariadb_source, source_db, "CREATE TABLE old_a (id INT PRIMARY KEY, dt DATETIME(6))")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO old_a VALUES (1, '2024-02-29 12:34:56.654321')")
    mariadb_source.query("SET GLOBAL mysql56_temporal_format = OFF")
    try:
        execute(mariadb_source, source_db, "ALTER TABLE old_a MODIFY dt DATETIME")
    finally:
        mariadb_source.query("SET GLOBAL mysql56_temporal_format = ON")
    precision = mariadb_source.query("SELECT DATETIME_PRECISION FROM information_schema.COLUMNS WHERE "
                                     f"TABLE_SCHEMA = '{source_db}' AND TABLE_NAME = 'old_a' AND COLUMN_NAME = 'dt'")
    assert [tuple(row) for row in precision] == [(0,)]
    src = sources(mariadb_source, start, fast_decoder=fast_decoder)
    with pytest.raises(CorruptEvent) as caught:
        drain(src, lambda got: False, timeout=15)
    text = str(caught.value)
    assert f"table={source_db}.old_a" in text and f"{start.log}:" in text and "\n" not in text, text
    assert "dt: a TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 formats, whose table the server redefined" \
        in text, text


def test_mysql_55_temporal_formats_decode_alike_in_both_decoders():
    """MySQL 5.5's TIME (a signed hhmmss), DATETIME (yyyymmddhhmmss) and TIMESTAMP (epoch seconds), as a
    MySQL server logs them: both decoders read the values packed, a zero DATETIME as `InvalidDate`."""
    from types import SimpleNamespace

    columns = [SimpleNamespace(type=3, name="id", unsigned=False), SimpleNamespace(type=11, name="tm"),
               SimpleNamespace(type=12, name="dt"), SimpleNamespace(type=7, name="ts")]
    table = SimpleNamespace(columns=columns)
    cases = [((-1, 838, 59, 59), (2024, 2, 29, 12, 34, 56), 1_000_000_000),
             ((1, 0, 0, 1), (0, 0, 0, 0, 0, 0), 0),
             ((-1, 0, 0, 1), (9999, 12, 31, 23, 59, 59), 2_147_483_647)]
    body = b""
    for i, ((sign, h, m, s), (y, mo, d, hh, mi, ss), ts) in enumerate(cases):
        packed_dt = ((y * 100 + mo) * 100 + d) * 1_000_000 + (hh * 100 + mi) * 100 + ss
        body += b"\0" + i.to_bytes(4, "little") + (sign * (h * 10000 + m * 100 + s)).to_bytes(3, "little", signed=True)
        body += packed_dt.to_bytes(8, "little") + ts.to_bytes(4, "little")
    got = [fast.RowDecoders(compiled=compiled).get(table).decode(body, 0, len(body), 0) for compiled in (True, False)]
    assert typed(got[0]) == typed(got[1])
    for row, ((sign, h, m, s), (y, mo, d, hh, mi, ss), ts) in zip(got[0], cases):
        values = row["values"]
        assert values["tm"] == sign * datetime.timedelta(hours=h, minutes=m, seconds=s)
        expected = datetime.datetime(y, mo, d, hh, mi, ss) if y else InvalidDate("0000-00-00 00:00:00")
        assert values["dt"] == expected and type(values["dt"]) is type(expected)
        assert values["ts"] == datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=ts)
    with pytest.raises(fast.Unreadable, match="tm: a TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1"):
        fast.RowDecoders().get(table, mariadb=True)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_old_temporal_precisions_are_asked_again_in_each_binlog_file(compiled):
    """What the server said of a table's old temporal columns holds for one binlog file only (a restarted
    server starts a new one, reuses table ids and may have altered the table): a new file asks again,
    while the decoders of other tables are kept; a definition at or after the event refuses it."""
    from types import SimpleNamespace

    asked: list[str] = []
    answers = {"old": ({"dt": ("datetime", 6)}, 100, "InnoDB")}

    def precisions(schema: str, table: str) -> Any:
        asked.append(table)
        return answers[table]

    old = SimpleNamespace(schema="s", table="old", columns=[SimpleNamespace(type=3, name="id", unsigned=False),
                                                            SimpleNamespace(type=12, name="dt")])
    plain_table = SimpleNamespace(schema="s", table="new", columns=[SimpleNamespace(type=3, name="id", unsigned=False)])
    decoders = fast.RowDecoders(compiled=compiled, precisions=precisions)
    first, other = decoders.get(old, True, 101), decoders.get(plain_table, True, 101)
    assert decoders.get(old, True, 102) is first and asked == ["old"]
    packed = ((((((2024 * 13 + 2) * 32 + 29) * 24 + 12) * 60 + 34) * 60 + 56) * 1_000_000 + 654321).to_bytes(8, "big")
    row = b"\0" + (7).to_bytes(4, "little") + packed
    assert first.decode(row, 0, len(row), 0)[0]["values"] == {"id": 7, "dt": datetime.datetime(2024, 2, 29, 12, 34,
                                                                                               56, 654321)}
    answers["old"] = ({"dt": ("datetime", 0)}, 100, "InnoDB")
    decoders.new_file()
    again = decoders.get(old, True, 103)
    assert asked == ["old", "old"] and again is not first and decoders.get(plain_table, True, 103) is other
    classic = b"\0" + (7).to_bytes(4, "little") + (20240229123456).to_bytes(8, "little")
    assert again.decode(classic, 0, len(classic), 0)[0]["values"]["dt"] == datetime.datetime(2024, 2, 29, 12, 34, 56)
    with pytest.raises(fast.Unreadable, match="whose table the server redefined"):
        decoders.get(old, True, 100)
