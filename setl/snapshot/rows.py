"""A snapshot chunk's result set read straight into row dicts: PyMySQL's wire format and value
conversions, without its per-row packet objects and per-column method calls (about half of the
CPU a chunk costs setl to read).

The data rows are read here from the connection's packets, through PyMySQL's reading machinery as
`setl.adapters.pymysql` reaches it (`query_rows`, `PacketIO`); a connection without those
internals, or a server speaking a protocol variant this does not read (``CLIENT_DEPRECATE_EOF``),
goes through PyMySQL's own cursor instead, with the same values.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any

from pymysql import err
from pymysql.constants import CR
from pymysql.protocol import MysqlPacket

from setl.adapters import pymysql as pymysql_io

_MAX_PACKET = 0xFFFFFF


def supported(conn: Any) -> bool:
    """Whether `conn` has the PyMySQL internals `fetch_dicts` reads through, and the protocol it reads."""
    return pymysql_io.reads_packets(conn)


def fetch_dicts(conn: Any, sql: str, args: Sequence[Any],
                names: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of query `sql` (%-formatted with `args` as PyMySQL does), as dicts keyed by `names`
    (one per selected column, in order), with PyMySQL's values (its decoders, the connection's
    encoding; binary columns as bytes)."""
    with conn.cursor() as cur:
        query = cur.mogrify(sql, args)
    if not supported(conn):
        return _through_cursor(conn, query, names)
    rows: list[dict[str, Any]] = pymysql_io.query_rows(conn, query, _DictRows(tuple(names)).read)
    return rows


def _through_cursor(conn: Any, query: str, names: Sequence[str]) -> list[dict[str, Any]]:
    with conn.cursor() as cur:
        cur.execute(query)
        return [dict(zip(names, row)) for row in cur.fetchall()]


_RowParser: Any
try:  # the per-row parse in C (built by pip install); the loop below where it is not built
    from setl.snapshot._rowparse import RowParser as _RowParser
except ImportError:
    _RowParser = None
#: whether data rows are parsed by the compiled `RowParser` (the tests turn it off to compare)
COMPILED = _RowParser is not None


class _DictRows:
    """A result's data rows, parsed in one loop into dicts keyed by `names` (a `pymysql_io.RowsReader`)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def read(self, io: pymysql_io.PacketIO, converters: Sequence[tuple[Any, Any]]
             ) -> tuple[list[dict[str, Any]], bytes]:
        """The rows up to the EOF packet, and that packet's payload."""
        if len(converters) != len(self.names):
            raise err.ProgrammingError(f"{len(converters)} columns selected, {len(self.names)} names given")
        fields = []
        for name, (encoding, converter) in zip(self.names, converters):
            if converter is int and encoding == "ascii":
                fields.append((name, None, int))  # int() takes the ASCII bytes as they are
            else:
                fields.append((name, encoding, converter))
        read = io.read
        seq = io.seq
        out: list[dict[str, Any]] = []
        append = out.append
        parse = _RowParser(fields).parse if COMPILED else None
        try:
            while True:
                data, seq = _packet(read, io, seq)
                if len(data) == _MAX_PACKET:  # a row in several packets
                    parts = [data]
                    part = data
                    while len(part) == _MAX_PACKET:
                        part, seq = _packet(read, io, seq)
                        parts.append(part)
                    data = b"".join(parts)
                first = data[0]
                if first == 0xFE and len(data) < 9:  # EOF: the end of the rows
                    io.seq = seq
                    return out, data
                if first == 0xFF:  # an error in the middle of the result
                    io.seq = seq
                    MysqlPacket(data, io.encoding).raise_for_error()
                if parse is not None:
                    append(parse(data))
                    continue
                row: dict[str, Any] = {}
                pos = 0
                for name, encoding, converter in fields:
                    n = data[pos]
                    if n < 251:
                        pos += 1
                    elif n == 251:  # NULL
                        row[name] = None
                        pos += 1
                        continue
                    elif n == 252:
                        n = data[pos + 1] | data[pos + 2] << 8
                        pos += 3
                    elif n == 253:
                        n = data[pos + 1] | data[pos + 2] << 8 | data[pos + 3] << 16
                        pos += 4
                    else:
                        n = int.from_bytes(data[pos + 1:pos + 9], "little")
                        pos += 9
                    value: Any = data[pos:pos + n]
                    pos += n
                    if encoding is not None:
                        value = value.decode(encoding)
                    if converter is not None:
                        value = converter(value)
                    row[name] = value
                append(row)
        except _Lost:
            io.force_close()
            raise err.OperationalError(CR.CR_SERVER_LOST, "Lost connection to MySQL server during query") from None
        except OSError as exc:
            io.force_close()
            if exc.errno == errno.EINTR:  # BufferedReader retries EINTR itself; never seen here
                raise err.OperationalError(CR.CR_SERVER_LOST, f"Interrupted read ({exc})") from exc
            raise err.OperationalError(CR.CR_SERVER_LOST,
                                       f"Lost connection to MySQL server during query ({exc})") from exc


def _packet(read: Any, io: Any, seq: int) -> tuple[bytes, int]:
    """The payload of the next packet, and the sequence number the packet after it carries; `_Lost`
    when the connection ends first, an `InternalError` (the connection closed) when the packet
    carries another number than `seq`."""
    header = read(4)
    if len(header) < 4:
        raise _Lost()
    length = header[0] | header[1] << 8 | header[2] << 16
    if header[3] != seq:
        io.seq = seq
        io.force_close()
        raise err.InternalError(f"Packet sequence number wrong - got {header[3]} expected {seq}")
    data = read(length)
    if len(data) < length:
        raise _Lost()
    return data, (seq + 1) & 0xFF


class _Lost(Exception):
    """The server closed the connection in the middle of the result."""
