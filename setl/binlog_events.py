"""setl's own binlog event values: what the binlog reader hands its assembler, one frozen value per event.

setl's reader (`sources.mysql_binlog.fast`) builds the hot ones (every rows event, repeated table
maps, GTID, XID) from their bytes; every other body is parsed by python-mysql-replication and
converted into one of these at its one door (`setl.adapters.replication.event_value`). No library
event object leaves the adapter and the stream.

Each value's `header` is the event's header: `timestamp`, `event_type`, `server_id`, `event_size`
(the whole event's, header included) and `log_pos` (where the next event starts): the compiled
`_rows.EventHeader` on the fast path, a `Header` otherwise.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import attrs

#: A rows event's kind of change.
WRITE, UPDATE, DELETE = 0, 1, 2
_HEADER = struct.Struct("<IBIII")


@attrs.frozen(slots=True)
class Header:
    """An event's common header (the 19 bytes before its body)."""

    timestamp: int
    event_type: int
    server_id: int
    event_size: int
    log_pos: int

    @classmethod
    def of(cls, payload: bytes) -> Header:
        """The header of an event packet's payload (the OK byte, then the header; at least 20 bytes)."""
        return cls(*_HEADER.unpack_from(payload, 1))


@attrs.frozen(slots=True)
class TableLayout:
    """A table map's decoded body, shared by every table-map event of the same bytes.

    `columns` are the column descriptions the row decoders read (name, type, charset, metadata);
    `description` is the library's decoded table the stream's table map holds (opaque here).
    """

    table_id: int
    schema: str
    table: str
    columns: Sequence[Any]
    primary_key: tuple[str, ...]
    description: Any = attrs.field(eq=False, repr=False)


@attrs.frozen(slots=True)
class TableMap:
    """TABLE_MAP_EVENT: the table the rows events after it with its id change."""

    header: Any
    layout: TableLayout


@attrs.frozen(slots=True)
class Rows:
    """WRITE/UPDATE/DELETE_ROWS: the rows of one table; each row a dict with ``values`` and
    ``none_sources`` (an update: ``before_values``, ``before_none_sources``, ``after_values``,
    ``after_none_sources``), a column the row image leaves out marked in its none sources."""

    header: Any
    kind: int  # WRITE, UPDATE or DELETE
    table_id: int
    schema: str
    table: str
    rows: Sequence[dict[str, Any]] = attrs.field(eq=False, repr=False)


@attrs.frozen(slots=True)
class SkippedRows:
    """WRITE/UPDATE/DELETE_ROWS of a table the reader does not hand on, passed over by length: its
    row count (a split transaction's resume point counts them), no rows decoded
    (`sources.mysql_binlog.skipping`)."""

    header: Any
    kind: int
    table_id: int
    schema: str
    table: str
    count: int


@attrs.frozen(slots=True)
class MariadbGtid:
    """MariaDB's GTID event: a transaction (or one standalone statement) starts."""

    header: Any
    gtid: str  # domain-server-sequence
    flags: int


@attrs.frozen(slots=True)
class MysqlGtid:
    """MySQL's GTID event: a transaction starts."""

    header: Any
    gtid: str  # uuid:number


@attrs.frozen(slots=True)
class Xid:
    """XID_EVENT: a transaction commits."""

    header: Any
    xid: int


@attrs.frozen(slots=True)
class XaPrepare:
    """XA_PREPARE_LOG_EVENT: an XA group ends in XA PREPARE, or commits (XA COMMIT ONE PHASE)."""

    header: Any
    one_phase: bool
    format_id: int
    gtrid: bytes
    bqual: bytes


@attrs.frozen(slots=True)
class Query:
    """QUERY_EVENT (and a statement-logged LOAD DATA's EXECUTE_LOAD_QUERY): a statement."""

    header: Any
    query: str
    schema: str  # the session's default schema
    sql_mode: int | None  # the session's sql_mode bits, when the event carries them
    thread_id: int = 0  # the connection id of the session that ran it (a channel's marker guard knows its loader's)


@attrs.frozen(slots=True)
class Rotate:
    """ROTATE_EVENT: reading continues in `next_binlog` at `position` (a zero timestamp: the
    server's note of where a dump starts, not a new file)."""

    header: Any
    next_binlog: str
    position: int


@attrs.frozen(slots=True)
class Heartbeat:
    """HEARTBEAT_LOG_EVENT: an idle server's note of its binlog file (`log_file`) and position."""

    header: Any
    log_file: str


@attrs.frozen(slots=True)
class Mark:
    """An event that only moves the read position: a format description, GTID list, checkpoint,
    previous GTIDs or stop event (`name` says which)."""

    header: Any
    name: str


@attrs.frozen(slots=True)
class Unknown:
    """An event setl reads no body of: its kind is judged by its type (`header.event_type`);
    `name` is the library's name for it, None when the library does not know the type."""

    header: Any
    name: str | None


#: The events that only move the read position: outside a transaction they become position marks.
POSITION_EVENTS = (Rotate, Heartbeat, Mark)
