"""Forwarding a control-API request to the node that holds the pipeline (docs/api.md, "Which node
answers"): one hop, the caller's token and ``Idempotency-Key`` passed on, a bounded timeout, and
the ``X-Setl-Forwarded-From`` header that stops the holder from forwarding it again."""

from __future__ import annotations

import json
import logging
import ssl
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import attrs

from setl.ha.cluster import Holder, holder_api
from setl.meta.base import MetaStore

log = logging.getLogger("setl.api")

#: The header a forwarded request carries (the asking node's id): a request with it is answered
#: where it lands, never forwarded again, so two nodes that disagree on the holder cannot loop.
FORWARDED_FROM = "X-Setl-Forwarded-From"
#: The header of an answer that came from another node (its id).
FORWARDED_TO = "X-Setl-Forwarded-To"
#: The headers of the holder's answer that are passed back to the caller.
PASSED_BACK = ("Location", "Idempotent-Replayed", "Allow", "WWW-Authenticate", "Retry-After")


class Unreachable(Exception):
    """The holder could not be asked. `sent`: the request may have reached it (a timeout after
    sending), so it may have acted; otherwise nothing was sent."""

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.sent = sent


@attrs.frozen
class Answer:
    """The holder's answer: status, parsed JSON body and the headers passed back."""

    status: int
    body: Any
    headers: dict[str, str]


@attrs.frozen
class Forwarder:
    """Sends requests on to `url` (a node's API base URL, ``scheme://host:port``) as node `node_id`."""

    node_id: str
    timeout: float = 10.0
    context: ssl.SSLContext | None = attrs.field(default=None, repr=False)

    def _request(self, url: str, method: str, path: str, body: dict[str, Any] | None,
                 headers: dict[str, str]) -> urllib.request.Request:
        sent = {**headers, FORWARDED_FROM: self.node_id, "Accept": "application/json"}
        data = None
        if method == "POST":
            data = json.dumps(body or {}).encode()
            sent["Content-Type"] = "application/json"
        return urllib.request.Request(url.rstrip("/") + path, data=data, method=method, headers=sent)

    def call(self, url: str, method: str, path: str, body: dict[str, Any] | None,
             headers: dict[str, str]) -> Answer:
        """The holder's answer to `method` `path` (its JSON); Unreachable when it gives none."""
        request = self._request(url, method, path, body, headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context(url)) as response:
                return Answer(response.status, _json(response.read()), _passed(response.headers))
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, _json(exc.read()), _passed(exc.headers))
        except urllib.error.URLError as exc:  # refused, no route, bad certificate: nothing was sent
            raise Unreachable(str(getattr(exc, "reason", exc)), sent=False) from exc
        except (TimeoutError, OSError) as exc:  # sent, and no answer in time (or the connection cut)
            raise Unreachable(f"no answer in {self.timeout:g}s ({type(exc).__name__}: {exc})", sent=True) from exc

    def stream(self, url: str, path: str, headers: dict[str, str], idle: float) -> tuple[Answer, Iterator[bytes]]:
        """A GET whose answer is JSON lines (an operation's events), passed on line by line; `idle`
        bounds the wait for each line."""
        request = self._request(url, "GET", path, None, headers)
        try:
            response = urllib.request.urlopen(request, timeout=idle, context=self._context(url))
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, _json(exc.read()), _passed(exc.headers)), iter(())
        except (urllib.error.URLError, OSError) as exc:
            raise Unreachable(str(getattr(exc, "reason", exc)), sent=False) from exc

        def lines() -> Iterator[bytes]:
            with response:
                try:
                    yield from response
                except OSError as exc:  # the holder went away mid-stream: the caller sees the stream end
                    yield json.dumps({"event": "lost", "error": f"the holder's stream ended: {exc}"}).encode() + b"\n"

        return Answer(response.status, None, {"Content-Type": response.headers.get("Content-Type",
                                                                                   "application/x-ndjson")}), lines()

    def _context(self, url: str) -> ssl.SSLContext | None:
        if not url.startswith("https://"):
            return None
        return self.context if self.context is not None else ssl.create_default_context()


class Forwarding:
    """One node's side of forwarding: who holds a pipeline (`holder`, from the cluster's registry
    in ZooKeeper; None in single-node mode), the request sent on to the holder (`send`), and the
    operations started on another node through this one, whose polls and event streams go there
    too (`operation`, `events`). Every failure to reach the holder is an `Answer` of 503 that names
    it and its address, and says whether it may have acted."""

    def __init__(self, node_id: str, meta: MetaStore, *, timeout: float = 10.0,
                 context: ssl.SSLContext | None = None, tls: bool = False) -> None:
        """`tls`: this node serves https, so a token is never sent on to a plain-http holder."""
        self.node_id = node_id
        self.meta = meta
        self.tls = tls
        self.forwarder = Forwarder(node_id, timeout, context)
        #: operations started on another node through this one: id -> (node, its API's URL)
        self._remote: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()

    def holder(self, pipeline: str) -> Holder | None:
        """Who holds `pipeline` now (None: nobody, or a single node with no cluster)."""
        coordinator = getattr(self.meta, "coordinator", None)
        return holder_api(coordinator, pipeline) if coordinator is not None else None

    def elsewhere(self, pipeline: str) -> Holder | None:
        """The holder to send a request for `pipeline` on to: another registered node serving an
        API. None to answer here: nobody holds it, this node does, or its holder serves no API (then
        it acts on the request in the shared meta store, as on the CLI's)."""
        holder = self.holder(pipeline)
        if holder is None or holder.node == self.node_id or holder.api is None:
            return None
        return holder

    def send(self, holder: Holder, pipeline: str, path: str, body: dict[str, Any],
             passed: dict[str, str]) -> Answer:
        """POST `path` on `holder`'s node; its answer, its refusals' lines prefixed with its name."""
        assert holder.api is not None
        where = f"pipeline {pipeline} is held by node {holder.node} ({holder.api})"
        if self.tls and not holder.api.startswith("https://"):
            return _unavailable(f"{where}, which serves plain http: the token is not sent there in clear; serve "
                                f"its API over https (http.tls), or ask it directly. Nothing was changed")
        try:
            answer = self.forwarder.call(holder.api, "POST", path, body, passed)
        except Unreachable as exc:
            log.warning("api: %s: cannot forward %s: %s", where, path, exc)
            if exc.sent:
                return _unavailable(f"{where}: {exc}; it may have acted on it: look at the pipeline, and retry "
                                    f"with the same Idempotency-Key")
            return _unavailable(f"{where}, which cannot be reached: {exc}; nothing was changed. Retry when it "
                                f"answers (or once another node holds the pipeline)")
        body_back = answer.body
        if answer.status >= 400 and isinstance(body_back, dict) and "error" in body_back:
            body_back = {**body_back, "error": f"node {holder.node} (which holds pipeline {pipeline}) answered: "
                                              f"{body_back['error']}"}
        if answer.status == 202 and isinstance(body_back, dict) and isinstance(body_back.get("id"), str):
            with self._lock:  # its id is polled through this node too
                self._remote[body_back["id"]] = (holder.node, holder.api)
                while len(self._remote) > 1000:
                    self._remote.popitem(last=False)
        return Answer(answer.status, body_back, {**answer.headers, FORWARDED_TO: holder.node})

    def remote(self, op_id: str) -> tuple[str, str] | None:
        """The node (and its API's URL) of an operation started there through this node."""
        with self._lock:
            return self._remote.get(op_id)

    def operation(self, op_id: str, path: str, passed: dict[str, str]) -> Answer | None:
        """GET `path` of operation `op_id` from the node it runs on; None when it was not started
        through this node."""
        remote = self.remote(op_id)
        if remote is None:
            return None
        try:
            answer = self.forwarder.call(remote[1], "GET", path, None, passed)
        except Unreachable as exc:
            return _unavailable(f"operation {op_id} runs on node {remote[0]} ({remote[1]}), which cannot be "
                                f"reached: {exc}")
        return Answer(answer.status, answer.body, {**answer.headers, FORWARDED_TO: remote[0]})

    def events(self, op_id: str, path: str, passed: dict[str, str]) -> tuple[Answer, Iterator[bytes]] | None:
        """The event stream of operation `op_id` from the node it runs on (None as `operation`)."""
        remote = self.remote(op_id)
        if remote is None:
            return None
        try:
            answer, lines = self.forwarder.stream(remote[1], path, passed, idle=60.0)
        except Unreachable as exc:
            return _unavailable(f"operation {op_id} runs on node {remote[0]} ({remote[1]}), which cannot be "
                                f"reached: {exc}"), iter(())
        return attrs.evolve(answer, headers={**answer.headers, FORWARDED_TO: remote[0]}), lines


def trust(cafile: str | None) -> ssl.SSLContext:
    """The TLS context a forward checks an https holder with: the system's CAs, and `cafile` (this
    node's own certificate chain, `http.tls.cert`: a cluster's nodes usually share their CA)."""
    context = ssl.create_default_context()
    if cafile is not None:
        try:
            context.load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            log.warning("api: cannot trust %s for forwards: %s", cafile, exc)
    return context


def _unavailable(message: str) -> Answer:
    return Answer(503, {"error": message, "status": 503}, {"Retry-After": "2"})


def _passed(headers: Any) -> dict[str, str]:
    return {key: headers[key] for key in PASSED_BACK if headers is not None and headers.get(key) is not None}


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return {"error": raw[:300].decode("utf-8", "replace")}
