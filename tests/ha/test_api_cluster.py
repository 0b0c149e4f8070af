"""The control API of an HA fleet (ZooKeeper, two nodes, two pipelines, both serving the API): any
node answers for every pipeline (forwarding to the holder), moves and drains run as operations, and
nothing is lost or repeated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
                 node_extra={"m1": {"http": {"listen": f"127.0.0.1:{free_port()}", "api": {"tokens_file": "tokens"}}},
                             "m2": {"http": {"listen": f"127.0.0.1:{port}",
                                             "api": {"tokens_file": "tokens"}}}})
    for name in ("m1", "m2"):
        (made.conf(name) / "tokens").write_text(f"ops operator {TOKEN}\n")
    made.api_url = f"http://127.0.0.1:{port}/api/v1"  # type: ignore[attr-defined]
    yield made
    made.close()


def audited(fleet: Fleet, node: str) -> list[dict[str, Any]]:
    path = fleet.conf(node) / "api-audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


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


def setl_through(fleet: Fleet, *args: str) -> subprocess.CompletedProcess:
    """`setl --node URL ARGS` against m2's API, with the operator's token."""
    url = fleet.api_url.removesuffix("/api/v1")  # type: ignore[attr-defined]
    return subprocess.run([sys.executable, "-m", "setl.cli", "--node", url, *args], capture_output=True, text=True,
                          env={**os.environ, "SETL_API_TOKEN": TOKEN}, timeout=150)


def drain_on_the_page(fleet: Fleet, node: str) -> None:
    """In Chromium on m2's page: no Drain button before sign-in; an operator's Drain of `node`
    dismissed changes nothing; confirmed, its operation ends done with `node` running nothing."""
    from playwright.sync_api import sync_playwright

    from tests.observe.test_page import ARGS, CHROMIUM

    answers = {"confirm": False}
    problems: list[str] = []

    def draining() -> bool:
        return bool(call(fleet, "GET", "/cluster")[1]["nodes"][node]["draining"])

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("dialog", lambda d: d.accept() if answers["confirm"] else d.dismiss())
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(fleet.api_url.removesuffix("/api/v1") + "/")  # type: ignore[attr-defined]
            row = page.locator(f'table.cluster-nodes tr[data-node="{node}"]')
            row.wait_for(timeout=15_000)
            assert page.locator("button[data-action=drain]").count() == 0
            page.fill("#token", TOKEN)
            page.click("#signin button")
            button = row.locator("button[data-action=drain]")
            wait_until(lambda: button.count() == 1, 15, 0.1, message="the Drain button")
            button.click()  # dismissed
            page.wait_for_timeout(1500)
            assert not draining() and page.locator(".operation").count() == 0
            answers["confirm"] = True
            row.locator("button[data-action=drain]").click()
            op = page.locator(".operation").first
            wait_until(lambda: op.get_attribute("data-state") != "running" and op.get_attribute("data-state"),
                       120, 0.2, message=lambda: f"the drain, got {op.inner_text()}")
            assert op.get_attribute("data-state") == "done", op.inner_text()
            assert op.inner_text().startswith(f"drain {node}") and f"{node} runs nothing" in op.inner_text()
            assert draining()
            wait_until(lambda: "draining" in row.inner_text() and row.locator("button").count() == 0, 15, 0.2,
                       message=lambda: f"the row to show draining, got {row.inner_text()}")
            assert problems == []
        finally:
            browser.close()


def test_one_node_answers_for_the_cluster(fleet: Fleet) -> None:
    """Through m2's API: the cluster view, a pause and resume of a pipeline m1 runs (forwarded to m1,
    audited on both nodes), `setl --node`
    cluster move to m2, the page's Drain button on m2 (confirmed in Chromium, an operation that ends
    done), `setl --node` drain undo; an unknown node is a 400; the target ends equal to the source
    with epochs never going back."""
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
    [forwarded] = [e for e in audited(fleet, "m1") if e["path"].endswith(f"/{on_m1}/pause")]
    assert forwarded["forwarded_from"] == "m2" and forwarded["status"] == 200, forwarded
    [asked] = [e for e in audited(fleet, "m2") if e["path"].endswith(f"/{on_m1}/pause")]
    assert asked["forwarded_to"] == "m1" and asked["status"] == 200, asked
    wait_until(lambda: fleet.store.state(on_m1).status is Status.PAUSED
               and fleet.store.liveness(on_m1) is not None, 30, 0.2, message="m1's pipeline paused")
    paused_at = fleet.store.position(on_m1)
    status, body = call(fleet, "POST", f"/pipelines/{on_m1}/resume")
    assert status == 200 and body["changed"], body
    wait_until(lambda: (ack := fleet.store.position(on_m1)) is not None and ack.batch_id > paused_at.batch_id, 60,
               0.2, message=lambda: f"acks after the resume: {fleet.store.state(on_m1)}\n{fleet.logs()}")
    moved = setl_through(fleet, "cluster", "move", "--pipeline", on_m1, "--to", "m2", "--timeout", "90")
    assert moved.returncode == 0 and moved.stdout.strip().endswith(f"m2 runs {on_m1}"), moved
    assert fleet.holders()[on_m1] == "m2"
    status, body = call(fleet, "POST", "/cluster/nodes/nosuch/drain", {})
    assert status == 400 and "no node nosuch in the cluster" in body["error"]
    drain_on_the_page(fleet, "m2")
    fleet.wait_spread(("m1",), 2, 2, timeout=60)
    undone = setl_through(fleet, "cluster", "drain", "--node", "m2", "--undo")
    assert undone.returncode == 0 and "m2: no longer draining" in undone.stdout, undone
    fleet.wait_spread(nodes, 1, 1, timeout=90)
    fleet.stop_load()
    fleet.wait_equal()
    codes = fleet.stop_all()
    assert all(code in (0, -signal.SIGKILL) for code in codes.values()), (codes, fleet.logs())
    fleet.assert_exact()
    fleet.assert_epochs_never_go_back()
