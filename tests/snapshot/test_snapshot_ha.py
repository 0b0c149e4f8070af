"""A ZooKeeper failover in the middle of a snapshot: kill -9 of the holder while it copies, under
sysbench load; the standby resumes after the chunks the old holder acked and the target ends equal."""

from __future__ import annotations

import re
import signal

import pytest
import yaml

from setl.snapshot import CopyStatus
from setl.testing.servers import wait_until
from tests.ha.test_failover import make_cluster  # noqa: F401 - make_cluster is a fixture
from tests.snapshot import tables as t

pytestmark = pytest.mark.timeout(300)

ROWS = 40_000


def test_failover_during_a_snapshot_resumes_on_the_standby(zookeeper_server, make_cluster, mariadb_source,  # noqa: F811
                                                            mariadb_target, source_db, mysql_db):
    """kill -9 of the holder mid-copy: node-b takes over, logs the chunk each table resumes from, never
    copies an acked chunk again, and every table ends equal by CHECKSUM TABLE."""
    cluster = make_cluster(zookeeper_server.hosts)
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    t.fill(mariadb_source, source_db, ROWS, binlog=False)
    for name in cluster.names:
        path = cluster.conf(name) / "pipelines" / f"{cluster.name}.yaml"
        pipeline = yaml.safe_load(path.read_text())
        pipeline["source"].update(start="snapshot", snapshot={"chunk_rows": 1000, "readers": 2})
        path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    # node-a copies `ints` slowly enough to be killed mid-copy, however fast the copy and the load's start
    slow = {"stage": "snapshot_read", "action": "slow", "seconds": 0.3, "task": f"{source_db}.ints", "times": None}
    cluster.spawn("node-a", faults=[slow])
    cluster.wait_holder("node-a")
    cluster.spawn("node-b")
    cluster.wait_standby("node-b")
    running = cluster.load(seconds=12)

    def ints() -> tuple[str, int]:
        found = {p.table: p for p in cluster.store.snapshot_progress(cluster.name)}.get("ints")
        return (found.status.value, found.chunks) if found else ("-", 0)

    wait_until(lambda: ints()[0] == "copying" and ints()[1] >= 5, timeout=60, interval=0.02,
               message=lambda: f"chunks of ints acked ({ints()})")
    cluster.signal("node-a", signal.SIGKILL)
    at_kill = ints()[1]
    cluster.wait_holder("node-b", timeout=30)

    def all_done() -> bool:
        cluster._alive()
        found = cluster.store.snapshot_progress(cluster.name)
        return len(found) == len(t.TABLES) + 2 and all(p.status is CopyStatus.DONE for p in found)

    wait_until(all_done, timeout=120, interval=0.2,
               message=lambda: f"snapshot done ({cluster.store.snapshot_progress('p')})")
    running.wait()
    cluster.wait_caught_up()
    codes = cluster.stop_all()
    assert all(code in (0, -signal.SIGKILL) for code in codes.values()), (codes, cluster.logs())
    every = [*t.TABLES, "sbtest1", "sbtest2"]
    assert t.checksums(mariadb_source, source_db, every) == t.checksums(mariadb_target, mysql_db, every), \
        cluster.logs()
    cluster.assert_epochs_never_go_back()
    logs = cluster.logs(tail=None)
    assert "failpoint snapshot_read: sleeping" in logs, logs[-3000:]  # node-a copied ints slowly
    resumed = [int(n) for n in re.findall(r"table=\S+\.ints snapshot resumes after chunk (\d+)", logs)]
    assert resumed and resumed[0] >= at_kill, logs[-6000:]
    final = {p.table: p for p in cluster.store.snapshot_progress(cluster.name)}["ints"]
    assert -(-ROWS // 1000) <= final.chunks <= -(-ROWS // 1000) + 3, final
