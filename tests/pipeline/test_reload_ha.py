"""Issue 23: a rule reload under HA. `setl reload`, run where the standby's configuration lives (as an
operator on another host would: the request goes through ZooKeeper, no signal), makes the mainstem
holder apply the added table under the same lease (the mainstem is not handed to the standby,
which would know nothing of the copy), and the table ends with exactly the source's rows while
sysbench writes the others."""

from __future__ import annotations

import re

import pytest
import yaml

from setl.testing.servers import wait_until
from tests.ha.cluster import TABLES
from tests.ha.test_failover import make_cluster, start_pair  # noqa: F401 - make_cluster is a fixture
from tests.schema.test_schema import run_source
from tests.snapshot import tables as t
from tools import sysbench

pytestmark = pytest.mark.timeout(300)


def _rules(cluster, pattern: str) -> None:
    for name in cluster.names:
        path = cluster.conf(name) / "pipelines" / f"{cluster.name}.yaml"
        pipeline = yaml.safe_load(path.read_text())
        pipeline["tables"] = [{"source": rf"{re.escape(cluster.source_db)}\.{pattern}",
                               "target": f"{cluster.target_db}.{{table}}"}]
        path.write_text(yaml.safe_dump(pipeline, sort_keys=False))


def test_setl_reload_from_the_standby_s_host_adds_a_table_under_the_holder_s_lease(zookeeper_server, make_cluster,  # noqa: F811
                                                                mariadb_source, mariadb_target, source_db,
                                                                mysql_db):
    """node-a holds, node-b stands by, sysbench writes; `extra` (1,200 rows) is added to both files
    and `setl reload` runs with node-b's configuration directory: it waits for node-a's answer and
    says "applied"; node-a still holds afterwards, `extra` is copied and equal row by row, and the
    sysbench tables end equal."""
    cluster = make_cluster(zookeeper_server.hosts)
    t.create(mariadb_source, source_db, {"extra": "(id INT NOT NULL PRIMARY KEY, v INT NOT NULL)"})
    run_source(mariadb_source, source_db, ["INSERT INTO extra SELECT seq, seq FROM seq_1_to_1200"])
    _rules(cluster, "sbtest.*")
    start_pair(cluster)
    running = cluster.load(seconds=8)
    cluster.wait_ack(after_batch=2)
    _rules(cluster, "(sbtest.*|extra)")
    reload = cluster.cli("node-b", "reload", "--pipeline", cluster.name, timeout=120)
    assert reload.returncode == 0 and "reload applied" in reload.stdout, (reload.stdout, reload.stderr)

    def copied() -> bool:
        found = {p.table: p for p in cluster.store.snapshot_progress(cluster.name)}.get("extra")
        return found is not None and found.status.value == "done"

    wait_until(copied, timeout=120, interval=0.2, message=lambda: f"extra copied; {cluster.logs()}")
    assert cluster.members()[0] == "node-a", cluster.logs()
    mariadb_source.query(f"UPDATE `{source_db}`.extra SET v = -v WHERE id <= 10")
    wait_until(lambda: t.mariadb_rows(mariadb_source, source_db, "extra")
               == t.mariadb_rows(mariadb_target, mysql_db, "extra"), timeout=60, interval=0.5,
               message=lambda: f"extra equal; {cluster.logs()}")
    assert "stage=reload applied" in cluster.logs(tail=None)
    running.wait()
    cluster.wait_caught_up()
    codes = cluster.stop_all()
    assert all(code == 0 for code in codes.values()), (codes, cluster.logs())
    tables = [f"sbtest{i}" for i in range(1, TABLES + 1)]
    assert sysbench.checksums(cluster.target_conn, tables) == sysbench.checksums(cluster.source_conn, tables)
    cluster.assert_epochs_never_go_back()
