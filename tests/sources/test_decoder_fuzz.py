"""No binlog input crashes the reader: mutated real rows events give the same rows or a clean error.

Real WRITE/UPDATE/DELETE_ROWS events of tables with every column type (SET, BIT, JSON and spatial
ones, partial images of MINIMAL and NOBLOB sessions) are read from a real MariaDB's binlog file, then
mutated (truncated bodies, flipped and overwritten bytes, huge length prefixes, out-of-range ENUM
indexes and SET bits, header sizes that lie, table maps with DECIMAL, temporal, BLOB, ENUM, SET and
BIT metadata out of range) and fed to setl's two decoders through the reader's call site
(`fast.FastStream._rows`): the compiled `_rows.RowDecoder` and the Python `rowcodec.RowDecoder`.
Both give the same rows or both a clean `CorruptEvent`; a segfault or a hang fails the run (every
test has a timeout). Under SETL_PURE_PYTHON=1 the Python decoder alone: rows or a clean error.
"""

from __future__ import annotations

import copy
import time
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from setl.adapters import replication
from setl.errors import CorruptEvent, SourceError
from setl.model import Position
from setl.retry import Backoff, Failure, classify
from setl.scheduler import Outcome
from setl.sources.mysql_binlog import fast
from setl.testing.harness import MemorySink, ScriptedSource, insert, run_pipeline
from tests.sources.binlog import execute, head
from tests.sources.test_fast_decoder import typed
from tests.test_scheduler import fast_settings

pytestmark = pytest.mark.timeout(180)

TYPED = """CREATE TABLE typed (
  id INT PRIMARY KEY, ti TINYINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, bi BIGINT, biu BIGINT UNSIGNED,
  f FLOAT, d DOUBLE, dc DECIMAL(65,30), dc2 DECIMAL(10,2), dc3 DECIMAL(5,5), dc4 DECIMAL(18,0),
  dt DATE, dtt DATETIME(6), ts TIMESTAMP(3) NULL DEFAULT NULL, tm TIME(6), y YEAR,
  vc VARCHAR(300), c CHAR(10), vcs VARCHAR(20) CHARACTER SET latin1, t TEXT, b BLOB, e ENUM('a','b','ccc')
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""
ODD = ("CREATE TABLE odd (id INT PRIMARY KEY, s SET('x','y','z'), bt BIT(10), e ENUM('p','q'), v VARCHAR(5), "
       "s64 SET(" + ", ".join(f"'m{i}'" for i in range(64)) + "), b1 BIT(1), b64 BIT(64), j JSON, g POINT, "
       "t TEXT)")
STATEMENTS = [
    "SET SESSION sql_mode = ''",
    "INSERT INTO typed VALUES (1, -128, 65535, -8388608, -9223372036854775808, 18446744073709551615, -3.4e38, "
    "1.7976931348623157e308, -12345678901234567890.123456789012345678901234567890, -99999999.99, 0.99999, "
    "999999999999999999, '1000-01-01', '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999', "
    "'-838:59:59.000000', 2155, REPEAT('x', 300), 'ünïcødé', 'café', REPEAT('t', 700), 0x00ff80, 'ccc')",
    "INSERT INTO typed VALUES (2, 0, 0, 0, 0, 0, 0, -0.0, 0, 0.01, 0.00001, 0, '0000-00-00', "
    "'2024-00-15 00:00:00.5', '1970-01-01 00:00:01.001', '-00:00:01.5', 0, '', '', '', '', '', '')",
    "INSERT INTO typed (id) VALUES (3)",
    "INSERT INTO typed VALUES (4, 1, 2, 3, 4, 5, 1.5, 2.25, 3.14, -1.05, 0.5, 42, '2024-02-29', "
    "'2024-02-29 12:34:56.123456', '2001-09-09 01:46:40.123', '12:34:56.789', 1999, 'vc', 'c', 'l', 'text', "
    "0x01, 'a'), (5, 9, 8, 7, 6, 5, 4.5, 3.5, -2.5, 1.5, 0.25, -7, '1999-12-31', '1999-12-31 23:59:59.5', "
    "NULL, '-12:00:00.25', 1901, 'x', NULL, 'z', NULL, 0x02, 'b')",
    "UPDATE typed SET vc = CONCAT(vc, '!'), dc = -dc, tm = '-01:02:03.456789', e = 'b' WHERE id IN (1, 2, 4)",
    "DELETE FROM typed WHERE id IN (2, 5)",
    "INSERT INTO odd VALUES (1, 'x,z', b'1010101010', 'q', 'v', 'm0,m63', b'1', 0xFFFFFFFFFFFFFFFF, '[1, \"x\"]', "
    "POINT(1, 2), 'text'), (2, '', b'0', NULL, NULL, '', b'0', 1, NULL, NULL, NULL)",
    "UPDATE odd SET s = 'y', e = 'p', s64 = 'm5' WHERE id = 1",
    "SET SESSION binlog_row_image = 'MINIMAL'",
    "UPDATE odd SET b64 = 7, s = 'x' WHERE id = 1",
    "SET SESSION binlog_row_image = 'NOBLOB'",
    "UPDATE odd SET e = 'q' WHERE id = 1",
    "DELETE FROM odd WHERE id = 2",
    "SET SESSION binlog_row_image = 'FULL'",
]
#: MariaDB's pre-10.1 temporal formats (created under mysql56_temporal_format=OFF): whole-second ones
#: (MySQL 5.5's) and fractional ones (``Field_*_hires``), sized by the precision the server gives
OLD = ("CREATE TABLE oldt (id INT PRIMARY KEY, tm0 TIME, tm3 TIME(3), tm6 TIME(6), dt0 DATETIME, dt1 DATETIME(1), "
       "dt6 DATETIME(6), ts0 TIMESTAMP NULL DEFAULT NULL, ts2 TIMESTAMP(2) NULL DEFAULT NULL, "
       "ts5 TIMESTAMP(5) NULL DEFAULT NULL)")
OLD_STATEMENTS = [
    "SET SESSION sql_mode = ''",
    "INSERT INTO oldt VALUES (1, '-838:59:59', '-838:59:59.999', '838:59:59.999999', '0000-00-00 00:00:00', "
    "'9999-12-31 23:59:59.9', '2024-00-15 01:02:03.000001', 0, '2038-01-19 03:14:07.99', '1970-01-01 00:00:01.5'), "
    "(2, '-00:00:01', '-00:00:00.001', '-00:00:00.000001', '1000-01-01 00:00:00', '0000-00-00 00:00:00', "
    "'2024-02-29 12:34:56.654321', '2001-09-09 01:46:40', 0, '2001-09-09 01:46:40.12345'), (3, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL)",
    "UPDATE oldt SET tm3 = '12:34:56.789', dt6 = '1999-12-31 23:59:59.999999', ts5 = '2024-02-29 12:34:56.54321' "
    "WHERE id IN (1, 3)",
    "DELETE FROM oldt WHERE id = 2",
]
#: the precision information_schema gives each captured table's old temporal columns (filled at capture)
PRECISIONS: dict[str, dict[str, tuple[str, int | None]]] = {}
ROWS_TYPES = {23: 0, 24: 1, 25: 2, 30: 0, 31: 1, 32: 2}  # WRITE/UPDATE/DELETE_ROWS, V1 and V2
ALLOWED = frozenset({TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent})
_CTL = types.SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mariadb", dbms="mariadb")
_VERSION = (10, 11, 0)
LOG_FILE = "mysql-bin.000001"


def binlog_events(server: Any, start: Position, end: Position) -> list[tuple[int, bytes]]:
    """The events between two positions of one binlog file, read from the server's own file: (offset,
    the payload the server sends for it: the OK byte, then the event as written)."""
    assert start.log == end.log
    data = (server.datadir / start.log).read_bytes()
    events, at = [], start.offset
    while at < end.offset:
        size = int.from_bytes(data[at + 9:at + 13], "little")
        events.append((at, b"\x00" + data[at:at + size]))
        at += size
    assert at == end.offset
    return events


def table_map_event(payload: bytes, table_map: dict[int, Any], checksum: bool) -> None:
    """Decode a table map as setl's stream does (the library, through the adapter) into `table_map`."""
    wrapper = replication.parse_packet(payload, "utf8", table_map, replication.ParseContext("mariadb"), _VERSION,
                                       checksum, frozenset({TableMapEvent}), None)
    table_map[wrapper.event.table_id] = wrapper.event.get_table()


class Captured:
    """Real rows events of the tables above, and the library's tables of their table maps."""

    def __init__(self, server: Any, db: str) -> None:
        execute(server, db, TYPED, ODD)
        server.query("SET GLOBAL mysql56_temporal_format = OFF")
        try:
            execute(server, db, OLD)
        finally:
            server.query("SET GLOBAL mysql56_temporal_format = ON")
        start = head(server)
        execute(server, db, *STATEMENTS, *OLD_STATEMENTS)
        end = head(server)
        for name, of, digits in server.query("SELECT COLUMN_NAME, DATA_TYPE, DATETIME_PRECISION FROM "
                                             f"information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' AND "
                                             "DATA_TYPE IN ('time', 'datetime', 'timestamp') AND TABLE_NAME = 'oldt'"):
            PRECISIONS.setdefault("oldt", {})[name] = (of, digits)
        self.checksum = server.query("SELECT @@GLOBAL.binlog_checksum")[0][0] == "CRC32"
        self.table_map: dict[int, Any] = {}
        self.rows: list[bytes] = []
        for _, payload in binlog_events(server, start, end):
            if payload[5] == 19:  # TABLE_MAP_EVENT
                table_map_event(payload, self.table_map, self.checksum)
            elif payload[5] in ROWS_TYPES:
                self.rows.append(payload)

    def table(self, payload: bytes) -> Any:
        return self.table_map[int.from_bytes(payload[20:26], "little")]


@pytest.fixture(scope="module")
def captured(mariadb_source) -> Any:
    """The events, captured once for the module."""
    db = "fuzz_decoder"
    mariadb_source.query(f"DROP DATABASE IF EXISTS {db}")
    mariadb_source.query(f"CREATE DATABASE {db}")
    try:
        yield Captured(mariadb_source, db)
    finally:
        mariadb_source.query(f"DROP DATABASE IF EXISTS {db}")


def outcome(payload: bytes, table_map: dict[int, Any], checksum: bool, compiled: bool,
            precisions: dict[str, dict[str, tuple[str, int | None]]] | None = None) -> Any:
    """What the reader's call site makes of a packet with one of the decoders: its rows (typed), or
    "error" for a CorruptEvent naming the event's position (anything else raises here). The old
    temporal columns' precisions are `precisions` (the server's by default), of a definition older
    than every event."""
    reader = types.SimpleNamespace(table_map=table_map, log_file=LOG_FILE, log_pos=4, context=_CTL)
    known = PRECISIONS if precisions is None else precisions
    decoders = fast.RowDecoders(compiled=compiled, precisions=lambda schema, table: (known.get(table, {}), 0, "InnoDB"))
    assert decoders.compiled is compiled
    stream = fast.FastStream(reader, decoders)
    stream._settings = (_CTL, checksum, ALLOWED, _VERSION, None)
    try:
        event = stream._rows(payload, payload[5])
    except CorruptEvent as exc:
        assert f"{LOG_FILE}:4" in str(exc), exc  # names the position of the event
        return "error"
    assert event is not None, "a rows event of an allowed kind was left to the library"
    return typed(event.rows)


def check(payload: bytes, table_map: dict[int, Any], checksum: bool,
          precisions: dict[str, dict[str, tuple[str, int | None]]] | None = None) -> Any:
    """Both decoders give the same rows, or both a clean error; the Python one alone where nothing is built."""
    plain = outcome(payload, table_map, checksum, compiled=False, precisions=precisions)
    if fast.available():
        assert outcome(payload, table_map, checksum, compiled=True, precisions=precisions) == plain, \
            "the decoders disagree"
    return plain


def test_the_captured_events_decode_the_same_both_ways(captured):
    """Unmutated, every captured event decodes to the same rows both ways (the fuzz starts from real rows),
    partial images among them."""
    assert len(captured.rows) >= 14
    assert sum(captured.table(payload).table == "oldt" for payload in captured.rows) == 3
    results = [check(payload, captured.table_map, captured.checksum) for payload in captured.rows]
    assert "error" not in results
    partial = [row for rows in results for row in rows
               if ("str", "'cols bitmap'") in row.get("before_none_sources", {}).values()]
    assert len(partial) == 2  # the MINIMAL and the NOBLOB update


def _mutate(payload: bytes, kind: str, at: int, value: int, width: int) -> bytes:
    data = bytearray(payload)
    body = 31  # past the header and most of the post-header: the bitmaps and row images
    at = body + at % max(1, len(data) - body)
    if kind == "flip":
        data[at] ^= value or 1
    elif kind == "fill":  # huge length prefixes, out-of-range ENUM indexes, bad DECIMAL and temporal bytes
        data[at:at + width] = bytes([value]) * width
        del data[len(payload):]
    elif kind == "cut":  # a body that ends early, its header's size either kept (a lie) or fixed
        del data[at:]
        if value % 2:
            data[10:14] = (len(data) - 1).to_bytes(4, "little")
    elif kind == "size":  # the header's event size lies
        data[10:14] = (value * 7919 % (len(data) + 64)).to_bytes(4, "little")
    return bytes(data)


@settings(max_examples=5000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_events_give_the_same_rows_or_a_clean_error(captured, data):
    """Truncated, flipped, overwritten and resized rows events: both readers agree or stop cleanly."""
    payload = data.draw(st.sampled_from(captured.rows))
    kind = data.draw(st.sampled_from(["flip", "flip", "fill", "fill", "cut", "size"]))
    mutated = _mutate(payload, kind, data.draw(st.integers(0, 1 << 20)), data.draw(st.integers(0, 255)),
                      data.draw(st.integers(1, 9)))
    check(mutated, captured.table_map, captured.checksum)


def _bent(table: Any, index: int, field: str, value: Any) -> Any:
    """A copy of `table` whose column `index` has `field` set to `value` (a table map out of range)."""
    bent = copy.copy(table)
    bent.columns = list(table.columns)
    column = bent.columns[index] = copy.copy(table.columns[index])
    setattr(column, field, value)
    return bent


@settings(max_examples=1000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_table_maps_out_of_range_give_the_same_rows_or_a_clean_error(captured, data):
    """DECIMAL precision and scale, fractional seconds, BLOB length sizes, ENUM and SET sizes and values,
    BIT sizes out of range: both decoders refuse the table or give the same rows."""
    payload = data.draw(st.sampled_from(captured.rows))
    table = captured.table(payload)
    index = data.draw(st.integers(0, len(table.columns) - 1))
    column = table.columns[index]
    fields = [name for name in ("precision", "decimals", "fsp", "length_size", "size", "max_length", "bits", "bytes")
              if isinstance(getattr(column, name, None), int)]
    for values in ("enum_values", "set_values"):  # fewer values than the rows index or name
        if getattr(column, values, None):
            fields.append(values)
    assume(fields)  # a column of a type without sizes (INT, DATE): nothing to bend
    field = data.draw(st.sampled_from(fields))
    if field in ("enum_values", "set_values"):
        value: Any = data.draw(st.sampled_from([[""], [], None, ["", "a"]]))
    else:
        value = data.draw(st.sampled_from([-1, 0, 1, 7, 9, 31, 66, 255, 1 << 31]))
    bent = _bent(table, index, field, value)
    table_map = {**captured.table_map, bent.table_id: bent}
    check(payload, table_map, captured.checksum)


def test_old_temporals_read_with_a_wrong_precision_give_the_same_rows_or_a_clean_error(captured):
    """MariaDB's pre-10.1 temporal columns read with every other precision (0-7, or none) than the one
    they were logged with: both decoders give the same rows or both stop cleanly, never crash."""
    checked = 0
    for payload in captured.rows:
        if captured.table(payload).table != "oldt":
            continue
        for name, (of, right) in PRECISIONS["oldt"].items():
            for wrong in (0, 1, 2, 3, 4, 5, 6, 7, None):
                if wrong != right:
                    check(payload, captured.table_map, captured.checksum,
                          {"oldt": {**PRECISIONS["oldt"], name: (of, wrong)}})
                    checked += 1
    assert checked == 3 * 9 * 8


def test_an_enum_index_out_of_range_is_a_clean_error_both_ways(captured):
    """An ENUM index past the table map's values: both decoders raise (the compiled one once segfaulted)."""
    checked = 0
    for payload in captured.rows:
        table = captured.table(payload)
        if table.table != "typed":
            continue
        index = [column.name for column in table.columns].index("e")
        bent = _bent(table, index, "enum_values", [""])  # only index 0: every non-empty value is out of range
        table_map = {**captured.table_map, bent.table_id: bent}
        rows = outcome(payload, captured.table_map, captured.checksum, compiled=False)
        empty = (("NoneType", "None"), ("str", "''"))
        if any(row.get("values", row.get("after_values", {})).get("e") not in empty for row in rows):
            assert check(payload, table_map, captured.checksum) == "error"
            checked += 1
    assert checked >= 3



def _poll_until_error(src: Any, timeout: float = 15.0) -> BaseException:
    """The error `src.poll` raises within `timeout` seconds (transactions before it are dropped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            src.poll(0.2)
        except SourceError as exc:
            return exc
    raise AssertionError(f"no error from poll within {timeout}s")


@pytest.mark.parametrize("fast_decoder", [True, False], ids=["compiled", "python"])
def test_an_enum_index_out_of_range_in_the_binlog_pauses_the_pipeline_naming_the_event(
        mariadb_source, source_db, sources, fast_decoder):
    """A rows event whose ENUM index is past the column's values, as the server sends it from a binlog file
    corrupted on disk: the source stops with a CorruptEvent (not retryable) naming the table and the
    event's position, with the compiled decoder and with the Python one, instead of killing the process."""
    execute(mariadb_source, source_db, "CREATE TABLE en (id INT PRIMARY KEY, e ENUM('a','b','c'))")
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "INSERT INTO en VALUES (1234567890, 'b')", "INSERT INTO en VALUES (2, 'a')")
    end = head(mariadb_source)
    events = binlog_events(mariadb_source, start, end)
    row = (1234567890).to_bytes(4, "little") + b"\x02"  # the id, then the ENUM's index of 'b'
    [(offset, payload)] = [(at, payload) for at, payload in events if payload[5] in ROWS_TYPES and row in payload]
    at = offset + payload.index(row) - 1 + 4  # in the file: the payload's OK byte is not there
    path = mariadb_source.datadir / start.log
    with open(path, "r+b") as binlog:
        binlog.seek(at)
        assert binlog.read(1) == b"\x02"
        binlog.seek(at)
        binlog.write(b"\x09")  # index 9 of an ENUM of 3 values
    try:
        src = sources(mariadb_source, start, fast_decoder=fast_decoder)
        error = _poll_until_error(src)
    finally:
        with open(path, "r+b") as binlog:  # the server's binlog is shared by the session's tests
            binlog.seek(at)
            binlog.write(b"\x02")
    event_end = offset + len(payload) - 1
    assert isinstance(error, CorruptEvent), repr(error)
    text = str(error)
    assert f"table={source_db}.en" in text and "stage=select" in text and "pipeline=t" in text, text
    assert f"{start.log}:{offset}" in text and f"ends at {event_end}" in text, text
    assert "ENUM index 9" in text, text
    assert "\n" not in text
    assert classify(error) is Failure.PERMANENT
    assert Backoff(initial=0.1, maximum=1.0, max_attempts=10).decide(error, 1).pause


class _CorruptAt(ScriptedSource):
    """A source whose transaction `at` cannot be decoded, however often it is read again."""

    def __init__(self, transactions: list, at: int) -> None:
        super().__init__(transactions)
        self.at, self.failures = at, 0

    def poll(self, timeout: float) -> Any:
        if self.tell().offset == self.at:
            self.failures += 1
            raise CorruptEvent("cannot decode the binlog's WriteRowsEvent", position=self.tell())
        return super().poll(timeout)


def test_a_corrupt_event_pauses_the_pipeline_at_the_first_attempt():
    """The scheduler pauses at a CorruptEvent instead of spending its retries reading the same event again,
    after acking what came before it."""
    source = _CorruptAt([[insert("t", {"id": i})] for i in range(6)], at=4)
    result = run_pipeline(source, MemorySink(), settings=fast_settings(parallelism=2, max_rows=1, attempts=20))
    assert result.outcome is Outcome.PAUSED
    assert source.failures == 1
    assert result.meta.position("test").position == Position("scripted", 4)
    assert "cannot decode the binlog's WriteRowsEvent" in str(result.meta.state("test").error)
