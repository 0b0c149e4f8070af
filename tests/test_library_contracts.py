"""The behaviours of PyMySQL's and python-mysql-replication's internals that setl relies on, through
their adapters (`setl.adapters.pymysql`, `setl.adapters.replication`), against a real MariaDB: run
these against a release other than the one an adapter was written for before trusting it."""

from __future__ import annotations

import contextlib
import logging
import ssl
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from pymysql.constants import COMMAND
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import RowsEvent, TableMapEvent, WriteRowsEvent

from setl import adapters
from setl import binlog_events as ev
from setl.adapters import pymysql as pymysql_io
from setl.adapters import replication
from setl.dial import mysql_connection
from setl.sources.mysql_binlog.connector import _Connector
from setl.sources.mysql_binlog.fast import FastStream
from setl.sources.mysql_binlog.stream import BinlogStream
from setl.testing.servers import MariaDBServer
from tests.sources.binlog import execute, head, next_server_id

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def conn(mariadb_source: MariaDBServer) -> Iterator[Any]:
    """A plain PyMySQL connection to the test server."""
    with contextlib.closing(mariadb_source.connect()) as connection:
        yield connection


def test_the_adapters_are_written_for_the_installed_releases() -> None:
    """The releases the adapters pin are the ones installed here, which these tests exercise."""
    assert pymysql_io.INSTALLED == pymysql_io.WRITTEN_FOR
    assert replication.INSTALLED == replication.WRITTEN_FOR


def test_another_release_is_named_in_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    """A release other than the one written for logs one WARNING naming the library, both releases
    and the fix; the pinned release logs nothing; setl goes on either way."""
    with caplog.at_level(logging.WARNING, logger="setl.adapters"):
        assert adapters.check_version("PyMySQL", pymysql_io.WRITTEN_FOR) == pymysql_io.WRITTEN_FOR
        assert caplog.records == []
        assert adapters.check_version("PyMySQL", "0.9.3") == pymysql_io.INSTALLED
    (record,) = caplog.records
    line = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in line
    assert f"PyMySQL {pymysql_io.INSTALLED} is installed" in line and "written for 0.9.3" in line
    assert "pip install 'PyMySQL==0.9.3'" in line


def test_importing_an_adapter_checks_the_installed_release() -> None:
    """Importing an adapter over another release logs the one WARNING line at import, and the
    adapter still loads."""
    code = ("import importlib.metadata, logging\n"
            "logging.basicConfig(format='%(levelname)s %(message)s')\n"
            "real = importlib.metadata.version\n"
            "importlib.metadata.version = lambda name: '9.9.9' if name == 'mysql-replication' else real(name)\n"
            "from setl.adapters import replication\n"
            "print(replication.INSTALLED)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "9.9.9", done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert lines == [f"WARNING mysql-replication 9.9.9 is installed, but setl's use of its internals was written "
                     f"for {replication.WRITTEN_FOR} exactly: run tests/test_library_contracts.py against it, or "
                     f"pip install 'mysql-replication=={replication.WRITTEN_FOR}'"]


def test_a_command_and_its_packets_leave_the_connection_usable(conn: Any) -> None:
    """A command sent with `send_command` is answered by `read_packet`, a server error is raised as
    PyMySQL raises it, and PyMySQL's own queries go on after both."""
    assert pymysql_io.reads_packets(conn)
    pymysql_io.send_command(conn, COMMAND.COM_QUERY, "DO 1")
    assert pymysql_io.read_packet(conn).is_ok_packet()
    pymysql_io.send_query(conn, "SELEC 1")
    with pytest.raises(pymysql.err.ProgrammingError) as raised:
        pymysql_io.read_packet(conn)
    assert raised.value.args[0] == 1064
    with conn.cursor() as cur:
        cur.execute("SELECT 41 + 1")
        assert cur.fetchone() == (42,)


def test_packet_io_reads_the_result_pymysql_would(conn: Any) -> None:
    """`query_rows` hands a reader the connection's packets (`PacketIO`: the buffered reads, the
    next sequence number) and one converter per column; rows read with them end at the EOF packet,
    and the connection's next query reads from where they stopped."""
    seen: dict[str, Any] = {}

    def read_rows(io: pymysql_io.PacketIO, converters: Any) -> tuple[list[Any], bytes]:
        seen["converters"] = list(converters)
        rows = []
        while True:
            header = io.read(4)
            assert header[3] == io.seq  # the sequence number PyMySQL expects next
            io.seq = (io.seq + 1) % 256
            data = io.read(header[0] | header[1] << 8 | header[2] << 16)
            if data[0] == 0xFE and len(data) < 9:
                return rows, data
            rows.append(data)

    got = pymysql_io.query_rows(conn, "SELECT 7, 'ab' UNION ALL SELECT NULL, 'c'", read_rows)
    assert got == [b"\x017\x02ab", b"\xfb\x01c"]
    assert len(seen["converters"]) == 2 and seen["converters"][0][1] is int
    with conn.cursor() as cur:
        cur.execute("SELECT 'next'")
        assert cur.fetchone() == ("next",)


def test_connections_share_the_preferred_modes_tls_context(mariadb_source: MariaDBServer) -> None:
    """`mysql_connection` without TLS settings builds PyMySQL's preferred mode (TLS if offered, no
    certificate checked) with one context per process, the one PyMySQL would build; explicit TLS
    settings still get a context of their own; the connections work."""
    plain = pymysql.connections.Connection(defer_connect=True)
    shared = pymysql_io.preferred_tls_context()
    assert plain.ssl and not plain._ssl_required and shared is not plain.ctx
    assert (shared.verify_mode, shared.check_hostname, shared.options, shared.verify_flags) == (
        plain.ctx.verify_mode, plain.ctx.check_hostname, plain.ctx.options, plain.ctx.verify_flags)
    args = mariadb_source.connect_args()
    connections = [mysql_connection(connect_timeout=5, **args) for _ in range(2)]
    try:
        assert [type(c) for c in connections] == [pymysql_io.Connection] * 2
        assert all(c.ctx is shared and c.ssl and not c._ssl_required for c in connections)
        for c in connections:
            with c.cursor() as cur:
                cur.execute("SELECT 1")
                assert cur.fetchone() == (1,)
    finally:
        for c in connections:
            c.close()
    own = pymysql_io.Connection(defer_connect=True, ssl={"verify_mode": "required"})
    assert own.ctx is not shared and own.ctx.verify_mode == ssl.CERT_REQUIRED


def test_the_socket_and_the_read_timeout(mariadb_source: MariaDBServer) -> None:
    """`socket_of` is the connection's socket (None once closed); `read_timeout_at_least` lifts the
    read timeout PyMySQL applies before each read for the block only, and `apply_read_timeout`
    sets it on the socket."""
    conn = mariadb_source.connect(read_timeout=1)
    try:
        sock = pymysql_io.socket_of(conn)
        assert sock is not None
        pymysql_io.apply_read_timeout(conn)
        assert sock.gettimeout() == 1
        with pymysql_io.read_timeout_at_least(conn, 5), conn.cursor() as cur:
            cur.execute("SELECT SLEEP(1.3)")
            assert cur.fetchone() == (0,)
        with pytest.raises(pymysql.err.OperationalError) as raised, conn.cursor() as cur:
            cur.execute("SELECT SLEEP(1.3)")
        assert raised.value.args[0] == 2013
    finally:
        conn.close()
    assert pymysql_io.socket_of(conn) is None


@pytest.fixture
def reader(mariadb_source: MariaDBServer, source_db: str) -> Iterator[tuple[FastStream, str]]:
    """setl's own stream from the binlog's end, every event parsed by the library (no compiled
    decoders), and the events of one insert ahead of it."""
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
            "INSERT INTO t VALUES (1, 'one')")
    settings = {"connect_timeout": 5.0, **{k: v for k, v in mariadb_source.connect_args().items() if k != "ssl"}}
    stream = BinlogStream(_Connector(), settings, server_id=next_server_id(), at=start, gtid=None, flavor="mariadb",
                          events=[TableMapEvent, WriteRowsEvent, XidEvent], table_maps=None, blocking=False)
    stream.connect()
    try:
        yield FastStream(stream, None), source_db
    finally:
        stream.close()


def _next(events: FastStream, cls: type) -> Any:
    for _ in range(50):
        event = events.fetchone()
        assert event is not None, f"no {cls.__name__}"
        if isinstance(event, cls):
            return event
    raise AssertionError(f"no {cls.__name__} in 50 events")


def test_the_library_parses_the_packets_of_setls_stream(reader: tuple[FastStream, str]) -> None:
    """`parse_packet` with a `ParseContext` (no control connection) parses the stream's packets into
    setl's values (`event_value`), with the stream's state (format description, table map, position) kept up."""
    events, db = reader
    stream = events.reader
    event = _next(events, ev.Rows)
    assert (event.schema, event.table, event.kind, event.rows[0]["values"]) == (db, "t", ev.WRITE,
                                                                               {"id": 1, "v": "one"})
    assert event.table_id in stream.table_map
    assert len(stream.post_header_lengths) >= BINLOG.DELETE_ROWS_EVENT_V2 and stream.mysql_version >= (10, 0)
    assert stream.log_pos == event.header.log_pos and event.header.event_type == BINLOG.WRITE_ROWS_EVENT_V1
    assert "_read_packet" not in vars(stream.conn)  # nothing of PyMySQL's is swapped on the stream connection
    assert (stream.context.encoding, stream.context.charset) == (stream.conn.encoding, stream.conn.charset)
    xid = _next(events, ev.Xid)
    assert xid.xid > 0 and stream.log_pos == xid.header.log_pos
    assert events.fetchone() is None and stream.ended  # a non-blocking dump ends at the log's end


def test_library_table_maps_become_setls_layouts(reader: tuple[FastStream, str]) -> None:
    """The library's decoded table map becomes a `TableLayout` with the table's names, columns and key,
    and the stream's table map holds the same decoded table the layout describes."""
    events, db = reader
    stream = events.reader
    event = _next(events, ev.TableMap)
    layout = event.layout
    assert (layout.schema, layout.table, layout.primary_key) == (db, "t", ("id",))
    assert [column.name for column in layout.columns] == ["id", "v"]
    assert stream.table_map[layout.table_id] is layout.description


def test_the_library_parts_setl_uses_exist() -> None:
    """The packet wrapper's table-map string reader setl's own wrapper replaces, the binary-JSON parser
    setl calls for MySQL's JSON columns, and the event class map naming the rows and table-map events."""
    assert callable(BinLogPacketWrapper.read_variable_length_string)
    assert replication._Packet.read_variable_length_string is not BinLogPacketWrapper.read_variable_length_string
    # a JSON object {"a": 1} in MySQL's binary format: small object, one key, an inlined int16
    assert replication.json_value(bytes([0, 1, 0, 12, 0, 11, 0, 1, 0, 5, 1, 0, 97])) == {b"a": 1}
    assert issubclass(WriteRowsEvent, RowsEvent)
    classes = replication.event_classes()
    assert classes[BINLOG.WRITE_ROWS_EVENT_V2] is WriteRowsEvent
    assert classes[BINLOG.XID_EVENT] is XidEvent


def test_the_stream_answers_a_repeated_table_map_from_its_cache(mariadb_source: MariaDBServer,
                                                                 source_db: str) -> None:
    """A table map whose bytes the stream's `TableMapCache` holds is answered without the library (the
    same layout, a hit counted), and the library's own `TableMapEvent.__init__` is left unpatched."""
    start = head(mariadb_source)
    execute(mariadb_source, source_db, "CREATE TABLE c (id INT PRIMARY KEY, v VARCHAR(10))",
            "INSERT INTO c VALUES (1, 'one')", "INSERT INTO c VALUES (2, 'two')")
    settings = {"connect_timeout": 5.0, **{k: v for k, v in mariadb_source.connect_args().items() if k != "ssl"}}
    cache = replication.TableMapCache()
    stream = BinlogStream(_Connector(), settings, server_id=next_server_id(), at=start, gtid=None, flavor="mariadb",
                          events=[TableMapEvent, WriteRowsEvent], table_maps=cache, blocking=False)
    stream.connect()
    try:
        events = FastStream(stream, None)  # every packet through the stream's `parse`
        first, second = _next(events, ev.TableMap), _next(events, ev.TableMap)
        rows = _next(events, ev.Rows)
    finally:
        stream.close()
    assert second.layout is first.layout and (cache.misses, cache.hits) == (1, 1)
    assert second.header.log_pos > first.header.log_pos and stream.log_pos == rows.header.log_pos
    assert rows.rows[0]["values"] == {"id": 2, "v": "two"} and first.layout.primary_key == ("id",)
    assert (TableMapEvent.__init__.__module__, TableMapEvent.__init__.__qualname__) == (
        "pymysqlreplication.row_event", "TableMapEvent.__init__")
