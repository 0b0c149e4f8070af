"""python-mysql-replication's internals, the one place setl reaches into them: its packet parser as
setl's stream calls it for the bodies of events that are not rows (`parse_packet`, with a
`ParseContext` in place of a control connection, and table-map names read as the server writes
them), its events converted into setl's own values (`event_value`, `setl.binlog_events`), and its
binary-JSON parser (`json_value`, MySQL's JSON columns). Rows events never reach the library: setl
decodes them (`sources.mysql_binlog.fast`); no library class is patched. No library event leaves
this module and the stream that calls it.

Written for mysql-replication `WRITTEN_FOR` exactly (a WARNING at import names another release);
tests/test_library_contracts.py pins the behaviours setl relies on against a real server.
"""

from __future__ import annotations

import contextlib
import datetime
import struct
from collections import OrderedDict
from typing import Any

from pymysql.charset import charset_by_name
from pymysql.protocol import MysqlPacket
from pymysqlreplication import exceptions as _library_errors
from pymysqlreplication.event import (
    BinLogEvent,
    ExecuteLoadQueryEvent,
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbBinLogCheckPointEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    NotImplementedEvent,
    PreviousGtidsEvent,
    QueryEvent,
    RotateEvent,
    StopEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.json_binary import parse_json
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from setl import binlog_events as ev
from setl.adapters import check_version
from setl.model import InvalidDate

#: The mysql-replication release this module was written and tested against.
WRITTEN_FOR = "1.0.17"
INSTALLED = check_version("mysql-replication", WRITTEN_FOR)


def date_value(year: int, month: int, day: int) -> datetime.date | InvalidDate:
    """A DATE's value: a calendar date, else `InvalidDate` with its text."""
    try:
        return datetime.date(year, month, day)
    except ValueError:
        return InvalidDate(f"{year:04d}-{month:02d}-{day:02d}")


def datetime_value(year: int, month: int, day: int, hour: int, minute: int, second: int, micros: int, fsp: int
                   ) -> datetime.datetime | InvalidDate:
    """A DATETIME's value: a calendar datetime, else `InvalidDate` with its text (a zero or partial date)."""
    date = date_value(year, month, day)
    if isinstance(date, datetime.date):
        with contextlib.suppress(ValueError):
            return datetime.datetime(year, month, day, hour, minute, second, micros)
    fraction = f".{micros:06d}"[: fsp + 1] if fsp else ""
    return InvalidDate(f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}{fraction}")


#: The UTF-16/32 family, which PyMySQL does not map: utf16, utf32 and ucs2 are big-endian in
#: MySQL (Python's "utf16"/"utf32" would look for a byte-order mark), utf16le is little-endian.
_WIDE_CHARSETS = {"utf16": "utf-16-be", "utf32": "utf-32-be", "ucs2": "utf-16-be", "utf16le": "utf-16-le"}


def charset_to_encoding(name: str) -> str:
    """The Python codec of a MySQL character set (PyMySQL's, the UTF-16/32 family setl's); a name
    without one comes back as it is, and setl's decoders hand such a column's bytes on raw."""
    wide = _WIDE_CHARSETS.get(name)
    if wide is not None:
        return wide
    charset = charset_by_name(name)
    return charset.encoding if charset else name


def json_value(data: bytes) -> Any:
    """The value of a MySQL JSON column's binary bytes (MySQL's own JSON format; MariaDB's JSON is
    text). The one value of a rows event setl has the library read: its binary-JSON parser,
    ``pymysqlreplication.json_binary.parse_json``, called on the column's bytes."""
    return parse_json(data[0], data[1:])


class _Packet(BinLogPacketWrapper):
    """The library's packet wrapper with table-map strings read as the server writes them.

    A string of the table map's optional metadata (a column name, an ENUM or SET value) is
    prefixed with a packed integer (``net_store_length``: one byte below 251, else 252/253/254 and
    2, 3 or 8 bytes); the library reads a 7-bit varint, which is the same below 128 bytes and
    fails on a longer name (64 two-byte characters) with a bare AssertionError.
    """

    def read_variable_length_string(self) -> bytes:
        length = self.read_length_coded_binary()
        return self.read(length) if length else b""




class TableMapCache:
    """Decoded table maps of one reader (`TableLayout`), by the raw bytes of their event body (which
    start with the table id): the library re-decodes the full column metadata of every table-map
    event, one of which precedes every rows event, and that is most of its parse time. setl's
    stream answers a table map from here before asking the library (`sources.mysql_binlog.stream`)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, ev.TableLayout] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, body: bytes) -> ev.TableLayout | None:
        layout = self._entries.get(body)
        if layout is not None:
            self._entries.move_to_end(body)
            self.hits += 1
        return layout

    def put(self, body: bytes, layout: ev.TableLayout) -> None:
        self.misses += 1
        self._entries[body] = layout
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)


def event_classes() -> dict[int, type[BinLogEvent]]:
    """The library's event class for each binlog event type it parses (others: NotImplementedEvent)."""
    return dict(BinLogPacketWrapper._BinLogPacketWrapper__event_map)


# -- The library as a parser of event bodies, for setl's own stream (`sources.mysql_binlog.stream`).


class ParseContext:
    """What the library's event parsers take as their "control connection": the connection's charset
    and encoding, the server's flavor
    (``_get_dbms``). With full row metadata and no column-name cache the library asks that
    connection nothing, so setl's stream opens none (tests/test_library_contracts.py)."""

    def __init__(self, dbms: str, charset: str = "utf8mb4", encoding: str = "utf8") -> None:
        self.dbms = dbms
        self.charset = charset
        self.encoding = encoding

    def _get_dbms(self) -> str:
        return self.dbms


def parse_packet(data: bytes, encoding: str, table_map: dict[int, Any], context: ParseContext, mysql_version: Any,
                 use_checksum: bool, allowed: frozenset[type[BinLogEvent]], post_header_lengths: Any) -> Any:
    """The library's `BinLogPacketWrapper` of payload `data` (the OK byte, the event header and body):
    its `event` is None for a kind outside `allowed`. Read with setl's settings: no table or schema
    filters, full row metadata, no column-name cache, checksums not verified by the library."""
    return _Packet(MysqlPacket(data, encoding), table_map, context, mysql_version, use_checksum,
                   allowed, None, None, None, None, False, False, False, True, False, False, post_header_lengths)


# -- The library's events as setl's values (`setl.binlog_events`): the one door they pass.

#: Every event kind setl's stream reads. The library drops the others before building them: only kinds
#: setl may pass over (`sources.mysql_binlog.assembler.IGNORED_EVENTS`). Every kind the library does not
#: know arrives as a NotImplementedEvent, judged by its type. The rows kinds are setl's to decode
#: (`sources.mysql_binlog.fast`): the stream never hands their bodies to the library (`ROWS_EVENTS`).
READ_EVENTS: tuple[type[BinLogEvent], ...] = (
    RotateEvent, FormatDescriptionEvent, MariadbGtidListEvent, MariadbBinLogCheckPointEvent, PreviousGtidsEvent,
    HeartbeatLogEvent, StopEvent, MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, XAPrepareEvent, TableMapEvent,
    WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, PartialUpdateRowsEvent, ExecuteLoadQueryEvent,
    NotImplementedEvent)

#: What the library raises on bytes it cannot account for: a short read (PyMySQL's bare AssertionError),
#: struct.error, an ENUM index out of range, a value no codec, date or Decimal takes, its own
#: malformed-event errors.
UNDECODABLE: tuple[type[BaseException], ...] = (
    AssertionError, struct.error, ValueError, ArithmeticError, LookupError, TypeError,
    *(getattr(_library_errors, name) for name in ("MalformedBinLogEvent", "StatusVariableMismatch")
      if hasattr(_library_errors, name)))

#: The rows events setl decodes itself; PARTIAL_UPDATE_ROWS (MySQL's JSON diffs) is not one of them: the
#: library reads its header only, and the assembler refuses it.
ROWS_EVENTS = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)
_MARKS = (FormatDescriptionEvent, MariadbGtidListEvent, MariadbBinLogCheckPointEvent, PreviousGtidsEvent, StopEvent)


def header_of(wrapper: BinLogPacketWrapper) -> ev.Header:
    """The common header of the event `wrapper` holds."""
    return ev.Header(wrapper.timestamp, wrapper.event_type, wrapper.server_id, wrapper.event_size, wrapper.log_pos)


def table_layout(table_id: int, schema: str, table: str, columns: Any, optional_metadata: Any, description: Any
                 ) -> ev.TableLayout:
    """setl's `TableLayout` of a table map the library decoded (its columns, optional metadata and table)."""
    indexes = list(optional_metadata.simple_primary_key_list) or list(optional_metadata.primary_keys_with_prefix)
    if indexes:
        key = tuple(columns[i].name for i in indexes)
    else:
        pk = description.primary_key
        key = tuple(pk) if isinstance(pk, tuple) else ((pk,) if pk else ())
    return ev.TableLayout(table_id, schema, table, columns, key, description)


def load_query_statement(event: ExecuteLoadQueryEvent) -> tuple[str, str]:
    """A statement-logged LOAD DATA's default schema and statement text (the library reads only the
    fixed part of its EXECUTE_LOAD_QUERY event)."""
    packet = event.packet
    packet.read(event.status_vars_length)
    schema = packet.read(event.schema_length).decode("utf-8", "replace")
    packet.read(1)
    rest = event.event_size - 26 - event.status_vars_length - event.schema_length - 1
    return schema, (packet.read(rest).decode("utf-8", "replace") if rest > 0 else "LOAD DATA")


def event_value(wrapper: BinLogPacketWrapper) -> Any:
    """setl's value (`setl.binlog_events`) of the event the library parsed into `wrapper` (not None).

    An undecodable body raises one of `UNDECODABLE`; a rows event is setl's to decode (TypeError). The
    wrapper and its event no longer refer to each other afterwards, so reference counting frees both
    here instead of the cyclic collector."""
    event = wrapper.event
    header = header_of(wrapper)
    kind = type(event)
    try:
        if kind in ROWS_EVENTS:
            raise TypeError(f"{kind.__name__} handed to the library: setl decodes rows events itself")
        if kind is TableMapEvent:
            return ev.TableMap(header, table_layout(event.table_id, event.schema, event.table, event.columns,
                                                    event.optional_metadata, event.table_obj))
        if kind is MariadbGtidEvent:
            return ev.MariadbGtid(header, event.gtid, event.flags)
        if kind is GtidEvent:
            return ev.MysqlGtid(header, event.gtid)
        if kind is XidEvent:
            return ev.Xid(header, event.xid)
        if kind is QueryEvent:
            schema = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) else event.schema
            return ev.Query(header, event.query, schema or "", getattr(event, "sql_mode", None),
                            int(getattr(event, "slave_proxy_id", 0) or 0))
        if kind is ExecuteLoadQueryEvent:
            schema, statement = load_query_statement(event)
            return ev.Query(header, statement, schema, None)
        if kind is XAPrepareEvent:
            return ev.XaPrepare(header, bool(event.one_phase), event.xid_format_id, bytes(event.xid_gtrid),
                                bytes(event.xid_bqual))
        if kind is RotateEvent:
            return ev.Rotate(header, event.next_binlog, event.position)
        if kind is HeartbeatLogEvent:
            return ev.Heartbeat(header, event.ident.rstrip("\0"))
        if isinstance(event, _MARKS):
            return ev.Mark(header, kind.__name__)
        return ev.Unknown(header, None if kind is NotImplementedEvent else kind.__name__)
    finally:
        wrapper.event = None
        event.packet = None
