"""The node's HTTP endpoint (``http.listen`` in setl.yaml): read-only, on the standard library's
threading HTTP server (docs/status-page.md says why).

* ``/``: the status page (setl/web/static, shipped with the package);
* ``/metrics``: Prometheus text format, from the node's own registry;
* ``/api/status``: JSON, the rows of ``setl status --json`` with live figures;
* ``/api/history?since=T&step=N``: an hour of lag, rate and bytes behind, one sample a second;
* ``/healthz``: 200 while every pipeline of the node is healthy (not paused nor failed), else 503;
* ``/api/v1/...``: with ``http.api``, the authenticated control API (`setl.observe.api`).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from setl.config import HttpTlsConfig, parse_listen
from setl.errors import ConfigError
from setl.observe import NodeObserver
from setl.observe.api import PREFIX, Api, Response

log = logging.getLogger("setl.observe")

#: The page's files, and their content types.
STATIC = {"index.html": "text/html; charset=utf-8", "status.js": "text/javascript; charset=utf-8",
          "status.css": "text/css; charset=utf-8"}


def _static(name: str) -> bytes:
    return resources.files("setl.web").joinpath("static").joinpath(name).read_bytes()


#: A browser that went away while it was answered: nothing is wrong with the node.
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _page(status: Any) -> bytes:
    """The page with the node's status of now inside it, which the script renders before it first
    asks for one: a page read at its load (a plain headless screenshot, a slow link) is not blank."""
    data = json.dumps(status, allow_nan=False, default=str).replace("</", "<\\/")
    return _static("index.html").replace(
        b'<script src="/static/status.js">',
        f'<script id="initial-status" type="application/json">{data}</script>\n'
        '<script src="/static/status.js">'.encode(), 1)


class _Server(ThreadingHTTPServer):
    """One thread per connection, as ThreadingHTTPServer, but a thread that finished its connection
    waits `IDLE_S` for the next one instead of ending: 50 clients polling twice a second, each on a
    new connection, cost the node half the CPU (starting a thread per poll was the other half,
    tools/bench/bench_api.py). A connection is only ever handed to an idle thread, never queued
    behind a busy one, so an event stream or a slow client holds up no one."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops the connections of a burst of clients (50 scripts
    # polling at once), which then wait the kernel's 1 s SYN retransmit: tail latency, not work
    request_queue_size = 128
    #: how long a thread waits for another connection, and how many may wait at once
    IDLE_S = 10.0
    MAX_IDLE = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle: list[_Worker] = []
        self._idle_lock = threading.Lock()
        self._closed = False
        self._started = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._idle_lock:
            worker = self._idle.pop() if self._idle else None
            if worker is not None:
                worker.give((request, client_address))
                return
            self._started += 1
            number = self._started
        thread = threading.Thread(target=self._work, args=((request, client_address),),
                                  name=f"setl-http-{number}", daemon=True)
        thread.start()

    def _work(self, job: tuple[Any, Any] | None) -> None:
        worker = _Worker()
        while job is not None:
            self.process_request_thread(*job)  # answers the connection and closes it, whatever happens
            with self._idle_lock:
                if self._closed or len(self._idle) >= self.MAX_IDLE:
                    return
                self._idle.append(worker)
            handed, job = worker.take(self.IDLE_S)
            if not handed:
                with self._idle_lock:
                    if worker in self._idle:  # nobody handed it a connection: it ends
                        self._idle.remove(worker)
                        return
                # handed one (or the end) just as it timed out, under the lock: it is in the slot
                handed, job = worker.take(None)

    def server_close(self) -> None:
        super().server_close()
        with self._idle_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.give(None)  # ends it

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A closed browser connection is a DEBUG line; anything else is logged once, with its cause."""
        exc = sys.exc_info()[1]
        if isinstance(exc, _GONE):
            log.debug("http %s went away: %s", client_address, exc)
        else:
            log.error("http %s: %s", client_address, exc, exc_info=log.isEnabledFor(logging.DEBUG))


class _Worker:
    """An idle connection thread's slot: the server hands it the next connection (or None: end)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._job: tuple[Any, Any] | None = None

    def give(self, job: tuple[Any, Any] | None) -> None:
        self._job = job
        self._ready.set()

    def take(self, timeout: float | None) -> tuple[bool, tuple[Any, Any] | None]:
        """(True, the connection handed over, or None: end), or (False, None) when nothing was
        handed within `timeout`."""
        if not self._ready.wait(timeout):
            return False, None
        self._ready.clear()
        job, self._job = self._job, None
        return True, job


class _Server6(_Server):
    address_family = socket.AF_INET6


class StatusServer:
    """Serves `observer` on `listen` (``HOST:PORT``) from a thread of its own until `stop`."""

    def __init__(self, observer: NodeObserver, listen: str, api: Api | None = None,
                 tls: HttpTlsConfig | None = None, timeout: float = 30.0) -> None:
        self.observer = observer
        self.api = api
        host, port = parse_listen(listen)
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), _handler(observer, api, timeout))
        except OSError as exc:
            raise ConfigError(f"http.listen: cannot listen on {listen}: {exc.strerror or exc}") from exc
        self.scheme = "http"
        if tls is not None:
            from setl.tls import server_context

            context = server_context(tls.cert, tls.key)
            # the handshake happens in the request's thread, under its timeout: a slow client never
            # holds the accepting thread
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True,
                                                      do_handshake_on_connect=False)
            self.scheme = "https"
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"{self.scheme}://{'[' + host + ']' if ':' in host else host}:{port}/"

    @property
    def advertised_url(self) -> str:
        """`url` as the other nodes of a cluster reach it (registered with the node, docs/api.md):
        a wildcard address (``0.0.0.0``, ``::``) becomes this host's name."""
        host, port = self.address
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        return f"{self.scheme}://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="setl-http", daemon=True)
        self._thread.start()
        log.info("status page and metrics on %s (/metrics, /api/status, /healthz%s)", self.url,
                 ", control API /api/v1" if self.api is not None else "")

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self._server.server_close()


def _handler(observer: NodeObserver, api: Api | None, read_timeout: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """One HTTP request to the node's page: the static page, ``/api/status``, ``/metrics``,
        answered from `observer` (read-only; a request never blocks a pipeline), and the control
        API under ``/api/v1`` (`api`) when it is on."""

        server_version = "setl"
        protocol_version = "HTTP/1.1"
        timeout = read_timeout  # a client that sends nothing for this long is cut off

        def _api(self, method: str) -> bool:
            """Answer a request under ``/api/v1``; False when it is not one."""
            url = urlsplit(self.path)
            if not (url.path == PREFIX or url.path.startswith(PREFIX + "/")):
                return False
            if api is None:
                self._json(404, {"error": "the control API is off on this node (http.api in setl.yaml turns it on)"})
                return True
            response = api.handle(method, url.path, parse_qs(url.query), self.headers, self.rfile.read,
                                  self.address_string())
            if method == "POST" and response.status >= 400:  # its body may be unread: the connection cannot go on
                self.close_connection = True
            self._answer(response)
            return True

        def _answer(self, response: Response) -> None:
            if response.stream is None:
                body = response.encoded if response.encoded is not None else \
                    json.dumps(response.body, allow_nan=False, default=str).encode()
                self.send_response(response.status)
                for key, value in {"Content-Type": "application/json", **response.headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return
            self.close_connection = True  # the stream ends with the connection
            self.send_response(response.status)
            for key, value in response.headers.items():
                self.send_header(key, value)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            for line in response.stream:
                self.wfile.write(line)
                self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            if log.isEnabledFor(logging.DEBUG):  # called for every request: nothing formatted for nothing
                log.debug("http %s %s", self.address_string(), format % args)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            try:
                if self._api("GET"):
                    return
            except _GONE as exc:
                log.debug("http %s: the client went away: %s", self.path, exc)
                return
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            path = url.path
            try:
                if path == "/metrics" and observer.metrics is not None:
                    self._send(200, generate_latest(observer.metrics.registry), CONTENT_TYPE_LATEST)
                elif path == "/api/status":
                    self._json(200, observer.status())
                elif path == "/api/history":
                    since = float(query["since"][0]) if "since" in query else None
                    step = int(query["step"][0]) if "step" in query else 1
                    names = set(query["pipeline"]) if "pipeline" in query else None
                    self._json(200, observer.history.since(since, step, names))
                elif path == "/healthz":
                    healthy, body = observer.health()
                    self._json(200 if healthy else 503, body)
                elif path in ("/", "/index.html"):
                    self._send(200, _page(observer.status()), STATIC["index.html"])
                elif path.startswith("/static/") and path[len("/static/"):] in STATIC:
                    name = path[len("/static/"):]
                    self._send(200, _static(name), STATIC[name])
                else:
                    self._json(404, {"error": f"no such page: {path}"})
            except _GONE as exc:
                log.debug("http %s: the browser went away: %s", path, exc)
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
            except Exception as exc:  # one bad request never takes the endpoint down
                log.exception("http %s failed", path)
                self._json(500, {"error": f"{type(exc).__name__}: {exc}"})

        def do_POST(self) -> None:
            try:
                if self._api("POST"):
                    return
            except _GONE as exc:
                log.debug("http %s: the client went away: %s", self.path, exc)
                return
            self.close_connection = True  # its body is not read
            self._json(405, {"error": "the endpoint is read-only" + ("" if api is not None else
                                                                    " (http.api in setl.yaml turns on /api/v1)")})

        def _json(self, code: int, body: Any) -> None:
            self._send(code, json.dumps(body, allow_nan=False, default=str).encode(), "application/json")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler
