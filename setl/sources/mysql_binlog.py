"""A MySQL or MariaDB binary log as a Select: whole transactions of full-image row changes and DDL.

This is the only module that imports pymysqlreplication; nothing it returns holds a library object.
A background thread reads the binlog with a blocking stream, reconnects when the server goes away,
and hands assembled transactions to `poll` through a bounded queue, so `poll` honours its timeout
and `close` interrupts the read.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import logging
import queue
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE, NONE_SOURCE
from pymysqlreplication.event import (
    BinLogEvent,
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbBinLogCheckPointEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    PreviousGtidsEvent,
    QueryEvent,
    RotateEvent,
    StopEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.gtid import Gtid, GtidSet
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from setl import ddl
from setl.config import MysqlSourceConfig
from setl.errors import ConfigError, PositionPurged, SourceError
from setl.model import Change, DdlChange, InvalidDate, Op, Position, RowChange, Transaction
from setl.retry import Backoff
from setl.stages.select import Select

log = logging.getLogger("setl.sources.mysql_binlog")


def _drop_reconnect_notice(record: logging.LogRecord) -> bool:
    # The library logs this on every lost stream, ours included when close() cuts it; a real
    # loss surfaces as a SourceError from poll() instead.
    return "Re-request the connection" not in record.getMessage()



# What a server must run with, and why: column names and primary keys come from the table map.
REQUIRED_SETTINGS: Mapping[str, str] = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}

# Events that only move the read position: outside a transaction they become position marks.
_POSITION_EVENTS = (RotateEvent, FormatDescriptionEvent, MariadbGtidListEvent, MariadbBinLogCheckPointEvent,
                    PreviousGtidsEvent, HeartbeatLogEvent, StopEvent)
_EVENTS = [*_POSITION_EVENTS, MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, XAPrepareEvent, TableMapEvent,
           WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent]
_TRANSACTIONAL_ENGINES = frozenset({"innodb", "rocksdb", "tokudb", "xtradb"})
_GTID_STANDALONE = 0x01  # MariaDB GTID flag: one statement, no BEGIN/COMMIT follows
_GTID_PREPARED_XA = 0x40  # MariaDB GTID flag: the group ends in XA PREPARE
_IGNORED_IN_TX = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO|RELEASE\s+SAVEPOINT|XA\s)", re.I)
# How the server logs the second phase of a prepared XA transaction (its own event group).
_XA_END = re.compile(r"^\s*XA\s+(?P<verb>COMMIT|ROLLBACK)\s+X'(?P<gtrid>[0-9a-f]*)'\s*,\s*X'(?P<bqual>[0-9a-f]*)'"
                     r"\s*,\s*(?P<format>\d+)\s*;?\s*$", re.I)

#: A prepared XA transaction's identity: (formatID, gtrid, bqual).
XaKey = tuple[int, bytes, bytes]
#: A row change (or a statement logged inside a transaction) as the assembler holds it.
_Item = tuple[Any, Any, Any, Any]


def _row_items(event: RowsEvent, info: "_TableInfo") -> list[_Item]:
    """The row changes of one rows event, with setl's images (of a system-versioned table: its
    current rows only)."""
    items = _raw_row_items(event, info)
    if info.period is None:
        return items
    return [current for current in map(info.current, items) if current is not None]


def _raw_row_items(event: RowsEvent, info: "_TableInfo") -> list[_Item]:
    if isinstance(event, WriteRowsEvent):
        return [(Op.INSERT, info, None, info.image(row["values"], row["none_sources"])) for row in event.rows]
    if isinstance(event, DeleteRowsEvent):
        return [(Op.DELETE, info, info.image(row["values"], row["none_sources"]), None) for row in event.rows]
    return [(Op.UPDATE, info, info.image(row["before_values"], row["before_none_sources"]),
             info.image(row["after_values"], row["after_none_sources"])) for row in event.rows]

_NAME = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_QUALIFIED = rf"(?P<name>{_NAME}(?:\s*\.\s*{_NAME})?)"
_DDL_DATABASE = re.compile(rf"^(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:DATABASE|SCHEMA)\s+"
                           rf"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?P<name>{_NAME})", re.I)
_SAVEPOINT = re.compile(rf"^\s*(?P<verb>SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO(?:\s+SAVEPOINT)?|RELEASE\s+SAVEPOINT)\s+"
                        rf"(?P<name>{_NAME})\s*;?\s*$", re.I)
_LEADING_COMMENTS = re.compile(r"^\s*(?:/\*(?!!).*?\*/\s*|#[^\n]*\n\s*|--\s[^\n]*\n\s*)*", re.S)


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def ddl_target(statement: str, default_schema: str) -> tuple[str, str | None]:
    """``(schema, table or None)`` a DDL statement acts on: the database of CREATE/ALTER/DROP
    DATABASE, else the first table `setl.ddl` finds (None for a statement that is not a table DDL)."""
    match = _DDL_DATABASE.match(_LEADING_COMMENTS.sub("", statement, count=1))
    if match:
        return _unquote(match["name"]), None
    parsed = ddl.parse(statement)
    if not parsed.tables:
        return default_schema, None
    first = parsed.tables[0]
    return first.schema or default_schema, first.table


_DML = re.compile(r"^\s*(?:INSERT|REPLACE|UPDATE|DELETE|LOAD\s+(?:DATA|XML)|WITH\s|CALL\s)", re.I)
_DML_TARGETS = [
    re.compile(rf"^\s*(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*(?:INTO\s+)?"
               rf"{_QUALIFIED}", re.I),
    re.compile(rf"^\s*UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*{_QUALIFIED}\s+SET\s", re.I),
    re.compile(rf"^\s*DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*FROM\s+{_QUALIFIED}"
               rf"\s*(?:$|;|WHERE\s|ORDER\s|LIMIT\s|RETURNING\s|PARTITION\s)", re.I),
    re.compile(rf"^\s*LOAD\s+(?:DATA|XML)\s.*?\sINTO\s+TABLE\s+{_QUALIFIED}", re.I | re.S),
]


def dml_target(statement: str, default_schema: str) -> tuple[str, str] | None:
    """``(schema, table)`` a single-table DML statement writes, or None when it cannot be told
    (a multi-table UPDATE or DELETE, a CTE, a procedure call)."""
    for pattern in _DML_TARGETS:
        match = pattern.match(statement)
        if match:
            parts = re.split(rf"\s*\.\s*(?={_NAME}$)", match["name"], maxsplit=1)
            if len(parts) == 2:
                return _unquote(parts[0]), _unquote(parts[1])
            return default_schema, _unquote(parts[0])
    return None


def _read_time2(self: RowsEvent, column: Any) -> datetime.timedelta:
    """TIME(fsp) as MySQL packs it (``my_time_packed_from_binary``).

    The library decodes the whole and the fractional part of a negative TIME separately and gets
    the fraction wrong (-00:00:01.5 comes back as -00:00:01.000005).
    """
    nfrac = (column.fsp + 1) // 2
    data = self.packet.read(3 + nfrac)
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



def _calendar_date(year: int, month: int, day: int, text: str) -> datetime.date | InvalidDate:
    try:
        return datetime.date(year, month, day)
    except ValueError:
        return InvalidDate(text)


def _read_date(self: RowsEvent) -> datetime.date | InvalidDate:
    """DATE; a zero or partial date (``0000-00-00``, ``2024-00-15``) as `InvalidDate` (the library: None)."""
    raw = self.packet.read_uint24()
    year, month, day = raw >> 9, (raw >> 5) & 15, raw & 31
    return _calendar_date(year, month, day, f"{year:04d}-{month:02d}-{day:02d}")


def _datetime(year: int, month: int, day: int, hour: int, minute: int, second: int, micros: int, fsp: int
              ) -> datetime.datetime | InvalidDate:
    date = _calendar_date(year, month, day, "")
    if isinstance(date, datetime.date):
        with contextlib.suppress(ValueError):
            return datetime.datetime(year, month, day, hour, minute, second, micros)
    fraction = f".{micros:06d}"[: fsp + 1] if fsp else ""
    return InvalidDate(f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}{fraction}")


def _read_datetime(self: RowsEvent) -> datetime.datetime | InvalidDate:
    """DATETIME of the old format (YYYYMMDDhhmmss as an integer)."""
    value = self.packet.read_uint64()
    date, time_ = divmod(value, 1_000_000)
    return _datetime(date // 10000, date // 100 % 100, date % 100, time_ // 10000, time_ // 100 % 100,
                     time_ % 100, 0, 0)


def _read_datetime2(self: RowsEvent, column: Any) -> datetime.datetime | InvalidDate:
    """DATETIME(fsp); a zero or partial one as `InvalidDate` (the library: None)."""
    data = self.packet.read_int_be_by_size(5)
    year_month = (data >> 22) & ((1 << 17) - 1)
    micros = self._RowsEvent__read_fsp(column)  # type: ignore[attr-defined]
    return _datetime(year_month // 13, year_month % 13, (data >> 17) & 31, (data >> 12) & 31, (data >> 6) & 63,
                     data & 63, micros, column.fsp or 0)


#: The row end of a system-versioned table's current rows: TIMESTAMP's maximum, or the largest
#: transaction id (WITH SYSTEM VERSIONING over BIGINT UNSIGNED trx ids).
_TIMESTAMP_MAX = datetime.datetime(2038, 1, 19, 3, 14, 7)
_TRX_ID_MAX = (1 << 64) - 1


@attrs.frozen
class TableKind:
    """What information_schema says about a table the binlog's table map does not."""

    sequence: bool = False
    period: tuple[str, str] | None = None


_PERIOD = re.compile(r"PERIOD\s+FOR\s+SYSTEM_TIME\s*\(\s*(`(?:[^`]|``)+`|\w+)\s*,\s*(`(?:[^`]|``)+`|\w+)\s*\)", re.I)

#: A TIMESTAMP of 0 ('0000-00-00 00:00:00') decodes as the epoch, which a TIMESTAMP cannot hold.
_ZERO_TIMESTAMP = datetime.datetime(1970, 1, 1)

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
        RowsEvent._RowsEvent__read_time2 = _read_time2  # type: ignore[attr-defined]
        RowsEvent._RowsEvent__read_date = _read_date  # type: ignore[attr-defined]
        RowsEvent._RowsEvent__read_datetime = _read_datetime  # type: ignore[attr-defined]
        RowsEvent._RowsEvent__read_datetime2 = _read_datetime2  # type: ignore[attr-defined]
        RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)  # type: ignore[method-assign]
        BinLogPacketWrapper.read_variable_length_string = _read_variable_length_string  # type: ignore[method-assign]
        TableMapEvent.__init__ = _table_map_init  # type: ignore[method-assign]
        _installed = True


@attrs.frozen
class _TableInfo:
    """What a rows event needs from its table map: names, key, and per-column value fixes."""

    schema: str
    table: str
    primary_key: tuple[str, ...]
    sets: frozenset[str]
    bits: frozenset[str]
    years: frozenset[str]
    binaries: frozenset[str]
    binary_widths: Mapping[str, int]
    timestamps: Mapping[str, int] = attrs.field(factory=dict)  # TIMESTAMP columns and their fsp
    sequence: bool = False  # a SEQUENCE's state row: not handed on
    period: tuple[str, str] | None = None  # a system-versioned table's (row start, row end) columns

    def with_kind(self, kind: "TableKind") -> "_TableInfo":
        if kind.period is None:
            return attrs.evolve(self, sequence=kind.sequence)
        key = tuple(c for c in self.primary_key if c not in kind.period)  # the server adds row end to it
        return attrs.evolve(self, sequence=kind.sequence, period=kind.period, primary_key=key)

    def current(self, item: _Item) -> _Item | None:
        """A system-versioned table's row change as a change of its current rows, without the
        period columns; None for a change to history rows only."""
        assert self.period is not None
        op, _, before, after = item
        start, end = self.period

        def live(image: Mapping[str, Any] | None) -> bool:
            value = image.get(end) if image is not None else None
            return (isinstance(value, datetime.datetime) and value >= _TIMESTAMP_MAX) or value == _TRX_ID_MAX

        def strip(image: Mapping[str, Any] | None) -> dict[str, Any] | None:
            return None if image is None else {k: v for k, v in image.items() if k not in (start, end)}

        was, now = live(before), live(after)
        if was and now:
            return (op, self, strip(before), strip(after))
        if was:
            return (Op.DELETE, self, strip(before), None)
        if now:
            return (Op.INSERT, self, None, strip(after))
        return None

    @classmethod
    def from_table_map(cls, event: TableMapEvent) -> "_TableInfo":
        columns = event.columns
        meta = event.optional_metadata
        indexes = list(meta.simple_primary_key_list) or list(meta.primary_keys_with_prefix)
        if indexes:
            key = tuple(columns[i].name for i in indexes)
        else:
            pk = event.get_table().primary_key
            key = tuple(pk) if isinstance(pk, tuple) else ((pk,) if pk else ())
        return cls(
            event.schema, event.table, key,
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.SET),
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.BIT),
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.YEAR),
            frozenset(c.name for c in columns if c.character_set_name == "binary"),
            # BINARY(n) arrives with its trailing zero bytes stripped
            {c.name: c.max_length for c in columns
             if c.type == FIELD_TYPE.STRING and c.character_set_name == "binary"},
            {c.name: getattr(c, "fsp", 0) or 0 for c in columns
             if c.type in (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2)},
        )

    def image(self, values: dict[str, Any], none_sources: Mapping[str, str]) -> dict[str, Any]:
        """The row as setl hands it on: the library's values, with its lossy spots undone."""
        for name in self.sets:
            if values.get(name) is None and none_sources.get(name) == NONE_SOURCE.EMPTY_SET:
                values[name] = set()
        for name in self.bits:
            if values.get(name) is not None:
                values[name] = int(values[name], 2)
        for name in self.years:
            if values.get(name) == 1900:  # YEAR 0000 decodes as 1900, which YEAR cannot hold
                values[name] = 0
        for name in self.binaries:
            if values.get(name) == "":  # an empty value skips the (failing) decode and stays str
                values[name] = b""
        for name, fsp in self.timestamps.items():
            if values.get(name) == _ZERO_TIMESTAMP:
                values[name] = InvalidDate("0000-00-00 00:00:00" + ("." + "0" * fsp if fsp else ""))
        for name, width in self.binary_widths.items():
            value = values.get(name)
            if isinstance(value, bytes) and len(value) < width:
                values[name] = value.ljust(width, b"\0")
        return values


_MARIADB_GTID = re.compile(r"^\s*\d+-\d+-\d+\s*(?:,\s*\d+-\d+-\d+\s*)*$")
_MYSQL_GTID = re.compile(r"^\s*[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}(?::\d+(?:-\d+)?)+\s*"
                         r"(?:,\s*[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}(?::\d+(?:-\d+)?)+\s*)*$", re.I)


def gtid_flavor(text: str) -> str | None:
    """``"mariadb"`` for a ``domain-server-seq`` list, ``"mysql"`` for a ``uuid:interval`` set, else None."""
    if _MARIADB_GTID.match(text):
        return "mariadb"
    if _MYSQL_GTID.match(text):
        return "mysql"
    return None


class _GtidState:
    """The GTID set executed up to a point of the binlog, in the server's flavour.

    MariaDB: the last GTID of each replication domain (``0-1-42,1-2-7``); MySQL: a ``uuid:intervals``
    set. `add` records a committed transaction's GTID.
    """

    def __init__(self, flavor: str, text: str) -> None:
        self.flavor = flavor
        self._domains: dict[int, str] = {}
        self._set: GtidSet | None = None
        if flavor == "mariadb":
            for gtid in filter(None, (g.strip() for g in text.split(","))):
                self._domains[int(gtid.split("-", 1)[0])] = gtid
        else:
            self._set = GtidSet(text.replace("\n", ""))
        self.text = self._render()

    def _render(self) -> str:
        if self._set is not None:
            return str(self._set)
        return ",".join(self._domains[d] for d in sorted(self._domains))

    def add(self, gtid: str) -> None:
        if self._set is not None:
            self._set = self._set + Gtid(gtid)
        else:
            self._domains[int(gtid.split("-", 1)[0])] = gtid
        self.text = self._render()

    def covers(self, other: "_GtidState") -> bool:
        """Whether every transaction of `other` is in this set."""
        if self._set is not None and other._set is not None:
            return all(gtid in self._set for gtid in other._set.gtids)
        mine = {d: int(g.rsplit("-", 1)[1]) for d, g in self._domains.items()}
        return all(mine.get(d, -1) >= int(g.rsplit("-", 1)[1]) for d, g in other._domains.items())


class _Assembler:
    """Turns a stream of binlog events into transactions (runs on the reader thread).

    Outside a transaction, events that only move the read position (rotation, checkpoints, GTID
    lists, heartbeats) yield a position mark: a Transaction with no changes whose `end` is where
    reading continues.

    A transaction of more than `max_rows` row changes is handed on in pieces. A piece's `end` is
    the transaction's start (where its first event begins, with the GTID set before it) with
    `row` = the row changes handed on so far, and each change of such a transaction carries the
    start with `row` = its 1-based ordinal. Reading again from such a position (a reconnect, or
    `open` at an acknowledged piece end) re-reads the transaction and drops its first `skip`
    row changes.
    """

    def __init__(self, start: Position, max_rows: int, gtids: _GtidState | None,
                 prepared_rows: Callable[[XaKey, Position | None, Position], list[_Item]] | None = None,
                 transactional: Callable[[str, str], bool] | None = None,
                 selects: Callable[[str, str], bool] | None = None, tables_of: KnownTables | None = None
                 ) -> None:
        self.tables_of = tables_of if tables_of is not None else KnownTables()
        self.kind_of: Callable[[str, str], TableKind] | None = None
        self.sequences_seen: set[tuple[str, str]] = set()
        self.kinds: dict[tuple[str, str], TableKind] = {}  # asked of the server once, until the next DDL
        self.transactional = transactional
        self.selects = selects  # whether the pipeline's table rules take schema.table (None: all)
        self.handed_undoable = 0  # the last ordinal of a transactional row handed on after a savepoint
        self.log_file = start.log
        # XA PREPARE groups seen by this reader (where each starts), and how to read a prepared
        # transaction's rows again when its XA COMMIT arrives.
        self.prepared: dict[XaKey, Position] = {}
        self.prepared_rows = prepared_rows
        self.xa_pending = False  # the open group is an XA PREPARE group: its rows wait for XA COMMIT
        self.tx_start: Position | None = None  # where the open transaction's first event begins
        self.max_rows = max_rows
        self.gtids = gtids
        self.tables: dict[int, _TableInfo] = {}
        self._infos: dict[int, tuple[Any, _TableInfo]] = {}
        self.rows: list[tuple[int, _Item]] = []  # (ordinal in the transaction, item) not yet handed on
        self.savepoints: dict[str, int] = {}  # savepoint name -> row changes read before it
        self.nbytes = 0
        self.in_tx = False
        self.standalone = False
        self.pending_gtid: str | None = None
        self.handed_in_tx = start.row  # row changes of the open transaction already handed on in pieces
        self.seen_in_tx = 0  # row changes of the open transaction read so far (skipped ones included)
        self.skip = start.row
        self.mark = start  # the last end handed on; a position mark must be past it
        # After a GTID start the server skips to it from the start of a file: positions read
        # before the first transaction are behind the start, so none is handed on as a mark.
        self.positioned = bool(start.log)

    def restart(self, at: Position) -> None:
        """Forget the open transaction: reading restarts at `at`, the last end handed on (a piece's
        end restarts at its transaction's start and skips the row changes it covers)."""
        self.skip = self.handed_in_tx = at.row
        if self.skip:
            log.info("re-reading a transaction split across a reconnect from %s: skipping the %d changes "
                     "already handed on", at, self.skip)
        self.log_file = at.log
        self.rows, self.nbytes, self.in_tx, self.standalone, self.pending_gtid = [], 0, False, False, None
        self.tx_start, self.seen_in_tx, self.xa_pending = None, 0, False
        self.savepoints, self.handed_undoable = {}, 0

    def _position(self, log: str, offset: int) -> Position:
        return Position(log, offset, self.gtids.text or None if self.gtids is not None else None)

    def feed(self, event: Any) -> list[Transaction]:
        if isinstance(event, _POSITION_EVENTS):
            return self._moved(event)
        self.nbytes += event.packet.event_size
        if self.tx_start is None and isinstance(event, (MariadbGtidEvent, GtidEvent, QueryEvent)):
            self.tx_start = self._position(self.log_file, event.packet.log_pos - event.packet.event_size)
        if isinstance(event, MariadbGtidEvent):
            self.xa_pending = bool(event.flags & _GTID_PREPARED_XA)
            self.standalone = bool(event.flags & _GTID_STANDALONE)
            self.in_tx = not self.standalone
            self.pending_gtid = event.gtid
            return []
        if isinstance(event, GtidEvent):
            self.pending_gtid = event.gtid
            return []
        if isinstance(event, TableMapEvent):
            # A cached table map shares its Table object: decode our view of it once too.
            known = self._infos.get(event.table_id)
            if known is None or known[0] is not event.table_obj:
                info = _TableInfo.from_table_map(event)
                if self.kind_of is not None:
                    kind = self.kinds.get((info.schema, info.table))
                    if kind is None:
                        kind = self.kinds[(info.schema, info.table)] = self.kind_of(info.schema, info.table)
                    info = info.with_kind(kind)
                known = self._infos[event.table_id] = (event.table_obj, info)
            self.tables[event.table_id] = known[1]
            return []
        if isinstance(event, RowsEvent):
            self._add_rows(event)
            if len(self.rows) >= self.max_rows:
                return self._pieces()
            return []
        if isinstance(event, XidEvent):
            return [self._commit(event.packet.log_pos, event.timestamp)]
        if isinstance(event, XAPrepareEvent):
            return self._xa_prepared(event)
        if isinstance(event, QueryEvent):
            return self._query(event, event.packet.log_pos)
        return []

    def _moved(self, event: Any) -> list[Transaction]:
        if isinstance(event, RotateEvent):
            self.log_file = event.next_binlog
            if event.timestamp:  # a real rotation: table ids may be reused in the next file
                self.tables.clear()
                self._infos.clear()
            end = self._position(event.next_binlog, event.position)
        elif isinstance(event, HeartbeatLogEvent):
            log_file = event.ident.rstrip("\0")
            if log_file != self.log_file or not event.packet.log_pos:
                return []
            end = self._position(log_file, event.packet.log_pos)
        else:
            if not event.packet.log_pos:
                return []
            end = self._position(self.log_file, event.packet.log_pos)
        return self._moved_to(end)

    def _moved_to(self, end: Position) -> list[Transaction]:
        if not self.positioned or self.in_tx or self.rows or self.handed_in_tx or end <= self.mark:
            return []
        self.mark = end
        return [Transaction((), end)]

    def _append(self, item: _Item) -> None:
        self.seen_in_tx += 1
        if self.skip:
            self.skip -= 1
            self._handing_on([(self.seen_in_tx, item)])
        else:
            self.rows.append((self.seen_in_tx, item))

    def _handing_on(self, rows: list[tuple[int, _Item]]) -> None:
        """Note the transactional rows among `rows`, handed on (or skipped as handed on before): a
        later ROLLBACK (TO SAVEPOINT) cannot take them back."""
        for ordinal, (op, info, _, _) in rows:
            if op is not None and ordinal > self.handed_undoable and self._is_transactional(info):
                self.handed_undoable = ordinal

    def _is_transactional(self, info: _TableInfo) -> bool:
        if self.transactional is None:
            return True
        return self.transactional(info.schema, info.table)

    def _savepoint(self, statement: str, offset: int) -> None:
        """SAVEPOINT, ROLLBACK TO and RELEASE SAVEPOINT inside a transaction.

        The server logs them only when the transaction also wrote a non-transactional table; the
        rows a ROLLBACK TO undid are still in the binlog before it, so the transactional ones
        after the savepoint are dropped here (the non-transactional ones were not undone).
        """
        match = _SAVEPOINT.match(statement)
        if match is None:
            return
        name = _unquote(match["name"]).lower()
        verb = match["verb"].upper()
        if verb == "SAVEPOINT":
            self.savepoints.pop(name, None)
            self.savepoints[name] = self.seen_in_tx
            return
        mark = self.savepoints.get(name)
        if mark is None:
            raise SourceError(f"{statement.strip()} at {self.log_file}:{offset}: the savepoint is not in the "
                              "binlog before it, so the rows it undid cannot be told apart")
        # savepoints set after this one are gone (for RELEASE, this one too)
        names = list(self.savepoints)
        for later in names[names.index(name) + (1 if verb.startswith("ROLLBACK") else 0):]:
            del self.savepoints[later]
        if not verb.startswith("ROLLBACK"):
            return
        self._undo(mark, statement, offset)

    def _undo(self, mark: int, statement: str, offset: int) -> None:
        """Drop the transactional row changes read after the first `mark` (the server undid them)."""
        if self.handed_undoable > mark:
            raise SourceError(f"{statement.strip()} at {self.log_file}:{offset} undoes row changes of a "
                              f"transaction too large to hold ({self.max_rows}+ rows) that were already "
                              "handed on; raise source.max_rows_in_memory above its size")
        kept = [(o, item) for o, item in self.rows
                if o <= mark or item[0] is None or not self._is_transactional(item[1])]
        if len(kept) < len(self.rows):
            log.info("%s at %s:%d: dropping the %d row changes it undid", statement.strip(), self.log_file,
                     offset, len(self.rows) - len(kept))
        self.rows = kept

    def _add_rows(self, event: RowsEvent) -> None:
        info = self.tables.get(event.table_id)
        if info is None:
            raise SourceError(f"rows event for table id {event.table_id} ({event.schema}.{event.table}) "
                              "without its table map")
        if self.xa_pending:
            return  # an XA PREPARE group: its rows are read again when its XA COMMIT arrives
        if info.sequence:
            if (info.schema, info.table) not in self.sequences_seen:
                self.sequences_seen.add((info.schema, info.table))
                log.info("%s.%s is a sequence: its state is not replicated (the values drawn from it arrive "
                         "in the tables that use them)", info.schema, info.table)
            return
        for item in _row_items(event, info):
            self._append(item)

    def _xa_prepared(self, event: XAPrepareEvent) -> list[Transaction]:
        """The end of a group: XA PREPARE (its rows wait for XA COMMIT), or XA COMMIT ONE PHASE."""
        if event.one_phase:
            return [self._commit(event.packet.log_pos, event.timestamp)]
        key = (event.xid_format_id, bytes(event.xid_gtrid), bytes(event.xid_bqual))
        offset = event.packet.log_pos
        if self.handed_in_tx:  # MySQL marks an XA group only at its end
            raise SourceError(f"XA PREPARE at {self.log_file}:{offset} of a transaction of which "
                              f"{self.handed_in_tx} row changes were already handed on as committed; "
                              "raise source.max_rows_in_memory above its size")
        self.prepared[key] = self._start()
        self.rows = []
        self._close_tx(offset)
        self.xa_pending = False
        # Its end may be acknowledged: at XA COMMIT the prepared rows are found in the binlog again.
        return self._moved_to(self._position(self.log_file, offset))

    def _xa_finished(self, match: re.Match[str], offset: int, timestamp: float | None) -> list[Transaction]:
        """XA COMMIT or XA ROLLBACK of a prepared transaction: its rows are applied now, or never."""
        key = (int(match["format"]), bytes.fromhex(match["gtrid"]), bytes.fromhex(match["bqual"]))
        start = self.prepared.pop(key, None)
        if match["verb"].upper() == "ROLLBACK":
            self._close_tx(offset)
            return self._moved_to(self._position(self.log_file, offset))
        if self.prepared_rows is None:
            raise SourceError(f"XA COMMIT at {self.log_file}:{offset} of a prepared transaction this reader "
                              "cannot read again")
        for item in self.prepared_rows(key, start, self._start()):
            self._append(item)
        pieces = self._pieces() if len(self.rows) >= self.max_rows else []
        return [*pieces, self._commit(offset, timestamp)]

    def _changes(self, rows: list[tuple[int, _Item]], position: Position, commit_time: float | None,
                 split: bool = False) -> tuple[Change, ...]:
        """The changes of `rows`. Those of a split transaction each carry the transaction's start
        with `row` = their 1-based ordinal among the row changes it logged, the others `position`."""
        start = self._start() if split else position
        return tuple(
            DdlChange(*after, before, attrs.evolve(start, row=o) if split else position) if op is None
            else RowChange(op, info.schema, info.table, info.primary_key, before, after,
                           attrs.evolve(start, row=o) if split else position, commit_time)
            for o, (op, info, before, after) in rows
        )

    def _statement_dml(self, statement: str, schema: str, offset: int) -> bool:
        """Whether `statement` is a row change logged as a statement (a session with binlog_format
        STATEMENT or MIXED) to a table the rules skip. setl has no row images for it, so for any
        other table (or one it cannot determine) it stops."""
        text = _LEADING_COMMENTS.sub("", statement, count=1)
        if not _DML.match(text):
            return False
        target = dml_target(text, schema)
        if target is not None and self.selects is not None and not self.selects(*target):
            return True
        where = f"{target[0]}.{target[1]}" if target is not None else "a table setl cannot determine"
        raise SourceError(f"a row change to {where} at {self.log_file}:{offset} is logged as a statement "
                          "(the session ran with binlog_format STATEMENT or MIXED), which setl cannot replicate "
                          f"exactly: {' '.join(text.split())[:120]}",
                          table=f"{target[0]}.{target[1]}" if target is not None else None)

    def _start(self) -> Position:
        if self.tx_start is None:
            raise SourceError(f"a transaction too large to hold ({self.max_rows}+ row changes) at {self.log_file} "
                              "has no start event (GTID or BEGIN) to resume it from")
        return self.tx_start

    def _pieces(self) -> list[Transaction]:
        """Cut full pieces off a transaction too large to hold; each `end` is a checkpoint inside it."""
        pieces = []
        while len(self.rows) >= self.max_rows:
            chunk, self.rows = self.rows[: self.max_rows], self.rows[self.max_rows:]
            self._handing_on(chunk)
            self.handed_in_tx = chunk[-1][0]
            end = attrs.evolve(self._start(), row=self.handed_in_tx)
            pieces.append(Transaction(self._changes(chunk, end, None, True), end, complete=False, nbytes=self.nbytes))
            self.nbytes = 0
        return pieces

    def _close_tx(self, offset: int) -> None:
        if self.skip:
            raise SourceError(f"resumed inside a transaction at {self._start() if self.tx_start else self.log_file}"
                              f" to skip {self.seen_in_tx + self.skip} row changes, but it ends at "
                              f"{self.log_file}:{offset} after {self.seen_in_tx}: the position does not "
                              "belong to this binlog")
        if self.pending_gtid is not None and self.gtids is not None:
            self.gtids.add(self.pending_gtid)
        self.rows, self.nbytes, self.in_tx, self.standalone, self.pending_gtid = [], 0, False, False, None
        self.handed_in_tx = self.skip = self.seen_in_tx = 0
        self.tx_start = None
        self.positioned = True

    def _commit(self, offset: int, timestamp: float | None) -> Transaction:
        rows, nbytes = self.rows, self.nbytes
        split = bool(self.handed_in_tx)
        start = self.tx_start
        self._close_tx(offset)
        end = self.mark = self._position(self.log_file, offset)
        self.tx_start = start  # for the ordinals of a split transaction's last changes
        changes = self._changes(rows, end, float(timestamp) if timestamp else None, split)
        self.tx_start = None
        return Transaction(changes, end, nbytes=nbytes)

    def _query(self, event: QueryEvent, offset: int) -> list[Transaction]:
        statement = event.query.strip()
        verb = statement.rstrip(";").strip().upper()
        if verb == "BEGIN":
            self.in_tx = True
            return []
        if statement.upper().startswith("XA START"):  # MySQL logs the XA group's start as a query
            self.in_tx = True
            return []
        xa_end = _XA_END.match(statement)
        if xa_end:
            return self._xa_finished(xa_end, offset, event.timestamp)
        if verb == "COMMIT":  # non-transactional tables, or a server that sends BEGIN/COMMIT
            return [self._commit(offset, event.timestamp)]
        if verb == "ROLLBACK":
            # Only a transaction that wrote a non-transactional table is logged this way: the
            # server undid its transactional rows, not the others.
            self._undo(0, statement, offset)
            return [self._commit(offset, event.timestamp)]
        if self.in_tx and not self.standalone and _IGNORED_IN_TX.match(statement):
            self._savepoint(statement, offset)
            return []
        schema = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) else event.schema
        if self._statement_dml(statement, schema or "", offset):  # on a table the rules skip
            if self.in_tx and not self.standalone:
                return []
            self._close_tx(offset)
            return self._moved_to(self._position(self.log_file, offset))
        ddl_schema, table = ddl_target(statement, schema or "")
        if self.in_tx and (self.rows or self.handed_in_tx):
            # A statement logged inside a transaction: keep it ordered with the rows around it.
            self._append((None, None, statement, (ddl_schema, table)))
            return []
        nbytes = self.nbytes
        self._close_tx(offset)
        end = self.mark = self._position(self.log_file, offset)
        self.kinds.clear()
        dropped = self.tables_of.track(statement, schema or "")
        if dropped is not None and dropped[1]:
            # DROP DATABASE: one DROP TABLE per table it held, each for the table rules to decide.
            return [Transaction(tuple(DdlChange(dropped[0], name, f"DROP TABLE IF EXISTS {ddl.quote(dropped[0])}."
                                                f"{ddl.quote(name)}", end) for name in dropped[1]), end,
                                nbytes=nbytes)]
        return [Transaction((DdlChange(ddl_schema, table, statement, end),), end, nbytes=nbytes)]


class KnownTables:
    """The tables of each schema, as of the binlog read so far: loaded from the server when the
    reader opens, then kept up to date by CREATE, DROP and RENAME TABLE and DROP DATABASE."""

    def __init__(self, tables: Iterable[tuple[str, str]] = ()) -> None:
        self._schemas: dict[str, set[str]] = {}
        for schema, table in tables:
            self._schemas.setdefault(schema, set()).add(table)

    def track(self, statement: str, default_schema: str) -> tuple[str, list[str]] | None:
        """Note what `statement` does to the set; for DROP DATABASE, ``(schema, its tables)``."""
        match = _DDL_DATABASE.match(_LEADING_COMMENTS.sub("", statement, count=1))
        if match:
            name = _unquote(match["name"])
            if statement.lstrip().upper().startswith("DROP"):
                return name, sorted(self._schemas.pop(name, ()))
            return None
        parsed = ddl.parse(statement)
        refs = [(ref.schema or default_schema, ref.table) for ref in parsed.tables]
        if parsed.kind == "create_table" and refs:
            self._schemas.setdefault(refs[0][0], set()).add(refs[0][1])
        elif parsed.kind == "drop_table":
            for schema, table in refs:
                self._schemas.get(schema, set()).discard(table)
        elif parsed.kind == "rename_table":
            for (old_schema, old), (new_schema, new) in zip(refs[::2], refs[1::2]):
                self._schemas.get(old_schema, set()).discard(old)
                self._schemas.setdefault(new_schema, set()).add(new)
        return None


class _Stopped(Exception):
    """The reader was closed; its thread ends quietly."""


class _Lost(Exception):
    """The stream connection dropped. The library would reconnect by itself from the middle of a
    transaction (or from its first GTID), so the connector refuses and the reader reconnects."""


class _Connector:
    """The `pymysql_wrapper` handed to the library: one stream connection, and a way to cut it.

    Control connections carry the reader's table-map cache (`setl_table_maps`) when it has one.
    """

    def __init__(self, table_maps: _TableMapCache | None) -> None:
        self._lock = threading.Lock()
        self._connections: list[pymysql.connections.Connection] = []
        self._stream_opened = False
        self.table_maps = table_maps
        self.closed = False

    def __call__(self, **kwargs: Any) -> pymysql.connections.Connection:
        if "db" in kwargs:  # the library still uses PyMySQL's deprecated names
            kwargs["database"] = kwargs.pop("db")
        if "passwd" in kwargs:
            kwargs["password"] = kwargs.pop("passwd")
        control = kwargs.get("database") == "information_schema"
        with self._lock:
            if self.closed:
                raise _Stopped()
            if not control:
                if self._stream_opened:
                    raise _Lost()
                self._stream_opened = True
        conn = pymysql.connect(**kwargs)
        if control:
            conn.setl_table_maps = self.table_maps
        with self._lock:
            self._connections.append(conn)
            if self.closed:
                self._cut(conn)
                raise _Stopped()
        return conn

    def reset(self) -> None:
        """Allow one new stream connection (a reconnect made by us, from a transaction end)."""
        with self._lock:
            self._stream_opened = False
            self._connections = [c for c in self._connections if c.open]

    @staticmethod
    def _cut(conn: pymysql.connections.Connection) -> None:
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def shutdown(self) -> None:
        """Wake a blocked read: shut the sockets down (the reader thread closes them)."""
        with self._lock:
            self.closed = True
            connections = list(self._connections)
        for conn in connections:
            self._cut(conn)


@attrs.frozen
class _Failure:
    error: BaseException
    position: Position | None


@attrs.frozen
class _GtidStart:
    """A configured start by GTID set: the server positions the stream (auto_position)."""

    gtid: str
    flavor: str


# Server errors that mean "gone for now": can't connect, gone away, lost, shutting down, killed.
_DISCONNECTS = frozenset({1053, 1152, 1927, 2003, 2006, 2013, 2055})
_ER_MASTER_FATAL_READING_BINLOG = 1236


def _disconnected(exc: BaseException) -> bool:
    if isinstance(exc, (_Lost, ConnectionError, TimeoutError, socket.timeout)):
        return True
    if isinstance(exc, pymysql.err.OperationalError) and exc.args:
        return exc.args[0] in _DISCONNECTS
    return isinstance(exc, (pymysql.err.InterfaceError, OSError, EOFError))


class MysqlBinlogSource(Select):
    """Reads a MySQL or MariaDB binlog from a file and position, or from a GTID set.

    * Positions are ``Position(binlog file, offset after the commit event, gtid)``; `gtid` is the
      GTID set executed up to there when the server logs GTIDs (MariaDB ``domain-server-seq``
      list, MySQL ``uuid:intervals`` set) and the state at the start is known.
    * A position from `open` or `seek` wins over the configured `start`: "earliest", "latest",
      ``{file: ..., pos: ...}`` or ``{gtid: ...}``. A GTID start is handed to the server
      (MariaDB ``slave_connect_state``, MySQL ``COM_BINLOG_DUMP_GTID``); `tell` is None until
      the first transaction after it arrives, and every later open or seek is by file and
      position. A GTID set the server has fully executed starts at the head.
    * `open` refuses a server whose binlog settings lose data (`REQUIRED_SETTINGS`) and a
      position whose file was purged (`PositionPurged`).
    * `poll` blocks at most `timeout` seconds. When the binlog ends in events that are not
      transactions (rotation, checkpoints, heartbeats), `poll` returns a position mark: a
      Transaction with no changes whose `end` has moved past them, so an ack can reach the head.
    * A lost connection is re-established with backoff from the end of the last complete
      transaction handed on (dropping the part of a split transaction already handed on), for
      up to `reconnect_timeout` seconds; after that `poll` raises `SourceError`.
    * Transactions of more than `max_rows_in_memory` rows come in pieces with ``complete=False``;
      a piece's end is the transaction's start with `row` = row changes handed on so far, and
      `open`/`seek` there re-reads the transaction and skips them (see `_Assembler`).
      The reader runs ahead of `poll` by up to `max_rows_in_memory` rows (a transaction with no
      rows counts as one; a bigger piece waits for an empty queue), so it is never held back by
      many small transactions and never holds more than about twice that (`peak_buffered_rows`).
    * With `table_map_cache` (the default) a table-map event whose bytes were seen before reuses
      the decoded table instead of decoding its column metadata again (`table_maps` counts hits).
    * Values are pymysqlreplication's, except: an empty SET is ``set()``, BIT is an int, BINARY(n)
      keeps its trailing zero bytes, YEAR 0 is 0. MariaDB's JSON is text and stays a str.
    * Two-phase XA: an XA PREPARE group hands nothing on (its end may be acknowledged); its rows
      are read again from the binlog and handed on at its XA COMMIT, in commit order (XA ROLLBACK:
      never). After a restart between the two, the XA PREPARE is searched for in the binlogs,
      newest first; if it was purged the pipeline stops naming the XA COMMIT's position.
    * `server_id` must be unique among the server's replicas and readers.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 3306,
        user: str = "root",
        password: str = "",
        server_id: int = 1001,
        flavor: str = "auto",
        start: Any = "earliest",
        pipeline: str = "",
        max_rows_in_memory: int = 50_000,
        connect_timeout: float = 5.0,
        heartbeat: float = 5.0,
        reconnect_timeout: float = 60.0,
        table_map_cache: bool = True,
        selects: Callable[[str, str], bool] | None = None,
    ) -> None:
        if flavor not in ("auto", "mariadb", "mysql"):
            raise ConfigError(f"source.flavor {flavor!r} is not auto, mariadb or mysql", pipeline=pipeline)
        if max_rows_in_memory < 1:
            raise ConfigError("max_rows_in_memory must be at least 1", pipeline=pipeline)
        install()
        self.host, self.port, self.user = host, port, user
        self._password = password
        self.server_id = server_id
        self.flavor = flavor
        self.start = self._parse_start(start, pipeline)
        self.pipeline = pipeline
        self.max_rows_in_memory = max_rows_in_memory
        self.connect_timeout = connect_timeout
        self.heartbeat = heartbeat
        self.reconnect_timeout = reconnect_timeout
        self.table_map_cache = table_map_cache
        self.selects = selects  # whether the pipeline's table rules take (schema, table); None: every table
        self.backoff = Backoff(initial=0.1, maximum=2.0, max_attempts=0)
        self._queue: queue.Queue[Transaction | _Failure] | None = None
        self._thread: threading.Thread | None = None
        self._connector: _Connector | None = None
        self._stop = threading.Event()
        self._cursor: Position | None = None
        self._mark: Transaction | None = None
        self._buffer_lock = threading.Lock()
        self._room = threading.Condition(self._buffer_lock)  # the reader waits here for the queue to drain
        self._queued_rows = 0  # rows in the queue, a transaction without rows counting as one
        self.peak_buffered_rows = 0
        self.reconnects = 0
        self.detected_flavor: str | None = None
        self.table_maps: _TableMapCache | None = None
        self._engines: dict[tuple[str, str], str] = {}  # storage engine by table, asked at a ROLLBACK TO

    @classmethod
    def from_config(cls, cfg: MysqlSourceConfig, *, pipeline: str, **kwargs: Any) -> "MysqlBinlogSource":
        return cls(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                   server_id=cfg.server_id, flavor=cfg.flavor, start=cfg.start, pipeline=pipeline,
                   **kwargs)

    def __repr__(self) -> str:
        return f"<MysqlBinlogSource {self.host}:{self.port} server_id={self.server_id} at {self._cursor}>"

    @staticmethod
    def _parse_start(start: Any, pipeline: str) -> str | Position | _GtidStart:
        if start is None or start in ("earliest", "latest"):
            return start or "earliest"
        if isinstance(start, Position):
            return start
        if isinstance(start, Mapping) and set(start) == {"gtid"} and isinstance(start["gtid"], str):
            flavor = gtid_flavor(start["gtid"])
            if flavor is not None:
                return _GtidStart(start["gtid"].strip(), flavor)
            raise ConfigError(f"source.start.gtid {start['gtid']!r} is neither a MariaDB GTID list "
                              "(DOMAIN-SERVER-SEQ[,...]) nor a MySQL GTID set (UUID:N[-M][,...])",
                              pipeline=pipeline)
        if isinstance(start, Mapping) and set(start) <= {"file", "log", "pos", "offset"}:
            file = start.get("file", start.get("log"))
            pos = start.get("pos", start.get("offset", 4))
            if isinstance(file, str) and isinstance(pos, int) and not isinstance(pos, bool) and pos >= 4:
                return Position(file, pos)
        if isinstance(start, str):
            with contextlib.suppress(ValueError):
                return Position.parse(start)
        raise ConfigError(f"source.start {start!r} is not earliest, latest, {{file: NAME, pos: OFFSET}} "
                          "(OFFSET at least 4) or {gtid: GTID_SET}", pipeline=pipeline)

    # --- control connection ------------------------------------------------------------------

    def _error(self, message: str, position: Position | None = None, cls: type[SourceError] = SourceError
               ) -> SourceError:
        return cls(message, pipeline=self.pipeline, stage="select", position=position)

    def _connect(self) -> pymysql.connections.Connection:
        try:
            return pymysql.connect(host=self.host, port=self.port, user=self.user, password=self._password,
                                   connect_timeout=self.connect_timeout, autocommit=True, charset="utf8mb4")
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot connect to {self.host}:{self.port} as {self.user}: {exc}") from exc

    def _query(self, conn: pymysql.connections.Connection, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def _status(self, conn: pymysql.connections.Connection) -> tuple[Position, str | None] | None:
        """The binlog head, and (MySQL) the GTID set executed up to it."""
        try:
            rows = self._query(conn, "SHOW MASTER STATUS")
        except pymysql.err.ProgrammingError:  # MySQL 8.4 renamed it
            rows = self._query(conn, "SHOW BINARY LOG STATUS")
        if not rows:
            return None
        executed = rows[0][4] if len(rows[0]) > 4 else None
        return Position(rows[0][0], int(rows[0][1])), (executed or None)

    def _check_settings(self, conn: pymysql.connections.Connection) -> str:
        """Refuse a server that cannot give full row images with names; return its flavor."""
        version = self._query(conn, "SELECT VERSION()")[0][0]
        flavor = self.flavor if self.flavor != "auto" else ("mariadb" if "mariadb" in version.lower() else "mysql")
        names = ", ".join(f"'{name}'" for name in REQUIRED_SETTINGS)
        values = {name.lower(): str(value) for name, value in
                  self._query(conn, f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")}
        for name, wanted in REQUIRED_SETTINGS.items():
            value = values.get(name)
            if value is not None and value.upper() == wanted:
                continue
            shown = "missing (server too old: needs MariaDB 10.5+ or MySQL 8.0.14+)" if value is None else value
            fix = (f"start the server with log_bin (log-bin=mysql-bin in [mysqld])" if name == "log_bin"
                   else f"set {name}={wanted} in the server's [mysqld] config (or SET GLOBAL {name}={wanted}) "
                        "and restart the pipeline")
            raise self._error(f"server {self.host}:{self.port} ({version}) has {name}={shown}; setl needs "
                              f"{name}={wanted} to read full row images: {fix}")
        compressed = self._query(conn, "SHOW GLOBAL VARIABLES LIKE 'binlog_transaction_compression'")
        if compressed and str(compressed[0][1]).upper() == "ON":  # MySQL 8.0.20+: payload events we cannot read
            raise self._error(f"server {self.host}:{self.port} ({version}) has binlog_transaction_compression=ON; "
                              "setl cannot read compressed transactions: set it OFF and restart the pipeline")
        return flavor

    def _refuse_cascades(self, conn: pymysql.connections.Connection) -> None:
        """Refuse a selected table whose rows a foreign key changes: InnoDB applies ON DELETE/UPDATE
        CASCADE, SET NULL and SET DEFAULT inside the engine, and the binlog never shows them."""
        found = self._query(conn, "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, REFERENCED_TABLE_NAME, "
                                  "DELETE_RULE, UPDATE_RULE FROM information_schema.REFERENTIAL_CONSTRAINTS "
                                  "WHERE DELETE_RULE <> 'RESTRICT' AND DELETE_RULE <> 'NO ACTION' "
                                  "OR UPDATE_RULE <> 'RESTRICT' AND UPDATE_RULE <> 'NO ACTION' "
                                  "ORDER BY CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME")
        for schema, table, constraint, parent, on_delete, on_update in found:
            if self.selects is not None and not self.selects(schema, table):
                continue
            rules = " ".join(f"ON {what} {rule}" for what, rule in (("DELETE", on_delete), ("UPDATE", on_update))
                             if rule not in ("RESTRICT", "NO ACTION"))
            raise self._error(f"table {schema}.{table} has foreign key {constraint} ({rules} from {parent}): the "
                              "server changes its rows without logging them, so its copy would differ; exclude "
                              "the table or drop the cascade (see docs/mysql-source.md)")

    def _gtids_at(self, conn: pymysql.connections.Connection, position: Position,
                  executed: str | None = None) -> _GtidState | None:
        """The GTID set executed up to `position`, when the server can tell."""
        if self.detected_flavor == "mariadb":
            rows = self._query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", (position.log, position.offset))
            text = rows[0][0] if rows else None
            return _GtidState("mariadb", text) if text is not None else None
        return _GtidState("mysql", executed) if executed else None

    def _resolve(self, conn: pymysql.connections.Connection, start: Position | None
                 ) -> tuple[Position | None, _GtidState | None]:
        """Where to read from: a checked file+pos (or None for a GTID start), and the GTIDs there."""
        logs = [(row[0], int(row[1])) for row in self._query(conn, "SHOW BINARY LOGS")]
        if not logs:
            raise self._error(f"server {self.host}:{self.port} lists no binary logs")
        target = start if start is not None else self.start
        if target == "earliest":
            target = Position(logs[0][0], 4)
        elif target == "latest" or isinstance(target, _GtidStart):
            status = self._status(conn)
            if status is None:
                raise self._error(f"server {self.host}:{self.port} shows no binlog status")
            head, executed = status
            if target == "latest":
                gtids = self._gtids_at(conn, head, executed)
                return attrs.evolve(head, gtid=gtids.text or None if gtids else None), gtids
            return self._resolve_gtid(conn, target, head, executed)
        assert isinstance(target, Position)
        sizes = dict(logs)
        if target.log not in sizes:
            oldest = Position(logs[0][0], 4)
            if _log_number(target.log) > _log_number(logs[-1][0]):
                raise self._error(f"position {target} is ahead of the server's last binlog {logs[-1][0]} "
                                  "(was the server reset?)", target)
            raise self._error(f"position {target} was purged from the server; the oldest available is "
                              f"{oldest}: reset the pipeline's position and reload its tables",
                              target, cls=PositionPurged)
        if target.offset > sizes[target.log]:
            raise self._error(f"position {target} is past the end of {target.log} "
                              f"({sizes[target.log]} bytes)", target)
        position = Position(target.log, max(4, target.offset))
        gtids = self._gtids_at(conn, position)
        if gtids is None and target.gtid and gtid_flavor(target.gtid) == self.detected_flavor:
            gtids = _GtidState(self.detected_flavor, target.gtid)
        # A checkpoint inside a split transaction (row > 0) reads it again from its start.
        return attrs.evolve(position, gtid=gtids.text or None if gtids else None, row=target.row), gtids

    def _resolve_gtid(self, conn: pymysql.connections.Connection, target: _GtidStart, head: Position,
                      executed: str | None) -> tuple[Position | None, _GtidState]:
        if target.flavor != self.detected_flavor:
            raise self._error(f"source.start.gtid {target.gtid!r} is a {target.flavor} GTID but "
                              f"{self.host}:{self.port} is {self.detected_flavor}")
        wanted = _GtidState(target.flavor, target.gtid)
        if target.flavor == "mariadb":
            executed = self._query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
        if executed is not None and wanted.covers(_GtidState(target.flavor, executed)):
            # Nothing after it yet: start at the head by position, so caught-up is known at once.
            return attrs.evolve(head, gtid=wanted.text), wanted
        return None, wanted

    # --- Select ------------------------------------------------------------------------------

    def open(self, start: Position | None) -> None:
        self.close()
        conn = self._connect()
        try:
            self.detected_flavor = self._check_settings(conn)
            self._refuse_cascades(conn)
            position, gtids = self._resolve(conn, start)
            tables = [(str(schema), str(table)) for schema, table in self._query(
                conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE <> 'VIEW' "
                      "AND TABLE_SCHEMA NOT IN ('information_schema', 'performance_schema', 'sys', 'mysql')")]
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the binlog settings of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        self._cursor = position
        self._mark = None
        self._stop = threading.Event()
        self._queue = queue.Queue()  # bounded by rows: see _read's put
        self._queued_rows = 0
        self.table_maps = _TableMapCache() if self.table_map_cache else None
        self._connector = _Connector(self.table_maps)
        self._engines = {}
        assembler = _Assembler(position or Position("", 0), self.max_rows_in_memory, gtids, self._prepared_rows,
                               self._transactional, self.selects, KnownTables(tables))
        assembler.kind_of = self._table_kind
        gtid_start = gtids.text if position is None and gtids is not None else None
        self._thread = threading.Thread(
            target=self._read, args=(self._connector, assembler, self._queue, self._stop, position, gtid_start),
            name=f"setl-{self.pipeline or 'mysql'}-binlog", daemon=True)
        self._thread.start()
        log.info("pipeline=%s reading the %s binlog of %s:%s from %s (server_id %d)", self.pipeline,
                 self.detected_flavor, self.host, self.port, position or f"after GTID {gtid_start}",
                 self.server_id)

    def _table_kind(self, schema: str, table: str) -> TableKind:
        """Whether a table is a SEQUENCE or system-versioned (and its period columns), asked once per
        table map the reader decodes."""
        conn = self._connect()
        try:
            found = self._query(conn, "SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                                      "AND TABLE_NAME = %s", (schema, table))
            kind = str(found[0][0]).upper() if found else ""
            if kind == "SEQUENCE":
                return TableKind(sequence=True)
            if kind != "SYSTEM VERSIONED":
                return TableKind()
            create = str(self._query(conn, f"SHOW CREATE TABLE {ddl.quote(schema)}.{ddl.quote(table)}")[0][1])
        finally:
            conn.close()
        match = _PERIOD.search(create)
        return TableKind(period=(_unquote(match[1]), _unquote(match[2])) if match else ("row_start", "row_end"))

    def _transactional(self, schema: str, table: str) -> bool:
        """Whether a ROLLBACK TO undoes the table's changes (its engine is transactional)."""
        engine = self._engines.get((schema, table))
        if engine is None:
            conn = self._connect()
            try:
                found = self._query(conn, "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                                          "AND TABLE_NAME = %s", (schema, table))
            finally:
                conn.close()
            if not found or not found[0][0]:
                raise SourceError(f"a ROLLBACK TO SAVEPOINT undid changes to {schema}.{table}, which no longer "
                                  "exists on the server, so setl cannot tell whether they were undone", table=
                                  f"{schema}.{table}")
            engine = self._engines[(schema, table)] = str(found[0][0]).lower()
        return engine in _TRANSACTIONAL_ENGINES

    def _prepared_rows(self, key: XaKey, start: Position | None, commit: Position) -> list[_Item]:
        """The row changes of prepared XA transaction `key`, read again from the binlog (runs on the
        reader thread when its XA COMMIT group, starting at `commit`, arrives).

        From `start` when this reader saw its XA PREPARE; else (a restart between XA PREPARE and
        XA COMMIT) from the last XA PREPARE of `key` before `commit`, searching the binlogs newest
        first. A prepared transaction no binlog holds any more stops the pipeline.
        """
        xid = f"X'{key[1].hex()}',X'{key[2].hex()}',{key[0]}"
        if start is not None:
            found = self._scan_for_prepare(key, start, commit, first_only=True)
        else:
            conn = self._connect()
            try:
                logs = [str(row[0]) for row in self._query(conn, "SHOW BINARY LOGS")]
            finally:
                conn.close()
            found = None
            for name in reversed(logs[: logs.index(commit.log) + 1] if commit.log in logs else []):
                found = self._scan_for_prepare(key, Position(name, 4), commit)
                if found is not None:
                    log.info("pipeline=%s found the XA PREPARE of %s (committed at %s) in %s", self.pipeline,
                             xid, commit, name)
                    break
        if found is None:
            raise SourceError(f"XA COMMIT {xid} at {commit}: its XA PREPARE is no longer in the binlogs of "
                              f"{self.host}:{self.port} (purged?), so its rows cannot be applied; reload the "
                              "tables it touched and reset the pipeline's position past it", position=commit)
        return found

    def _scan_for_prepare(self, key: XaKey, start: Position, stop: Position, first_only: bool = False
                          ) -> list[_Item] | None:
        """The rows of the last XA PREPARE group of `key` in ``[start, stop)`` of one binlog file."""
        connector = _Connector(None)
        settings = {"host": self.host, "port": self.port, "user": self.user, "password": self._password,
                    "connect_timeout": self.connect_timeout, "read_timeout": max(30.0, 4 * self.heartbeat)}
        # server_id 0 with a non-blocking dump, as mariadb-binlog reads: it does not displace the
        # pipeline's own stream (a second reader with its server_id would).
        reader = BinLogStreamReader(connection_settings=settings, server_id=0, blocking=False, resume_stream=True,
                                    log_file=start.log, log_pos=start.offset, is_mariadb=False,
                                    only_events=_EVENTS, pymysql_wrapper=connector, enable_logging=False)
        tables: dict[int, _TableInfo] = {}
        group: list[_Item] = []
        found: list[_Item] | None = None
        try:
            while True:
                event = reader.fetchone()
                if event is None:
                    return found
                if isinstance(event, RotateEvent):
                    if event.next_binlog != start.log:
                        return found
                    continue
                if not isinstance(event, _POSITION_EVENTS) and (start.log, event.packet.log_pos) > (
                        stop.log, stop.offset):
                    return found
                if isinstance(event, (MariadbGtidEvent, GtidEvent)):
                    group = []
                elif isinstance(event, TableMapEvent):
                    info = _TableInfo.from_table_map(event)
                    tables[event.table_id] = info.with_kind(self._table_kind(info.schema, info.table))
                elif isinstance(event, RowsEvent) and event.table_id in tables:
                    if not tables[event.table_id].sequence:
                        group.extend(_row_items(event, tables[event.table_id]))
                elif isinstance(event, XAPrepareEvent) and not event.one_phase and (
                        event.xid_format_id, bytes(event.xid_gtrid), bytes(event.xid_bqual)) == key:
                    found = group
                    if first_only:
                        return found
                elif isinstance(event, QueryEvent):
                    match = _XA_END.match(event.query)
                    if match and (int(match["format"]), bytes.fromhex(match["gtrid"]),
                                  bytes.fromhex(match["bqual"])) == key:
                        found = None  # finished before: a later XA PREPARE reuses the XID
                    elif event.query.strip().upper().startswith("XA START"):
                        group = []
        except pymysql.MySQLError as exc:
            raise SourceError(f"cannot read {start.log} of {self.host}:{self.port} again for the XA PREPARE of "
                              f"the XA COMMIT at {stop}: {exc}", position=stop) from exc
        finally:
            with contextlib.suppress(Exception):
                reader.close()
            connector.shutdown()

    def _stream(self, connector: _Connector, at: Position | None, gtid: str | None) -> BinLogStreamReader:
        settings = {"host": self.host, "port": self.port, "user": self.user, "password": self._password,
                    "connect_timeout": self.connect_timeout, "read_timeout": max(30.0, 4 * self.heartbeat)}
        common: dict[str, Any] = dict(
            connection_settings=settings, server_id=self.server_id, blocking=True, only_events=_EVENTS,
            slave_heartbeat=self.heartbeat, pymysql_wrapper=connector, enable_logging=False)
        if at is not None:
            # is_mariadb=False on purpose: with is_mariadb=True the library sends an empty file
            # name (the server's first binlog) unless given a GTID; the classic COM_BINLOG_DUMP
            # serves both flavors by file+pos, and resume_stream=True makes it send log_pos.
            return BinLogStreamReader(resume_stream=True, log_file=at.log, log_pos=at.offset, is_mariadb=False,
                                      **common)
        return BinLogStreamReader(auto_position=gtid, is_mariadb=self.detected_flavor == "mariadb", **common)

    def _read(self, connector: _Connector, assembler: _Assembler, out: queue.Queue, stop: threading.Event,
              start: Position | None, gtid_start: str | None) -> None:
        """The reader thread: events → transactions → `out`, reconnecting from the last end handed on."""
        handed = start  # end of the last complete transaction handed on (None: still the GTID start)
        down_since: float | None = None
        attempt = 0

        def put(item: Transaction | _Failure) -> None:
            weight = _weight(item)
            with self._room:
                while self._queued_rows and self._queued_rows + weight > self.max_rows_in_memory:
                    if stop.is_set():
                        raise _Stopped()
                    self._room.wait(0.1)
                self._queued_rows += weight
            out.put(item)

        try:
            while not stop.is_set():
                reader = self._stream(connector, handed, gtid_start)
                try:
                    while not stop.is_set():
                        event = reader.fetchone()
                        if event is None:
                            raise _Lost()
                        for tx in assembler.feed(event):
                            put(tx)
                            down_since, attempt = None, 0  # progress: the retry budget starts afresh
                            handed = tx.end
                        with self._buffer_lock:
                            buffered = self._queued_rows + len(assembler.rows)
                        self.peak_buffered_rows = max(self.peak_buffered_rows, buffered)
                except _Stopped:
                    raise
                except BaseException as exc:
                    if stop.is_set() or not _disconnected(exc):
                        raise
                    now = time.monotonic()
                    down_since = down_since if down_since is not None else now
                    if now - down_since >= self.reconnect_timeout:
                        raise self._error(f"the binlog server {self.host}:{self.port} stayed unreachable for "
                                          f"{now - down_since:.0f}s (reconnect_timeout); last error: {exc}",
                                          handed) from exc
                    attempt += 1
                    delay = self.backoff.delay(attempt)
                    log.warning("pipeline=%s lost the binlog stream of %s:%s (%s); reconnecting from %s in "
                                "%.1fs", self.pipeline, self.host, self.port, exc,
                                handed or f"GTID {gtid_start}", delay)
                    if stop.wait(delay):
                        raise _Stopped() from None
                    self.reconnects += 1
                    connector.reset()
                    if handed is not None:
                        assembler.restart(handed)  # a piece's end restarts at its transaction's start
                    else:
                        assembler.restart(Position(assembler.log_file, 0))
                finally:
                    with contextlib.suppress(Exception):
                        reader.close()
        except _Stopped:
            pass
        except BaseException as exc:  # every failure reaches poll(); none kills the thread silently
            if not stop.is_set():
                with contextlib.suppress(_Stopped):
                    put(_Failure(exc, handed))

    def poll(self, timeout: float) -> Transaction | None:
        """The next transaction; a position mark only when nothing else is ready (see the class)."""
        if self._queue is None:
            raise RuntimeError("poll() before open()")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                if self._mark is not None:
                    item = self._queue.get_nowait()
                else:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                mark, self._mark = self._mark, None
                if mark is not None:
                    self._cursor = mark.end
                return mark
            with self._room:
                self._queued_rows -= _weight(item)
                self._room.notify()
            if isinstance(item, _Failure):
                self._queue = None  # this stream is dead; seek or open starts a new one
                raise self._failure(item) from item.error
            if not item.changes and item.complete:
                self._mark = item  # a later mark or transaction supersedes it
                continue
            self._mark = None
            self._cursor = item.end
            return item

    def _failure(self, failure: _Failure) -> SourceError:
        exc, where = failure.error, failure.position
        after = where or "the configured start"
        if isinstance(exc, SourceError):
            return exc.with_context(pipeline=self.pipeline or None, stage="select",
                                    position=where)  # type: ignore[return-value]
        if isinstance(exc, pymysql.MySQLError):
            if exc.args and exc.args[0] == _ER_MASTER_FATAL_READING_BINLOG:
                return self._error(f"the server {self.host}:{self.port} cannot send its binlog after {after} "
                                   f"(purged, or a GTID it does not have?): {exc.args[-1]}", where,
                                   cls=PositionPurged)
            return self._error(f"binlog read from {self.host}:{self.port} failed after {after}: {exc}", where)
        return self._error(f"cannot decode the binlog of {self.host}:{self.port} after {after}: "
                           f"{type(exc).__name__}: {exc}", where)

    def tell(self) -> Position | None:
        return self._cursor

    def head(self) -> Position | None:
        conn = self._connect()
        try:
            status = self._status(conn)
            return status[0] if status else None
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the binlog status of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._connector is not None:
            self._connector.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("pipeline=%s binlog reader thread did not stop within %.0fs", self.pipeline, timeout)
        self._thread = self._connector = self._queue = None
        self._mark = None


def _weight(item: Transaction | _Failure) -> int:
    """What an item counts for in the reader's queue: its rows, at least one."""
    return max(1, len(item.changes)) if isinstance(item, Transaction) else 1


def _log_number(name: str) -> int:
    suffix = name.rpartition(".")[2]
    return int(suffix) if suffix.isdigit() else -1
