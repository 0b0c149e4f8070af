"""The endpoint of two HA nodes (ZooKeeper, MariaDB source and target): the holder says it leads and
the standby that it stands by, on /metrics, /api/status and the page; after kill -9 of the holder
the standby's endpoint shows it leading."""

from __future__ import annotations

import json
import signal
import urllib.request

import pytest
import yaml
from playwright.sync_api import sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from setl.testing.servers import free_port, wait_until
from tests.ha.cluster import Cluster
from tests.helpers.receiver import Receiver

from .test_page import ARGS, CHROMIUM

pytestmark = pytest.mark.timeout(180)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def _leader(url: str, pipeline: str) -> float | None:
    for family in text_string_to_metric_families(_get(url + "/metrics").decode()):
        for sample in family.samples:
            if sample.name == "setl_leader" and sample.labels == {"pipeline": pipeline}:
                return sample.value
    return None


def _row(url: str) -> dict:
    return json.loads(_get(url + "/api/status"))["pipelines"][0]


def test_holder_and_standby_endpoints_and_a_failover(tmp_path, zookeeper_server, mariadb_source, source_db,
                                                     mariadb_target, mysql_db):
    """node-a leads (setl_leader 1, running here), node-b stands by (0; its row names node-a as holder
    and itself as standby; its page card says standby), both healthy; kill -9 of node-a: node-b leads.
    Each leadership is a `leader_changed` alert, from the node that took the pipeline."""
    cluster = Cluster(tmp_path, zookeeper_server.hosts, mariadb_source, source_db, mariadb_target, mysql_db)
    receiver = Receiver()
    urls = {}
    try:
        for name in cluster.names:
            path = cluster.conf(name) / "setl.yaml"
            settings = yaml.safe_load(path.read_text())
            port = free_port()
            settings["http"] = {"listen": f"127.0.0.1:{port}"}
            settings["alerts"] = [{"webhook": receiver.url, "events": ["leader_changed", "paused"]}]
            path.write_text(yaml.safe_dump(settings))
            urls[name] = f"http://127.0.0.1:{port}"
        cluster.spawn("node-a")
        cluster.wait_holder("node-a")
        cluster.spawn("node-b")
        cluster.wait_standby("node-b")
        a, b = urls["node-a"], urls["node-b"]
        wait_until(lambda: _leader(a, cluster.name) == 1.0, 30, 0.2, message="node-a's setl_leader 1")
        wait_until(lambda: _leader(b, cluster.name) == 0.0, 30, 0.2, message="node-b's setl_leader 0")
        row = _row(b)
        assert row["holder"] == "node-a" and "node-b" in row["standbys"] and not row["running_here"]
        assert _row(a)["running_here"] and _row(a)["holder"] == "node-a"
        assert json.loads(_get(a + "/healthz"))["healthy"] and json.loads(_get(b + "/healthz"))["healthy"]
        problems: list[str] = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            try:
                page = browser.new_page()
                page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
                page.goto(b + "/")
                card = page.locator(f'article.card[data-pipeline="{cluster.name}"]')
                card.wait_for(timeout=15_000)
                wait_until(lambda: card.get_attribute("data-state") == "standby", 15, 0.2, message="standby card")
                assert "node-a" in card.inner_text() and "node-b" in card.inner_text()
            finally:
                browser.close()
        assert problems == [], problems
        cluster.signal("node-a", signal.SIGKILL)
        wait_until(lambda: _leader(b, cluster.name) == 1.0, 60, 0.3, message="node-b to lead after kill -9 of node-a")
        wait_until(lambda: _row(b)["running_here"] and _row(b)["holder"] == "node-b", 30, 0.3,
                   message="node-b's row to say it holds p")
        wait_until(lambda: len(receiver.bodies) >= 2, 30, 0.2, message=lambda: f"two alerts, got {receiver.bodies}")
        assert [(a["pipeline"], a["event"], a["node"]) for a in receiver.bodies] == [
            (cluster.name, "leader_changed", "node-a"), (cluster.name, "leader_changed", "node-b")]
    finally:
        cluster.close()
        receiver.close()
