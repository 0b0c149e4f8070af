"""A browser that closes its connection while the node's page answers is not an error of the node."""

from __future__ import annotations

import logging
import socket
import struct
import threading

from setl.meta.sqlite import SqliteMetaStore
from setl.observe import NodeObserver
from setl.observe.server import StatusServer
from tests.helpers.wait import wait_until


def test_a_closed_browser_connection_logs_no_error(tmp_path, caplog) -> None:
    """Requests whose client resets the connection before reading the answer log nothing at
    ERROR and no traceback; the endpoint keeps answering."""
    caplog.set_level(logging.DEBUG)
    meta = SqliteMetaStore(tmp_path / "meta.db")
    observer = NodeObserver("n1", ["p1"], meta, lambda: {"p1": {"running": False}})
    server = StatusServer(observer, "127.0.0.1:0")
    server.start()
    try:
        host, port = server.address
        for path in ("/", "/static/status.js", "/api/status", "/metrics"):
            for _ in range(20):
                sock = socket.create_connection((host, port))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                sock.close()
        ok = socket.create_connection((host, port))
        ok.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := ok.recv(65536):
            answer += chunk
        ok.close()
        assert answer.startswith(b"HTTP/1.1 "), answer[:100]
        wait_until(lambda: not any("process_request_thread" in t.name for t in threading.enumerate()), timeout=10,
                   message="every request handled")
    finally:
        server.stop()
        meta.close()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], [r.getMessage() for r in bad]
