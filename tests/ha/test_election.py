"""The mainstem election, its leases and fences, and `Elections.run` around a real scheduler, on a
real ZooKeeper (in-process: deterministic timing, no binlog)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time

import pytest
import yaml

from setl.config import BatchSettings, LoadSettings, PipelineSettings
from setl.errors import LeadershipLost
from setl.ha import Elections, FencedLoad, FencedSelect, Mainstem
from setl.model import Batch, Position
from setl.pipeline import Stages, fenced
from setl.scheduler import Outcome, Scheduler
from setl.stages import Extract, Load, LoadCapabilities, Transform
from setl.testing.harness import MemorySink, ScriptedSource, insert, reference_state, update
from setl.testing.servers import free_port, wait_until
from tests.ha.proxy import TcpProxy
from tests.ha.zk import expire, stores

pytestmark = pytest.mark.timeout(60)


class Acquirer:
    """`mainstem.acquire` on its own thread, timed."""

    def __init__(self, mainstem: Mainstem) -> None:
        self.stop = threading.Event()
        self.lease = None
        self.took_at: float | None = None
        self.thread = threading.Thread(target=self._run, args=(mainstem,), name="test-acquirer")
        self.thread.start()

    def _run(self, mainstem: Mainstem) -> None:
        self.lease = mainstem.acquire(self.stop)
        self.took_at = time.monotonic()

    def join(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_standby_takes_over_only_after_the_delay(zookeeper_server):
    """When the holder's session ends, the standby contends no sooner than its standby delay."""
    with stores(zookeeper_server.hosts, 2) as (a, b):
        assert Mainstem(a.coordinator, "p", "a").acquire(threading.Event()) is not None
        standby = Acquirer(Mainstem(b.coordinator, "p", "b", standby_delay=0.8))
        try:
            wait_until(lambda: b.members("p") == ("a", ["b"]), timeout=5, message="b standing by")
            gone = time.monotonic()
            a.coordinator.stop()
            wait_until(lambda: standby.lease is not None, timeout=10, message="b to take over")
            assert standby.took_at - gone >= 0.8
            assert b.members("p") == ("b", [])
        finally:
            standby.join()


def test_the_standby_delay_counts_from_when_the_mainstem_was_first_seen_free(zookeeper_server):
    """Wake-ups during the standby delay (a cluster's gate changing as other pipelines move) do not
    start the delay again: the standby contends one delay after it saw the mainstem free."""
    callbacks: list = []

    def gate_changes(callback):
        callbacks.append(callback)
        return lambda: callbacks.remove(callback)

    with stores(zookeeper_server.hosts, 2) as (a, b):
        assert Mainstem(a.coordinator, "p", "a").acquire(threading.Event()) is not None
        standby = Acquirer(Mainstem(b.coordinator, "p", "b", standby_delay=2.0, gate=lambda info: True,
                                    gate_changes=gate_changes))
        try:
            wait_until(lambda: b.members("p") == ("a", ["b"]) and callbacks, timeout=5, message="b standing by")
            gone = time.monotonic()
            a.coordinator.stop()

            def nudged() -> bool:  # the gate changes every 0.3 s until b holds it
                for callback in list(callbacks):
                    callback()
                return standby.lease is not None

            wait_until(nudged, timeout=15, interval=0.3, message="b to take over")
            took = standby.took_at - gone
            assert 2.0 <= took < 2.0 + 2.0, f"took over {took:.1f}s after the holder went (the delay is 2 s)"
        finally:
            standby.join()


def test_holder_that_lost_it_takes_it_back_at_once(zookeeper_server):
    """A holder whose session expired re-takes the free mainstem at once, while the standby still waits."""
    with stores(zookeeper_server.hosts, 2) as (a, b):
        mine = Mainstem(a.coordinator, "p", "a", standby_delay=5)
        lease = mine.acquire(threading.Event())
        standby = Acquirer(Mainstem(b.coordinator, "p", "b", standby_delay=5))
        try:
            wait_until(lambda: "b" in b.members("p")[1], timeout=5, message="b standing by")
            expire(a.coordinator)
            wait_until(lambda: lease.lost, timeout=10, message="a to notice")
            started = time.monotonic()
            again = mine.acquire(threading.Event())
            assert again is not None and again.term > lease.term
            assert time.monotonic() - started < 2.5
            assert standby.lease is None and b.members("p")[0] == "a"
        finally:
            standby.join()


def test_switch_hands_over_to_the_standby_at_once(zookeeper_server):
    """A switch request reaches the holder; its release lets the named standby take over without delay."""
    with stores(zookeeper_server.hosts, 3) as (a, b, cli):
        mine = Mainstem(a.coordinator, "p", "a", standby_delay=5, handover_timeout=30)
        lease = mine.acquire(threading.Event())
        cancel = mine.watch(lease)
        asked = threading.Event()
        lease.on_switch(asked.set)
        standby = Acquirer(Mainstem(b.coordinator, "p", "b", standby_delay=5))
        try:
            wait_until(lambda: "b" in cli.members("p")[1], timeout=5, message="b standing by")
            assert cli.request_switch("p", "b") == "a"
            wait_until(asked.is_set, timeout=5, message="the holder to hear the switch request")
            assert lease.switch_to == "b"
            released = time.monotonic()
            cancel()
            mine.release(lease, to=lease.switch_to)
            wait_until(lambda: standby.lease is not None, timeout=3, message="b to take over")
            assert standby.took_at - released < 1.5
            mine_again = Acquirer(mine)  # the releaser waits out the handover instead of re-taking it
            wait_until(lambda: "a" in cli.members("p")[1], timeout=5, message="a standing by")
            assert cli.members("p")[0] == "b" and mine_again.lease is None
            mine_again.join()
        finally:
            standby.join()


def test_fenced_stages_refuse_once_the_lease_is_lost(zookeeper_server):
    """After the session expires, the fenced Select and Load raise LeadershipLost without touching the inner stage."""
    with stores(zookeeper_server.hosts, 1) as (a,):
        lease = Mainstem(a.coordinator, "p", "a").acquire(threading.Event())
        source, sink = ScriptedSource([[insert("t", {"id": 1})]]), MemorySink()
        select, load = FencedSelect(lease, source), FencedLoad(lease, sink)
        select.open(None)
        assert select.poll(0.1) is not None
        expire(a.coordinator)
        wait_until(lambda: lease.lost, timeout=10, message="the lease to be lost")
        source.append([insert("t", {"id": 2})])
        with pytest.raises(LeadershipLost):
            select.poll(0.1)
        batch = Batch("p", 1, 1, Position("scripted", 0), Position("scripted", 1), ())
        with pytest.raises(LeadershipLost):
            load.load(batch)
        assert source.tell() == Position("scripted", 1) and sink.loads == []


def test_suspended_connection_pauses_selecting_until_it_is_back(zookeeper_server):
    """While ZooKeeper is unreachable (shorter than the session timeout) the fenced Select returns nothing;
    then it reads on.

    The connection is cut and healed through a TCP proxy (a partition, not a ZooKeeper restart: a
    JVM's restart took over 19 s once on a loaded machine, past any session this server allows).
    """
    proxy = TcpProxy(zookeeper_server.hosts).start()
    with contextlib.closing(proxy), stores(proxy.address, 1, session_timeout=10) as (a,):
        lease = Mainstem(a.coordinator, "p", "a").acquire(threading.Event())
        source = ScriptedSource([[insert("t", {"id": i})] for i in range(3)])
        select = FencedSelect(lease, source)
        select.open(None)
        proxy.cut()
        wait_until(lambda: not a.coordinator.connected, timeout=10, message="the connection to drop")
        assert select.poll(0.2) is None and source.tell() == Position("scripted", 0)
        proxy.heal()
        wait_until(lambda: select.poll(0.2) is not None, timeout=20, message="polling to resume")
        assert not lease.lost and source.tell() == Position("scripted", 1)


@pytest.mark.parametrize("mode", ["ordered", "per_table"])
def test_elections_run_hands_a_pipeline_over_without_losing_or_reordering(zookeeper_server, mode):
    """Two nodes' `Elections.run` on one source and sink: after the holder's session expires mid-stream, the
    other finishes it; the sink equals the reference and the ack history's epochs never go back."""
    transactions = [[insert("t", {"id": i % 20, "v": i})] if i < 20 else
                    [update("t", {"id": i % 20, "v": i - 20}, {"id": i % 20, "v": i})] for i in range(400)]
    source, sink = ScriptedSource(transactions), MemorySink(holds_position=True)
    settings = PipelineSettings(parallelism=2, batch=BatchSettings(max_rows=5, max_wait_ms=5),
                                load=LoadSettings(mode=mode))
    with stores(zookeeper_server.hosts, 2) as (a, b):
        outcomes: dict[str, list[Outcome]] = {"a": [], "b": []}
        running: dict[str, Scheduler] = {}
        stop = threading.Event()

        def node(store, name: str, slow: float) -> None:
            elections = Elections(store.coordinator, name, standby_delay=0)

            def lead(lease) -> Outcome:  # the leadership: fenced stages and a scheduler on them
                stages = fenced(Stages(source, Extract(), Transform(), SlowLoad(sink, slow)), lease)
                scheduler = Scheduler("p", settings, stages.select, stages.extract, stages.transform, stages.load,
                                      store, node_id=name)
                running[name] = scheduler
                lease.on_switch(scheduler.stop)
                try:
                    outcome = scheduler.run()
                except LeadershipLost:
                    outcome = Outcome.LOST
                return Outcome.LOST if lease.lost else outcome

            while not stop.is_set():
                outcome = elections.run("p", lead, stop=stop)
                if outcome is not None:
                    outcomes[name].append(outcome)

        threads = [threading.Thread(target=node, args=(a, "a", 0.01), name="test-node-a")]
        threads[0].start()
        wait_until(lambda: a.position("p") is not None and a.position("p").batch_id >= 5, timeout=20,
                   message="a few acks by a")
        threads.append(threading.Thread(target=node, args=(b, "b", 0.0), name="test-node-b"))
        threads[1].start()
        wait_until(lambda: "b" in a.members("p")[1], timeout=10, message="b standing by")
        expire(a.coordinator)
        wait_until(lambda: a.members("p")[0] == "b" or b.members("p")[0] == "b", timeout=10,
                   message="b to take over")
        wait_until(lambda: (ack := b.position("p")) is not None and ack.position == source.head(), timeout=30,
                   message="the stream to be acked")
        stop.set()
        for scheduler in running.values():  # as Node.stop does
            scheduler.stop()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        assert Outcome.LOST in outcomes["a"]
        assert sink.tables == reference_state(transactions)
        epochs = [ack.epoch for ack in reversed(b.history("p", 10_000))]
        assert epochs == sorted(epochs)


class SlowLoad(Load):
    """A MemorySink load that takes `delay` seconds, so the handover happens mid-stream."""

    capabilities = LoadCapabilities(per_table=True)

    def __init__(self, sink: MemorySink, delay: float) -> None:
        self.sink, self.delay = sink, delay

    def load(self, batch: Batch) -> None:
        time.sleep(self.delay)
        self.sink.load(batch)

    def load_part(self, batch: Batch) -> None:
        time.sleep(self.delay)
        self.sink.load_part(batch)

    def mark_loaded(self, batch: Batch) -> None:
        self.sink.mark_loaded(batch)

    def committed(self):
        return self.sink.committed()


@pytest.mark.parametrize(("ha", "message"), [
    ({"session_timeout_ms": 50}, "ha.session_timeout_ms: must be between"),
    ({"standby_delay_ms": -1}, "ha.standby_delay_ms: must not be negative"),
    ({"chroot": "setl/"}, "ha.chroot: 'setl/' must start with '/'"),
    ({"zookeeper": None}, "ha.zookeeper: required when meta.store is zookeeper"),
])
def test_bad_ha_settings_are_one_line_config_errors(tmp_path, ha, message):
    """Wrong HA settings fail `setl start` with exit code 2 and one line naming the key."""
    (tmp_path / "setl.yaml").write_text(yaml.safe_dump(
        {"meta": {"store": "zookeeper"}, "ha": {"zookeeper": "127.0.0.1:1", **ha}}))
    done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(tmp_path), "status"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_unreachable_zookeeper_is_a_one_line_error(tmp_path):
    """A node whose ZooKeeper cannot be reached exits 1 with one line naming the hosts."""
    hosts = f"127.0.0.1:{free_port()}"
    (tmp_path / "setl.yaml").write_text(yaml.safe_dump(
        {"meta": {"store": "zookeeper"}, "ha": {"zookeeper": hosts, "session_timeout_ms": 1000}}))
    done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(tmp_path), "status"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"setl: error: cannot reach ZooKeeper at {hosts}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_switch_without_a_standby_is_a_one_line_error(tmp_path, zookeeper_server):
    """`setl switch` with nobody standing by fails in one line naming pipeline and holder; `setl status` shows it."""
    with stores(zookeeper_server.hosts, 1) as (a,):
        Mainstem(a.coordinator, "p", "node-a").acquire(threading.Event())
        (tmp_path / "setl.yaml").write_text(yaml.safe_dump(
            {"meta": {"store": "zookeeper"},
             "ha": {"zookeeper": zookeeper_server.hosts, "chroot": a.coordinator.root}}))

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(tmp_path), *args],
                                  capture_output=True, text=True, timeout=60)

        done = cli("switch", "--pipeline", "p")
        assert done.returncode == 1
        assert done.stderr.strip() == ("setl: error: pipeline=p: no node stands by for it (holder node-a); "
                                       "nothing to switch to")
        status = cli("status")
        assert status.returncode == 0 and "holder" in status.stdout and "node-a" in status.stdout


def test_a_standby_registration_unkept_while_the_keeper_reregisters_it_stays_gone(zookeeper_server, monkeypatch):
    """After a new session the keeper re-creates the standby node from a snapshot; a holder that
    takes the mainstem meanwhile (unkeep) is not listed among its own standbys (the ZooKeeper outage bug)."""
    with stores(zookeeper_server.hosts, 1) as (store,):
        co = store.coordinator
        path = "/pipelines/p/standbys/a"
        co.ensure("/pipelines/p/standbys")
        in_claim, go_on = threading.Event(), threading.Event()
        claim = co.claim

        def slow_claim(claimed: str, data: bytes, **kw) -> None:
            if claimed == path:
                in_claim.set()
                go_on.wait(10)
            claim(claimed, data, **kw)

        monkeypatch.setattr(co, "claim", slow_claim)
        co.keep(path, b"{}")  # wakes the keeper, which snapshots the kept paths and claims this one
        assert in_claim.wait(10), "the keeper did not re-register"
        unkept = threading.Thread(target=co.unkeep, args=(path,))
        unkept.start()
        time.sleep(0.2)  # unkeep runs while the keeper is between its snapshot and its create
        go_on.set()
        unkept.join(10)
        assert not unkept.is_alive()
        time.sleep(0.3)
        assert co.get(path) is None
        assert store.members("p") == (None, [])


def test_elections_run_calls_the_leadership_with_the_lease_and_releases_after_it(zookeeper_server):
    """`Elections.run(pipeline, func)` returns func(lease)'s value and then frees the mainstem (another
    node takes it at once); a node stopped while standing by gets None and never calls func."""
    with stores(zookeeper_server.hosts, 2) as (a, b):
        first, second = Elections(a.coordinator, "a", standby_delay=0), Elections(b.coordinator, "b", standby_delay=0)
        seen = []

        def leadership(lease) -> str:
            seen.append((lease.node_id, a.members("p")[0]))
            return "done"

        assert first.run("p", leadership, stop=threading.Event()) == "done"
        assert seen == [("a", "a")] and a.members("p") == (None, [])
        held, stop_a = threading.Event(), threading.Event()
        result: list = []
        holder = threading.Thread(target=lambda: second.run("p", lambda lease: held.set() or stop_a.wait(10),
                                                            stop=threading.Event()))
        holder.start()
        assert held.wait(10), "b did not take the released mainstem at once"
        standby = threading.Thread(target=lambda: result.append(first.run("p", leadership, stop=stop_a)))
        standby.start()
        wait_until(lambda: b.members("p") == ("b", ["a"]), timeout=10, message="a standing by")
        stop_a.set()
        standby.join(10)
        holder.join(10)
        assert result == [None] and seen == [("a", "a")]
