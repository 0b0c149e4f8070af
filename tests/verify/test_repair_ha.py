"""`setl repair` under HA (ZooKeeper meta store, two nodes) while sysbench writes: the mainstem holder
serves the repair asked from the standby's host, fenced like any batch; a kill -9 of the holder
afterwards hands over and the tables end equal."""

from __future__ import annotations

import contextlib
import re
import signal

import pytest

from tests.ha.test_failover import make_cluster, start_pair  # noqa: F401 - make_cluster is a fixture

pytestmark = pytest.mark.timeout(300)


def test_repair_is_served_by_the_holder_under_load(zookeeper_server, make_cluster, mariadb_target,  # noqa: F811
                                                  mysql_db):
    """Drift in sbtest1 (a row deleted, one changed, one extra) is repaired through node-a while the
    source is written; after a failover to node-b every table is equal by CHECKSUM TABLE."""
    cluster = make_cluster(zookeeper_server.hosts)
    start_pair(cluster)
    running = cluster.load(seconds=10, rate=20)
    cluster.wait_ack(after_batch=3)
    conn = mariadb_target.connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(f"DELETE FROM `{mysql_db}`.sbtest1 WHERE id = 5")
        cur.execute(f"UPDATE `{mysql_db}`.sbtest1 SET c = 'drift' WHERE id = 6")
        cur.execute(f"INSERT INTO `{mysql_db}`.sbtest1 (id, k, c, pad) VALUES (900000, 1, 'x', 'y')")
    result = cluster.cli("node-b", "repair", "--pipeline", cluster.name, "--table", f"{cluster.source_db}.sbtest1",
                         "--wait-timeout", "60", timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + cluster.logs()
    assert re.search(r"sbtest1: [1-9]\d* key\(s\) to copy again", result.stdout), result.stdout
    assert re.search(r"sbtest1 -> \S+: equal", result.stdout), result.stdout
    logs = cluster.logs(tail=None)
    assert re.search(r"table=\S+\.sbtest1 position=\S+ repair \S+: \d+ row\(s\) copied again, 1 deleted", logs), logs
    assert cluster.store.repair_requests(cluster.name) == []
    running.wait()
    cluster.signal("node-a", signal.SIGKILL)
    cluster.wait_holder("node-b", timeout=30)
    cluster.wait_caught_up()
    codes = cluster.stop_all()
    assert all(code in (0, -signal.SIGKILL) for code in codes.values()), (codes, cluster.logs())
    cluster.assert_equal()
    cluster.assert_epochs_never_go_back()
