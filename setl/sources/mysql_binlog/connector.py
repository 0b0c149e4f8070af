"""The binlog stream's connections: `_Connector` opens one stream connection at a time through
`setl.dial` (TLS required when configured) and can cut it from another thread; `_disconnected`
tells a lost connection (reconnect) from an error (stop)."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pymysql

from setl.adapters import pymysql as pymysql_io
from setl.dial import mysql_connection
from setl.sources.mysql_binlog.handoff import Stopped as _Stopped
from setl.tls import require_encrypted, tls_failure


class _Lost(Exception):
    """The stream connection dropped, or a second stream was asked for before `reset`: the reader
    reconnects itself, from the end of the last complete transaction."""


_STREAM_BUFFER = 1 << 20  # bytes the binlog stream's socket file reads at most at once


class _Connector:
    """The stream connections of one reader: at most one open until `reset`, and a way to cut it."""

    def __init__(self, tls: bool = False) -> None:
        self.tls = tls  # refuse a connection the server did not encrypt
        self._lock = threading.Lock()
        self._connections: list[pymysql.connections.Connection] = []
        self._stream_opened = False
        self.closed = False

    def open(self, **settings: Any) -> pymysql.connections.Connection:
        """A new stream connection with `settings` (`SourceServer.stream_settings`)."""
        with self._lock:
            if self.closed:
                raise _Stopped()
            if self._stream_opened:
                raise _Lost()
            self._stream_opened = True
        conn = mysql_connection(**settings)
        # Nothing is buffered between the handshake and the dump: read the stream in large
        # pieces, so the reader thread releases the GIL (to block in recv) less often.
        pymysql_io.buffer_reads(conn, _STREAM_BUFFER)
        if self.tls:
            require_encrypted(conn, settings.get("host", "?"), settings.get("port", 0))
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
        sock = pymysql_io.socket_of(conn)
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


# Server errors that mean "gone for now": can't connect, gone away, lost, shutting down, killed.
_DISCONNECTS = frozenset({1053, 1152, 1927, 2003, 2006, 2013, 2055})


def _disconnected(exc: BaseException) -> bool:
    """Whether `exc` means the server is gone for now (reconnect), not that something is wrong (stop)."""
    if tls_failure(exc) is not None:  # a certificate not trusted stays so: no reconnecting
        return False
    if isinstance(exc, (_Lost, ConnectionError, TimeoutError, socket.timeout)):
        return True
    if isinstance(exc, pymysql.err.OperationalError) and exc.args:
        return exc.args[0] in _DISCONNECTS
    return isinstance(exc, (pymysql.err.InterfaceError, OSError, EOFError))
