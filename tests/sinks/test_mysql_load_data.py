"""Snapshot reads into MySQL/MariaDB by ``LOAD DATA LOCAL`` (`setl.sinks.mysql_load_data`), against a
real MariaDB server: the rows land exactly as the upsert statements write them, and whatever the
server would have converted, skipped or refused goes by the statements as before."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from setl.errors import LoadError
from setl.sinks import mysql_load_data, mysql_sql
from setl.sinks.mysql import MysqlLoad
from setl.sinks.mysql_sql import load_data_text

from .contract import Changes, make_batch, parts, read
from .test_mysql_sink import MySQLTarget

TYPED = ("(id BIGINT UNSIGNED PRIMARY KEY, i INT, d DECIMAL(65,30), f DOUBLE, r FLOAT, ts DATETIME(6),"
         " t0 DATETIME, day DATE, stamp TIMESTAMP(6) NULL, s VARCHAR(64) CHARACTER SET utf8mb4,"
         " l VARCHAR(16) CHARACTER SET latin1, c CHAR(8), txt TEXT, e ENUM('a','b'), u UUID) ENGINE=InnoDB")

TEXTS = ["", "plain", "tab\there", "new\nline", "cr\rhere", "back\\slash", "\\N", "\\", "\\\\t", "nul\x00byte",
         "ctrl\x1az", "'quote'", '"dq"', "é ünï", "4-byte \U0001F600", "trailing  ", "%s %%", "\t\n\r\\\x00"]


def typed_row(n: int) -> dict[str, Any]:
    text = TEXTS[n % len(TEXTS)]
    return {"id": 2**63 + n, "i": -n if n % 3 else None, "d": decimal.Decimal(f"-{n}.{n:030d}") if n % 4 else
            decimal.Decimal("1E+3"), "f": 1 / (n + 3), "r": 0.5 + n, "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, n),
            "t0": datetime.datetime(1000 + n, 12, 31, 23, 59, 59), "day": datetime.date(1 + n, 2, 28),
            "stamp": None if n % 5 == 0 else datetime.datetime(2030, 6, 1, 0, 0, n % 60, 999999),
            "s": text, "l": "caf\u00e9" if n % 2 else text[:16].replace("\U0001F600", "?"),
            "c": text.rstrip()[:8].replace("\U0001F600", "x"), "txt": text * 3, "e": "ab"[n % 2],
            "u": f"{n:08x}-0000-4000-8000-000000000000"}


@pytest.fixture
def target(mariadb_target, mysql_db) -> MySQLTarget:
    return MySQLTarget(mariadb_target, mysql_db)


@pytest.fixture(params=[True, False], ids=["compiled", "pure"])
def compiled(request, monkeypatch) -> bool:
    """`load_data_text` in C (`setl.sinks._loaddata`), then by its Python loop."""
    assert mysql_sql.COMPILED, "the compiled LOAD DATA writer is not built"
    monkeypatch.setattr(mysql_sql, "COMPILED", request.param)
    return bool(request.param)


@pytest.fixture
def sent(monkeypatch) -> list[str]:
    """The LOAD DATA statements sent, whatever came of them."""
    statements: list[str] = []
    original = mysql_load_data.load_local

    def spy(conn: Any, text: str, data: bytes, packet: int = mysql_load_data.PACKET_BYTES) -> tuple[int, int]:
        statements.append(text)
        return original(conn, text, data, packet)

    monkeypatch.setattr(mysql_load_data, "load_local", spy)
    return statements


def copy(load: MysqlLoad, changes: Changes, rows: list[dict[str, Any]], first_id: int = 1) -> None:
    """Rows as a snapshot copies them: a first batch of one row (the sink learns the table), then
    chunks of reads each prepared on the side and loaded, as the scheduler does."""
    load.load(make_batch([read(changes, rows[0])], id=first_id))
    for n, start in enumerate(range(1, len(rows), 40)):
        batch = make_batch([read(changes, row) for row in rows[start:start + 40]], id=first_id + 1 + n)
        load.prepare(batch)
        load.load(batch)


def test_reads_by_load_data_land_exactly_as_the_upserts_write_them(target, sent, compiled):
    """Every supported type (unsigned and signed integers, DECIMAL(65,30), DOUBLE, FLOAT, DATETIME with
    and without fractions, dates from year 1, TIMESTAMP, utf8mb4 and latin1 text with every character
    the input format escapes, CHAR, TEXT, ENUM, UUID, NULLs) copied once by LOAD DATA and once by the
    statements alone: both tables hold the same rows, byte for byte."""
    for name in ("by_load", "by_upsert"):
        target.execute(f"CREATE TABLE {target.qualified(name)} {TYPED}")
    rows = [typed_row(n) for n in range(200)]
    fast, plain = target.make_load(), target.make_load()
    plain.sql.rows.load_data.refused = True  # as on a server that refuses LOCAL: statements only
    try:
        copy(fast, Changes(target.schema, "by_load"), rows)
        copy(plain, Changes(target.schema, "by_upsert"), rows)
    finally:
        fast.close()
        plain.close()
    assert len(sent) == 5 and all("`by_load`" in text for text in sent)
    assert not fast.sql.rows.load_data.collided and not fast.sql.rows.load_data.refused
    columns = "id, i, d, f, r, ts, t0, day, stamp, HEX(s), HEX(l), HEX(c), HEX(txt), e, u"
    by_load = target.query(f"SELECT {columns} FROM {target.qualified('by_load')} ORDER BY id")
    assert len(by_load) == 200
    assert by_load == target.query(f"SELECT {columns} FROM {target.qualified('by_upsert')} ORDER BY id")
    assert target.rows("by_load", "id")[7][9] == TEXTS[7]


def test_a_replayed_chunk_rolls_its_load_back_and_goes_by_upserts(target, sent):
    """A chunk whose rows are there already (replayed, or written first by the binlog) gives warnings:
    its load is rolled back to the savepoint, the rows go by upserts (the newer values win), the batch
    commits with its position, and the table is not loaded by LOAD DATA again."""
    target.execute(f"CREATE TABLE {target.qualified('t')} (id INT PRIMARY KEY, v VARCHAR(8))")
    t = Changes(target.schema, "t")
    load = target.make_load()
    try:
        copy(load, t, [{"id": i, "v": "old"} for i in range(1, 82)])
        assert len(sent) == 2
        again = make_batch([read(t, {"id": i, "v": "new"}) for i in range(60, 101)], id=9)
        load.prepare(again)
        load.load(again)
        later = make_batch([read(t, {"id": i, "v": "later"}) for i in range(101, 121)], id=10)
        load.prepare(later)
        load.load(later)
        assert load.committed() == later.end
    finally:
        load.close()
    assert len(sent) == 3 and load.sql.rows.load_data.collided == {(target.schema, "t")}
    rows = dict(target.rows("t"))
    assert len(rows) == 120
    assert {rows[i] for i in range(1, 60)} == {"old"} and {rows[i] for i in range(60, 101)} == {"new"}
    assert {rows[i] for i in range(101, 121)} == {"later"}


def test_per_table_parts_of_chunks_go_by_load_data_and_land_exactly(target, sent):
    """load.mode per_table: each table's part of a chunk batch (every supported type, NULLs, escapes,
    latin1) goes by LOAD DATA in its own transaction, lands as the statements write the same rows, and
    a part whose rows are there already (a replay) rolls its load back and goes by upserts."""
    for name in ("a", "b", "by_upsert"):
        target.execute(f"CREATE TABLE {target.qualified(name)} {TYPED}")
    rows = [typed_row(n) for n in range(120)]
    a, b = Changes(target.schema, "a"), Changes(target.schema, "b")
    load, plain = target.make_load(), target.make_load()
    plain.sql.rows.load_data.refused = True  # statements only
    try:
        copy(plain, Changes(target.schema, "by_upsert"), rows)
        for n, start in enumerate(range(0, 120, 40)):  # the first batch teaches the sink the tables
            batch = make_batch([read(t, row) for row in rows[start:start + 40] for t in (a, b)], id=1 + n)
            for part in parts(batch):
                load.load_part(part)
            load.mark_loaded(batch)
        assert len(sent) == 4 and {text.split()[7] for text in sent} == {f"`{target.schema}`.`a`",
                                                                           f"`{target.schema}`.`b`"}
        again = make_batch([read(a, {**row, "i": 7}) for row in rows[30:50]], id=4)
        load.load_part(parts(again)[0])
        load.mark_loaded(again)
        assert load.committed() == again.end
    finally:
        load.close()
        plain.close()
    assert len(sent) == 5 and load.sql.rows.load_data.collided == {(target.schema, "a")}
    columns = "id, i, d, f, r, ts, t0, day, stamp, HEX(s), HEX(l), HEX(c), HEX(txt), e, u"
    expected = target.query(f"SELECT {columns} FROM {target.qualified('by_upsert')} ORDER BY id")
    assert len(expected) == 120
    assert target.query(f"SELECT {columns} FROM {target.qualified('b')} ORDER BY id") == expected
    in_a = target.query(f"SELECT {columns} FROM {target.qualified('a')} ORDER BY id")
    assert [r[:1] + r[2:] for r in in_a] == [r[:1] + r[2:] for r in expected]
    assert [r[1] for r in in_a] == [7 if 30 <= n < 50 else e[1] for n, e in enumerate(expected)]


@pytest.mark.parametrize("value, error", [("x" * 9, "(?i)too long"), ("c", "(?i)truncated")])
def test_a_value_strict_mode_refuses_fails_the_batch_after_its_load_is_rolled_back(target, sent, value, error):
    """A value LOAD DATA LOCAL would cut or turn into the ENUM's error value (a warning there) fails the
    batch as the strict statements refuse it; nothing of the batch lands."""
    target.execute(f"CREATE TABLE {target.qualified('t')} (id INT PRIMARY KEY, v VARCHAR(8), e ENUM('a','b'))")
    t = Changes(target.schema, "t")
    load = target.make_load()
    try:
        load.load(make_batch([read(t, {"id": 0, "v": "ok", "e": "a"})]))
        bad = {"id": 5, "v": value if len(value) > 1 else "ok", "e": value if len(value) == 1 else "a"}
        batch = make_batch([read(t, {"id": i, "v": "fine", "e": "b"}) for i in range(1, 5)] + [read(t, bad)], id=2)
        load.prepare(batch)
        with pytest.raises(LoadError, match=error):
            load.load(batch)
    finally:
        load.close()
    assert len(sent) == 1
    assert target.rows("t") == [(0, "ok", "a")]


def test_a_myisam_table_and_unsupported_types_go_by_statements(target, sent):
    """A table whose engine cannot roll a load back (MyISAM), and a chunk holding a value only a
    statement writes (bytes), never go by LOAD DATA; their rows land."""
    target.execute(f"CREATE TABLE {target.qualified('m')} (id INT PRIMARY KEY, v VARCHAR(8)) ENGINE=MyISAM")
    target.execute(f"CREATE TABLE {target.qualified('b')} (id INT PRIMARY KEY, v VARBINARY(8))")
    load = target.make_load()
    try:
        copy(load, Changes(target.schema, "m"), [{"id": i, "v": "m"} for i in range(1, 50)])
        copy(load, Changes(target.schema, "b"), [{"id": i, "v": b"\x00\xff"} for i in range(1, 50)], first_id=5)
    finally:
        load.close()
    assert sent == []
    assert len(target.rows("m")) == 49 and target.rows("b")[-1] == (49, b"\x00\xff")


def test_a_server_that_refuses_local_makes_the_sink_write_statements(target, sent):
    """With the server's local_infile off, the first load is refused: the sink says so once and
    writes statements from then on; every row lands."""
    target.execute(f"CREATE TABLE {target.qualified('t')} (id INT PRIMARY KEY, v INT)")
    (before,) = target.query("SELECT @@GLOBAL.local_infile")[0]
    target.execute("SET GLOBAL local_infile = 0")
    load = target.make_load()
    try:
        copy(load, Changes(target.schema, "t"), [{"id": i, "v": i} for i in range(1, 122)])
    finally:
        load.close()
        target.execute(f"SET GLOBAL local_infile = {int(before)}")
    assert len(sent) == 1 and load.sql.rows.load_data.refused
    assert target.rows("t") == [(i, i) for i in range(1, 122)]


def test_the_input_format_escapes_and_refuses_what_it_must(compiled):
    """Fields as a literal's text, the format's special characters escaped; a row of one empty
    field, a lone surrogate or a value of another type is left to statements (None)."""
    assert load_data_text([{"a": 1, "b": "t\tn\nr\rb\\z\x00", "c": None}]) == b"1\tt\\tn\\nr\\rb\\\\z\\0\t\\N\n"
    assert load_data_text([{"a": decimal.Decimal("1E+3"), "b": 0.1, "c": datetime.datetime(2024, 1, 2, 3, 4, 5)}]) \
        == b"1000\t0.1\t2024-01-02 03:04:05\n"
    for refused in ("", "\udc80", b"x", True, datetime.timedelta(1), {"j": 1}, frozenset("a"), float("nan"),
                    decimal.Decimal("NaN"), datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)):
        assert load_data_text([{"a": refused}]) is None, refused


VALUES = st.one_of(
    st.text(), st.text(alphabet="\\\t\n\r\x00a\u00e9\U0001F600", max_size=12),
    st.sampled_from(["", "\udc80", "x\ud800y"]),
    st.integers(), st.integers(min_value=-2**64, max_value=2**64), st.none(), st.booleans(), st.floats(),
    st.decimals(), st.datetimes(), st.dates(), st.binary(max_size=4), st.timedeltas(),
    st.datetimes(timezones=st.just(datetime.timezone.utc)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abcd"), VALUES, max_size=4), max_size=5))
def test_the_compiled_input_is_the_pure_loops_byte_for_byte(images):
    """For any rows of any values (text with every escaped character and lone surrogates, integers of
    any size, bools, floats and decimals finite or not, naive and aware datetimes, dates, bytes,
    empty rows), the C writer gives the Python loop's bytes, or None where it does."""
    assert mysql_sql.COMPILED, "the compiled LOAD DATA writer is not built"
    compiled = mysql_sql.load_data_text(images)
    mysql_sql.COMPILED = False
    try:
        assert compiled == mysql_sql.load_data_text(images)
    finally:
        mysql_sql.COMPILED = True
