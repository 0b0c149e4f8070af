"""The binlog reader's events built by setl from their bytes; every rows event decoded by setl.

`FastStream` takes each packet of setl's own stream (`stream.BinlogStream`, framed by the
compiled `_rows.Framer`) and builds setl's own values (`setl.binlog_events`) of the events that
make up nearly all of a busy binlog from their bytes: every WRITE/UPDATE/DELETE_ROWS event,
decoded straight from the packet by the compiled `_rows.RowDecoder` (every column type, partial
images too); table maps already decoded once (answered from setl's table-map cache); MariaDB GTID
and XID events (two a transaction), read from their few bytes. The other events (rotations, format
descriptions, queries, XA, GTID lists, a table map seen for the first time) go to the stream's
`parse`, where the library parses the body and `setl.adapters.replication.event_value` converts
it into setl's value. No rows event reaches the library: a rows event setl cannot decode stops
the reader with one line naming its table, position and cause.

Without the compiled module (a source tree that was not built, or ``SETL_PURE_PYTHON=1``),
`available()` is False and the same events are built by setl's Python twins (`rowcodec`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import BinLogEvent, MariadbGtidEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from setl import binlog_events as ev
from setl.adapters import replication
from setl.sources.mysql_binlog import compressed, rowcodec
from setl.sources.mysql_binlog.assembler import corrupt_event
from setl.sources.mysql_binlog.rowcodec import Corrupt, Unreadable
from setl.sources.mysql_binlog.skipping import RowCounter

try:
    from setl.sources.mysql_binlog._rows import EventHeader, RowDecoder, equal_at, full_bitmap, le_int
except ImportError:  # not built: setl's Python decoder reads every rows event
    RowDecoder = None  # type: ignore[assignment,misc]
    from setl.sources.mysql_binlog.rowcodec import (  # type: ignore[assignment]
        EventHeader,
        equal_at,
        full_bitmap,
        le_int,
    )

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
    """One reader's row decoders, by table map (`Table` object), and counts of their use: `fast` the
    rows events the compiled decoder read, `slow` those setl's Python decoder read (`compiled`
    False, or the compiled module not built). `precisions` (`lookups.TableLookups.temporal_precisions`)
    tells the precision of MariaDB's pre-10.1 temporal columns; without it they are refused."""

    def __init__(self, compiled: bool = True, precisions: Callable[[str, str], Any] | None = None) -> None:
        self.compiled = compiled and RowDecoder is not None
        self.precisions = precisions
        #: id(table) -> (table, its decoder or why not, when its definition was written: None, or the
        #: ``CREATE_TIME`` its old temporal columns' precision was read from)
        self._by_table: dict[int, tuple[Any, Any, int | None]] = {}
        self.fast = self.slow = 0

    def get(self, table: Any, mariadb: bool = False, written: int = 0) -> Any:
        """The table's decoder for a rows event `written` at that Unix time; `rowcodec.Unreadable` when
        one of its columns is beyond setl's readers.

        On a MariaDB server (`mariadb`) a TIME, DATETIME or TIMESTAMP of the pre-10.1 formats
        (``mysql56_temporal_format=OFF``, tables of 5.3-10.0) is logged without its precision: MariaDB
        logs its own fractional formats under MySQL 5.5's types. Its precision is asked of the server
        (`precisions`): of precision 0 it is MySQL 5.5's format, of 1-6 MariaDB's ``Field_*_hires``
        format of that width. One of a table whose definition the server wrote at or after the event
        (an ALTER since: the precision now may not be the event's) is refused."""
        known = self._by_table.get(id(table))
        if known is None or known[0] is not table:
            known = self._make(table, mariadb)
            if len(self._by_table) > 4096:
                self._by_table.clear()
            self._by_table[id(table)] = known
        decoder, defined = known[1], known[2]
        if isinstance(decoder, Unreadable):
            raise decoder
        if defined is not None and defined >= written:
            raise Unreadable(f"{_old_temporals(table)[0]}: a TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 "
                             f"formats, whose table the server redefined (at Unix time {defined}) at or after "
                             f"this event was written (at {written}), so the precision it was logged with, "
                             "which its table map does not give, is unknown (reset the position past it, or "
                             "copy the table again)")
        return decoder

    def _make(self, table: Any, mariadb: bool) -> tuple[Any, Any, int | None]:
        make = RowDecoder if self.compiled else rowcodec.RowDecoder
        defined: int | None = None
        columns = table.columns
        try:
            old = _old_temporals(table) if mariadb else []
            if old:
                defined, digits = self._precisions(table, old)
                columns = [_Hires(c, digits[c.name]) if digits.get(c.name) else c for c in columns]
            decoder = make(columns, replication.charset_to_encoding, rowcodec.time2_value,
                           replication.date_value, replication.datetime_value, replication.json_value)
        except Unreadable as exc:
            return table, exc, None
        return table, decoder, defined

    def _precisions(self, table: Any, old: list[str]) -> tuple[int, dict[str, int]]:
        """When the server wrote the table's definition, and the precision (0-6) of each of its old
        temporal columns `old` there; `Unreadable` naming the first whose precision cannot be told."""
        if self.precisions is None:
            raise Unreadable(f"{old[0]}: a TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 formats, whose "
                             "fractional digits its table map does not give (ALTER TABLE ... FORCE with "
                             "mysql56_temporal_format=ON rewrites it in the current format)")
        columns, defined, engine = self.precisions(table.schema, table.table)
        if columns and engine.lower() not in _RENAME_DATED:
            raise Unreadable(f"{old[0]}: a TIME, DATETIME or TIMESTAMP of MariaDB's pre-10.1 formats in a {engine} "
                             "table, whose definition time (CREATE_TIME) a RENAME TABLE does not rewrite, so "
                             "setl cannot tell that the precision the server gives now is the one the event "
                             "was logged with (ALTER TABLE ... ENGINE=InnoDB, or FORCE with "
                             "mysql56_temporal_format=ON, makes later events readable)")
        types = {c.name: c.type for c in table.columns}
        digits: dict[str, int] = {}
        for name in old:
            of, fsp = columns.get(name, (None, None))
            if of != _OLD_TYPE_NAMES[types[name]] or defined is None or fsp not in range(7):
                raise Unreadable(f"{name}: a {_OLD_TYPE_NAMES[types[name]].upper()} of MariaDB's pre-10.1 "
                                 f"formats, whose precision neither its table map nor the server (which has "
                                 f"{'no such column' if of is None else f'{of.upper()}({fsp})'} there now) gives")
            digits[name] = fsp
        assert defined is not None
        return defined, digits

    def new_file(self) -> None:
        """Forget what the server said of old temporal columns: a new binlog file may come from a server
        restarted since (table ids start again, and a table map's bytes may repeat an earlier one's
        while the table it names was altered in between)."""
        for key, (_, decoder, defined) in list(self._by_table.items()):
            if defined is not None or isinstance(decoder, Unreadable):
                del self._by_table[key]

    def count(self) -> None:
        """Count one rows event decoded."""
        if self.compiled:
            self.fast += 1
        else:
            self.slow += 1


#: the engines whose CREATE_TIME every ALTER and RENAME TABLE rewrites (InnoDB's is its .frm's ctime;
#: MyISAM's, Aria's and MEMORY's survive a RENAME): only there is the server's definition dated
_RENAME_DATED = frozenset({"innodb"})
#: MariaDB's pre-10.1 temporal types -> information_schema's DATA_TYPE of a column of that type
_OLD_TYPE_NAMES = {rowcodec.T_TIME: "time", rowcodec.T_DATETIME: "datetime", rowcodec.T_TIMESTAMP: "timestamp"}


class _Hires:
    """A table map's column of MariaDB's pre-10.1 fractional formats, with the precision the server
    gave (`hires_fsp`, which both decoders read)."""

    def __init__(self, column: Any, fsp: int) -> None:
        self._column = column
        self.hires_fsp = fsp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._column, name)


def _old_temporals(table: Any) -> list[str]:
    """The names of the table map's TIME, DATETIME and TIMESTAMP columns of the pre-5.6 types."""
    return [c.name for c in table.columns if c.type in rowcodec.OLD_TEMPORALS]


def _packed_int(data: bytes, pos: int) -> tuple[int, int]:
    """The packed integer at `pos` (``net_store_length``) and where it ends."""
    first = le_int(data, pos, 1)
    if first < 251:
        return first, pos + 1
    size = {252: 2, 253: 3, 254: 8}.get(first)
    if size is None:
        raise Corrupt(f"a column count that starts with byte {first}")
    return le_int(data, pos + 1, size), pos + 1 + size


class FastStream:
    """The events of a `stream.BinlogStream`, the hot ones built here from their bytes.

    `fetchone()` takes each packet from the stream (framed by the compiled `Framer`) and builds the
    events that make up nearly all of a busy binlog straight from the bytes: WRITE/UPDATE/DELETE_ROWS
    of a table the compiled `RowDecoder` knows, table maps already in the reader's cache, MariaDB
    GTID and XID events. Every other packet (rotation, format description, queries, heartbeats,
    errors, the end of the stream, rows events the decoder leaves to the library) goes to the
    stream's `parse`, which has the library parse it and keeps the stream's state (`log_pos`,
    `log_file`, the table map, the format description) up to date. Without `decoders`, a reader's
    own (`RowDecoders()`) decode the rows.

    A rows event whose table id is in `skip` (the ids the assembler's table maps gave to tables the
    reader does not hand on) is passed over by length, compiled or not (`skipping`): its row count
    only, unless it cannot be counted exactly, when it is decoded as any other.
    """

    def __init__(self, reader: Any, decoders: RowDecoders | None, skip: set[int] | frozenset[int] = frozenset(),
                 counter: RowCounter | None = None) -> None:
        self.reader = reader  # the stream: its table map, file and position, `packet` and `parse`
        self.decoders = decoders if decoders is not None else RowDecoders()
        self.skip = skip  # table ids whose rows events are counted, not decoded (the assembler's, live)
        self.counter = counter if counter is not None else RowCounter(self.decoders.compiled)
        self._settings: tuple[Any, bool, Any, Any, Any] = (None, False, (), None, None)
        #: the last table map of each table id: (its body, its layout), reused while the bytes repeat
        self._last_maps: dict[int, tuple[bytes, Any]] = {}

    def fetchone(self) -> Any:
        """The next event; None once a non-blocking dump has ended."""
        stream = self.reader
        while True:
            data = stream.packet()
            if data[0] == 0 and len(data) > 20:
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
            event = stream.parse(data)
            if data[0] == 0 and len(data) > 5 and data[5] in _SETTINGS_EVENTS:
                self._read_settings()  # a format description or rotation changes them
                if data[5] == BINLOG.FORMAT_DESCRIPTION_EVENT:  # a binlog file's start
                    self.decoders.new_file()
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
        self._settings = (stream.context, stream.use_checksum, stream.in_packet | stream.allowed,
                          stream.mysql_version, stream.post_header_lengths)

    def _rows(self, data: bytes, kind: int) -> Any:
        """A WRITE/UPDATE/DELETE_ROWS event, its rows decoded here; one setl cannot decode stops the
        reader here (`CorruptEvent` naming its table, position and cause): reading it again would
        fail again, and no other reader would read it better."""
        cls, change, post_header = _ROWS[kind]
        settings = self._settings
        use_checksum, allowed_events, post_header_lengths = settings[1], settings[2], settings[4]
        if cls not in allowed_events:
            return None  # the stream's `parse` moves past it
        packet = EventHeader(data)
        table: Any = None
        table_id = le_int(data, 20, 6)
        try:
            if 1 + packet.event_size != len(data):
                raise Corrupt(f"its header's size {packet.event_size} is not its packet's {len(data) - 1} bytes")
            end = 1 + packet.event_size - (4 if use_checksum else 0)
            if post_header_lengths and len(post_header_lengths) >= kind and \
                    post_header_lengths[kind - 1] != post_header:
                raise Corrupt(f"its format description gives it a {post_header_lengths[kind - 1]}-byte post-header, "
                              f"not {post_header}")
            table = self.reader.table_map.get(table_id)
            if table is None:
                raise Corrupt(f"no table map before it names its table id {table_id}")
            pos = 28
            if post_header == 10:  # the extra data's length counts its own 2 bytes (NDB, partition ids)
                extra = le_int(data, 28, 2)
                if extra < 2:
                    raise Corrupt(f"an extra-data length of {extra}")
                pos = 28 + extra
            ncols, pos = _packed_int(data, pos)
            if ncols != len(table.columns):
                raise Corrupt(f"{ncols} columns where its table map has {len(table.columns)}")
            decoders = self.decoders
            context = getattr(self.reader, "context", None)
            decoder = decoders.get(table, getattr(context, "dbms", "") == "mariadb", packet.timestamp)
            width = (ncols + 7) // 8
            second = pos + width if change == 1 else pos
            if second + width > end:
                raise rowcodec.Truncated("columns-present bitmap")
            present = None
            if not (full_bitmap(data, pos, ncols) and full_bitmap(data, second, ncols)):
                present = (data[pos:pos + width], data[second:second + width])  # a partial image
            rows = decoder.decode(data, second + width, end, change, present)
        except (Corrupt, Unreadable) as exc:
            name = f"{table.schema}.{table.table}" if table is not None else None
            raise corrupt_event(exc, cls.__name__ + (f" of {name}" if name else ""), self.reader.log_file,
                                self.reader.log_pos, packet.log_pos, name) from exc
        decoders.count()
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
