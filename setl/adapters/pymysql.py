"""PyMySQL's internals, the one place setl reaches into them: the TLS context of its preferred mode
(`Connection`), the connection's command and packet reads (``_execute_command``, ``_read_packet``),
its buffered socket file and sequence id (``_rfile``, ``_next_seq_id``, ``_force_close``) for
readers that frame packets themselves, its socket and read timeout, and its buffered result
(`MySQLResult`) for a result read into dicts.

Written for PyMySQL `WRITTEN_FOR` exactly (a WARNING at import names another release);
tests/test_library_contracts.py pins every behaviour below against a real server.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pymysql.connections
from pymysql.constants import CLIENT, COMMAND
from pymysql.protocol import MysqlPacket

from setl.adapters import check_version

#: The PyMySQL release this module was written and tested against.
WRITTEN_FOR = "1.2.4"
INSTALLED = check_version("PyMySQL", WRITTEN_FOR)

#: The internals `PacketIO` and `query_rows` read through.
_PACKET_INTERNALS = ("_execute_command", "_read_packet", "_rfile", "_next_seq_id", "_force_close")


@functools.cache
def preferred_tls_context() -> ssl.SSLContext:
    """The context PyMySQL builds for its preferred mode (no TLS settings given: TLS when the server
    offers it, no certificate checked), built once per process: `ssl.create_default_context` loads
    the system's CA certificates, about 30 ms of CPU, and PyMySQL builds one for every connection
    (a snapshot opens one per chunk reader, per table done, per load connection)."""
    connection: Any = pymysql.connections.Connection  # the method does not use its instance
    built: ssl.SSLContext = connection._create_ssl_ctx(None, {})
    return built


class Connection(pymysql.connections.Connection):
    """PyMySQL's connection with its preferred mode's TLS context shared (`preferred_tls_context`);
    any TLS setting given builds its own as PyMySQL does."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if isinstance(sslp, dict) and not sslp:  # the preferred mode's empty settings
            return preferred_tls_context()
        parent: Any = super()
        built: ssl.SSLContext = parent._create_ssl_ctx(sslp)
        return built


def send_command(conn: Any, command: int, payload: str | bytes) -> None:
    """Send one command packet (``COM_QUERY`` and its text, say) and read nothing: the caller reads
    the answer with `read_packet` (PyMySQL has no public way to send a file held in memory)."""
    conn._execute_command(command, payload)


def send_query(conn: Any, sql: str) -> None:
    """Send `sql` as a ``COM_QUERY`` in the connection's encoding, reading nothing."""
    send_command(conn, COMMAND.COM_QUERY, sql.encode(conn.encoding))


def read_packet(conn: Any) -> MysqlPacket:
    """The connection's next packet; a server error packet is raised as PyMySQL raises it."""
    packet: MysqlPacket = conn._read_packet()
    return packet


def reads_packets(conn: Any) -> bool:
    """Whether `conn` has the internals `PacketIO` and `query_rows` use, and speaks the classic
    protocol they read (result sets that end in an EOF packet, not ``CLIENT_DEPRECATE_EOF``)."""
    return all(hasattr(conn, name) for name in _PACKET_INTERNALS) and \
        hasattr(pymysql.connections, "MySQLResult") and \
        not getattr(conn, "client_flag", 0) & getattr(CLIENT, "DEPRECATE_EOF", 1 << 24)


class PacketIO:
    """A connection's packet stream, for a reader that frames packets itself: `read` is its buffered
    socket file's read (so nothing is read twice or skipped), `seq` the sequence number PyMySQL
    expects next (write it back before PyMySQL reads again), `force_close` what PyMySQL does on a
    lost connection or a wrong sequence number."""

    __slots__ = ("conn", "read", "encoding")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.read: Callable[[int], bytes] = conn._rfile.read
        self.encoding: str = conn.encoding

    @property
    def seq(self) -> int:
        seq: int = self.conn._next_seq_id
        return seq

    @seq.setter
    def seq(self, value: int) -> None:
        self.conn._next_seq_id = value

    def force_close(self) -> None:
        self.conn._force_close()


def socket_of(conn: Any) -> socket.socket | None:
    """The connection's socket (a TLS one once encrypted), None once closed."""
    return getattr(conn, "_sock", None)


def buffer_reads(conn: Any, size: int) -> None:
    """Read the connection's socket through a buffer of `size` bytes from here on (call it only while
    nothing is buffered: right after connecting)."""
    conn._rfile = conn._sock.makefile("rb", buffering=size)


def apply_read_timeout(conn: Any) -> None:
    """Set the socket timeout PyMySQL sets before each read, for a reader reading past it."""
    if conn._current_timeout != conn._read_timeout:
        conn._sock.settimeout(conn._read_timeout)
        conn._current_timeout = conn._read_timeout


@contextlib.contextmanager
def read_timeout_at_least(conn: Any, seconds: float) -> Iterator[None]:
    """Within the block, each read of `conn` waits at least `seconds` (PyMySQL applies the
    connection's read timeout before each read); the connection's own timeout after it."""
    kept = getattr(conn, "_read_timeout", None)
    conn._read_timeout = max(kept or 0.0, seconds)
    try:
        yield
    finally:
        conn._read_timeout = kept


def packet_of(data: bytes, encoding: str, packet_type: Any = None) -> Any:
    """The packet PyMySQL's ``_read_packet`` makes of payload `data` (a `MysqlPacket`, or
    `packet_type`); an error packet is raised as the server's error, as it raises it."""
    packet = (packet_type or MysqlPacket)(data, encoding)
    if packet.is_error_packet():
        packet.raise_for_error()
    return packet


#: A reader of a result's data rows: (the connection's packets, one (encoding, converter) per
#: column) -> (the rows, the payload of the EOF packet that ended them). It raises a server error.
RowsReader = Callable[[PacketIO, Sequence[tuple[Any, Any]]], tuple[list[Any], bytes]]


def query_rows(conn: Any, sql: str, read_rows: RowsReader) -> list[Any]:
    """Run `sql` and read its data rows with `read_rows`, PyMySQL doing the rest (the column
    descriptions and their converters, the status, the connection's state after the result)."""
    send_query(conn, sql)
    result = _RowsResult(conn, read_rows)
    conn._result = None
    result.read()
    conn._result = result
    if result.server_status is not None:
        conn.server_status = result.server_status
    conn._affected_rows = result.affected_rows
    return result.read_rows_out


_MySQLResult: Any = pymysql.connections.MySQLResult  # its private members are not in the type stubs


class _RowsResult(_MySQLResult):
    """A buffered result whose data rows a `RowsReader` reads."""

    connection: Any

    def __init__(self, connection: Any, read_rows: RowsReader) -> None:
        super().__init__(connection)
        self.read_rows = read_rows
        self.read_rows_out: list[Any] = []

    def _read_rowdata_packet(self) -> None:
        conn = self.connection
        rows, end = self.read_rows(PacketIO(conn), self.converters)
        self._check_packet_is_eof(MysqlPacket(end, conn.encoding))
        self.read_rows_out = rows
        self.connection = None
        self.affected_rows = len(rows)
        self.rows = ()
