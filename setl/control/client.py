"""A client of a node's HTTP control API (`setl --node URL ...`): JSON in, JSON out, a refusal
as a `SetlError` with the node's one line. The token comes from ``$SETL_API_TOKEN`` or a file.

``--node zk://HOSTS/CHROOT`` finds the node in the cluster's registry (`registered_node`): the
node that holds the pipeline acted on, else the first live node (by name) that serves an API.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from setl.errors import SetlError, UsageError
from setl.ha.cluster import holder_api, read_nodes
from setl.ha.coordinator import Coordinator

PREFIX = "/api/v1"
#: ``--node`` names the cluster's ZooKeeper instead of one node's URL.
REGISTRY = "zk://"


def registered_node(spec: str, pipeline: str | None, *, connect_timeout: float = 10.0) -> str:
    """The base URL of a node's API, from the registry of the cluster at `spec` (``zk://HOSTS`` and
    optionally ``/CHROOT``, the nodes' ``ha.chroot``; default ``/setl``): the holder of `pipeline`
    when it registered an API, else the first live node by name that did. A UsageError naming the
    cluster when none did; a MetaStoreError when ZooKeeper cannot be reached in `connect_timeout`."""
    rest = spec[len(REGISTRY):]
    hosts, slash, chroot = rest.partition("/")
    if not hosts:
        raise UsageError(f"--node {spec!r}: give zk://HOST:PORT[,HOST:PORT...][/CHROOT]")
    coordinator = Coordinator(hosts, root="/" + chroot if slash and chroot else "/setl",
                              connect_timeout=connect_timeout, give_up_after=connect_timeout).start()
    try:
        if pipeline is not None:
            holder = holder_api(coordinator, pipeline)
            if holder is not None and holder.api:
                return holder.api
        for _, node in sorted(read_nodes(coordinator).items()):
            if node.api:
                return node.api
    finally:
        coordinator.stop()
    raise UsageError(f"--node {spec}: no live node of that cluster serves a control API (http.api in its setl.yaml)")


def read_token(token_file: Path | None) -> str:
    """The API token: the first line of `token_file`, else ``$SETL_API_TOKEN``; a UsageError without one."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip().splitlines()
        except OSError as exc:
            raise UsageError(f"--token-file {token_file}: cannot read it: {exc.strerror or exc}") from exc
        if token and token[0].strip():
            return token[0].strip()
        raise UsageError(f"--token-file {token_file} is empty")
    token_env = os.environ.get("SETL_API_TOKEN", "").strip()
    if not token_env:
        raise UsageError("--node needs a token: set $SETL_API_TOKEN or give --token-file FILE")
    return token_env


class ApiClient:
    """Calls `url`'s ``/api/v1`` with `token`; `cafile` checks an HTTPS node's certificate."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, cafile: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--node {url!r} is not an http:// or https:// URL")
        self.url = url.rstrip("/")
        self._token = token
        self.timeout = timeout
        self._context = ssl.create_default_context(cafile=cafile) if url.startswith("https://") else None

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> urllib.request.Request:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        return urllib.request.Request(self.url + PREFIX + path, data=data, method=method, headers=headers)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The node's JSON answer; a SetlError with its error line when it refuses (4xx, 5xx) or cannot be reached."""
        request = self._request(method, path, body if body is not None or method == "GET" else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise self._refused(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SetlError(f"cannot reach the node at {self.url}: {reason}", stage="api") from exc

    def events(self, op_id: str) -> Iterator[dict[str, Any]]:
        """An operation's progress events as the node streams them, until its ``end`` event."""
        request = self._request("GET", f"/operations/{op_id}/events", None)
        try:
            with urllib.request.urlopen(request, timeout=max(self.timeout, 60.0), context=self._context) as response:
                for line in response:
                    if line.strip():
                        yield json.loads(line)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise SetlError(f"lost the node at {self.url} while following operation {op_id}: "
                            f"{getattr(exc, 'reason', exc)}", stage="api") from exc

    def follow(self, started: dict[str, Any], what: str, on_message: Callable[[str], None]) -> dict[str, Any]:
        """Follow the operation the node `started` to its end, each progress message to `on_message`;
        its result once done, a SetlError with the node's one line when it failed (or the stream
        ended early)."""
        end: dict[str, Any] = {}
        for event in self.events(started["id"]):
            if event.get("event") == "progress" and "message" in event:
                on_message(str(event["message"]))
            elif event.get("event") == "end":
                end = event
        if end.get("state") != "done":
            raise SetlError(f"{what} failed on {self.url} (operation {started['id']}): "
                            f"{end.get('error') or 'the stream ended early'}", stage="api")
        return dict(end.get("result") or {})

    def _refused(self, exc: urllib.error.HTTPError) -> SetlError:
        try:
            message = json.loads(exc.read()).get("error") or exc.reason
        except (ValueError, AttributeError):
            message = exc.reason
        error = SetlError(f"the node at {self.url} answered {exc.code}: {message}", stage="api")
        if exc.code in (400, 401, 403, 404, 405, 409, 413, 422):
            error.exit_code = 2
        return error
