"""How setl opens a connection to a MySQL or MariaDB server: the TCP connect and the whole
handshake (greeting, TLS, authentication, the first session statements) end within a time limit.

PyMySQL bounds only the TCP connect by `connect_timeout`; its handshake then reads with the
connection's `read_timeout`, which is None (wait for ever) unless given. A port that accepts the
connection and never answers (a wrong port, a frozen server, a black hole, a SIGSTOPped
mariadbd) held `setl check` and `setl start` for minutes, deaf to SIGTERM. `mysql_connection`
opens the socket itself and cuts it when the handshake has not ended in time, through PyMySQL's
public `defer_connect` and `connect(sock)`; after the handshake the connection's own read and
write timeouts hold.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, TypeVar, overload

import pymysql

from setl.adapters import pymysql as pymysql_io

C = TypeVar("C", bound=pymysql.connections.Connection)

#: CR_SERVER_LOST: the error a reader of a cut connection gets, which setl's retries treat as transient
_SERVER_LOST = 2013


@overload
def mysql_connection(*, connect_timeout: float, cls: None = None, **kwargs: Any) -> pymysql.connections.Connection:
    ...


@overload
def mysql_connection(*, connect_timeout: float, cls: type[C], **kwargs: Any) -> C:
    ...


def mysql_connection(*, connect_timeout: float, cls: Any = None, **kwargs: Any) -> Any:
    """A connected `cls` (PyMySQL's `Connection` by default, its preferred mode's TLS context built
    once per process: `setl.adapters.pymysql.Connection`) built from PyMySQL's `kwargs`.

    The TCP connect and the handshake each end within `connect_timeout` seconds, or raise
    `pymysql.err.OperationalError` (2003 can't connect, 2013 no handshake) naming the server and
    the time waited. Blocks at most about twice `connect_timeout`.
    """
    factory: Any = cls or pymysql_io.Connection
    if kwargs.get("unix_socket"):
        return factory(connect_timeout=connect_timeout, **kwargs)
    conn = factory(defer_connect=True, connect_timeout=connect_timeout, **kwargs)
    host, port = kwargs.get("host", "localhost"), int(kwargs.get("port", 3306))
    try:
        sock = socket.create_connection((host, port), connect_timeout)
    except OSError as exc:
        raise pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on {host}:{port} ({exc})") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    guard = _Guard(sock)
    timer = threading.Timer(connect_timeout, guard.cut)
    timer.daemon = True
    timer.name = f"setl-handshake-{host}:{port}"
    timer.start()
    failed: BaseException | None = None
    try:
        conn.connect(sock)
    except (pymysql.MySQLError, OSError) as exc:
        failed = exc
    finally:
        timer.cancel()
    if guard.finish():  # cut: also when the handshake ended just as the time ran out
        if failed is None:
            conn.close()
        raise pymysql.err.OperationalError(
            _SERVER_LOST, f"MySQL server {host}:{port} accepted the connection but did not finish the "
                          f"handshake within {connect_timeout:g}s (a frozen server, or not a MySQL port)") from failed
    if failed is not None:
        raise failed
    return conn


class _Guard:
    """Cuts a socket whose handshake ran out of time, unless the handshake finished first."""

    def __init__(self, sock: socket.socket) -> None:
        # a second descriptor of the same socket: PyMySQL's TLS detaches the first one, and a
        # shutdown through either ends the socket's reads
        self._sock = sock.dup()
        self._lock = threading.Lock()
        self._done = False
        self.cut_off = False

    def cut(self) -> None:
        with self._lock:
            if self._done:
                return
            self.cut_off = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once
            except OSError:
                pass

    def finish(self) -> bool:
        """Mark the handshake over (no cut after this); whether it was cut."""
        with self._lock:
            if not self._done:
                self._done = True
                self._sock.close()
            return self.cut_off
