"""The node's HTTP endpoint reuses a connection's thread for the next connection, never queues a
connection behind a busy thread, and ends its waiting threads when it stops."""

from __future__ import annotations

import socket
import threading
import time

from setl.meta.sqlite import SqliteMetaStore
from setl.observe import NodeObserver
from setl.observe.server import StatusServer
from tests.helpers.wait import wait_until


def get(host: str, port: int, path: str = "/healthz") -> bytes:
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def http_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("setl-http-")]


def test_connection_threads_are_reused_and_never_queue_behind_a_busy_one(tmp_path) -> None:
    """30 connections one after the other are answered by one or two threads, not 30; while three
    clients hold connections open without sending, a new request is answered at once; after stop,
    no connection thread is left."""
    meta = SqliteMetaStore(tmp_path / "meta.db")
    observer = NodeObserver("n1", ["p1"], meta, lambda: {"p1": {"running": False}})
    server = StatusServer(observer, "127.0.0.1:0")
    server.start()
    slow: list[socket.socket] = []
    try:
        host, port = server.address
        for _ in range(30):
            assert get(host, port).startswith(b"HTTP/1.1 ")
        assert server._server._started <= 2, server._server._started  # type: ignore[attr-defined]
        for _ in range(3):  # each holds a thread, reading a request that does not come
            sock = socket.create_connection((host, port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            slow.append(sock)
        began = time.monotonic()
        assert get(host, port).startswith(b"HTTP/1.1 ")
        assert time.monotonic() - began < 2.0
        for sock in slow:
            sock.close()
    finally:
        server.stop()
        meta.close()
    wait_until(lambda: not http_threads(), timeout=10, message="the connection threads to end")
