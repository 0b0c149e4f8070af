"""setl's binlog stream: the replication connection opened through `setl.dial`, the dump asked for
by file and position (``COM_BINLOG_DUMP``), by MariaDB GTID (``@slave_connect_state``) or by MySQL
GTID set (``COM_BINLOG_DUMP_GTID``), and the stream's state (file, position, table maps, format
description, checksums) kept here as each event passes.

`BinlogStream.packet` is the next packet's payload (framed by the compiled `_rows.Framer`, or by
PyMySQL where it is not built); `parse` has the library parse a payload, follows it and gives
setl's value of it (`setl.binlog_events`, converted by `setl.adapters.replication.event_value`).
`fast.FastStream` reads through it: it builds the hot events (every rows event among them) itself
and hands the rest to `parse`. No library reader or connection object is swapped or half-built: the
library parses the bodies of events that are not rows only (`setl.adapters.replication.parse_packet`).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pymysql
from pymysql.constants import COMMAND
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import BinLogEvent, FormatDescriptionEvent, RotateEvent
from pymysqlreplication.gtid import GtidSet
from pymysqlreplication.row_event import RowsEvent, TableMapEvent

from setl.adapters import pymysql as pymysql_io
from setl.adapters import replication
from setl.adapters.replication import TableMapCache
from setl.binlog_events import Header, TableMap
from setl.errors import SetlError
from setl.model import Position
from setl.sources.mysql_binlog import compressed
from setl.sources.mysql_binlog.assembler import corrupt_event
from setl.sources.mysql_binlog.connector import _Connector

try:
    from setl.sources.mysql_binlog._rows import Framer
except ImportError:  # not built: PyMySQL frames the packets
    Framer = None  # type: ignore[assignment,misc]

#: rows event type -> its library class: the kinds `parse` never hands to the library
_ROWS_CLASSES = {kind: cls for kind, cls in replication.event_classes().items() if cls in replication.ROWS_EVENTS}
_DUMP_NON_BLOCK = 0x01  # the server ends the stream at the log's end instead of waiting
_DUMP_THROUGH_GTID = 0x04


class BinlogStream:
    """One binlog dump on one connection: `connect`, then `packet` and `parse` until the end, `close`.

    `log_file` and `log_pos` follow the stream as the library's reader did (a rotation sets both, every
    other event its end; the first rotation of a GTID start names the file), and `table_map` holds the
    tables of the table-map events read since the last timestamped rotation. `events` are the event
    classes returned (`parse` returns None for the others); format descriptions, table maps and
    rotations are always read.
    """

    def __init__(self, connector: _Connector, settings: dict[str, Any], *, server_id: int,
                 at: Position | None, gtid: str | None, flavor: str, events: Sequence[type[BinLogEvent]],
                 table_maps: TableMapCache | None, heartbeat: float | None = None, blocking: bool = True) -> None:
        self.connector = connector
        self.settings = settings
        self.server_id = server_id
        self.at = at
        self.gtid = gtid  # a GTID start (at is None)
        self.flavor = flavor  # the server's ("mariadb" or "mysql"): how a GTID start is asked for
        self.heartbeat = heartbeat
        self.blocking = blocking
        self.allowed = frozenset(events)
        # the kinds the library builds: rows events are setl's to decode (`fast.FastStream`), never its
        self.in_packet = (self.allowed | {FormatDescriptionEvent, TableMapEvent, RotateEvent}) - set(
            replication.ROWS_EVENTS)
        self.log_file: str | None = at.log if at is not None else None
        self.log_pos: int | None = at.offset if at is not None else None
        self.table_map: dict[int, Any] = {}
        self.mysql_version: Any = (0, 0, 0)
        self.post_header_lengths: Any = None
        self.use_checksum = False
        self.table_maps = table_maps  # decoded table maps, answered before the library is asked
        self.context = replication.ParseContext(flavor)
        self.conn: pymysql.connections.Connection | None = None
        self.encoding = "utf8"
        self.ended = False  # a non-blocking dump reached the log's end
        #: the next packet's payload (bytes); a lost connection raises OperationalError
        self.packet: Callable[[], bytes] = self._not_connected

    @staticmethod
    def _not_connected() -> bytes:
        raise pymysql.err.InterfaceError(0, "the binlog stream is not connected")

    def connect(self) -> None:
        """Open the connection, tell the server what this reader takes, and ask for the dump."""
        conn = self.conn = self.connector.open(**self.settings)
        self.encoding = self.context.encoding = conn.encoding
        self.context.charset = conn.charset
        # what the library's events call their server, as its reader tells it
        self.context.dbms = "mariadb" if "MariaDB" in conn.get_server_info() else "mysql"
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'")
            row = cur.fetchone()
            self.use_checksum = row is not None and str(row[1]).upper() != "NONE"
            if self.use_checksum:  # else the server refuses a reader that does not say it takes them
                cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            if self.heartbeat:
                period = min(float(self.settings.get("read_timeout") or 4294967) / 2, self.heartbeat)
                cur.execute("SET @master_heartbeat_period = %s", (int(min(period, 4294967) * 1_000_000_000),))
            # MariaDB below capability 4 replaces GTID events with dummy ones (MDEV-30958): setl reads them
            cur.execute("SET @mariadb_slave_capability = 4")
            if self.at is None and self.flavor == "mariadb":
                cur.execute("SET @slave_connect_state = %s", (self.gtid or "",))
                cur.execute("SET @slave_gtid_strict_mode = 1")
                cur.execute("SET @slave_gtid_ignore_duplicates = 0")
        flags = 0 if self.blocking else _DUMP_NON_BLOCK
        if self.at is not None:
            pymysql_io.send_command(conn, COMMAND.COM_BINLOG_DUMP, struct.pack(
                "<IHI", self.at.offset, flags, self.server_id) + self.at.log.encode())
        elif self.flavor == "mariadb":  # the server positions the stream after @slave_connect_state
            pymysql_io.send_command(conn, COMMAND.COM_BINLOG_DUMP, struct.pack("<IHI", 4, flags, self.server_id))
        else:
            gtids = GtidSet(self.gtid or "")
            pymysql_io.send_command(conn, COMMAND.COM_BINLOG_DUMP_GTID, struct.pack(
                "<HII3sQI", flags | _DUMP_THROUGH_GTID, self.server_id, 3, b"\0\0\0", 4, gtids.encoded_length)
                + gtids.encoded())
        pymysql_io.apply_read_timeout(conn)
        if Framer is not None:
            self.packet = Framer(pymysql_io.PacketIO(conn)).packet
        else:
            read = pymysql_io.read_packet
            self.packet = lambda: read(conn).get_all_data()

    def parse(self, data: bytes) -> Any:
        """setl's value (`setl.binlog_events`) of the event of payload `data`, which the library parses,
        with the stream's state brought past it; None for an event of a kind not returned, a packet
        that is no event, or the end of a non-blocking dump (`ended` is then True). An error packet
        raises the server's error; a body the library cannot read, `CorruptEvent`. A rows event of a
        kind returned is not the library's to read: it is refused (TypeError; `fast.FastStream` reads
        those), one of a kind not returned is passed over."""
        first = data[0]
        if first == 0xFF:
            pymysql_io.packet_of(data, self.encoding)  # raises the server's error
        if first == 0xFE and len(data) < 9:
            self.ended = True
            return None
        if first != 0 or len(data) < 20:
            return None
        if data[5] in compressed.PLAIN_TYPE:  # log_bin_compress: the library parses the plain event
            data = compressed.plain_packet(data, self.use_checksum, self.post_header_lengths)
        rows = _ROWS_CLASSES.get(data[5])
        if rows is not None and rows in self.allowed:
            raise TypeError(f"{rows.__name__} handed to the library: setl decodes rows events (fast.FastStream)")
        body = None
        if data[5] == BINLOG.TABLE_MAP_EVENT and self.table_maps is not None:
            header = Header.of(data)
            body = data[20:header.event_size + 1 - (4 if self.use_checksum else 0)]
            layout = self.table_maps.get(body)
            if layout is not None:  # decoded before: the library is not asked again
                if header.log_pos:
                    self.log_pos = header.log_pos
                self.table_map[layout.table_id] = layout.description
                return TableMap(header, layout) if TableMapEvent in self.allowed else None
        wrapper = replication.parse_packet(data, self.encoding, self.table_map, self.context, self.mysql_version,
                                           self.use_checksum, self.in_packet, self.post_header_lengths)
        event = wrapper.event
        if wrapper.event_type == BINLOG.ROTATE_EVENT and event is not None:
            self.log_pos, self.log_file = event.position, event.next_binlog
            # Table ids are not kept across a server restart, which starts a new file: every
            # timestamped rotation may be one, so the table maps read before it are dropped.
            if wrapper.timestamp != 0:
                self.table_map = {}
        elif wrapper.log_pos:
            self.log_pos = wrapper.log_pos
        if event is None:
            return None
        if wrapper.event_type == BINLOG.FORMAT_DESCRIPTION_EVENT:
            self.mysql_version, self.post_header_lengths = event.mysql_version, event.post_header_len
        elif wrapper.event_type == BINLOG.TABLE_MAP_EVENT:
            self.table_map[event.table_id] = event.get_table()
            if body is not None and self.table_maps is not None:
                value = replication.event_value(wrapper)
                self.table_maps.put(body, value.layout)
                return value if TableMapEvent in self.allowed else None
        if type(event) not in self.allowed:
            return None
        try:
            return replication.event_value(wrapper)
        except replication.UNDECODABLE as exc:  # rows the library cannot read: stop at their event
            if isinstance(exc, SetlError):
                raise
            table = f"{event.schema}.{event.table}" if isinstance(event, RowsEvent) else None
            what = type(event).__name__ + (f" of {table}" if table else "")
            raise corrupt_event(exc, what, str(self.log_file), wrapper.log_pos - wrapper.event_size,
                                wrapper.log_pos, table) from exc

    def close(self) -> None:
        conn, self.conn = self.conn, None
        self.packet = self._not_connected
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
