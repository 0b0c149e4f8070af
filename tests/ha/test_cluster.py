"""Scale-out with real servers: `setl start --all` nodes sharing one ZooKeeper spread small
pipelines (each a keyed and a keyless table) from a MariaDB source into a MariaDB target. Every
test ends with each target equal to its source, every keyless row there exactly once, and ack
histories whose epochs never go back."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from setl.ha.cluster import request_move
from setl.status import status_rows
from setl.testing.servers import ZooKeeperServer, free_port, wait_until
from tests.ha.fleet import REASSIGN_AFTER_MS, SESSION_TIMEOUT_MS, STANDBY_DELAY_MS, Fleet
from tests.helpers.receiver import Receiver

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def make_fleet(tmp_path, zookeeper_server, mariadb_source, source_db, mariadb_target, mysql_db):
    made = []

    def make(zk_hosts: str | None = None, **kwargs) -> Fleet:
        fleet = Fleet(tmp_path, zk_hosts or zookeeper_server.hosts, mariadb_source, source_db, mariadb_target,
                      mysql_db, **kwargs)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.close()


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


def finish(fleet: Fleet) -> None:
    fleet.stop_load()
    fleet.wait_equal()
    codes = fleet.stop_all()
    assert all(code in (0, -signal.SIGKILL) for code in codes.values()), (codes, fleet.logs())
    fleet.assert_exact()
    fleet.assert_epochs_never_go_back()


def acked_again(fleet: Fleet, epochs: dict[str, int], timeout: float) -> float:
    """Seconds until every pipeline in `epochs` has acked in an epoch above the one given."""
    began = time.monotonic()

    def again() -> bool:
        fleet._alive()
        return all((a := fleet.store.position(name)) is not None and a.epoch > epoch for name, epoch in epochs.items())

    wait_until(again, timeout=timeout, interval=0.05,
               message=lambda: f"{sorted(epochs)} to ack in a new epoch ({fleet.holders()})\n{fleet.logs()}")
    return time.monotonic() - began


def settled(fleet: Fleet) -> None:
    wait_until(lambda: all(row["node"] == row["holder"] and not row["moving_from"]
                           for row in fleet.view()["pipelines"].values()),
               timeout=60, message=lambda: f"the assignments to settle ({fleet.view()['pipelines']})")


def test_three_nodes_share_twelve_pipelines_a_killed_node_s_run_elsewhere_and_it_gets_a_share_back(make_fleet):
    """3 nodes x 12 pipelines under sysbench and a keyless writer: started together they run 4±1
    each with no move (the start-up grace); kill -9 of one: every pipeline runs (acks) again within
    session timeout + reassign delay + 5 s, 6±1 each; it returns and gets a share back in at most 4
    moves; targets equal, keyless rows once, epochs monotonic."""
    nodes = ("n1", "n2", "n3")
    fleet = make_fleet(names=nodes, pipelines=12, with_sysbench=True, join_grace_ms=20_000)
    for node in nodes:
        fleet.spawn(node)
    fleet.start_load()
    started = fleet.wait_spread(nodes, 3, 5, timeout=120)
    settled(fleet)
    assert fleet.view()["moves"] == 0, fleet.view()  # placed once all three were live, nothing moved
    victims = [p for p, h in fleet.holders().items() if h == "n3"]
    assert 3 <= len(victims) <= 5
    # the bound is about a hand-over, not a start: every pipeline has acked in its epoch before the kill
    wait_until(lambda: all((a := fleet.store.position(name)) is not None and a.epoch >= fleet.store.state(name).epoch
                           for name in fleet.pipelines), timeout=60, message="every pipeline to ack in its epoch")
    epochs = {name: fleet.store.state(name).epoch for name in fleet.pipelines}
    killed = time.monotonic()
    fleet.kill("n3")
    bound = (SESSION_TIMEOUT_MS + REASSIGN_AFTER_MS) / 1000 + 5
    running = acked_again(fleet, {name: epochs[name] for name in victims}, timeout=60)
    fleet.wait_spread(("n1", "n2"), 5, 7, timeout=60)
    spread = time.monotonic() - killed
    print(f"\nstart: 4±1 each after {started:.2f}s; kill -9 of n3 ({len(victims)} pipelines): all acking again "
          f"on n1, n2 after {running:.2f}s (bound {bound:.0f}s), 6±1 each after {spread:.2f}s")
    assert running < bound, fleet.logs()
    settled(fleet)
    moves_before = fleet.view()["moves"]
    fleet.spawn("n3")
    back = fleet.wait_spread(nodes, 3, 5, timeout=90)
    settled(fleet)
    moves = fleet.view()["moves"] - moves_before
    print(f"n3 back: a share in {back:.2f}s, {moves} moves; per node {fleet.counts(nodes)}")
    assert 1 <= moves <= 4
    view = fleet.view()
    assert sorted(n for n, row in view["nodes"].items() if row["live"]) == list(nodes)
    assert view["last_rebalance"] is not None
    finish(fleet)


def test_a_frozen_owner_s_pipelines_move_and_it_is_fenced_when_resumed(make_fleet, mariadb_target, mysql_db):
    """3 nodes x 6 pipelines under load; the owner of a pipeline whose load waits inside its target
    transaction is frozen (SIGSTOP): its pipelines run on the others within session timeout +
    standby delay + 5 s, the new holder kills the frozen session as it takes the epoch fence; resumed
    (SIGCONT), the frozen node writes nothing (its session expired, its epoch is older), rejoins and
    gets a share back; nothing lost or applied twice, epochs monotonic."""
    nodes = ("f1", "f2", "f3")
    fleet = make_fleet(names=nodes, pipelines=6)
    for node in nodes:
        fleet.spawn(node)
    fleet.start_load(rate=30)
    fleet.wait_spread(nodes, 1, 3, timeout=120)
    settled(fleet)
    fleet.wait_equal()
    victims = [p for p, h in fleet.holders().items() if h == "f3"]
    assert victims
    stuck = victims[0]
    epochs = {name: fleet.store.state(name).epoch for name in fleet.pipelines}
    blocker = mariadb_target.connect(database=mysql_db, autocommit=False)
    try:
        with blocker.cursor() as cur:  # the next load of `stuck` that touches row 0 waits on this lock
            cur.execute(f"SELECT * FROM `{stuck}_keyed` WHERE id = 0 FOR UPDATE")
        with contextlib.closing(fleet.source.connect(database=fleet.source_db)) as conn, conn.cursor() as cur:
            cur.execute(f"UPDATE `{stuck}_keyed` SET v = v + 1 WHERE id = 0")

        def waiting() -> bool:
            fleet._alive()
            rows = mariadb_target.query(
                "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")
            return rows[0][0] >= 1

        wait_until(waiting, timeout=60, interval=0.3, message=lambda: f"{stuck}'s load to wait\n{fleet.logs()}")
        fleet.procs["f3"].send_signal(signal.SIGSTOP)
    finally:
        blocker.rollback()
        blocker.close()
    frozen = time.monotonic()
    try:
        bound = (SESSION_TIMEOUT_MS + STANDBY_DELAY_MS) / 1000 + 5
        running = acked_again(fleet, {name: epochs[name] for name in victims}, timeout=60)
        print(f"\nSIGSTOP of f3 ({len(victims)} pipelines): all acking again on f1, f2 after {running:.2f}s "
              f"(bound {bound:.1f}s)")
        assert running < bound, fleet.logs()
        fleet.wait_spread(("f1", "f2"), 2, 4, timeout=60)
        taken = {name: fleet.store.state(name).epoch for name in victims}
    finally:
        fleet.procs["f3"].send_signal(signal.SIGCONT)
    # Resumed: f3 learns its session expired; its leases are lost and nothing of its old epochs lands.
    def rejoined() -> bool:
        fleet._alive()
        row = fleet.view()["nodes"].get("f3")
        return row is not None and row["live"]

    wait_until(rejoined, timeout=60, message=lambda: f"f3 to rejoin\n{fleet.logs()}")
    fleet.wait_spread(nodes, 1, 3, timeout=90)
    settled(fleet)
    assert all(fleet.store.state(name).epoch >= taken[name] for name in victims)
    logs = fleet.logs(tail=None)
    assert re.search(r"pipeline=" + re.escape(stuck) + r" stage=load: took the \w+ target's fence for epoch "
                     r"\d+ \([1-9]\d* other session\(s\) killed\)", logs), logs
    assert "expired" in logs
    print(f"f3 resumed: rejoined, frozen for {time.monotonic() - frozen:.1f}s in all; per node {fleet.counts(nodes)}")
    finish(fleet)


def test_move_and_drain_hand_over_without_losing_or_repeating(make_fleet, receiver):
    """`setl cluster move` and `setl cluster drain` under load hand over at a batch boundary:
    nothing lost or applied twice; `setl cluster status`, a node that does not coordinate's
    /api/status and /metrics show the whole cluster; the coordinator alerts ``rebalanced``."""
    nodes = ("m1", "m2")
    port = free_port()
    alerts = [{"webhook": receiver.url, "events": ["rebalanced"]}]
    fleet = make_fleet(names=nodes, pipelines=2, node_extra={"m1": {"alerts": alerts},
                                                             "m2": {"alerts": alerts,
                                                                    "http": {"listen": f"127.0.0.1:{port}"}}})
    fleet.spawn("m1")
    fleet.wait_spread(("m1",), 2, 2)
    fleet.spawn("m2")
    fleet.start_load(rate=40)
    fleet.wait_spread(nodes, 1, 1, timeout=90)  # the joining node takes its share
    on_m1 = next(p for p, h in fleet.holders().items() if h == "m1")
    epoch = fleet.store.state(on_m1).epoch
    done = fleet.cli("m1", "cluster", "move", "--pipeline", on_m1, "--to", "m2", "--timeout", "90")
    assert done.returncode == 0, (done.stdout, done.stderr, fleet.logs())
    wait_until(lambda: fleet.store.state(on_m1).epoch > epoch, timeout=30, message="the moved pipeline's new epoch")
    fleet.wait_spread(nodes, 1, 1, timeout=60)  # balance moves the other one, not the one an operator placed
    status = fleet.cli("m1", "cluster", "status", "--json")
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert view["pipelines"][on_m1]["node"] == "m2" and view["pipelines"][on_m1]["held"]
    assert view["nodes"]["m1"]["weight"] == view["nodes"]["m2"]["weight"] == 1
    assert fleet.holders()[on_m1] == "m2"
    page = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10).read())
    assert page["cluster"]["coordinator"] == "m1"
    assert page["cluster"]["pipelines"][on_m1]["node"] == "m2"
    metrics = {(s.name, s.labels.get("node")): s.value
               for family in text_string_to_metric_families(
                   urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
               for s in family.samples}
    assert metrics[("setl_cluster_nodes", None)] == 2
    assert metrics[("setl_pipelines_assigned", "m1")] == metrics[("setl_pipelines_assigned", "m2")] == 1
    wait_until(lambda: any(b["event"] == "rebalanced" and b["pipeline"] == on_m1 and b["to"] == "m2"
                           and b["node"] == "m1" for b in receiver.bodies), timeout=20,
               message=lambda: f"a rebalanced alert for {on_m1} ({receiver.bodies})")
    done = fleet.cli("m1", "cluster", "drain", "--node", "m2", "--timeout", "90")
    assert done.returncode == 0, (done.stdout, done.stderr, fleet.logs())
    fleet.wait_spread(("m1",), 2, 2, timeout=60)
    text = fleet.cli("m1", "cluster", "status")
    assert "draining" in text.stdout and "m2" in text.stdout, text.stdout
    undone = fleet.cli("m1", "cluster", "drain", "--node", "m2", "--undo")
    assert undone.returncode == 0, undone.stderr
    fleet.wait_spread(nodes, 1, 1, timeout=60)
    assert "handing over at the next batch boundary" in fleet.logs(tail=None)
    finish(fleet)


def test_a_zookeeper_outage_shorter_than_the_session_moves_nothing(make_fleet):
    """ZooKeeper frozen (SIGSTOP) long enough for the nodes to lose their connection, but shorter
    than the session: no assignment is rewritten, no pipeline changes node or epoch, and the
    pipelines go on acking."""
    with ZooKeeperServer() as zk:
        nodes = ("z1", "z2")
        fleet = make_fleet(zk_hosts=zk.hosts, names=nodes, pipelines=2, session_timeout_ms=6000)
        fleet.spawn("z1")
        fleet.wait_spread(("z1",), 2, 2)
        fleet.spawn("z2")
        fleet.start_load(rate=30)
        fleet.wait_spread(nodes, 1, 1, timeout=90)
        wait_until(lambda: all(row["node"] == row["holder"] and row["standby"]
                               for row in fleet.view()["pipelines"].values()), timeout=30, message="a settled cluster")
        fleet.wait_equal()
        before = fleet.view()
        epochs = {name: fleet.store.state(name).epoch for name in fleet.pipelines}
        fleet.store.close()  # the observer's own session must not be the one to notice anything
        fleet._store = None
        assert zk.pid is not None
        os.kill(zk.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: fleet.logs(tail=None).count("ZooKeeper connection lost") >= 2, timeout=10,
                       interval=0.1, message="both nodes to lose their connection")
        finally:
            os.kill(zk.pid, signal.SIGCONT)
        acks = {name: fleet.store.position(name) for name in fleet.pipelines}
        for name in fleet.pipelines:
            wait_until(lambda name=name: fleet.store.position(name).batch_id > acks[name].batch_id, timeout=30,
                       message=f"{name} to ack after the outage")
        after = fleet.view()
        assert {p: (r["node"], r["holder"], r["version"]) for p, r in after["pipelines"].items()} == \
            {p: (r["node"], r["holder"], r["version"]) for p, r in before["pipelines"].items()}
        assert after["moves"] == before["moves"]
        assert {name: fleet.store.state(name).epoch for name in fleet.pipelines} == epochs
        assert "expired" not in fleet.logs(tail=None)
        finish(fleet)



def taken_and_acked(fleet: Fleet, epochs: dict[str, int], since: float, timeout: float
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """Per pipeline in `epochs`: the seconds from `since` until another live node held its mainstem,
    and until it acked in an epoch above the one given."""
    taken: dict[str, float] = {}
    acked: dict[str, float] = {}
    gone = {name: fleet.holders()[name] for name in epochs}

    def again() -> bool:
        fleet._alive()
        for name, epoch in epochs.items():
            now = time.monotonic() - since
            if name not in taken and fleet.store.members(name)[0] not in (None, gone[name]):
                taken[name] = now
            if name not in acked and (a := fleet.store.position(name)) is not None and a.epoch > epoch:
                acked[name] = now
                taken.setdefault(name, now)
        return len(acked) == len(epochs)

    wait_until(again, timeout=timeout, interval=0.05,
               message=lambda: f"{sorted(set(epochs) - set(acked))} to ack in a new epoch ({fleet.holders()})\n"
                               f"{fleet.logs()}")
    return taken, acked


def test_a_killed_node_s_pipelines_are_all_handed_over_in_one_step(make_fleet):
    """kill -9 of one of 3 nodes: each of its pipelines waits the standby delay once (none waits
    again after another is taken), is taken by its standby within session timeout + standby delay
    + 1.5 s and acks again within + 2 s; targets equal, keyless rows once, epochs monotonic."""
    nodes = ("k1", "k2", "k3")
    fleet = make_fleet(names=nodes, pipelines=6)
    for node in nodes:
        fleet.spawn(node)
    fleet.start_load(rate=60)
    fleet.wait_spread(nodes, 2, 2, timeout=120)
    settled(fleet)
    wait_until(lambda: all(row["standby"] for row in fleet.view()["pipelines"].values()), timeout=30,
               message=lambda: f"every pipeline to have a standby ({fleet.view()['pipelines']})")
    fleet.wait_equal()  # every pipeline acking steadily: the kill interrupts running work
    victims = [p for p, h in fleet.holders().items() if h == "k3"]
    assert len(victims) == 2, fleet.holders()
    epochs = {name: fleet.store.state(name).epoch for name in victims}
    logs = {path: path.stat().st_size for path in fleet.root.glob("setl-*.log")}
    killed = time.monotonic()
    fleet.kill("k3")
    taken, acked = taken_and_acked(fleet, epochs, killed, timeout=60)
    failover = (SESSION_TIMEOUT_MS + STANDBY_DELAY_MS) / 1000
    after = "".join(path.read_bytes()[size:].decode(errors="replace") for path, size in logs.items())
    waits = {name: after.count(f"pipeline={name} ha: the mainstem is free; contending in") for name in victims}
    print(f"\nkill -9 of k3: its pipelines taken after {', '.join(f'{t:.2f}s' for t in sorted(taken.values()))}, "
          f"acking again after {', '.join(f'{t:.2f}s' for t in sorted(acked.values()))} (session + delay "
          f"{failover:.1f}s); standby delays waited {waits}")
    assert waits == dict.fromkeys(victims, 1), (waits, after)
    assert max(taken.values()) < failover + 1.5, (taken, after[-6000:])  # the ZooKeeper tick is 0.5 s
    # the new owner opens its source while it fences the target, and cuts its first batch at once
    assert max(acked.values()) < failover + 2, (acked, after[-6000:])
    finish(fleet)

def test_a_node_setl_status_calls_dead_is_never_shown_as_owner_and_stays_lost(make_fleet):
    """kill -9 of one of 3 nodes: from the first moment `setl status` reports one of its pipelines
    dead, neither the cluster view (`setl cluster status`) nor the page shows that node as live or as
    any pipeline's owner or holder; once its pipelines run elsewhere and a later move rewrites the
    last rebalance, the node is still shown, lost (CLI, page)."""
    nodes = ("d1", "d2", "d3")
    port = free_port()
    fleet = make_fleet(names=nodes, pipelines=3, node_extra={"d1": {"http": {"listen": f"127.0.0.1:{port}"}}})
    for node in nodes:
        fleet.spawn(node)
    fleet.start_load(rate=30)
    fleet.wait_spread(nodes, 1, 1, timeout=120)
    settled(fleet)
    fleet.wait_equal()
    victim = next(p for p, h in fleet.holders().items() if h == "d3")
    epoch = fleet.store.state(victim).epoch
    fleet.kill("d3")
    seen_dead = 0

    def checked() -> bool:
        nonlocal seen_dead
        fleet._alive()
        rows = {row["pipeline"]: row for row in status_rows(fleet.store, fleet.pipelines)}
        view = fleet.view()
        for name, row in rows.items():
            if row["status"] == "dead" and row["node"] == "d3":
                seen_dead += 1
                assert view["pipelines"][name]["node"] != "d3" and view["pipelines"][name]["holder"] != "d3", view
                assert not view["nodes"]["d3"]["live"] and view["nodes"]["d3"]["lost"], view
        ack = fleet.store.position(victim)
        return ack is not None and ack.epoch > epoch

    wait_until(checked, timeout=30, interval=0.05, message=lambda: f"{victim} to run elsewhere\n{fleet.logs()}")
    assert seen_dead > 0  # the window this test is about was observed
    settled(fleet)
    mover = next(p for p, h in fleet.holders().items() if h == "d1")
    request_move(fleet.store.coordinator, mover, "d2")
    wait_until(lambda: fleet.view()["last_rebalance"]["from"] == "d1", timeout=30,
               message=lambda: f"the move of {mover} ({fleet.view()})")
    status = fleet.cli("d1", "cluster", "status", "--json")
    assert status.returncode == 0, status.stderr
    cli = json.loads(status.stdout)["nodes"]["d3"]
    assert cli["lost"] and not cli["live"] and cli["pipelines"] == [], cli
    assert "d3               lost" in fleet.cli("d1", "cluster", "status").stdout
    page = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10).read())
    assert page["cluster"]["nodes"]["d3"]["lost"] and not page["cluster"]["nodes"]["d3"]["live"], page["cluster"]
    finish(fleet)
