"""The binlog reader's fast path: rows events decoded by the compiled `_rows` module.

python-mysql-replication builds a packet wrapper, an event object and a reader call per value for
every rows event, and that is most of a catch-up's CPU. `install()` puts `FastPacketWrapper` in
its place inside the library's stream reader. For a control connection that carries setl's
`RowDecoders` (`setl_row_decoders`, set by the source's connector), the wrapper decodes a
WRITE/UPDATE/DELETE_ROWS event of a table whose columns `_rows.RowDecoder` knows straight from
the packet's bytes, into the library's own event class with the same rows; a cached table map is
answered from setl's table-map cache without the library's event set-up, and MariaDB GTID and
XID events (two a transaction) are read from their few bytes. Everything else (other
events, other readers, a table with a column type the decoder does not know, a partial row image,
filters, checksum verification) goes through the library unchanged.

Without the compiled module (a source tree that was not built), `available()` is False and the
library decodes every event as before.
"""

from __future__ import annotations

import struct
from typing import Any

from pymysqlreplication import binlogstream
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import BinLogEvent, MariadbGtidEvent, XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from setl.sources.mysql_binlog import patches

try:
    from setl.sources.mysql_binlog._rows import RowDecoder, full_bitmap
except ImportError:  # not built: the library decodes every event
    RowDecoder = None  # type: ignore[assignment,misc]

#: rows event type -> (event class, 0 write / 1 update / 2 delete, post-header length)
_ROWS: dict[int, tuple[type[RowsEvent], int, int]] = {
    BINLOG.WRITE_ROWS_EVENT_V1: (WriteRowsEvent, 0, 8),
    BINLOG.UPDATE_ROWS_EVENT_V1: (UpdateRowsEvent, 1, 8),
    BINLOG.DELETE_ROWS_EVENT_V1: (DeleteRowsEvent, 2, 8),
    BINLOG.WRITE_ROWS_EVENT_V2: (WriteRowsEvent, 0, 10),
    BINLOG.UPDATE_ROWS_EVENT_V2: (UpdateRowsEvent, 1, 10),
    BINLOG.DELETE_ROWS_EVENT_V2: (DeleteRowsEvent, 2, 10),
}
_HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server id, event size, next position, flags
_GTID = struct.Struct("<QIB")  # a MariaDB GTID event's sequence number, domain id, flags (then more, unread)
_XID = struct.Struct("<Q")


def available() -> bool:
    """Whether the compiled decoder is built (`pip install` builds it)."""
    return RowDecoder is not None


class RowDecoders:
    """One reader's compiled decoders, by table map (`Table` object), and counts of their use."""

    def __init__(self) -> None:
        self._by_table: dict[int, tuple[Any, Any]] = {}
        #: the attributes every rows event of a table and type shares, by (table, event type)
        self.templates: dict[tuple[int, int], tuple[Any, dict[str, Any]]] = {}
        #: table-map events by the bytes of their body, reused (their table is read-only)
        self.table_maps: dict[bytes, TableMapEvent] = {}
        self.fast = self.slow = 0
        self.dbms: str | None = None

    def get(self, table: Any) -> Any:
        """The table's decoder, or None when one of its columns needs the library."""
        known = self._by_table.get(id(table))
        if known is not None and known[0] is table:
            return known[1]
        try:
            decoder = RowDecoder(table.columns, RowsEvent.charset_to_encoding, patches.time2_value,
                                       patches.date_value, patches.datetime_value)
        except LookupError:
            decoder = None
        if len(self._by_table) > 4096:
            self._by_table.clear()
            self.templates.clear()
        self._by_table[id(table)] = (table, decoder)
        return decoder

    def template(self, table: Any, event_type: int, ctl_connection: Any, mysql_version: Any,
                 post_header_lengths: Any) -> dict[str, Any]:
        """What a rows event of `table` and `event_type` holds besides its own header and rows."""
        known = self.templates.get((id(table), event_type))
        if known is not None and known[0] is table:
            return known[1]
        shared = dict(event_type=event_type, _post_header_lengths=post_header_lengths,
                      _ctl_connection=ctl_connection, mysql_version=mysql_version, _ignore_decode_errors=False,
                      _verify_checksum=False, _is_event_valid=None, _processed=True, complete=True, dbms=self.dbms,
                      schema=table.schema, table=table.table, number_of_columns=len(table.columns),
                      columns=table.columns)
        self.templates[(id(table), event_type)] = (table, shared)
        return shared


class FastPacketWrapper(BinLogPacketWrapper):
    """`BinLogPacketWrapper`, taking the fast path for rows events and cached table maps."""

    def __init__(self, from_packet: Any, table_map: dict, ctl_connection: Any, mysql_version: Any,
                 use_checksum: bool, allowed_events: Any, only_tables: Any, ignored_tables: Any, only_schemas: Any,
                 ignored_schemas: Any, freeze_schema: Any, ignore_decode_errors: bool, verify_checksum: bool,
                 optional_meta_data: bool, enable_logging: bool, use_column_name_cache: bool = False,
                 post_header_lengths: Any = None) -> None:
        decoders: RowDecoders | None = getattr(ctl_connection, "setl_row_decoders", None)
        if (decoders is not None and optional_meta_data and not verify_checksum and not ignore_decode_errors
                and not (only_tables or ignored_tables or only_schemas or ignored_schemas or freeze_schema)):
            data = from_packet.get_all_data()
            kind = data[5] if len(data) > 20 else -1
            if kind in _ROWS and self._fast_rows(from_packet, data, table_map, ctl_connection, decoders,
                                                 use_checksum, allowed_events, mysql_version, post_header_lengths):
                return
            if kind == BINLOG.TABLE_MAP_EVENT and self._cached_table_map(
                    from_packet, data, table_map, ctl_connection, decoders, use_checksum, allowed_events,
                    mysql_version, post_header_lengths):
                return
            if kind in _SMALL and self._small(from_packet, data, table_map, ctl_connection, decoders, use_checksum,
                                              allowed_events, mysql_version, post_header_lengths):
                return
        super().__init__(from_packet, table_map, ctl_connection, mysql_version, use_checksum, allowed_events,
                         only_tables, ignored_tables, only_schemas, ignored_schemas, freeze_schema,
                         ignore_decode_errors, verify_checksum, optional_meta_data, enable_logging,
                         use_column_name_cache, post_header_lengths)

    def _header(self, from_packet: Any, data: bytes) -> None:
        self.packet = from_packet
        self.read_bytes = 0
        (self.timestamp, self.event_type, self.server_id, self.event_size, self.log_pos,
         self.flags) = _HEADER.unpack_from(data, 1)
        self.charset = None  # read only by the library's own string readers, which these events skip

    def _fast_rows(self, from_packet: Any, data: bytes, table_map: dict, ctl_connection: Any,
                   decoders: RowDecoders, use_checksum: bool, allowed_events: Any, mysql_version: Any,
                   post_header_lengths: Any) -> bool:
        cls, kind, post_header = _ROWS[data[5]]
        if cls not in allowed_events:
            return False
        if post_header_lengths and len(post_header_lengths) >= data[5] and \
                post_header_lengths[data[5] - 1] != post_header:
            return False
        table = table_map.get(int.from_bytes(data[20:26], "little"))
        if table is None:
            return False
        pos = 28
        if post_header == 10:
            extra = int.from_bytes(data[28:30], "little")
            if extra != 2:  # NDB or partition information: the library reads it
                return False
            pos = 30
        ncols = data[pos]
        if ncols >= 251 or ncols != len(table.columns):
            return False
        pos += 1
        decoder = decoders.get(table)
        if decoder is None:
            decoders.slow += 1
            return False
        width = (ncols + 7) // 8
        for _ in range(2 if kind == 1 else 1):
            if not full_bitmap(data, pos, ncols):
                return False  # a partial image: the library marks the missing columns
            pos += width
        event_size = int.from_bytes(data[10:14], "little")
        end = 1 + event_size - (4 if use_checksum else 0)
        rows = decoder.decode(data, pos, end, kind)
        self._header(from_packet, data)
        event = object.__new__(cls)
        event.__dict__ = {
            **decoders.template(table, self.event_type, ctl_connection, mysql_version, post_header_lengths),
            "packet": self, "table_map": table_map, "timestamp": self.timestamp,
            "event_size": event_size - (23 if use_checksum else 19),
            "table_id": int.from_bytes(data[20:26], "little"), "flags": int.from_bytes(data[26:28], "little"),
            "_RowsEvent__rows": rows}
        self.event = event
        decoders.fast += 1
        return True

    def _cached_table_map(self, from_packet: Any, data: bytes, table_map: dict, ctl_connection: Any,
                          decoders: RowDecoders, use_checksum: bool, allowed_events: Any, mysql_version: Any,
                          post_header_lengths: Any) -> bool:
        cache: patches._TableMapCache | None = getattr(ctl_connection, "setl_table_maps", None)
        if cache is None or TableMapEvent not in allowed_events:
            return False
        event_size = int.from_bytes(data[10:14], "little")
        size = event_size - (23 if use_checksum else 19)
        body = bytes(data[20:20 + size])
        event = decoders.table_maps.get(body)
        if event is None:
            state = cache.get(body)
            if state is None:
                return False
            if decoders.dbms is None:
                decoders.dbms = ctl_connection._get_dbms()
            event = object.__new__(TableMapEvent)
            event.__dict__.update(
                event_size=size, _post_header_lengths=post_header_lengths, _ctl_connection=ctl_connection,
                mysql_version=mysql_version, _ignore_decode_errors=False, _verify_checksum=False,
                _is_event_valid=None, _processed=True, complete=True, dbms=decoders.dbms)
            event.__dict__.update(state)
            if len(decoders.table_maps) > 4096:
                decoders.table_maps.clear()
            decoders.table_maps[body] = event
        else:
            cache.hits += 1
        self._header(from_packet, data)
        event.packet, event.table_map, event.event_type, event.timestamp = \
            self, table_map, self.event_type, self.timestamp
        table_map[event.table_id] = event.table_obj
        self.event = event
        return True


    def _small(self, from_packet: Any, data: bytes, table_map: dict, ctl_connection: Any, decoders: RowDecoders,
               use_checksum: bool, allowed_events: Any, mysql_version: Any, post_header_lengths: Any) -> bool:
        """A MariaDB GTID or an XID event, read as the library reads it."""
        cls, layout = _SMALL[data[5]]
        event_size = int.from_bytes(data[10:14], "little")
        size = event_size - (23 if use_checksum else 19)
        if cls not in allowed_events or size < layout.size or len(data) < 20 + layout.size:
            return False
        if decoders.dbms is None:
            decoders.dbms = ctl_connection._get_dbms()
        self._header(from_packet, data)
        event = object.__new__(cls)
        event.__dict__ = {
            "packet": self, "table_map": table_map, "event_type": self.event_type, "timestamp": self.timestamp,
            "event_size": size, "_post_header_lengths": post_header_lengths, "_ctl_connection": ctl_connection,
            "mysql_version": mysql_version, "_ignore_decode_errors": False, "_verify_checksum": False,
            "_is_event_valid": None, "_processed": True, "complete": True, "dbms": decoders.dbms}
        if cls is XidEvent:
            (event.xid,) = _XID.unpack_from(data, 20)
        else:
            event.server_id = self.server_id
            event.gtid_seq_no, event.domain_id, event.flags = _GTID.unpack_from(data, 20)
            event.gtid = f"{event.domain_id}-{event.server_id}-{event.gtid_seq_no}"
        self.event = event
        return True


#: the small events read here: type -> (event class, the part of its body the library reads)
_SMALL: dict[int, tuple[type[BinLogEvent], struct.Struct]] = {
    BINLOG.MARIADB_GTID_EVENT: (MariadbGtidEvent, _GTID),
    BINLOG.XID_EVENT: (XidEvent, _XID),
}

_installed = False


def install() -> bool:
    """Put `FastPacketWrapper` in the library's stream reader (after `patches.install`); whether
    the compiled decoder is there to use."""
    global _installed
    if RowDecoder is None:
        return False
    if not _installed:
        binlogstream.BinLogPacketWrapper = FastPacketWrapper
        _installed = True
    return True
