"""The binlog reader's fast path: hot events built by setl from their bytes, rows decoded in C.

The library builds an event object with a reader call per value: most of a catch-up's CPU.
`FastStream` takes each packet of setl's own stream (`stream.BinlogStream`, framed by the
compiled `_rows.Framer`) and builds setl's own values (`setl.binlog_events`) of the events that
make up nearly all of a busy binlog from their bytes: WRITE/UPDATE/DELETE_ROWS of a table whose
columns the compiled `_rows.RowDecoder` knows, decoded straight from the packet; table maps
already decoded once (answered from setl's table-map cache); MariaDB GTID and XID events (two a
transaction), read from their few bytes. Everything else (other events, a table with a column
type the decoder does not know, a partial row image) goes to the stream's `parse`, where the
library parses it and `setl.adapters.replication.event_value` converts it into setl's value.

Without the compiled module (a source tree that was not built, or ``SETL_PURE_PYTHON=1``),
`available()` is False and the library parses every event.
"""

from __future__ import annotations

import struct
from typing import Any

from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import BinLogEvent, MariadbGtidEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from setl import binlog_events as ev
from setl.adapters import replication
from setl.sources.mysql_binlog import compressed
from setl.sources.mysql_binlog.assembler import corrupt_event
from setl.sources.mysql_binlog.skipping import RowCounter

try:
    from setl.sources.mysql_binlog._rows import Corrupt, EventHeader, RowDecoder, equal_at, full_bitmap, le_int
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
_GTID = struct.Struct("<QIB")  # a MariaDB GTID event's sequence number, domain id, flags (then more, unread)
_XID = struct.Struct("<Q")
#: the events after which the stream's state the fast path reads may have changed
_SETTINGS_EVENTS = frozenset({BINLOG.FORMAT_DESCRIPTION_EVENT, BINLOG.ROTATE_EVENT})


def available() -> bool:
    """Whether the compiled decoder is built (`pip install` builds it)."""
    return RowDecoder is not None


class RowDecoders:
    """One reader's compiled decoders, by table map (`Table` object), and counts of their use."""

    def __init__(self) -> None:
        self._by_table: dict[int, tuple[Any, Any]] = {}
        self.fast = self.slow = 0

    def get(self, table: Any) -> Any:
        """The table's decoder, or None when one of its columns needs the library."""
        known = self._by_table.get(id(table))
        if known is not None and known[0] is table:
            return known[1]
        try:
            decoder = RowDecoder(table.columns, RowsEvent.charset_to_encoding, replication.time2_value,
                                 replication.date_value, replication.datetime_value)
        except LookupError:
            decoder = None
        if len(self._by_table) > 4096:
            self._by_table.clear()
        self._by_table[id(table)] = (table, decoder)
        return decoder


class FastStream:
    """The events of a `stream.BinlogStream`, the hot ones built here from their bytes.

    `fetchone()` takes each packet from the stream (framed by the compiled `Framer`) and builds the
    events that make up nearly all of a busy binlog straight from the bytes: WRITE/UPDATE/DELETE_ROWS
    of a table the compiled `RowDecoder` knows, table maps already in the reader's cache, MariaDB
    GTID and XID events. Every other packet (rotation, format description, queries, heartbeats,
    errors, the end of the stream, rows events the decoder leaves to the library) goes to the
    stream's `parse`, which has the library parse it and keeps the stream's state (`log_pos`,
    `log_file`, the table map, the format description) up to date. Without `decoders` (or the
    compiled module) every packet goes to `parse`.

    A rows event whose table id is in `skip` (the ids the assembler's table maps gave to tables the
    reader does not hand on) is passed over by length, compiled or not (`skipping`): its row count
    only, unless it cannot be counted exactly, when it is decoded as any other.
    """

    def __init__(self, reader: Any, decoders: RowDecoders | None, skip: set[int] | frozenset[int] = frozenset(),
                 counter: RowCounter | None = None) -> None:
        self.reader = reader  # the stream: its table map, file and position, `packet` and `parse`
        self.decoders = decoders if decoders is not None else RowDecoders()
        self.fast = decoders is not None and RowDecoder is not None  # whether the hot events are built here
        self.skip = skip  # table ids whose rows events are counted, not decoded (the assembler's, live)
        self.counter = counter if counter is not None else RowCounter(self.fast)
        self._settings: tuple[Any, bool, Any, Any, Any] = (None, False, (), None, None)
        #: the last table map of each table id: (its body, its layout), reused while the bytes repeat
        self._last_maps: dict[int, tuple[bytes, Any]] = {}

    def fetchone(self) -> Any:
        """The next event; None once a non-blocking dump has ended."""
        stream = self.reader
        fast = self.fast
        while True:
            data = stream.packet()
            if fast and data[0] == 0 and len(data) > 20:
                kind = data[5]
                if kind in compressed.PLAIN_TYPE:  # log_bin_compress: read as the plain event it stands for
                    data = self._inflate(data, kind)
                    kind = data[5]
                event = None
                if kind in _ROWS:
                    if self.skip and le_int(data, 20, 6) in self.skip:
                        event = self.counter.skipped_rows(data, stream.table_map, self._settings[1],
                                                          self._settings[4], EventHeader)
                    if event is None:
                        event = self._rows(data, kind)
                elif kind == BINLOG.TABLE_MAP_EVENT:
                    event = self._table_map(data)
                elif kind in _SMALL:
                    event = self._small(data, kind)
                if event is not None:
                    if event.header.log_pos:
                        stream.log_pos = event.header.log_pos
                    return event
            elif self.skip and data[0] == 0 and len(data) > 26 and data[5] in _ROWS \
                    and int.from_bytes(data[20:26], "little") in self.skip:
                event = self.counter.skipped_rows(data, stream.table_map, stream.use_checksum,
                                                  stream.post_header_lengths)
                if event is not None:
                    if event.header.log_pos:
                        stream.log_pos = event.header.log_pos
                    return event
            event = stream.parse(data)
            if fast and data[0] == 0 and len(data) > 5 and data[5] in _SETTINGS_EVENTS:
                self._read_settings()  # a format description or rotation changes them
            if event is not None:
                return event
            if stream.ended:
                return None

    def _inflate(self, data: bytes, kind: int) -> bytes:
        """The plain event's packet for a compressed one; a corrupt one stops the reader here."""
        post_header_lengths, use_checksum = self._settings[4], self._settings[1]
        post_header = post_header_lengths[kind - 1] if post_header_lengths and len(post_header_lengths) >= kind \
            else None
        try:
            return compressed.inflate(data, use_checksum, post_header)
        except compressed.InflateError as exc:
            raise compressed.corrupt(exc, kind, self.reader.log_file, le_int(data, 14, 4)) from exc

    def _read_settings(self) -> None:
        """The stream's state the events are built with (it changes only in events `parse` reads)."""
        stream = self.reader
        self._settings = (stream.context, stream.use_checksum, stream.in_packet, stream.mysql_version,
                          stream.post_header_lengths)

    def _rows(self, data: bytes, kind: int) -> Any:
        cls, change, post_header = _ROWS[kind]
        settings = self._settings
        use_checksum, allowed_events, post_header_lengths = settings[1], settings[2], settings[4]
        if cls not in allowed_events:
            return None
        if post_header_lengths and len(post_header_lengths) >= kind and post_header_lengths[kind - 1] != post_header:
            return None
        table_map = self.reader.table_map
        table_id = le_int(data, 20, 6)
        table = table_map.get(table_id)
        if table is None:
            return None
        pos = 28
        if post_header == 10:
            if le_int(data, 28, 2) != 2:  # NDB or partition information: the library reads it
                return None
            pos = 30
        ncols = data[pos]
        if ncols >= 251 or ncols != len(table.columns):
            return None
        pos += 1
        decoders = self.decoders
        decoder = decoders.get(table)
        if decoder is None:
            decoders.slow += 1
            return None
        width = (ncols + 7) // 8
        for _ in range(2 if change == 1 else 1):
            if not full_bitmap(data, pos, ncols):
                return None  # a partial image: the library marks the missing columns
            pos += width
        packet = EventHeader(data)
        try:
            if 1 + packet.event_size != len(data):
                raise Corrupt(f"its header's size {packet.event_size} is not its packet's {len(data) - 1} bytes")
            rows = decoder.decode(data, pos, 1 + packet.event_size - (4 if use_checksum else 0), change)
        except Corrupt as exc:  # stop at it: the library would read it no better, and a retry reads it again
            raise corrupt_event(exc, f"{cls.__name__} of {table.schema}.{table.table}", self.reader.log_file,
                                self.reader.log_pos, packet.log_pos, f"{table.schema}.{table.table}") from exc
        decoders.fast += 1
        return ev.Rows(packet, change, table_id, table.schema, table.table, rows)

    def _table_map(self, data: bytes) -> Any:
        use_checksum, allowed_events = self._settings[1:3]
        cache: replication.TableMapCache | None = getattr(self.reader, "table_maps", None)
        if cache is None or TableMapEvent not in allowed_events:
            return None
        packet = EventHeader(data)
        size = packet.event_size - (23 if use_checksum else 19)
        table_id = le_int(data, 20, 6)
        last = self._last_maps.get(table_id)
        if last is not None and equal_at(data, 20, size, last[0]):  # the same bytes as this id's last map
            cache.hits += 1
            return self._table_map_event(last[1], packet)
        body = data[20:20 + size]
        layout = cache.get(body)
        if layout is None:
            return None  # the stream's `parse` has the library decode it, and caches it
        if len(self._last_maps) > 4096:
            self._last_maps.clear()
        self._last_maps[table_id] = (body, layout)
        return self._table_map_event(layout, packet)

    def _table_map_event(self, layout: ev.TableLayout, packet: Any) -> ev.TableMap:
        self.reader.table_map[layout.table_id] = layout.description
        return ev.TableMap(packet, layout)

    def _small(self, data: bytes, kind: int) -> Any:
        """A MariaDB GTID or an XID event, read from its few bytes."""
        cls, layout = _SMALL[kind]
        use_checksum, allowed_events = self._settings[1:3]
        packet = EventHeader(data)
        size = packet.event_size - (23 if use_checksum else 19)
        if cls not in allowed_events or size < layout.size or len(data) < 20 + layout.size:
            return None
        if cls is XidEvent:
            return ev.Xid(packet, _XID.unpack_from(data, 20)[0])
        sequence, domain, flags = _GTID.unpack_from(data, 20)
        return ev.MariadbGtid(packet, f"{domain}-{packet.server_id}-{sequence}", flags)


#: the small events read here: type -> (event class, the part of its body read)
_SMALL: dict[int, tuple[type[BinLogEvent], struct.Struct]] = {
    BINLOG.MARIADB_GTID_EVENT: (MariadbGtidEvent, _GTID),
    BINLOG.XID_EVENT: (XidEvent, _XID),
}
