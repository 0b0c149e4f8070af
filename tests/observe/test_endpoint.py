"""The node's HTTP endpoint on a real `setl start` (MariaDB to MariaDB): /metrics counters equal the
rows applied, /api/status carries `setl status --json`'s rows and live figures, /healthz follows
the pipelines' health."""

from __future__ import annotations

import contextlib

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from setl.testing.servers import wait_until

from .observed import PAUSE_SOON, ObservedNode

pytestmark = pytest.mark.timeout(180)


def samples(node: ObservedNode, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    status, body, content_type = node.get("/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == metric:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_metrics_count_the_rows_applied(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    """/metrics, parsed with the Prometheus text parser: rows acked by table and op equal the rows
    the source changed and the target holds; batches, stage histograms, lag and node gauges are there."""
    node = ObservedNode(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db).start()
    try:
        node.source_exec("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(16))",
                         "INSERT INTO t VALUES " + ", ".join(f"({i}, 'a')" for i in range(300)),
                         "UPDATE t SET v = 'b' WHERE id < 120",
                         "DELETE FROM t WHERE id >= 250")
        wait_until(lambda: node.target_has("t") and node.target_rows("t") == 250
                   and node.target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.t WHERE v = 'b'")[0][0] == 120,
                   60, 0.2, message="the target to hold the source's rows")
        table = f"{mysql_db}.t"

        def rows() -> dict[str, float]:
            found = samples(node, "setl_rows_acked_total")
            return {dict(k)["op"]: v for k, v in found.items() if dict(k)["table"] == table}

        wait_until(lambda: rows() == {"ddl": 1.0, "insert": 300.0, "update": 120.0, "delete": 50.0}, 30, 0.2,
                   message=lambda: f"the counters to match, got {rows()}")
        labels = (("pipeline", node.name),)
        assert samples(node, "setl_batches_acked_total")[labels] >= 1
        stages = samples(node, "setl_stage_seconds_count")
        for stage in ("select", "extract", "transform", "load", "termin"):
            assert stages[(("pipeline", node.name), ("stage", stage))] >= 1, stage
        assert labels in samples(node, "setl_lag_seconds")
        assert samples(node, "setl_leader")[labels] == 1.0
        assert samples(node, "setl_node_threads")[()] >= 3
        assert samples(node, "process_resident_memory_bytes")[()] > 10_000_000
        assert samples(node, "setl_rollbacks_total")[labels] == 0
    finally:
        node.stop()


def test_api_status_and_healthz_follow_a_pause(tmp_path, mariadb_source, source_db, mariadb_factory):
    """/api/status has the status rows and figures; /healthz is 200 while the pipeline runs, and
    503 naming it once the target is gone long enough for the pipeline to pause with its error."""
    target = mariadb_factory(server_id=41)
    target.query("CREATE DATABASE dst")
    node = ObservedNode(tmp_path, mariadb_source, source_db, target, "dst",
                        retry=PAUSE_SOON).start()
    try:
        node.source_exec("CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(16))",
                         "INSERT INTO t (v) VALUES ('a'), ('b')")
        wait_until(lambda: node.target_has("t") and node.target_rows("t") == 2, 60, 0.2, message="rows in the target")
        status = node.get_json("/api/status")
        row = status["pipelines"][0]
        assert status["node"] == "obs-node" and status["healthy"] is True
        assert row["pipeline"] == node.name and row["status"] == "running" and row["running_here"]
        assert row["position"] and row["batch"] >= 1 and row["figures"]["acked_rows"] >= 2
        assert node.get("/healthz")[0] == 200
        target.stop()
        node.source_exec("INSERT INTO t (v) VALUES ('c')")
        wait_until(lambda: node.get("/healthz")[0] == 503, 60, 0.2, message="/healthz to turn 503")
        body = node.get_json("/healthz")
        assert body["healthy"] is False and node.name in body["unhealthy"]
        row = node.pipeline()
        assert row["status"] == "paused" and row["healthy"] is False
        assert "2003" in row["error"] or "connect" in row["error"].lower()
        assert row["recent_rollbacks"], "the rollbacks before the pause are listed"
    finally:
        node.stop()


def test_the_endpoint_answers_starting_while_spark_starts(tmp_path, mariadb_source, source_db, mariadb_target,
                                                          mysql_db):
    """Issue 23 item 7: a node whose pipeline has a Spark step answers /api/status within seconds of
    its start, saying `starting` while the steps are analysed (Spark starting), then `running`."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY)")  # before the start position
    node = ObservedNode(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db)
    path = node.setl.conf / "pipelines" / f"{node.name}.yaml"
    config = yaml.safe_load(path.read_text())
    config["tables"][0]["transforms"] = [{"use": "add_column", "name": "twice", "expr": "2"}]
    path.write_text(yaml.safe_dump(config))
    node.proc = node.setl.spawn()
    try:
        seen: list[str] = []

        def answered() -> bool:
            assert node.proc.poll() is None, node.setl.logs()[-3000:]
            with contextlib.suppress(OSError, ValueError):
                seen.append(node.pipeline()["status"])
                return True
            return False

        wait_until(answered, 60, 0.1, message="the endpoint")
        assert "transform steps analysed" not in node.setl.logs()  # Spark was still starting
        assert seen[0] == "starting", seen
        wait_until(lambda: node.pipeline()["status"] == "running", 120, 0.3,
                   message=lambda: f"running: {node.pipeline()} {node.setl.logs()[-3000:]}")
    finally:
        node.stop()
