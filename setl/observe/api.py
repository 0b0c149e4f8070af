"""The node's HTTP control API, ``/api/v1`` (docs/http-api.md): the actions of the CLI
(`setl.control.actions`, the same functions), behind bearer tokens with two roles, every
state-changing request written to an audit log.

`ROUTES` is the one route table: the dispatcher, the role checks and the OpenAPI document
(`openapi`, served at ``/api/v1/openapi.json``) are all read from it.

Any node answers for any pipeline. Under HA, a state-changing request for a pipeline that another
live node holds is forwarded to that node (one hop, `setl.control.forward`; docs/api.md says why
not a redirect), and its answer passed back; the holder that cannot be reached is a 503 naming it,
and nothing is changed here. A pipeline nobody holds is acted on through the shared meta store, as
the CLI does from any host. A long operation (verify, snapshot, repair, replay, reload, switch,
drain, move) runs on the node that acts on it, and its id is polled through either node. A stop is
an operation too: it ends once no process runs the pipeline.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from setl.config import ApiConfig, NodeSettings, load_pipeline
from setl.connectors import for_node, registry
from setl.control import actions
from setl.control.forward import FORWARDED_FROM, FORWARDED_TO, Forwarding, trust
from setl.control.operations import OperationRunning, Operations
from setl.errors import ConfigError, SetlError, UsageError
from setl.meta.base import MetaStore

log = logging.getLogger("setl.api")

PREFIX = "/api/v1"
ROLES = ("viewer", "operator")


@attrs.frozen
class Token:
    """A named bearer token and its role (the secret never reaches a log or the audit)."""

    name: str
    role: str
    secret: str = attrs.field(repr=False)


def parse_tokens(text: str, where: str) -> list[Token]:
    """Lines ``NAME ROLE TOKEN`` (``#`` comments, blank lines and ``;`` separators allowed)."""
    tokens = []
    for number, line in enumerate(re.split(r"[\n;]", text), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or parts[1] not in ROLES:
            raise ConfigError(f"{where}: entry {number} is not NAME ROLE TOKEN with ROLE viewer or operator")
        if len(parts[2]) < 16:
            raise ConfigError(f"{where}: the token of {parts[0]} is shorter than 16 characters")
        tokens.append(Token(parts[0], parts[1], parts[2]))
    return tokens


def load_tokens(config: ApiConfig, settings: NodeSettings) -> list[Token]:
    """The tokens of `tokens_file` and of `$tokens_env`; a ConfigError when there are none (an API
    nobody can call is a mistake, not a safe default)."""
    tokens = []
    if config.tokens_file:
        path = settings.resolve(config.tokens_file)
        try:
            tokens += parse_tokens(path.read_text(encoding="utf-8"), f"http.api.tokens_file {path}")
        except OSError as exc:
            raise ConfigError(f"http.api.tokens_file: cannot read {path}: {exc.strerror or exc}") from exc
    if os.environ.get(config.tokens_env):
        tokens += parse_tokens(os.environ[config.tokens_env], f"${config.tokens_env}")
    if not tokens:
        raise ConfigError(f"http.api is set but no token is given (http.api.tokens_file, or ${config.tokens_env}): "
                          "add lines NAME ROLE TOKEN")
    names = [t.name for t in tokens]
    if len(set(names)) != len(names):
        raise ConfigError("http.api: two tokens have the same name (the audit log names tokens by it)")
    return tokens


class ApiError(Exception):
    """A request refused: its HTTP status and one line saying why (and what to do)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@attrs.frozen
class Response:
    """What the endpoint sends: JSON `body` (or `encoded`, the same already as JSON bytes), or
    `stream` (JSON lines, written as they come)."""

    status: int
    body: Any = None
    headers: dict[str, str] = attrs.field(factory=dict)
    stream: Iterator[bytes] | None = None
    encoded: bytes | None = attrs.field(default=None, repr=False)


@attrs.frozen
class Request:
    """One parsed request to a route: the path's parameters, the JSON body (an object), who asks."""

    params: dict[str, str]
    body: dict[str, Any]
    query: dict[str, list[str]]
    who: Token | None
    path: str = ""
    #: what a forward passes on: Authorization and Idempotency-Key (never logged)
    passed: dict[str, str] = attrs.field(factory=dict, repr=False)
    forwarded_from: str | None = None  # the node that forwarded this request here


@attrs.frozen
class Route:
    """``METHOD /api/v1/...{param}``, the role it needs (None: anyone), what it does, the body keys
    it takes, and whether it starts an operation (202 with the operation)."""

    method: str
    path: str
    role: str | None
    summary: str
    handler: str
    body: tuple[str, ...] = ()
    operation: bool = False

    @property
    def pattern(self) -> re.Pattern[str]:
        return _pattern(self.path)


@functools.cache
def _pattern(path: str) -> re.Pattern[str]:
    """A route's path as a regex, built once (every request is matched against the routes)."""
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", re.escape(path).replace(r"\{", "{")
                                   .replace(r"\}", "}")) + "$")


P = PREFIX + "/pipelines/{name}"

#: Every route of the API.
ROUTES: tuple[Route, ...] = (
    Route("GET", PREFIX + "/openapi.json", None, "this document", "openapi"),
    Route("GET", PREFIX + "/whoami", "viewer", "the token's name and role (the page shows actions to operators)",
          "whoami"),
    Route("GET", PREFIX + "/pipelines", "viewer", "every pipeline with its status row", "list_pipelines"),
    Route("GET", P, "viewer", "one pipeline: its status row and position", "describe"),
    Route("POST", P + "/pause", "operator", "pause (a running node stops it gracefully)", "pause"),
    Route("POST", P + "/resume", "operator", "resume a paused (or stopped) pipeline", "resume"),
    Route("POST", P + "/stop", "operator", "pause, and end once no process runs the pipeline (its batches in "
          "flight acked or rolled back); it stays stopped until resumed", "stop", body=("timeout_s",),
          operation=True),
    Route("GET", P + "/position", "viewer", "the acked position and recent acks", "position_show",),
    Route("POST", P + "/position/reset", "operator", "restart a stopped pipeline from another position "
          "(`to` LOG:OFFSET, or `start` true; `force` even if it looks running)", "position_reset",
          body=("to", "start", "force")),
    Route("POST", P + "/snapshot", "operator", "copy tables again, online; the operation follows the copies",
          "snapshot", body=("tables", "timeout_s"), operation=True),
    Route("POST", P + "/verify", "operator", "compare source and target tables; the operation's result is the "
          "report", "verify", body=("tables", "attempts", "chunk_rows", "wait_timeout_s", "max_lag_s"),
          operation=True),
    Route("GET", P + "/verify", "viewer", "the last verify report of the pipeline", "verify_result"),
    Route("POST", P + "/repair", "operator", "copy the keys a verify report finds different again, through the "
          "pipeline, then verify them (`report`: a verify report to repair from; default: verify first)", "repair",
          body=("tables", "report", "timeout_s", "wait_timeout_s"), operation=True),
    Route("POST", P + "/reload", "operator", "the running node re-reads the pipeline's file", "reload",
          body=("timeout_s",), operation=True),
    Route("POST", P + "/switch", "operator", "hand the mainstem to a standby (HA)", "switch",
          body=("to", "timeout_s"), operation=True),
    Route("GET", P + "/quarantine", "viewer", "the pipeline's quarantined target tables, as its target keeps "
          "them (docs/quarantine.md)", "quarantined"),
    Route("POST", P + "/quarantine/{table}/replay", "operator", "replay a quarantined target table's kept changes "
          "in order, then let it follow the stream again (`setl resume --table`)", "replay",
          body=("chunk_rows",), operation=True),
    Route("GET", PREFIX + "/cluster", "viewer", "the cluster's nodes and assignments (HA)", "cluster"),
    Route("POST", PREFIX + "/cluster/nodes/{node}/drain", "operator", "move a node's pipelines away (`undo`: "
          "let it run pipelines again)", "drain", body=("undo", "timeout_s"), operation=True),
    Route("POST", PREFIX + "/cluster/pipelines/{name}/move", "operator", "move a pipeline to a node", "move",
          body=("to", "timeout_s"), operation=True),
    Route("GET", PREFIX + "/operations", "viewer", "the node's operations, newest last", "operations"),
    Route("GET", PREFIX + "/operations/{id}", "viewer", "one operation: state, progress, result", "operation"),
    Route("GET", PREFIX + "/operations/{id}/events", "viewer", "the operation's progress as JSON lines until it "
          "ends (application/x-ndjson)", "operation_events"),
)


class Audit:
    """The audit log: one JSON object a line (time, token name, role, method, path, body, status,
    result), appended and flushed per request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, default=str, sort_keys=True) + "\n"
        with self._lock:
            try:
                with self.path.open("a", encoding="utf-8") as out:
                    out.write(line)
            except OSError as exc:
                log.error("cannot write the API audit log %s: %s", self.path, exc)


class Replies:
    """The answers kept for ``Idempotency-Key`` (the last `keep`, in memory): the first answer to
    (token, key) is given again to a replay, which changes nothing; the same key on another request
    is refused (422)."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self._replies: OrderedDict[tuple[str, str], tuple[str, Response]] = OrderedDict()
        self._lock = threading.Lock()

    def answer(self, key: str | None, who: Token | None, method: str, path: str, body: dict[str, Any],
               call: Callable[[], Response]) -> Response:
        """`call`'s answer, or with `key` the one kept for it."""
        if key is None:
            return call()
        if not 1 <= len(key) <= 200:
            raise ApiError(400, "Idempotency-Key must have 1 to 200 characters")
        fingerprint = hashlib.sha256(json.dumps([method, path, body], sort_keys=True).encode()).hexdigest()
        slot = (who.name if who else "", key)
        with self._lock:  # held across the call: a concurrent replay waits for the first answer
            kept = self._replies.get(slot)
            if kept is not None:
                if kept[0] != fingerprint:
                    raise ApiError(422, f"Idempotency-Key {key!r} was used for another request; use a new key")
                first = kept[1]
                return attrs.evolve(first, headers={**first.headers, "Idempotent-Replayed": "true"})
            response = call()
            if response.status < 500:
                self._replies[slot] = (fingerprint, response)
                while len(self._replies) > self.keep:
                    self._replies.popitem(last=False)
            return response


class PolledStatus:
    """The node's status rows as the API's clients poll them: read at most once per `TTL` seconds
    (and again at once after an action), and the listing of `GET /api/v1/pipelines` encoded once
    per reading, for every poller."""

    #: 50 scripts polling twice a second cost one reading, not 100, of the CPU the pipelines run on
    #: (tools/bench/bench_api.py)
    TTL = 0.5

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status
        self._read: tuple[float, dict[str, Any]] | None = None
        self._listed: tuple[dict[str, Any], bytes] | None = None
        self._lock = threading.Lock()

    def now(self) -> dict[str, Any]:
        """The status rows, read at most `TTL` seconds ago."""
        with self._lock:
            now = time.monotonic()
            if self._read is None or now - self._read[0] >= self.TTL:
                self._read = (now, self.status())
            return self._read[1]

    def changed(self) -> None:
        with self._lock:
            self._read = None

    def listing(self) -> bytes:
        """``{"node", "time", "pipelines"}`` of the current reading, as JSON."""
        status = self.now()
        listed = self._listed
        if listed is None or listed[0] is not status:
            body = {"node": status.get("node"), "time": status.get("time"), "pipelines": status["pipelines"]}
            listed = self._listed = (status, json.dumps(body, allow_nan=False, default=str).encode())
        return listed[1]


class Api:
    """The control API of one node: `handle` answers one request under `PREFIX`. `meta` is the
    node's open meta store; `status` gives the status rows (`NodeObserver.status`)."""

    def __init__(self, settings: NodeSettings, meta: MetaStore, status: Callable[[], dict[str, Any]],
                 cluster: Callable[[], dict[str, Any] | None] | None = None,
                 operations: Operations | None = None, tokens: list[Token] | None = None) -> None:
        assert settings.http.api is not None
        self.settings = settings
        self.config: ApiConfig = settings.http.api
        self.conf = Path(settings.conf_dir)
        self.meta = meta
        self.status = status
        self.cluster_view = cluster
        self.operations = operations or Operations()
        self.tokens = tokens if tokens is not None else load_tokens(self.config, settings)
        self.audit = Audit(settings.resolve(self.config.audit_log))
        self.replies = Replies()
        self.polled = PolledStatus(status)
        tls = settings.http.tls
        self.forwarding = Forwarding(settings.node.id, meta, timeout=self.FORWARD_TIMEOUT, tls=tls is not None,
                                     context=trust(str(settings.resolve(tls.cert)) if tls is not None else None))

    #: how long a request forwarded to the holder may take (connect and answer) before a 503
    FORWARD_TIMEOUT = 10.0

    # --- the request ------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: Any,
               read_body: Callable[[int], bytes], client: str) -> Response:
        """Answer one request; every POST is audited, refused or not."""
        who: Token | None = None
        body: Any = None
        try:
            route, params = self._route(method, path)
            if route.role is not None:
                who = self._authenticate(headers)
                if route.role == "operator" and who.role != "operator":
                    raise ApiError(403, f"token {who.name} has role {who.role}: {method} {path} needs operator")
            body = self._body(headers, read_body) if method == "POST" else {}
            unknown = sorted(set(body) - set(route.body))
            if unknown:
                raise ApiError(400, f"unknown key(s) in the body: {', '.join(unknown)} (known: "
                                    f"{', '.join(route.body) or 'none'})")
            key = headers.get("Idempotency-Key") if method == "POST" else None
            passed = {}  # what a forward to another node passes on: only a POST, or an operation's polls, go there
            if method == "POST" or route.handler.startswith("operation"):
                passed["Authorization"] = headers.get("Authorization") or ""
            if key is not None:
                passed["Idempotency-Key"] = key
            request = Request(params, body, query, who, path + _query_string(query), passed,
                              (headers.get(FORWARDED_FROM) or None) if method == "POST" else None)
            response = self.replies.answer(key, who, method, path, body, lambda: self._call(route, request))
        except ApiError as exc:
            response = Response(exc.status, {"error": str(exc), "status": exc.status}, exc.headers)
        except actions.StateConflict as exc:
            response = Response(409, {"error": str(exc), "status": 409})
        except (UsageError, ConfigError) as exc:  # the request, or the pipeline's file, is wrong
            response = Response(400, {"error": str(exc), "status": 400})
        except SetlError as exc:
            response = Response(500, {"error": str(exc), "status": 500})
        except Exception as exc:  # a bug: one line to the client, the traceback in the node's log
            log.exception("api %s %s failed", method, path)
            response = Response(500, {"error": f"{type(exc).__name__}: {exc}", "status": 500})
        if method == "POST":
            entry = {"time": round(time.time(), 3), "token": who.name if who else None,
                     "role": who.role if who else None, "client": client, "method": method, "path": path,
                     "body": body if isinstance(body, dict) else None, "status": response.status,
                     "replayed": response.headers.get("Idempotent-Replayed") == "true",
                     "result": _summary(response)}
            if headers.get(FORWARDED_FROM):
                entry["forwarded_from"] = str(headers.get(FORWARDED_FROM))[:200]
            if response.headers.get(FORWARDED_TO):
                entry["forwarded_to"] = response.headers[FORWARDED_TO]
            self.audit.write(entry)
        return response

    def _route(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for route in ROUTES:
            found = route.pattern.match(path)
            if found is not None:
                if route.method == method:
                    return route, found.groupdict()
                allowed.append(route.method)
        if allowed:
            raise ApiError(405, f"{method} {path}: allowed {', '.join(allowed)}", {"Allow": ", ".join(allowed)})
        raise ApiError(404, f"no such API route: {method} {path} (see {PREFIX}/openapi.json)")

    def _authenticate(self, headers: Any) -> Token:
        given = headers.get("Authorization") or ""
        scheme, _, secret = given.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiError(401, "no token: send Authorization: Bearer TOKEN", {"WWW-Authenticate": "Bearer"})
        secret_bytes = secret.strip().encode()
        found = None
        for token in self.tokens:  # every token is compared, in constant time, whichever matches
            if hmac.compare_digest(secret_bytes, token.secret.encode()):
                found = token
        if found is None:
            raise ApiError(401, "the token is not known to this node",
                           {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return found

    def _body(self, headers: Any, read_body: Callable[[int], bytes]) -> dict[str, Any]:
        try:
            length = int(headers.get("Content-Length") or 0)
        except ValueError:
            raise ApiError(400, "Content-Length is not a number") from None
        if length > self.config.max_body_bytes:
            raise ApiError(413, f"the body has {length} bytes; at most {self.config.max_body_bytes} are taken")
        if length < 0:
            raise ApiError(400, "Content-Length is negative")
        raw = read_body(length) if length else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    def _call(self, route: Route, request: Request) -> Response:
        # a POST on one pipeline another node holds is its holder's to answer (a forwarded one is answered here)
        holder = None
        if route.method == "POST" and route.path.startswith(P + "/") and request.forwarded_from is None:
            holder = self.forwarding.elsewhere(request.params["name"])
        if holder is not None:
            answer = self.forwarding.send(holder, request.params["name"], request.path, request.body, request.passed)
            result: Any = Response(answer.status, answer.body, answer.headers)
        else:
            result = getattr(self, "_" + route.handler)(request)
        if route.method == "POST":
            self.polled.changed()  # the next reading shows what the action changed
        if isinstance(result, Response):
            return result
        return Response(200, result)

    def _pipeline(self, request: Request) -> str:
        name = request.params["name"]
        actions.known_pipeline(self.conf, self.meta, name)
        return name

    def _start(self, kind: str, pipeline: str | None, request: Request,
               work: Callable[[Callable[[dict[str, Any]], None]], dict[str, Any]]) -> Response:
        try:
            op = self.operations.start(kind, pipeline, work, who=request.who.name if request.who else None)
        except OperationRunning as exc:
            raise ApiError(409, str(exc)) from exc
        return Response(202, op.to_dict(events=False), {"Location": f"{PREFIX}/operations/{op.id}"})

    # --- the routes -------------------------------------------------------------------------

    def _openapi(self, request: Request) -> dict[str, Any]:
        return openapi()

    def _whoami(self, request: Request) -> dict[str, Any]:
        assert request.who is not None  # the route needs a token
        return {"token": request.who.name, "role": request.who.role}

    def _list_pipelines(self, request: Request) -> Response:
        return Response(200, None, encoded=self.polled.listing())

    def _describe(self, request: Request) -> dict[str, Any]:
        name = self._pipeline(request)
        rows = [row for row in self.polled.now()["pipelines"] if row["pipeline"] == name]
        if not rows:
            from setl.status import status_rows

            rows = status_rows(self.meta, [name])
        holder = self.forwarding.holder(name)
        held = {"node": holder.node, "api": holder.api} if holder is not None else None
        return {**rows[0], "acked": actions.position_show(self.meta, name, 5), "held_by": held}

    def _pause(self, request: Request) -> dict[str, Any]:
        return actions.pause(self.meta, self._pipeline(request)).to_dict()

    def _resume(self, request: Request) -> dict[str, Any]:
        return actions.resume(self.meta, self._pipeline(request)).to_dict()

    def _stop(self, request: Request) -> Response:
        name = self._pipeline(request)
        timeout = _number(request.body, "timeout_s", 60.0)

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            return actions.stop(self.meta, name, timeout, progress).to_dict()

        return self._start("stop", name, request, work)

    def _position_show(self, request: Request) -> dict[str, Any]:
        history = _int(request.query.get("history", ["5"])[0], "history", 0, 1000)
        return actions.position_show(self.meta, self._pipeline(request), history)

    def _position_reset(self, request: Request) -> dict[str, Any]:
        body = request.body
        to = body.get("to")
        if to is not None and not isinstance(to, str):
            raise ApiError(400, "to must be LOG:OFFSET, a string")
        return actions.position_reset(self.meta, self._pipeline(request), to=to, start=_bool(body, "start"),
                                      force=_bool(body, "force")).to_dict()

    def _snapshot(self, request: Request) -> Response:
        name = self._pipeline(request)
        texts = _strings(request.body, "tables")
        timeout = _number(request.body, "timeout_s", 3600.0)
        config, tables = actions.snapshot_config(self.conf, name, texts)
        requested = actions.request_snapshot(self.meta, config, tables)

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            progress({"message": requested.lines[0]})
            return {**requested.to_dict(), **actions.wait_snapshot(self.meta, name, tables, timeout, progress)}

        return self._start("snapshot", name, request, work)

    def _verify(self, request: Request) -> Response:
        from setl.verify.run import verify_pipeline
        from setl.verify.schedule import failure, summary

        name = self._pipeline(request)
        body = request.body
        tables = actions.parse_tables(_strings(body, "tables", required=False), "tables")
        attempts = int(_number(body, "attempts", 3, minimum=1))
        chunk_rows = int(_number(body, "chunk_rows", 10_000, minimum=1))
        wait_timeout = _number(body, "wait_timeout_s", 60.0, minimum=0.001)
        max_lag = _number(body, "max_lag_s", 30.0)
        config = load_pipeline(self.conf, name, registry())

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            def chunked(table: str, rows: int, estimate: int, done: bool) -> None:
                progress({"table": table, "rows": rows, "estimate": estimate, "done": done})

            started, began = time.time(), time.monotonic()
            try:
                report = verify_pipeline(self.settings, config, self.meta, tables, attempts=attempts,
                                         chunk_rows=chunk_rows, wait_timeout=wait_timeout, progress=chunked,
                                         max_lag=max_lag)
            except SetlError as exc:  # the status page and `setl status` show the check that reached no verdict
                self.meta.save_verify_result(name, failure(exc, started, time.monotonic() - began))
                raise
            self.meta.save_verify_result(name, summary(report, started))  # as a scheduled check's
            return {**report.to_dict(), "lines": report.lines()}

        return self._start("verify", name, request, work)

    def _verify_result(self, request: Request) -> dict[str, Any]:
        name = self._pipeline(request)
        return {"pipeline": name, "verify": self.meta.verify_result(name)}

    def _repair(self, request: Request) -> Response:
        from setl.control import repair
        from setl.verify.repair import check_report

        name = self._pipeline(request)
        body = request.body
        only = actions.parse_tables(_strings(body, "tables", required=False), "tables")
        timeout = _number(body, "timeout_s", 300.0, minimum=0.001)
        wait_timeout = _number(body, "wait_timeout_s", 60.0, minimum=0.001)
        report = check_report(body["report"], name, "report") if "report" in body else None
        config = load_pipeline(self.conf, name, for_node(self.settings))
        repair.check(config)  # refused before an operation starts

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            return repair.repair(self.settings, config, self.meta, only, report=report, timeout=timeout,
                                 wait_timeout=wait_timeout, progress=progress).to_dict()

        return self._start("repair", name, request, work)

    def _reload(self, request: Request) -> Response:
        name = self._pipeline(request)
        timeout = _number(request.body, "timeout_s", 120.0, minimum=0.001)
        config = load_pipeline(self.conf, name, for_node(self.settings))  # a broken file stops here

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            return actions.reload(self.meta, config, timeout, progress).to_dict()

        return self._start("reload", name, request, work)

    def _switch(self, request: Request) -> Response:
        name = self._pipeline(request)
        to = request.body.get("to")
        timeout = _number(request.body, "timeout_s", 60.0)
        if to is not None and not isinstance(to, str):
            raise ApiError(400, "to must be a node id, a string")

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            return actions.switch(self.meta, name, to, timeout, progress).to_dict()

        actions.zookeeper_meta(self.meta, "switch")
        return self._start("switch", name, request, work)

    def _quarantined(self, request: Request) -> dict[str, Any]:
        name = self._pipeline(request)
        config = load_pipeline(self.conf, name, for_node(self.settings))
        return {"pipeline": name, "quarantined": actions.quarantined(self.settings, config)}

    def _replay(self, request: Request) -> Response:
        name = self._pipeline(request)
        table = request.params["table"]
        chunk = int(_number(request.body, "chunk_rows", 1000, minimum=1))
        config = load_pipeline(self.conf, name, for_node(self.settings))
        tables = [q["table"] for q in actions.quarantined(self.settings, config)]
        if table not in tables:  # refused before an operation starts: nothing to replay
            raise UsageError(f"pipeline {name}: target table {table} is not quarantined (quarantined: "
                             f"{', '.join(tables) or 'none'})", pipeline=name, table=table)

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            return actions.replay_table(self.settings, config, table, chunk, progress).to_dict()

        return self._start("replay", name, request, work)

    def _cluster(self, request: Request) -> dict[str, Any]:
        view = self.cluster_view() if self.cluster_view is not None else None
        if view is None:
            raise ApiError(404, "this node is not in a cluster (meta.store: zookeeper makes one)")
        return view

    def _drain(self, request: Request) -> Response:
        node = request.params["node"]
        undo = _bool(request.body, "undo")
        timeout = _number(request.body, "timeout_s", 120.0)
        coordinator = actions.zookeeper_meta(self.meta, "cluster drain").coordinator
        actions.check_drain(coordinator, self.meta, node, undo)

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            return actions.drain(coordinator, self.meta, node, undo, timeout, progress).to_dict()

        return self._start("drain", node, request, work)

    def _move(self, request: Request) -> Response:
        name = request.params["name"]
        to = request.body.get("to")
        if not isinstance(to, str) or not to:
            raise ApiError(400, "to: the node to move the pipeline to is required")
        timeout = _number(request.body, "timeout_s", 120.0)
        coordinator = actions.zookeeper_meta(self.meta, "cluster move").coordinator
        actions.check_move(coordinator, self.meta, name, to)

        def work(progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
            return actions.move(coordinator, self.meta, name, to, timeout, progress).to_dict()

        return self._start("move", name, request, work)

    def _operations(self, request: Request) -> dict[str, Any]:
        return {"operations": [op.to_dict(events=False) for op in self.operations.list()]}

    def _operation(self, request: Request) -> dict[str, Any] | Response:
        op = self.operations.get(request.params["id"])
        answer = self.forwarding.operation(request.params["id"], request.path, request.passed) if op is None else None
        if answer is not None:  # started on its holder through this node
            return Response(answer.status, answer.body, answer.headers)
        if op is None:
            raise ApiError(404, f"no operation {request.params['id']} on this node (operations live on the node "
                                "that started them, until it restarts)")
        return op.to_dict()

    def _operation_events(self, request: Request) -> Response:
        op_id = request.params["id"]
        found = self.forwarding.events(op_id, request.path, request.passed) if self.operations.get(op_id) is None \
            else None
        if found is not None:  # started on its holder through this node
            answer, stream = found
            return Response(answer.status, answer.body, answer.headers, stream=stream if answer.status == 200 else None)
        if self.operations.get(op_id) is None:
            raise ApiError(404, f"no operation {op_id} on this node")

        def lines() -> Iterator[bytes]:
            seen = 0
            while True:
                op = self.operations.wait_change(op_id, seen, 15.0)
                if op is None:
                    return
                before = seen
                for event in op.events[seen:]:
                    yield json.dumps({"event": "progress", **event}, default=str).encode() + b"\n"
                seen = len(op.events)
                if not op.running:
                    yield json.dumps({"event": "end", **op.to_dict(events=False)}, default=str).encode() + b"\n"
                    return
                if seen == before:
                    yield b'{"event": "alive"}\n'  # a quiet operation: the client knows the node is there

        return Response(200, None, {"Content-Type": "application/x-ndjson"}, stream=lines())


def _query_string(query: dict[str, list[str]]) -> str:
    from urllib.parse import urlencode

    return "?" + urlencode(query, doseq=True) if query else ""


def _summary(response: Response) -> str:
    body = response.body if isinstance(response.body, dict) else {}
    return str(body.get("error") or body.get("message") or body.get("id") or response.status)[:500]


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false")
    return value


def _number(body: dict[str, Any], key: str, default: float, minimum: float = 0.0) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ApiError(400, f"{key} must be a number of at least {minimum:g}")
    return float(value)


def _int(text: str, key: str, low: int, high: int) -> int:
    if not text.isdigit() or not low <= int(text) <= high:
        raise ApiError(400, f"{key} must be a whole number from {low} to {high}")
    return int(text)


def _strings(body: dict[str, Any], key: str, required: bool = True) -> list[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (required and not value):
        raise ApiError(400, f"{key} must be a list of SCHEMA.TABLE strings" + (", at least one" if required else ""))
    return value


def openapi() -> dict[str, Any]:
    """The OpenAPI 3 document of `ROUTES`: every route with its method, role (``x-role``),
    parameters and body keys."""
    paths: dict[str, Any] = {}
    error = {"description": "refused: one line saying why",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for route in ROUTES:
        item: dict[str, Any] = {
            "summary": route.summary, "operationId": route.handler, "x-role": route.role,
            "security": [{"bearer": []}] if route.role else [],
            "parameters": [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                           for name in re.findall(r"\{(\w+)\}", route.path)],
            "responses": {"202" if route.operation else "200": {
                "description": "the operation started (poll its Location)" if route.operation else "ok",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Operation"}
                                                  if route.operation else {"type": "object"}}}},
                "400": error, "401": error, "403": error, "404": error},
        }
        if route.method == "POST":
            item["requestBody"] = {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False,
                "properties": {key: {} for key in route.body}}}}}
            item["parameters"].append({"name": "Idempotency-Key", "in": "header", "required": False,
                                       "schema": {"type": "string"}})
            item["responses"].update({"409": error, "413": error, "422": error})
            if route.path.startswith(P + "/"):  # forwarded to the pipeline's holder, which may not answer
                item["responses"]["503"] = error
        paths.setdefault(route.path, {})[route.method.lower()] = item
    return {
        "openapi": "3.0.3",
        "info": {"title": "setl node control API", "version": "1"},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {
                    "error": {"type": "string"}, "status": {"type": "integer"}}},
                "Operation": {"type": "object", "required": ["id", "kind", "state"], "properties": {
                    "id": {"type": "string"}, "kind": {"type": "string"}, "pipeline": {"type": "string"},
                    "state": {"type": "string", "enum": ["running", "done", "failed"]},
                    "progress": {"type": "object"}, "result": {"type": "object"}, "error": {"type": "string"}}},
            },
        },
    }
