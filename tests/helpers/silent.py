"""A TCP listener that accepts connections and never says a word: a wrong port, a black hole."""

from __future__ import annotations

import socket
import threading


class SilentListener:
    """Listens on a free loopback port; accepts every connection, reads and answers nothing."""

    def __init__(self) -> None:
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.host, self.port = self._server.getsockname()
        self.accepted: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._server.settimeout(0.2)
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._server.close()
        for conn in self.accepted:
            conn.close()

    def __enter__(self) -> SilentListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
