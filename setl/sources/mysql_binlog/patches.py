"""Fixes to python-mysql-replication, applied by `install()` when a binlog source is built.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from pymysql.protocol import MysqlPacket
from pymysqlreplication.event import BinLogEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import RowsEvent, TableMapEvent

from setl.errors import ConfigError
from setl.model import InvalidDate
from setl.sources.mysql_binlog import compressed


def _drop_reconnect_notice(record: logging.LogRecord) -> bool:
    # The library logs this on every lost stream, ours included when close() cuts it; a real
    # loss surfaces as a SourceError from poll() instead.
    return "Re-request the connection" not in record.getMessage()


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




class _TableMapCache:
    """Decoded table maps of one reader, by the raw bytes of their event body (which start with
    the table id): the library re-decodes the full column metadata of every table-map event,
    one of which precedes every rows event, and that is most of its parse time."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, dict[str, Any]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, body: bytes) -> dict[str, Any] | None:
        state = self._entries.get(body)
        if state is not None:
            self._entries.move_to_end(body)
            self.hits += 1
        return state

    def put(self, body: bytes, state: dict[str, Any]) -> None:
        self.misses += 1
        self._entries[body] = state
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)


_decode_table_map = TableMapEvent.__init__
_FILTERS = ("only_tables", "ignored_tables", "only_schemas", "ignored_schemas", "freeze_schema")


def _table_map_init(self: TableMapEvent, from_packet: Any, event_size: int, table_map: dict, ctl_connection: Any,
                    **kwargs: Any) -> None:
    """`TableMapEvent.__init__`, answered from the reader's `_TableMapCache` when it has one.

    Only readers whose control connection carries a cache (this module's) use it, and only with
    full row metadata (column names come from the event, not from a query) and no filters.
    """
    cache: _TableMapCache | None = getattr(ctl_connection, "setl_table_maps", None)
    if cache is None or not kwargs.get("optional_meta_data") or any(map(kwargs.get, _FILTERS)):
        _decode_table_map(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
        return
    # The packet is the OK byte, the 19-byte event header, the body and maybe a checksum.
    body = bytes(from_packet.packet.get_all_data()[20:20 + event_size])
    state = cache.get(body)
    if state is None:
        _decode_table_map(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
        if self._processed:
            cache.put(body, {k: v for k, v in vars(self).items() if k not in _PER_EVENT})
        return
    BinLogEvent.__init__(self, from_packet, event_size, table_map, ctl_connection, **kwargs)
    vars(self).update(state)  # the decoded table: shared, and read-only once decoded
    table_map[self.table_id] = self.table_obj


# What BinLogEvent.__init__ sets for each event; everything else a table map decodes is cacheable.
_PER_EVENT = frozenset({"packet", "table_map", "event_type", "timestamp", "event_size", "_post_header_lengths",
                        "_ctl_connection", "mysql_version", "_ignore_decode_errors", "_verify_checksum",
                        "_is_event_valid", "_processed", "complete", "dbms"})


#: The python-mysql-replication releases whose internals `install` patches (name-mangled private
#: readers, `TableMapEvent.__init__`'s signature), checked before patching.
SUPPORTED_LIBRARY = ("1.0.9", "1.1")
_installed = False
_install_lock = threading.Lock()


def _inflating_init(init: Any) -> Any:
    """`BinLogPacketWrapper.__init__` that reads a compressed event (MariaDB `log_bin_compress`) as the
    plain event it stands for (`compressed.inflate`); the library knows no compressed kind."""

    def wrapper_init(self: BinLogPacketWrapper, from_packet: Any, table_map: Any, ctl_connection: Any,
                     mysql_version: Any, use_checksum: bool, *args: Any, **kwargs: Any) -> None:
        data = from_packet.get_all_data()
        if compressed.is_compressed(data):
            kind = data[5]
            # the library passes everything positionally; post_header_lengths comes last
            lengths = args[11] if len(args) > 11 else kwargs.get("post_header_lengths")
            try:
                data = compressed.inflate(data, use_checksum, lengths[kind - 1] if lengths and len(lengths) >= kind
                                          else None)
            except compressed.InflateError as exc:
                raise compressed.corrupt(exc, kind, None, int.from_bytes(data[14:18], "little")) from exc
            from_packet = MysqlPacket(data, ctl_connection.encoding)
        init(self, from_packet, table_map, ctl_connection, mysql_version, use_checksum, *args, **kwargs)

    return wrapper_init


def event_classes() -> dict[int, type[BinLogEvent]]:
    """The library's event class for each binlog event type it parses (others: NotImplementedEvent)."""
    return dict(BinLogPacketWrapper._BinLogPacketWrapper__event_map)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def install() -> None:
    """Apply setl's fixes to python-mysql-replication, once per process (the source calls it when
    it is built, not at import).

    The library decodes a negative TIME(fsp) wrongly, returns None for zero and partial dates,
    maps no UTF-16/32 charset, misreads names of 128+ bytes, and re-decodes every table map;
    each fix replaces one of its functions. A release outside `SUPPORTED_LIBRARY` is refused,
    since its internals may differ.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        try:
            version = importlib.metadata.version("mysql-replication")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        low, high = SUPPORTED_LIBRARY
        if version == "unknown" or not _version_tuple(low) <= _version_tuple(version) < _version_tuple(high):
            raise ConfigError(f"python-mysql-replication {version} is installed; setl's binlog source needs "
                              f">={low},<{high} (pip install 'mysql-replication>={low},<{high}')")
        for owner, name in ((RowsEvent, "_RowsEvent__read_time2"), (RowsEvent, "_RowsEvent__read_date"),
                            (RowsEvent, "_RowsEvent__read_datetime"), (RowsEvent, "_RowsEvent__read_datetime2"),
                            (RowsEvent, "_RowsEvent__read_fsp"),
                            (BinLogPacketWrapper, "read_variable_length_string")):
            if not hasattr(owner, name):
                raise ConfigError(f"python-mysql-replication {version} has no {owner.__name__}.{name} to fix; "
                                  f"install mysql-replication>={low},<{high}")
        logging.getLogger("pymysqlreplication").addFilter(_drop_reconnect_notice)
        RowsEvent._RowsEvent__read_time2 = _read_time2
        RowsEvent._RowsEvent__read_date = _read_date
        RowsEvent._RowsEvent__read_datetime = _read_datetime
        RowsEvent._RowsEvent__read_datetime2 = _read_datetime2
        RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)
        BinLogPacketWrapper.read_variable_length_string = _read_variable_length_string
        TableMapEvent.__init__ = _table_map_init
        BinLogPacketWrapper.__init__ = _inflating_init(BinLogPacketWrapper.__init__)
        _installed = True
