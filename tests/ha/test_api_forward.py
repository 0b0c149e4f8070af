"""The control API on two nodes of one ZooKeeper cluster: a state-changing request for a pipeline
the other node holds is forwarded to it (audited on both, the same Idempotency-Key), its
operations are polled and streamed through the node that was asked, an unreachable holder is a 503
that changes nothing, and a forwarded request is never forwarded again."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from setl.config import load_node
from setl.control.forward import Forwarder
from setl.ha import Elections
from setl.meta.base import Status
from setl.meta.zookeeper import ZooKeeperMetaStore
from setl.observe import NodeObserver
from setl.observe.api import PREFIX, Api
from setl.observe.server import StatusServer
from setl.testing.servers import free_port
from tests.ha.zk import hold, stores, unique_root

pytestmark = pytest.mark.timeout(60)

TOKEN = "fwd-operator-" + "f" * 24
VIEWER = "fwd-viewer-" + "v" * 24


@attrs.define
class ApiNode:
    """One node's API on its own ZooKeeper session: its HTTP server, its audit log, registered in
    the cluster with its API's URL."""

    name: str
    store: ZooKeeperMetaStore
    server: StatusServer
    audit: Path

    @property
    def port(self) -> int:
        return self.server.address[1]

    def call(self, method: str, path: str, body: Any = None, *, token: str = TOKEN,
             headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
        """One request; the status, the JSON answer and the headers."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            sent = {"Authorization": f"Bearer {token}", **(headers or {})}
            data = json.dumps({} if body is None else body).encode() if method == "POST" else None
            if data is not None:
                sent["Content-Type"] = "application/json"
            conn.request(method, PREFIX + path, body=data, headers=sent)
            response = conn.getresponse()
            text = response.read()
            found = json.loads(text) if (response.getheader("Content-Type") or "").startswith("application/json") \
                else text
            return response.status, found, dict(response.getheaders())
        finally:
            conn.close()

    def audited(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines()] if self.audit.exists() else []


def conf_dir(root: Path, name: str, hosts: str, chroot: str, pipelines: tuple[str, ...]) -> Path:
    conf = root / name
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({
        "node": {"id": name}, "meta": {"store": "zookeeper"},
        "ha": {"zookeeper": hosts, "chroot": chroot},
        "http": {"listen": "127.0.0.1:0", "api": {"tokens_file": "tokens", "audit_log": "audit.jsonl"}}}))
    (conf / "tokens").write_text(f"ops operator {TOKEN}\nwatch viewer {VIEWER}\n")
    for pipeline in pipelines:  # the API knows a pipeline by its file; the file is not read for these actions
        (conf / "pipelines" / f"{pipeline}.yaml").write_text("{}\n")
    return conf


@pytest.fixture
def cluster(tmp_path: Path, zookeeper_server: Any) -> Iterator[dict[str, Any]]:
    """Nodes A and B serving the API, registered with their URLs; A holds pipeline ``pa``; ``gone``
    is held by node C, registered with an API address where nothing listens; ``mute`` by node M,
    whose address accepts connections and never answers; ``noapi`` by node D, which serves no API;
    ``free`` is held by nobody."""
    chroot = unique_root()
    pipelines = ("pa", "gone", "mute", "noapi", "free")
    mute = socket.create_server(("127.0.0.1", 0))  # the kernel completes the handshake; nobody reads
    with mute, stores(zookeeper_server.hosts, 5, root=chroot) as (store_a, store_b, store_c, store_m, store_d):
        nodes: dict[str, ApiNode] = {}
        try:
            for name, store in (("A", store_a), ("B", store_b)):
                conf = conf_dir(tmp_path, name, zookeeper_server.hosts, chroot, pipelines)
                settings = load_node(conf)
                observer = NodeObserver(name, list(pipelines), store, lambda: {}, metrics=False)
                api = Api(settings, store, lambda name=name: {"node": name, "pipelines": []})
                server = StatusServer(observer, "127.0.0.1:0", api=api)
                server.start()
                nodes[name] = ApiNode(name, store, server, conf / "audit.jsonl")
                Elections(store.coordinator, name, api_url=server.advertised_url).register()
            Elections(store_c.coordinator, "C", api_url=f"http://127.0.0.1:{free_port()}").register()
            Elections(store_m.coordinator, "M", api_url=f"http://127.0.0.1:{mute.getsockname()[1]}").register()
            Elections(store_d.coordinator, "D").register()
            leases = [hold(store_a, "pa", "A"), hold(store_c, "gone", "C"), hold(store_m, "mute", "M"),
                      hold(store_d, "noapi", "D")]
            store_a.set_state("free", Status.RUNNING)
            yield {"A": nodes["A"], "B": nodes["B"], "leases": leases, "registry": f"zk://{zookeeper_server.hosts}{chroot}"}
        finally:
            for node in nodes.values():
                node.server.stop()


def test_pause_through_another_node_is_forwarded_to_the_holder(cluster: dict[str, Any]) -> None:
    """A pause of A's pipeline asked of B is answered by A (X-Setl-Forwarded-To: A), takes effect,
    and is one audit line on each node (forwarded_to on B, forwarded_from on A); the same
    Idempotency-Key replayed on B or sent to A directly acts no second time."""
    a, b = cluster["A"], cluster["B"]
    status, body, headers = b.call("POST", "/pipelines/pa/pause", headers={"Idempotency-Key": "k1"})
    assert status == 200 and body["changed"] and headers.get("X-Setl-Forwarded-To") == "A", (status, body)
    assert a.store.state("pa").status is Status.PAUSED
    [on_a], [on_b] = a.audited(), b.audited()
    assert on_a["forwarded_from"] == "B" and on_a["status"] == 200 and on_a["token"] == "ops", on_a
    assert "forwarded_to" not in on_a
    assert on_b["forwarded_to"] == "A" and on_b["status"] == 200 and "forwarded_from" not in on_b, on_b
    status, again, headers = b.call("POST", "/pipelines/pa/pause", headers={"Idempotency-Key": "k1"})
    assert status == 200 and again == body and headers.get("Idempotent-Replayed") == "true"
    assert len(a.audited()) == 1  # B answered the replay from what it kept
    status, direct, headers = a.call("POST", "/pipelines/pa/pause", headers={"Idempotency-Key": "k1"})
    assert status == 200 and direct["changed"] and headers.get("Idempotent-Replayed") == "true", direct
    status, body, headers = b.call("POST", "/pipelines/pa/resume")
    assert status == 200 and body["changed"] and headers.get("X-Setl-Forwarded-To") == "A", body
    assert a.store.state("pa").status is not Status.PAUSED
    status, body, _ = b.call("POST", "/pipelines/pa/pause", token=VIEWER)  # refused on B, never forwarded
    assert status == 403 and a.store.state("pa").status is not Status.PAUSED
    assert [e["path"] for e in a.audited()] == ["/api/v1/pipelines/pa/pause"] * 2 + ["/api/v1/pipelines/pa/resume"]


def test_operation_started_through_another_node_is_followed_there(cluster: dict[str, Any]) -> None:
    """A stop of A's pipeline asked of B starts its operation on A; B's describe names A as the
    holder, and the operation is polled and streamed through B to its end, done and stopped."""
    a, b = cluster["A"], cluster["B"]
    status, described, _ = b.call("GET", "/pipelines/pa", token=VIEWER)
    assert status == 200 and described["held_by"] == {"node": "A", "api": a.server.advertised_url}, described
    status, started, headers = b.call("POST", "/pipelines/pa/stop", {"timeout_s": 20})
    assert status == 202 and headers["Location"] == f"{PREFIX}/operations/{started['id']}", (status, started)
    assert a.call("GET", f"/operations/{started['id']}", token=VIEWER)[0] == 200  # it runs on A
    status, streamed, _ = b.call("GET", f"/operations/{started['id']}/events", token=VIEWER)
    lines = [json.loads(line) for line in streamed.splitlines()]
    assert status == 200 and lines[-1]["event"] == "end" and lines[-1]["state"] == "done", lines
    status, polled, headers = b.call("GET", f"/operations/{started['id']}", token=VIEWER)
    assert status == 200 and polled["state"] == "done" and headers.get("X-Setl-Forwarded-To") == "A", polled
    assert a.store.state("pa").status is Status.PAUSED
    assert b.call("GET", "/operations/0123456789abcdef", token=VIEWER)[0] == 404


def test_unreachable_holder_is_a_503_that_changes_nothing(cluster: dict[str, Any]) -> None:
    """A request for a pipeline held by a node whose API cannot be reached is a 503 naming that
    node and its address; the pipeline's state is unchanged and no other node acted on it."""
    a, b = cluster["A"], cluster["B"]
    before = b.store.state("gone")
    status, body, headers = b.call("POST", "/pipelines/gone/pause")
    assert status == 503 and "held by node C (http://127.0.0.1:" in body["error"], body
    assert "nothing was changed" in body["error"] and headers.get("Retry-After") == "2"
    assert b.store.state("gone") == before and before.status is not Status.PAUSED
    assert a.audited() == [] and b.audited()[-1]["status"] == 503


def test_forwarded_request_is_not_forwarded_again(cluster: dict[str, Any]) -> None:
    """A request that carries X-Setl-Forwarded-From is answered where it lands (the meta store, as
    the CLI), even for a pipeline another node holds, so two nodes never bounce it; a pipeline
    nobody holds is answered locally too."""
    a, b = cluster["A"], cluster["B"]
    status, body, headers = b.call("POST", "/pipelines/pa/pause", headers={"X-Setl-Forwarded-From": "A"})
    assert status == 200 and body["changed"] and "X-Setl-Forwarded-To" not in headers, (status, headers)
    assert a.store.state("pa").status is Status.PAUSED and a.audited() == []
    [entry] = b.audited()
    assert entry["forwarded_from"] == "A" and "forwarded_to" not in entry
    status, body, headers = b.call("POST", "/pipelines/free/pause")
    assert status == 200 and body["changed"] and "X-Setl-Forwarded-To" not in headers
    assert a.store.state("free").status is Status.PAUSED and a.audited() == []
    assert b.call("GET", "/pipelines/free", token=VIEWER)[1]["held_by"] is None


def test_holder_that_never_answers_is_a_503_that_may_have_acted(cluster: dict[str, Any]) -> None:
    """A holder that takes the request and gives no answer within the forward's timeout is a 503
    that says it may have acted and to retry with the same Idempotency-Key; the 503 is not kept,
    so the retry is forwarded again."""
    b = cluster["B"]
    assert b.server.api is not None
    b.server.api.forwarding.forwarder = Forwarder("B", timeout=0.5)
    for _ in range(2):
        status, body, _ = b.call("POST", "/pipelines/mute/pause", headers={"Idempotency-Key": "m1"})
        assert status == 503 and "held by node M" in body["error"] and "may have acted" in body["error"], body
        assert "Idempotent-Replayed" not in _
    assert [e["status"] for e in b.audited()] == [503, 503]


def test_holder_without_api_acts_through_the_meta_store(cluster: dict[str, Any]) -> None:
    """A pipeline whose holder registered no API address is acted on through the meta store by the
    node that was asked, with no forward; its describe names the holder with no address."""
    a, b = cluster["A"], cluster["B"]
    status, body, headers = b.call("POST", "/pipelines/noapi/pause")
    assert status == 200 and body["changed"] and "X-Setl-Forwarded-To" not in headers, body
    assert a.store.state("noapi").status is Status.PAUSED
    assert b.call("GET", "/pipelines/noapi", token=VIEWER)[1]["held_by"] == {"node": "D", "api": None}


def test_cli_node_from_the_cluster_registry_acts_on_the_holder(cluster: dict[str, Any], tmp_path: Path) -> None:
    """`setl --node zk://HOSTS/CHROOT pause --pipeline pa` finds pa's holder (A) in the registry and
    acts there directly (A audits it, not as forwarded); `status` goes to the first live node by name
    that serves an API; a cluster where none does is one line, exit 2."""
    a = cluster["A"]
    env = {**os.environ, "SETL_API_TOKEN": TOKEN}
    done = subprocess.run([sys.executable, "-m", "setl.cli", "--node", cluster["registry"], "pause",
                           "--pipeline", "pa"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert a.store.state("pa").status is Status.PAUSED
    [entry] = a.audited()
    assert entry["path"] == "/api/v1/pipelines/pa/pause" and "forwarded_from" not in entry, entry
    shown = subprocess.run([sys.executable, "-m", "setl.cli", "--node", cluster["registry"], "status", "--json",
                            "--pipeline", "pa"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert row["pipeline"] == "pa" and row["status"] == "paused" and row["held_by"]["node"] == "A", row
    empty = subprocess.run([sys.executable, "-m", "setl.cli", "--node", cluster["registry"] + "-none", "status"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert empty.returncode == 2 and "no live node of that cluster serves a control API" in empty.stderr, empty.stderr
