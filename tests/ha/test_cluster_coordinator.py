"""The cluster's coordinator and members against a real ZooKeeper, driven round by round (no node
processes): placement, a lost node reassigned only after the delay, fenced writes, operator
moves and drains, and a member's gate and hand-over."""

from __future__ import annotations

import threading

import pytest

from setl.errors import MetaStoreError
from setl.ha import Coordinator
from setl.ha.cluster import (
    ASSIGNMENTS,
    Assignment,
    ClusterCoordinator,
    ClusterMember,
    cluster_view,
    node_data,
    request_drain,
    request_move,
)
from setl.ha.coordinator import dumps
from setl.testing.servers import wait_until
from tests.ha.zk import SESSION_TIMEOUT, expire, unique_root

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    def __init__(self, hosts: str, pipelines: int = 4) -> None:
        self.hosts, self.root = hosts, unique_root()
        self.names = [f"p{i}" for i in range(pipelines)]
        self.sessions: dict[str, Coordinator] = {}
        self.admin = self.session()
        self.clock = Clock()
        self.coordinator = ClusterCoordinator(self.admin, "admin", reassign_after=5.0, clock=self.clock)

    def session(self) -> Coordinator:
        return Coordinator(self.hosts, root=self.root, session_timeout=SESSION_TIMEOUT).start()

    def join(self, node: str, capacity: int | None = None, weights: dict[str, int] | None = None,
             pins: dict[str, tuple[str, ...]] | None = None) -> Coordinator:
        co = self.sessions[node] = self.session()
        data = node_data(capacity, {p: ((weights or {}).get(p, 1), (pins or {}).get(p)) for p in self.names})
        co.create(f"/nodes/{node}", dumps(data), ephemeral=True, makepath=True)
        return co

    def leave(self, node: str) -> None:
        self.sessions.pop(node).stop()

    def owners(self) -> dict[str, str | None]:
        return {p: a.node if (a := Assignment.from_znode(self.admin.get(f"{ASSIGNMENTS}/{p}"))) else None
                for p in self.names}

    def close(self) -> None:
        for co in self.sessions.values():
            co.stop()
        self.admin.stop()

    def lead(self, body) -> None:
        """Run `body(election)` as the elected coordinator (kazoo's Election recipe)."""
        self.admin.ensure("/cluster/leader")
        election = self.admin.election("/cluster/leader", "admin")
        failures: list[BaseException] = []

        def run() -> None:
            try:
                body(election)
            except BaseException as exc:  # re-raised below, outside kazoo's lock
                failures.append(exc)

        election.run(run)
        if failures:
            raise failures[0]


@pytest.fixture
def rig(zookeeper_server):
    made = Rig(zookeeper_server.hosts)
    yield made
    made.close()


def test_pipelines_are_placed_balanced_and_a_lost_node_s_only_after_the_delay(rig):
    """Two nodes get 2 + 2; when one goes its pipelines stay assigned to it until reassign_after
    has passed (by the injected clock), then go to the survivor; versions only grow. The view
    shows the lost node (not live) meanwhile and after, rather than dropping it."""
    rig.join("a")
    rig.join("b")

    def body(election):
        rig.coordinator.round(election)
        owners = rig.owners()
        assert sorted(owners.values()) == ["a", "a", "b", "b"]
        before = {p: Assignment.from_znode(rig.admin.get(f"{ASSIGNMENTS}/{p}")) for p in rig.names}
        assert all(a is not None and a.standby not in (None, a.node) for a in before.values())
        rig.leave("b")
        rig.coordinator.round(election)
        assert rig.owners() == owners  # b may come back: nothing moves yet
        view = cluster_view(rig.admin)
        lost = view["nodes"].get("b")  # shown as lost with the pipelines it had, not gone, and owning none
        assert lost is not None and lost["live"] is False and lost["lost"] and len(lost["lost_pipelines"]) == 2, lost
        assert lost["pipelines"] == [] and all(row["node"] != "b" for row in view["pipelines"].values()), view
        rig.clock.now += 6
        rig.coordinator.round(election)
        assert set(rig.owners().values()) == {"a"}
        for p in rig.names:
            after = Assignment.from_znode(rig.admin.get(f"{ASSIGNMENTS}/{p}"))
            assert after is not None and after.version >= before[p].version  # type: ignore[union-attr]
        view = cluster_view(rig.admin)
        assert view["last_rebalance"]["to"] == "a" and view["moves"] == 2
        assert view["nodes"]["b"]["live"] is False and view["nodes"]["b"]["lost"]  # still shown: lost, not gone
        rig.coordinator.round(election)
        assert cluster_view(rig.admin)["nodes"]["b"]["lost"]  # remembered by the coordinator until it is back
        rig.join("b")
        rig.coordinator.round(election)
        assert cluster_view(rig.admin)["nodes"]["b"]["live"]

    rig.lead(body)


def test_a_joining_node_gets_its_share_one_move_per_round(rig):
    """All four on a; b joins: each round moves one pipeline (no mainstem is held, so each move is
    over by the next round), and two rounds even them out."""
    rig.join("a")

    def body(election):
        rig.coordinator.round(election)
        assert set(rig.owners().values()) == {"a"}
        rig.join("b")
        counts = []
        for _ in range(4):
            rig.coordinator.round(election)
            counts.append(sorted(rig.owners().values()).count("b"))
        assert counts == [1, 2, 2, 2]  # one move per round, then none: balanced

    rig.lead(body)


def test_a_deposed_coordinator_cannot_write(rig):
    """Writes check the coordinator's election node: once its session expired, a round fails."""
    rig.join("a")

    def body(election):
        rig.coordinator.round(election)
        request_move(rig.sessions["a"], "p0", "a")  # something to write
        rig.join("b")
        expire(rig.admin)
        rig.admin.wait_connected(10)
        with pytest.raises(MetaStoreError):
            rig.coordinator.round(election)

    try:
        rig.lead(body)
    except MetaStoreError:
        pass  # releasing the lock of an expired session


def test_operator_move_is_held_and_drain_empties_a_node(rig):
    """`move` puts a pipeline on the named node and balance leaves it there; `drain` moves a
    node's pipelines away, one per round; undo lets it take a share again."""
    rig.join("a")
    rig.join("b")

    def body(election):
        rig.coordinator.round(election)
        p = next(p for p, n in rig.owners().items() if n == "a")
        request_move(rig.admin, p, "b")
        for _ in range(6):
            rig.coordinator.round(election)
        owners = rig.owners()
        assert owners[p] == "b" and sorted(owners.values()) == ["a", "a", "b", "b"]
        assert cluster_view(rig.admin)["pipelines"][p]["held"]
        request_drain(rig.admin, "b")
        for _ in range(8):
            rig.coordinator.round(election)
        assert set(rig.owners().values()) == {"a"}
        assert cluster_view(rig.admin)["nodes"]["b"]["draining"]
        request_drain(rig.admin, "b", undo=True)
        for _ in range(8):
            rig.coordinator.round(election)
        assert sorted(rig.owners().values()) == ["a", "a", "b", "b"]

    rig.lead(body)


class FakeLease:
    def __init__(self) -> None:
        self.lost = False
        self.asked: list[tuple[str | None, bool]] = []
        self.event = threading.Event()

    def request_switch(self, to: str | None, *, operator: bool = True) -> None:
        self.asked.append((to, operator))
        self.event.set()


def test_a_member_contends_only_where_assigned_and_hands_over_a_moved_pipeline(rig):
    """A member may contend for its assigned pipelines, for its standby ones only when the owner
    crashed or is gone, never for others; a move away from it asks its lease to hand over."""
    rig.join("a")
    rig.join("b")
    member = ClusterMember(rig.sessions["b"], "b", rig.names)
    member.start()
    try:
        def body(election):
            rig.coordinator.round(election)
            mine = [p for p, n in rig.owners().items() if n == "b"]
            theirs = [p for p, n in rig.owners().items() if n == "a"]

            def seen() -> bool:
                return all(member.assignment(p) is not None for p in rig.names)

            wait_until(seen, timeout=10, message="the member to see the assignments")
            assert all(member.may_contend(p) for p in mine)
            assert not any(member.may_contend(p, {"released": True}) for p in theirs)
            assert all(member.may_contend(p, {"node": "a"}) for p in theirs)  # a crashed holder: b is their standby
            assert not any(member.may_contend(p, {}) for p in theirs)  # a never took them yet: left to a
            lease = FakeLease()
            member.leading(mine[0], lease)
            request_move(rig.admin, mine[0], "a")
            rig.coordinator.round(election)
            assert lease.event.wait(10)
            assert lease.asked == [("a", False)]

        rig.lead(body)
    finally:
        member.stop()


def test_pins_weights_and_capacity_as_the_nodes_publish_them(rig):
    """p0 pinned to b runs on b; a weight-3 pipeline counts as three; a node with capacity 2
    never gets more than 2; a pipeline no node has room for stays unassigned."""
    pins = {"p0": ("b",)}
    weights = {"p1": 3}
    rig.join("a", capacity=2, weights=weights, pins=pins)
    rig.join("b", capacity=4, weights=weights, pins=pins)

    def body(election):
        for _ in range(4):
            rig.coordinator.round(election)
        owners = rig.owners()
        assert owners["p0"] == "b" and owners["p1"] == "b"  # 1 + 3 = b's capacity
        assert owners["p2"] == owners["p3"] == "a"
        rig.leave("b")
        rig.coordinator.round(election)  # b is seen gone
        rig.clock.now += 6
        rig.coordinator.round(election)
        owners = rig.owners()
        assert owners["p0"] is None  # pinned to a lost node
        assert owners["p1"] is None  # weight 3 > a's capacity 2
        assert cluster_view(rig.admin)["nodes"]["a"]["weight"] == 2

    rig.lead(body)



def test_the_start_up_grace_waits_for_the_expected_nodes_then_places_all_at_once(rig):
    """Within the grace period nothing is placed while an expected node is missing; once both are
    live one round places 2 + 2 with no move. Without them, the grace runs out by the clock and
    the live node gets everything."""
    rig.coordinator = ClusterCoordinator(rig.admin, "admin", reassign_after=5.0, join_grace=10.0,
                                         expected=("a", "b"), clock=rig.clock)
    rig.coordinator.begin()
    rig.join("a")

    def body(election):
        rig.coordinator.round(election)
        assert set(rig.owners().values()) == {None}  # b is expected: nothing placed yet
        rig.join("b")
        rig.coordinator.round(election)
        assert sorted(rig.owners().values()) == ["a", "a", "b", "b"]
        assert cluster_view(rig.admin)["moves"] == 0  # placed, never moved

        rig.leave("b")
        rig.coordinator.begin()  # a new leadership: b is named in the assignments, so expected
        rig.coordinator.round(election)
        rig.clock.now += 6  # past reassign_after, still within the grace: b's pipelines wait
        rig.coordinator.round(election)
        assert sorted(rig.owners().values()) == ["a", "a", "b", "b"]
        rig.clock.now += 5  # the grace is over
        rig.coordinator.round(election)
        assert set(rig.owners().values()) == {"a"}

    rig.lead(body)


def test_expected_nodes_when_given_are_the_only_ones_the_grace_waits_for(rig):
    """With ``ha.expected_nodes`` set, a node named only in the assignments left from before (gone
    since) does not hold the grace: it ends once the expected nodes are live (docs/cluster.md)."""
    rig.coordinator = ClusterCoordinator(rig.admin, "admin", reassign_after=5.0, join_grace=10.0,
                                         expected=("a", "b"), clock=rig.clock)
    rig.coordinator.begin()
    rig.join("a")
    rig.join("b")

    def body(election):
        rig.coordinator.round(election)
        assert sorted(rig.owners().values()) == ["a", "a", "b", "b"]
        rig.leave("b")
        rig.coordinator = ClusterCoordinator(rig.admin, "admin", reassign_after=5.0, join_grace=10.0,
                                             expected=("a",), clock=rig.clock)
        rig.coordinator.begin()  # b is still named in the assignments, but not expected
        rig.coordinator.round(election)  # the grace is over at once: a, the only expected node, is live
        rig.clock.now += 6  # past reassign_after, well within what the grace would have been
        rig.coordinator.round(election)
        assert set(rig.owners().values()) == {"a"}

    rig.lead(body)


def test_the_running_coordinator_reacts_to_watches_not_to_its_poll(rig):
    """With the safety poll at 60 s, a node joining is placed on, and a second one given its share,
    within seconds: the rounds are woken by the /nodes watch and the holders' watches."""
    coordinator = ClusterCoordinator(rig.admin, "admin", reassign_after=5.0, interval=60.0)
    coordinator.start()
    try:
        assert coordinator.elected.wait(10)
        rig.join("a")
        wait_until(lambda: list(rig.owners().values()) == ["a"] * 4, timeout=10,
                   message=lambda: f"a to run all four ({rig.owners()})")
        rig.join("b")
        wait_until(lambda: sorted(map(str, rig.owners().values())) == ["a", "a", "b", "b"], timeout=15,
                   message=lambda: f"b to take its share ({rig.owners()})")
        assert cluster_view(rig.admin)["moves"] == 2
    finally:
        coordinator.stop()
