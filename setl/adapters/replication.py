"""python-mysql-replication's internals, the one place setl reaches into them: the fixes `install()`
puts into its event classes (setl's binlog source installs them when it is built), its packet
parser as setl's stream calls it (`parse_packet`, with a `ParseContext` in place of a control
connection), and its events converted into setl's own values (`event_value`, `setl.binlog_events`):
no library event leaves this module and the stream that calls it.

Written for mysql-replication `WRITTEN_FOR` exactly (a WARNING at import names another release);
tests/test_library_contracts.py pins the behaviours setl relies on against a real server.
"""

from __future__ import annotations

import contextlib
import datetime
import struct
import threading
from collections import OrderedDict
from typing import Any

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
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    RowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from setl import binlog_events as ev
from setl.adapters import check_version
from setl.errors import ConfigError
from setl.model import InvalidDate

#: The mysql-replication release this module was written and tested against.
WRITTEN_FOR = "1.0.17"
INSTALLED = check_version("mysql-replication", WRITTEN_FOR)


def _read_time2(self: RowsEvent, column: Any) -> datetime.timedelta:
    """TIME(fsp) as MySQL packs it (``my_time_packed_from_binary``).

    The library decodes the whole and the fractional part of a negative TIME separately and gets
    the fraction wrong (-00:00:01.5 comes back as -00:00:01.000005).
    """
    return time2_value(self.packet.read(3 + (column.fsp + 1) // 2), column.fsp)


def time2_value(data: bytes, fsp: int) -> datetime.timedelta:
    """The TIME(fsp) packed in `data` (3 bytes and the fraction's (fsp + 1) // 2)."""
    nfrac = (fsp + 1) // 2
    if nfrac == 3:
        packed = int.from_bytes(data, "big") - (0x800000 << 24)
    else:
        intpart = int.from_bytes(data[:3], "big") - 0x800000
        frac = int.from_bytes(data[3:], "big")
        if intpart < 0 and frac:
            intpart, frac = intpart + 1, frac - (1 << (8 * nfrac))
        packed = (intpart << 24) + frac * (10_000 if nfrac == 1 else 100)
    sign, packed = (-1 if packed < 0 else 1), abs(packed)
    hms, micros = packed >> 24, packed % (1 << 24)
    return sign * datetime.timedelta(hours=(hms >> 12) % 1024, minutes=(hms >> 6) % 64, seconds=hms % 64,
                                     microseconds=micros)



def _read_date(self: RowsEvent) -> datetime.date | InvalidDate:
    """DATE; a zero or partial date (``0000-00-00``, ``2024-00-15``) as `InvalidDate` (the library: None)."""
    raw = self.packet.read_uint24()
    return date_value(raw >> 9, (raw >> 5) & 15, raw & 31)


def date_value(year: int, month: int, day: int) -> datetime.date | InvalidDate:
    """A DATE's value: a calendar date, else `InvalidDate` with its text."""
    try:
        return datetime.date(year, month, day)
    except ValueError:
        return InvalidDate(f"{year:04d}-{month:02d}-{day:02d}")


def datetime_value(year: int, month: int, day: int, hour: int, minute: int, second: int, micros: int, fsp: int
                   ) -> datetime.datetime | InvalidDate:
    date = date_value(year, month, day)
    if isinstance(date, datetime.date):
        with contextlib.suppress(ValueError):
            return datetime.datetime(year, month, day, hour, minute, second, micros)
    fraction = f".{micros:06d}"[: fsp + 1] if fsp else ""
    return InvalidDate(f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}{fraction}")


def _read_datetime(self: RowsEvent) -> datetime.datetime | InvalidDate:
    """DATETIME of the old format (YYYYMMDDhhmmss as an integer)."""
    value = self.packet.read_uint64()
    date, time_ = divmod(value, 1_000_000)
    return datetime_value(date // 10000, date // 100 % 100, date % 100, time_ // 10000, time_ // 100 % 100,
                     time_ % 100, 0, 0)


def _read_datetime2(self: RowsEvent, column: Any) -> datetime.datetime | InvalidDate:
    """DATETIME(fsp); a zero or partial one as `InvalidDate` (the library: None)."""
    data = self.packet.read_int_be_by_size(5)
    year_month = (data >> 22) & ((1 << 17) - 1)
    micros = self._RowsEvent__read_fsp(column)
    return datetime_value(year_month // 13, year_month % 13, (data >> 17) & 31, (data >> 12) & 31, (data >> 6) & 63,
                     data & 63, micros, column.fsp or 0)

def _read_variable_length_string(self: BinLogPacketWrapper) -> bytes:
    """A string of the table map's optional metadata (a column name, an ENUM or SET value).

    The server prefixes it with a packed integer (``net_store_length``: one byte below 251, else
    252/253/254 and 2, 3 or 8 bytes); the library reads a 7-bit varint, which is the same below
    128 bytes and fails on a longer name (64 two-byte characters) with a bare AssertionError.
    """
    length = self.read_length_coded_binary()
    return self.read(length) if length else b""



#: The UTF-16/32 family, which PyMySQL does not map: utf16, utf32 and ucs2 are big-endian in
#: MySQL (Python's "utf16"/"utf32" would look for a byte-order mark), utf16le is little-endian.
#: Unmapped, the library hands such a column on as raw bytes, or fails to decode it.
_WIDE_CHARSETS = {"utf16": "utf-16-be", "utf32": "utf-32-be", "ucs2": "utf-16-be", "utf16le": "utf-16-le"}
_library_encoding = RowsEvent.charset_to_encoding


def _charset_to_encoding(name: str) -> str:
    return _WIDE_CHARSETS.get(name) or _library_encoding(name)




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


_installed = False
_install_lock = threading.Lock()

def event_classes() -> dict[int, type[BinLogEvent]]:
    """The library's event class for each binlog event type it parses (others: NotImplementedEvent)."""
    return dict(BinLogPacketWrapper._BinLogPacketWrapper__event_map)


#: The library's private functions `install` replaces: (owner, name).
REPLACED = ((RowsEvent, "_RowsEvent__read_time2"), (RowsEvent, "_RowsEvent__read_date"),
            (RowsEvent, "_RowsEvent__read_datetime"), (RowsEvent, "_RowsEvent__read_datetime2"),
            (RowsEvent, "_RowsEvent__read_fsp"), (BinLogPacketWrapper, "read_variable_length_string"))


def install() -> None:
    """Apply setl's fixes to python-mysql-replication, once per process (the binlog source calls it
    when it is built, not at import).

    The library decodes a negative TIME(fsp) wrongly, returns None for zero and partial dates,
    maps no UTF-16/32 charset and misreads names of 128+ bytes; each fix replaces one of its
    functions. Its re-decoding of every table map and its not knowing MariaDB's compressed events are
    not patched: setl's stream answers table maps from its `TableMapCache` and inflates compressed
    events before it asks the library. A release without one of those
    functions is refused (ConfigError): setl could not read its events exactly.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        for owner, name in REPLACED:
            if not hasattr(owner, name):
                raise ConfigError(f"python-mysql-replication {INSTALLED} has no {owner.__name__}.{name} to fix; "
                                  f"install mysql-replication=={WRITTEN_FOR}")
        RowsEvent._RowsEvent__read_time2 = _read_time2
        RowsEvent._RowsEvent__read_date = _read_date
        RowsEvent._RowsEvent__read_datetime = _read_datetime
        RowsEvent._RowsEvent__read_datetime2 = _read_datetime2
        RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)
        BinLogPacketWrapper.read_variable_length_string = _read_variable_length_string
        _installed = True


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
    return BinLogPacketWrapper(MysqlPacket(data, encoding), table_map, context, mysql_version, use_checksum,
                               allowed, None, None, None, None, False, False, False, True, False, False,
                               post_header_lengths)


# -- The library's events as setl's values (`setl.binlog_events`): the one door they pass.

#: Every event kind setl's stream asks the library for. The library drops the others before building
#: them: only kinds setl may pass over (`sources.mysql_binlog.assembler.IGNORED_EVENTS`). Every kind
#: the library does not know arrives as a NotImplementedEvent, judged by its type.
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

_ROWS_KINDS: dict[type[BinLogEvent], int] = {WriteRowsEvent: ev.WRITE, UpdateRowsEvent: ev.UPDATE,
                                              DeleteRowsEvent: ev.DELETE}
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

    Rows are read here (the library reads them lazily): an undecodable body raises one of
    `UNDECODABLE`. The wrapper and its event no longer refer to each other afterwards, so reference
    counting frees both here instead of the cyclic collector."""
    event = wrapper.event
    header = header_of(wrapper)
    kind = type(event)
    try:
        change = _ROWS_KINDS.get(kind)
        if change is not None:
            return ev.Rows(header, change, event.table_id, event.schema, event.table, event.rows)
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
            return ev.Query(header, event.query, schema or "", getattr(event, "sql_mode", None))
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
