"""A snapshot chunk's result set read straight into row dicts: PyMySQL's wire format and value
conversions, without its per-row packet objects and per-column method calls (about half of the
CPU a chunk costs setl to read).

This is the one place that reaches into PyMySQL's private reading machinery (``_execute_command``,
``_rfile``, ``_next_seq_id``, `MySQLResult`), checked against the releases it was written for
(`SUPPORTED_PYMYSQL`); another release, a connection without those internals, or a server
speaking a protocol variant it does not read (``CLIENT_DEPRECATE_EOF``) goes through PyMySQL's own
cursor instead, with the same values.
"""

from __future__ import annotations

import errno
import functools
import importlib.metadata
import re
from collections.abc import Sequence
from typing import Any

import pymysql
import pymysql.connections
from pymysql import err
from pymysql.constants import CLIENT, COMMAND, CR
from pymysql.protocol import MysqlPacket

_MAX_PACKET = 0xFFFFFF

#: The PyMySQL releases whose private reading machinery `fetch_dicts` was written and tested
#: against (>= the first, < the second); setup.cfg allows a wider range, read through the cursor.
SUPPORTED_PYMYSQL = ("1.1", "1.3")


@functools.cache
def _known_release() -> bool:
    def numbers(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", text)[:3])

    try:
        version = importlib.metadata.version("PyMySQL")
    except importlib.metadata.PackageNotFoundError:
        return False
    low, high = SUPPORTED_PYMYSQL
    return numbers(low) <= numbers(version) < numbers(high)


def supported(conn: Any) -> bool:
    """Whether `conn` is of a PyMySQL release `fetch_dicts` knows and has the internals it reads
    through."""
    internals = ("_execute_command", "_rfile", "_next_seq_id", "_force_close")
    return _known_release() and all(hasattr(conn, name) for name in internals) \
        and hasattr(pymysql.connections, "MySQLResult") and not getattr(conn, "client_flag", 0) & \
        getattr(CLIENT, "DEPRECATE_EOF", 1 << 24)


def fetch_dicts(conn: Any, sql: str, args: Sequence[Any],
                names: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of query `sql` (%-formatted with `args` as PyMySQL does), as dicts keyed by `names`
    (one per selected column, in order), with PyMySQL's values (its decoders, the connection's
    encoding; binary columns as bytes)."""
    with conn.cursor() as cur:
        query = cur.mogrify(sql, args)
    if not supported(conn):
        return _through_cursor(conn, query, names)
    conn._execute_command(COMMAND.COM_QUERY, query.encode(conn.encoding))
    result = _DictResult(conn, tuple(names))
    conn._result = None
    result.read()
    conn._result = result
    if result.server_status is not None:
        conn.server_status = result.server_status
    conn._affected_rows = result.affected_rows
    rows: list[dict[str, Any]] = result.dicts
    return rows


def _through_cursor(conn: Any, query: str, names: Sequence[str]) -> list[dict[str, Any]]:
    with conn.cursor() as cur:
        cur.execute(query)
        return [dict(zip(names, row)) for row in cur.fetchall()]


_MySQLResult: Any = pymysql.connections.MySQLResult

_RowParser: Any
try:  # the per-row parse in C (built by pip install); the loop below where it is not built
    from setl.snapshot._rowparse import RowParser as _RowParser
except ImportError:
    _RowParser = None
#: whether data rows are parsed by the compiled `RowParser` (the tests turn it off to compare)
COMPILED = _RowParser is not None


class _DictResult(_MySQLResult):
    """A buffered result whose data rows are parsed in one loop into dicts."""

    connection: Any

    def __init__(self, connection: Any, names: tuple[str, ...]) -> None:
        super().__init__(connection)
        self.names = names
        self.dicts: list[dict[str, Any]] = []

    def _read_rowdata_packet(self) -> None:
        conn: Any = self.connection
        if len(self.converters) != len(self.names):
            raise err.ProgrammingError(f"{len(self.converters)} columns selected, {len(self.names)} names given")
        fields = []
        for name, (encoding, converter) in zip(self.names, self.converters):
            if converter is int and encoding == "ascii":
                fields.append((name, None, int))  # int() takes the ASCII bytes as they are
            else:
                fields.append((name, encoding, converter))
        read = conn._rfile.read
        seq = conn._next_seq_id
        out = self.dicts
        append = out.append
        parse = _RowParser(fields).parse if COMPILED else None
        try:
            while True:
                header = read(4)
                if len(header) < 4:
                    raise _Lost()
                length = header[0] | header[1] << 8 | header[2] << 16
                if header[3] != seq:
                    conn._next_seq_id = seq
                    conn._force_close()
                    raise err.InternalError(f"Packet sequence number wrong - got {header[3]} expected {seq}")
                seq = (seq + 1) & 0xFF
                data = read(length)
                if len(data) < length:
                    raise _Lost()
                if length == _MAX_PACKET:  # a row in several packets
                    parts = [data]
                    while length == _MAX_PACKET:
                        header = read(4)
                        if len(header) < 4:
                            raise _Lost()
                        length = header[0] | header[1] << 8 | header[2] << 16
                        if header[3] != seq:
                            conn._next_seq_id = seq
                            conn._force_close()
                            raise err.InternalError(
                                f"Packet sequence number wrong - got {header[3]} expected {seq}")
                        seq = (seq + 1) & 0xFF
                        part = read(length)
                        if len(part) < length:
                            raise _Lost()
                        parts.append(part)
                    data = b"".join(parts)
                first = data[0]
                if first == 0xFE and len(data) < 9:  # EOF: the end of the rows
                    conn._next_seq_id = seq
                    self._check_packet_is_eof(MysqlPacket(data, conn.encoding))
                    break
                if first == 0xFF:  # an error in the middle of the result
                    conn._next_seq_id = seq
                    MysqlPacket(data, conn.encoding).raise_for_error()
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
            conn._force_close()
            raise err.OperationalError(CR.CR_SERVER_LOST, "Lost connection to MySQL server during query") from None
        except OSError as exc:
            conn._force_close()
            if exc.errno == errno.EINTR:  # BufferedReader retries EINTR itself; never seen here
                raise err.OperationalError(CR.CR_SERVER_LOST, f"Interrupted read ({exc})") from exc
            raise err.OperationalError(CR.CR_SERVER_LOST,
                                       f"Lost connection to MySQL server during query ({exc})") from exc
        self.connection = None
        self.affected_rows = len(out)
        self.rows = ()


class _Lost(Exception):
    """The server closed the connection in the middle of the result."""
