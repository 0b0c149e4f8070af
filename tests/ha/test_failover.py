"""HA fault injection with real servers: two `setl start` nodes on one ZooKeeper, a MariaDB source
under sysbench load and a MariaDB target. Every test ends with each table's CHECKSUM equal in the
source and the target after catching up, and with an ack history whose epochs never go back."""

from __future__ import annotations

import re
import signal
import time

import pytest

from setl.testing.servers import ZooKeeperServer, wait_until
from tests.ha.cluster import SESSION_TIMEOUT_MS, STANDBY_DELAY_MS, Cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def make_cluster(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    made = []

    def make(zk_hosts: str, **kwargs) -> Cluster:
        cluster = Cluster(tmp_path, zk_hosts, mariadb_source, source_db, mariadb_target, mysql_db, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def start_pair(cluster: Cluster) -> None:
    """node-a holds the pipeline, node-b stands by."""
    cluster.spawn("node-a")
    cluster.wait_holder("node-a")
    cluster.spawn("node-b")
    cluster.wait_standby("node-b")


def finish(cluster: Cluster, running) -> None:
    """Let the load end, catch up, stop the nodes, and compare source and target."""
    running.wait()
    cluster.wait_caught_up()
    codes = cluster.stop_all()
    assert all(code in (0, -signal.SIGKILL) for code in codes.values()), (codes, cluster.logs())
    cluster.assert_equal()
    cluster.assert_epochs_never_go_back()


def test_kill_9_of_the_leader_hands_over_to_the_standby(zookeeper_server, make_cluster):
    """kill -9 of the holder mid-load: the standby acks within session timeout + standby delay + 2 s."""
    cluster = make_cluster(zookeeper_server.hosts)
    start_pair(cluster)
    running = cluster.load(seconds=8)
    before = cluster.wait_ack(after_batch=5)
    killed = time.monotonic()
    cluster.signal("node-a", signal.SIGKILL)
    cluster.wait_ack(min_epoch=cluster.store.state(cluster.name).epoch + 1, timeout=30)
    failover = time.monotonic() - killed
    print(f"failover (kill -9 to the first ack of the new holder): {failover:.2f}s")
    assert cluster.members()[0] == "node-b"
    assert cluster.acked().batch_id > before.batch_id
    assert failover < (SESSION_TIMEOUT_MS + STANDBY_DELAY_MS) / 1000 + 2
    assert not running.done, "the load ended before the failover: nothing was tested under load"
    finish(cluster, running)


def test_expired_session_stops_the_leader_and_the_standby_takes_over(zookeeper_server, make_cluster):
    """Holder's session expired mid-load: it stops writing, the standby takes over, the old epoch never acks again."""
    # The standby contends at once here, so it wins over the old holder, which may re-take at once.
    cluster = make_cluster(zookeeper_server.hosts, standby_delay_ms=0, proxied=True)
    start_pair(cluster)
    running = cluster.load(seconds=7)
    cluster.wait_ack(after_batch=5)
    old_epoch = cluster.store.state(cluster.name).epoch
    cluster.expire("node-a")
    cluster.wait_holder("node-b", timeout=10)
    cluster.wait_ack(min_epoch=old_epoch + 1)
    cluster.wait_standby("node-a", timeout=20)
    logs = cluster.logs(tail=None)
    assert "lost the mainstem" in logs and re.search(r"ZooKeeper session 0x[0-9a-f]+ expired", logs), logs[-3000:]
    finish(cluster, running)
    assert all(a.epoch > old_epoch for a in cluster.store.history(cluster.name, 5))


def test_zookeeper_outage_longer_than_the_session_timeout_pauses_and_resumes(make_cluster):
    """ZooKeeper stopped longer than the session timeout, then restarted: the pipeline stops, resumes, loses nothing."""
    with ZooKeeperServer() as zk:
        cluster = make_cluster(zk.hosts)
        start_pair(cluster)
        running = cluster.load(seconds=8)
        cluster.wait_ack(after_batch=5)
        zk.stop()
        down_until = time.monotonic() + SESSION_TIMEOUT_MS / 1000 + 1.5
        wait_until(lambda: time.monotonic() >= down_until, timeout=10, message="the outage to last")
        zk.start()
        before = cluster.acked()
        cluster.wait_ack(after_batch=before.batch_id, timeout=30)
        assert "ZooKeeper connection lost" in cluster.logs(tail=None)
        finish(cluster, running)


def test_frozen_leader_resumed_after_takeover_is_fenced(zookeeper_server, make_cluster):
    """SIGSTOP of the holder past its session timeout, takeover, then SIGCONT: its late writes are fenced."""
    cluster = make_cluster(zookeeper_server.hosts)
    start_pair(cluster)
    running = cluster.load(seconds=9)
    cluster.wait_ack(after_batch=5)
    old_epoch = cluster.store.state(cluster.name).epoch
    cluster.signal("node-a", signal.SIGSTOP)
    cluster.wait_holder("node-b", timeout=15)
    cluster.signal("node-a", signal.SIGCONT)
    cluster.wait_ack(min_epoch=old_epoch + 1, timeout=60)
    cluster.wait_standby("node-a", timeout=20)
    assert "lost the mainstem" in cluster.logs(tail=None)
    finish(cluster, running)


def test_switch_under_load_hands_over_gracefully(zookeeper_server, make_cluster):
    """`setl switch` under load: the holder drains and releases, the standby takes over at once."""
    cluster = make_cluster(zookeeper_server.hosts)
    start_pair(cluster)
    running = cluster.load(seconds=7)
    cluster.wait_ack(after_batch=5)
    result = cluster.cli("node-a", "switch", "--pipeline", cluster.name, "--timeout", "30")
    assert result.returncode == 0, result.stderr + cluster.logs()
    assert "node-b holds the mainstem now" in result.stdout
    cluster.wait_standby("node-a")
    status = cluster.cli("node-b", "status", "--json")
    assert '"holder": "node-b"' in status.stdout and '"node-a"' in status.stdout
    assert "released the mainstem" in cluster.logs(tail=None)
    finish(cluster, running)


def test_five_failovers_in_a_row_under_load(zookeeper_server, make_cluster):
    """Five kill -9 failovers in a row under load, each killed node restarted as the standby, end equal."""
    cluster = make_cluster(zookeeper_server.hosts)
    start_pair(cluster)
    running = cluster.load(seconds=60)
    try:
        holder, standby = "node-a", "node-b"
        for _ in range(5):
            epoch = cluster.wait_ack(after_batch=(cluster.acked().batch_id if cluster.acked() else 0)).epoch
            cluster.signal(holder, signal.SIGKILL)
            cluster.wait_holder(standby)
            cluster.wait_ack(min_epoch=epoch + 1)
            cluster.spawn(holder)
            cluster.wait_standby(holder)
            holder, standby = standby, holder
        assert not running.done
    finally:
        running.stop()
    cluster.wait_caught_up()
    codes = cluster.stop_all()
    assert all(code in (0, -signal.SIGKILL) for code in codes.values()), (codes, cluster.logs())
    cluster.assert_equal()
    cluster.assert_epochs_never_go_back()
