"""A TCP proxy between a node and ZooKeeper that a test can cut: a network partition of one
node, with the node running. Cut longer than the session timeout, the server expires the node's
session; healed, the node reconnects and learns that its session expired, as a real partition
does. This is how the HA tests expire a node's session from outside, without its password."""

from __future__ import annotations

import socket
import threading

from setl.testing.servers import HOST


class TcpProxy:
    """Forwards every connection made to `address` to `upstream` (``host:port``) until `cut`:
    then the open connections are closed and new ones are closed at once, until `heal`. While
    `muted`, what the upstream answers is dropped: requests arrive and apply, their answers are lost.

    Every thread is named and joined by `close`."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.2)
        self.address = f"{HOST}:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._cut = False
        self.muted = threading.Event()
        self._closed = threading.Event()
        self._open: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name=f"proxy-{self.address}", daemon=True)

    def start(self) -> TcpProxy:
        self._acceptor.start()
        return self

    def cut(self) -> None:
        """Close every forwarded connection, and each new one as soon as it is made."""
        with self._lock:
            self._cut = True
            sockets, self._open = self._open, []
        for sock in sockets:
            _close(sock)

    def heal(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._acceptor.join(10)
        for thread in self._threads:
            thread.join(10)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            client.settimeout(None)
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            self._threads = [t for t in self._threads if t.is_alive()]
            for (source, sink), mute in (((client, server), None), ((server, client), self.muted)):
                thread = threading.Thread(target=_pump, args=(source, sink, mute), daemon=True,
                                          name=f"proxy-{self.address}-{source.fileno()}")
                thread.start()
                self._threads.append(thread)


def _pump(source: socket.socket, sink: socket.socket, mute: threading.Event | None = None) -> None:
    """Copy bytes from `source` to `sink` (dropping them while `mute` is set) until either side
    closes; then close both."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            if mute is None or not mute.is_set():
                sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
