"""The control API of one node of an HA fleet (ZooKeeper, two nodes, two pipelines): any node
answers for every pipeline, moves and drains run as operations, and nothing is lost or repeated."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest

from setl.meta.base import Status
from setl.testing.servers import free_port, wait_until
from tests.ha.fleet import Fleet

pytestmark = pytest.mark.timeout(300)

TOKEN = "ha-operator-" + "h" * 24


@pytest.fixture
def fleet(tmp_path, zookeeper_server, mariadb_source, source_db, mariadb_target, mysql_db):
    port = free_port()
    made = Fleet(tmp_path, zookeeper_server.hosts, mariadb_source, source_db, mariadb_target, mysql_db,
                 names=("m1", "m2"), pipelines=2,
                 node_extra={"m2": {"http": {"listen": f"127.0.0.1:{port}",
                                             "api": {"tokens_file": "tokens"}}}})
    (made.conf("m2") / "tokens").write_text(f"ops operator {TOKEN}\n")
    made.api_url = f"http://127.0.0.1:{port}/api/v1"  # type: ignore[attr-defined]
    yield made
    made.close()


def call(fleet: Fleet, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(fleet.api_url + path, method=method,  # type: ignore[attr-defined]
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def finished(fleet: Fleet, op_id: str, timeout: float = 120) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        op = call(fleet, "GET", f"/operations/{op_id}")[1]
        return op if op["state"] != "running" else None

    return wait_until(ended, timeout, 0.3, message=f"operation {op_id} to end")


def test_one_node_answers_for_the_cluster(fleet: Fleet) -> None:
    """Through m2's API: the cluster view, a pause and resume of a pipeline m1 runs, a move to m2
    and a drain of m2 (operations that end done), its undo; an unknown node is a 400; the target
    ends equal to the source with epochs never going back."""
    nodes = ("m1", "m2")
    fleet.spawn("m1")
    fleet.wait_spread(("m1",), 2, 2)
    fleet.spawn("m2")
    fleet.start_load(rate=40)
    fleet.wait_spread(nodes, 1, 1, timeout=90)
    status, view = call(fleet, "GET", "/cluster")
    assert status == 200 and set(view["nodes"]) == set(nodes)
    on_m1 = next(p for p, h in fleet.holders().items() if h == "m1")
    status, body = call(fleet, "POST", f"/pipelines/{on_m1}/pause")
    assert status == 200 and body["changed"], body
    wait_until(lambda: fleet.store.state(on_m1).status is Status.PAUSED
               and fleet.store.liveness(on_m1) is not None, 30, 0.2, message="m1's pipeline paused")
    paused_at = fleet.store.position(on_m1)
    status, body = call(fleet, "POST", f"/pipelines/{on_m1}/resume")
    assert status == 200 and body["changed"], body
    wait_until(lambda: (ack := fleet.store.position(on_m1)) is not None and ack.batch_id > paused_at.batch_id, 60,
               0.2, message=lambda: f"acks after the resume: {fleet.store.state(on_m1)}\n{fleet.logs()}")
    status, started = call(fleet, "POST", f"/cluster/pipelines/{on_m1}/move", {"to": "m2", "timeout_s": 90})
    assert status == 202, started
    op = finished(fleet, started["id"])
    assert op["state"] == "done" and op["result"]["message"].endswith(f"m2 runs {on_m1}"), op
    assert fleet.holders()[on_m1] == "m2"
    status, body = call(fleet, "POST", "/cluster/nodes/nosuch/drain", {})
    assert status == 400 and "no node nosuch in the cluster" in body["error"]
    status, started = call(fleet, "POST", "/cluster/nodes/m2/drain", {"timeout_s": 90})
    assert status == 202, started
    op = finished(fleet, started["id"])
    assert op["state"] == "done" and "m2 runs nothing" in op["result"]["message"], op
    fleet.wait_spread(("m1",), 2, 2, timeout=60)
    status, started = call(fleet, "POST", "/cluster/nodes/m2/drain", {"undo": True})
    assert status == 202 and finished(fleet, started["id"])["state"] == "done"
    fleet.wait_spread(nodes, 1, 1, timeout=90)
    fleet.stop_load()
    fleet.wait_equal()
    codes = fleet.stop_all()
    assert all(code in (0, -signal.SIGKILL) for code in codes.values()), (codes, fleet.logs())
    fleet.assert_exact()
    fleet.assert_epochs_never_go_back()
