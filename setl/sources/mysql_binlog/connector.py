"""The reader's connections to the server as pymysqlreplication opens them: `_Connector`, the
`pymysql_wrapper` that allows one stream connection and can cut it, and which failures are a lost
connection (`_disconnected`) rather than an error."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pymysql

from setl.adapters import pymysql as pymysql_io
from setl.adapters.replication import TableMapCache
from setl.dial import mysql_connection
from setl.tls import require_encrypted, tls_failure


class _Stopped(Exception):
    """The reader was closed; its thread ends quietly."""


class _Lost(Exception):
    """The stream connection dropped. The library would reconnect by itself from the middle of a
    transaction (or from its first GTID), so the connector refuses and the reader reconnects."""


class _ControlConnection(pymysql.connections.Connection):
    """A control connection, carrying the reader's table-map cache for the patched TableMapEvent."""

    setl_table_maps: TableMapCache | None = None


_STREAM_BUFFER = 1 << 20  # bytes the binlog stream's socket file reads at most at once


class _Connector:
    """The `pymysql_wrapper` handed to the library: one stream connection, and a way to cut it.

    Control connections carry the reader's table-map cache (`setl_table_maps`) when it has one.
    """

    def __init__(self, table_maps: TableMapCache | None, tls: bool = False) -> None:
        self.tls = tls  # refuse a connection the server did not encrypt
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
        conn: pymysql.connections.Connection
        if control:
            control_conn = mysql_connection(cls=_ControlConnection, **kwargs)
            control_conn.setl_table_maps = self.table_maps
            conn = control_conn
        else:
            conn = mysql_connection(**kwargs)
            # Nothing is buffered between the handshake and the dump: read the stream in large
            # pieces, so the reader thread releases the GIL (to block in recv) less often.
            pymysql_io.buffer_reads(conn, _STREAM_BUFFER)
        if self.tls:
            require_encrypted(conn, kwargs.get("host", "?"), kwargs.get("port", 0))
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
