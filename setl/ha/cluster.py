"""Scale-out: pipelines spread over the nodes that share one ZooKeeper (docs/cluster.md).

One node, elected with kazoo's ``Election`` recipe, is the cluster's *coordinator*
(`ClusterCoordinator`): it reads the live nodes and the running holders, asks
`setl.ha.assign.plan` where each pipeline should run, and writes one assignment node per pipeline.
Every node's `ClusterMember` reads those assignments: the node contends for a pipeline's mainstem
only while assigned (or as its standby once its owner's node is gone), and hands a pipeline it
runs over, at a batch boundary, when the coordinator moves it away. The mainstem election and its
term fence (`setl.ha.election`) stay what decides who writes, so a hand-over never has two writers.

ZooKeeper paths (under ``ha.chroot``):

``/nodes/ID``
    ephemeral (`Elections.register`), now with ``{"capacity", "pipelines": {NAME: {"weight", "nodes"}}}``
    and, when the node serves the control API, ``"api"``: its base URL (scheme, host, port), which
    the other nodes forward requests for the pipelines it holds to (`holder_api`).
``/cluster/leader``
    the coordinator's election (kazoo's lock nodes).
``/cluster/assignments/NAME``
    persistent, written only by the coordinator, each write conditional on the version it read
    and on its leadership node: ``{"node", "standby", "from", "held", "since", "reason"}``
    (``from``: the node a move in flight takes it from; ``held``: put there by an operator).
``/cluster/drain/ID``, ``/cluster/moves/NAME``
    an operator's requests (`setl cluster drain`, `setl cluster move`: ``{"to"}``).
``/cluster/state``
    the coordinator's summary: ``{"coordinator", "since", "last_rebalance", "moves"}``.

Nothing polls at a fast pace: the coordinator re-plans when a ZooKeeper watch fires (a node joins
or goes, a drain mark or a move request, a pipeline's mainstem changes hands), when a deadline it
keeps falls due (a lost node's `reassign_after`, the start-up grace, a stuck move), and every
`SAFETY_POLL` seconds as a safety net; the members hear of assignments and live nodes by watches
and wake their mainstem elections at once (`ClusterMember.on_change`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import attrs

from setl.errors import MetaStoreError
from setl.ha.assign import NodeSpec, PipelineSpec, plan
from setl.ha.coordinator import Conflict, Coordinator, Create, LeaderElection, Op, SetData, ZNode, dumps

log = logging.getLogger("setl.ha.cluster")

ASSIGNMENTS = "/cluster/assignments"
DRAIN = "/cluster/drain"
MOVES = "/cluster/moves"
STATE = "/cluster/state"
LEADER = "/cluster/leader"

#: A move whose old owner still holds the pipeline after this long is given up (logged).
MOVE_TIMEOUT = 120.0
#: The slow poll kept as a safety net under the watches (a missed or late watch event costs at
#: most this long), for the coordinator's rounds and the members' mainstem elections.
SAFETY_POLL = 2.0
#: After a failed or conflicting round, the coordinator reads again this soon.
RETRY_ROUND = 0.5


class Handover(Protocol):
    """What a member needs of a lease it runs (`setl.ha.fencing.Lease`)."""

    @property
    def lost(self) -> bool: ...

    def request_switch(self, to: str | None, *, operator: bool = True) -> None: ...


@attrs.frozen
class Assignment:
    """One pipeline's assignment as the coordinator wrote it."""

    node: str | None
    standby: str | None = None
    source: str | None = None  # ``from``: the node a move in flight takes it from
    held: bool = False
    since: float = 0.0
    reason: str = ""
    version: int = -1  # of its znode; -1: none yet

    @classmethod
    def from_znode(cls, znode: ZNode | None) -> "Assignment | None":
        if znode is None:
            return None
        data = znode.json()
        return cls(data.get("node"), data.get("standby"), data.get("from"), bool(data.get("held")),
                   float(data.get("since") or 0.0), str(data.get("reason") or ""), znode.version)

    def dumps(self) -> bytes:
        return dumps({"node": self.node, "standby": self.standby, "from": self.source, "held": self.held,
                      "since": self.since, "reason": self.reason})


def node_data(capacity: int | None, pipelines: Mapping[str, tuple[int, tuple[str, ...] | None]]) -> dict[str, Any]:
    """What a node publishes in `/nodes/ID` for the coordinator: its capacity and its pipelines."""
    return {"capacity": capacity,
            "pipelines": {name: {"weight": weight, "nodes": list(nodes) if nodes is not None else None}
                          for name, (weight, nodes) in sorted(pipelines.items())}}


# --- a node's side ---------------------------------------------------------------------------


class ClusterMember:
    """This node's view of the assignments of the pipelines it is configured with.

    `may_contend` gates the mainstem election (`setl.ha.election.Mainstem`); `leading` tells the
    member of a lease this node took, so it can hand the pipeline over (`Lease.request_switch`,
    which drains in-flight batches and releases the mainstem to the new owner) when the
    coordinator moves it away.
    """

    def __init__(self, coordinator: Coordinator, node_id: str, pipelines: list[str]) -> None:
        self.coordinator = coordinator
        self.node_id = node_id
        self.pipelines = list(pipelines)
        self._lock = threading.Lock()
        self._assignments: dict[str, Assignment | None] = dict.fromkeys(self.pipelines)
        self._live: set[str] = set()
        self._leases: dict[str, Handover] = {}
        self._cancels: list[Callable[[], None]] = []
        self._listeners: dict[str, list[Callable[[], None]]] = {}

    def start(self) -> None:
        self.coordinator.ensure(ASSIGNMENTS)
        self._cancels.append(self.coordinator.watch_children("/nodes", self._nodes_changed))
        for name in self.pipelines:
            self._cancels.append(self.coordinator.watch(f"{ASSIGNMENTS}/{name}",
                                                        functools.partial(self._assigned, name)))

    def stop(self) -> None:
        for cancel in self._cancels:
            cancel()
        self._cancels.clear()

    def on_change(self, name: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` (on kazoo's thread: it must not block, e.g. set an event) whenever what
        `may_contend` answers for `name` may have changed: its assignment, or the live nodes.
        Returns the function that stops it."""
        with self._lock:
            self._listeners.setdefault(name, []).append(callback)

        def cancel() -> None:
            with self._lock:
                listeners = self._listeners.get(name, [])
                if callback in listeners:
                    listeners.remove(callback)

        return cancel

    def _notify(self, names: list[str]) -> None:
        with self._lock:
            callbacks = [c for name in names for c in self._listeners.get(name, [])]
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a listener must not stop the others
                log.exception("cluster: a change listener failed")

    def _nodes_changed(self, children: list[str]) -> None:
        with self._lock:
            self._live = set(children)
        self._notify(self.pipelines)

    def _assigned(self, name: str, znode: ZNode | None) -> None:
        assignment = Assignment.from_znode(znode)
        with self._lock:
            self._assignments[name] = assignment
            lease = self._leases.get(name)
        if lease is not None:
            self._hand_over_if_moved(name, assignment, lease)
        self._notify([name])

    def assignment(self, name: str) -> Assignment | None:
        with self._lock:
            return self._assignments.get(name)

    def may_contend(self, name: str, term: Mapping[str, Any] | None = None) -> bool:
        """Whether this node may take `name`'s free mainstem now, `term` being the data of its term
        node: it is assigned here; or this node is its standby (the hot standby) and its owner's
        node is gone, or the owner held the mainstem and lost it without releasing it (expired
        session). A deliberate release (a stop, a hand-over), and an owner that has not taken a
        pipeline newly placed on it yet, are left to the owner."""
        with self._lock:
            assignment = self._assignments.get(name)
            live = set(self._live)
        if assignment is None or assignment.node is None:
            return False
        if assignment.node == self.node_id:
            return True
        if assignment.standby not in (self.node_id, None) and assignment.standby in live:
            return False  # another node is its standby (none yet, or gone: any node stands in)
        info = term or {}
        return assignment.node not in live or (info.get("node") == assignment.node and not info.get("released"))

    def leading(self, name: str, lease: Handover) -> None:
        """This node holds `name` under `lease`; hand it over when it is moved away."""
        with self._lock:
            self._leases[name] = lease
            assignment = self._assignments.get(name)
        self._hand_over_if_moved(name, assignment, lease)

    def not_leading(self, name: str) -> None:
        with self._lock:
            self._leases.pop(name, None)

    def _hand_over_if_moved(self, name: str, assignment: Assignment | None, lease: Handover) -> None:
        # Only a move away from this node hands over: a standby that took a lost node's pipeline
        # keeps it until the coordinator writes it as the owner.
        if assignment is None or assignment.node in (None, self.node_id) or assignment.source != self.node_id:
            return
        if not lease.lost:
            log.info("pipeline=%s cluster: moved to %s (%s); handing over at the next batch boundary",
                     name, assignment.node, assignment.reason or "rebalance")
            lease.request_switch(assignment.node, operator=False)


# --- the coordinator --------------------------------------------------------------------------


@attrs.frozen
class NodeInfo:
    name: str
    capacity: int | None
    pipelines: dict[str, dict[str, Any]]
    host: str = ""
    pid: int = 0
    api: str | None = None  # the base URL of its control API; None: it serves none


def read_nodes(coordinator: Coordinator) -> dict[str, NodeInfo]:
    """The live nodes and what they published."""
    found = {}
    for name in coordinator.children("/nodes"):
        znode = coordinator.get(f"/nodes/{name}")
        if znode is None:
            continue
        data = znode.json()
        found[name] = NodeInfo(name, data.get("capacity"), dict(data.get("pipelines") or {}),
                               str(data.get("host") or ""), int(data.get("pid") or 0),
                               str(data["api"]) if data.get("api") else None)
    return found


def holder_of(coordinator: Coordinator, pipeline: str) -> str | None:
    znode = coordinator.get(f"/pipelines/{pipeline}/mainstem")
    return None if znode is None else znode.json().get("node")


@attrs.frozen
class Holder:
    """The node that holds a pipeline's mainstem now, and its control API's base URL as it
    registered it (None: it serves no API, or it is no longer registered)."""

    node: str
    api: str | None
    registered: bool


def holder_api(coordinator: Coordinator, pipeline: str) -> Holder | None:
    """Who holds `pipeline` now and where its API answers; None when nobody holds it (stopped,
    or between two holders)."""
    node = holder_of(coordinator, pipeline)
    if node is None:
        return None
    znode = coordinator.get(f"/nodes/{node}")
    if znode is None:
        return Holder(str(node), None, False)
    api = znode.json().get("api")
    return Holder(str(node), str(api) if api else None, True)


class ClusterCoordinator:
    """Contends for the cluster's coordinator in kazoo's ``Election`` recipe; while elected,
    re-plans (`round`) when a watch fires or a deadline falls due, and at least every `interval`
    seconds. `on_rebalanced(pipeline, details)` hears of each pipeline placed or moved (the
    ``rebalanced`` alert).

    Start-up grace: for `join_grace` seconds after it is elected, the coordinator places no
    pipeline and moves none for balance, unless every node it expects is live (`expected`, the
    nodes pinned by a pipeline and those named in the assignments left from before), so that the
    first node of a starting cluster does not take everything and then hand pipelines over one by
    one. Pipelines already assigned to a live node run meanwhile, standbys take over as ever.
    """

    def __init__(self, coordinator: Coordinator, node_id: str, *, reassign_after: float, join_grace: float = 0.0,
                 expected: Collection[str] = (), interval: float = SAFETY_POLL,
                 on_rebalanced: Callable[[str, dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.coordinator = coordinator
        self.node_id = node_id
        self.reassign_after = reassign_after
        self.join_grace = join_grace
        self.expected = frozenset(expected)
        self.interval = interval
        self.on_rebalanced = on_rebalanced
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._election: LeaderElection | None = None
        self._gone_since: dict[str, float] = {}
        self._moving_since: dict[str, float] = {}
        self._grace_until: float | None = None  # None: not in a grace period
        self._due: float | None = None  # the next deadline the last round found
        self._wake: threading.Event | None = None  # set by the watches while leading
        self._watched: dict[str, Callable[[], None]] = {}  # pipeline -> cancels its mainstem watch
        self.elected = threading.Event()

    # -- life

    def start(self) -> None:
        self._thread = threading.Thread(target=self._contend, name="setl-cluster-coordinator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        election = self._election
        if election is not None:
            election.cancel()
        if self._wake is not None:
            self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _contend(self) -> None:
        while not self._stop.is_set():
            if not self.coordinator.wait_connected(0.5):
                continue
            try:
                self.coordinator.ensure(LEADER)
                self._election = self.coordinator.election(LEADER, self.node_id)
                if self._stop.is_set():
                    return
                self._election.run(self._lead)
            except MetaStoreError as exc:
                log.warning("cluster: coordinator election: %s", exc)
            except Exception:  # never let the thread die silently
                log.exception("cluster: coordinator failed")
            finally:
                self.elected.clear()
            self._stop.wait(0.5)

    def begin(self) -> None:
        """A new leadership: forget the last one's timers and start the grace period."""
        self._gone_since.clear()
        self._moving_since.clear()
        self._grace_until = self.clock() + self.join_grace if self.join_grace > 0 else None

    def _lead(self) -> None:
        election = self._election
        assert election is not None
        session = self.coordinator.session_id
        log.info("cluster: this node (%s) coordinates the cluster", self.node_id)
        self.elected.set()
        self.begin()
        self._write_state({"coordinator": self.node_id, "since": time.time()}, election)
        wake = self._wake = threading.Event()
        cancels = [self.coordinator.watch_children(path, lambda _children: wake.set())
                   for path in ("/nodes", DRAIN, MOVES)]
        try:
            self._rounds(election, session, wake)
        finally:
            self._wake = None
            for cancel in [*cancels, *self._watched.values()]:
                cancel()
            self._watched.clear()

    def _rounds(self, election: LeaderElection, session: int, wake: threading.Event) -> None:
        while not self._stop.is_set():
            if self.coordinator.session_id != session:
                log.warning("cluster: the ZooKeeper session changed; contending for the coordinator again")
                return
            delay = self.interval
            if self.coordinator.connected:
                try:
                    self.round(election)
                    if self._due is not None:
                        delay = min(delay, max(0.05, self._due - self.clock()))
                except Conflict as exc:  # another coordinator wrote, or ours is gone
                    log.info("cluster: assignment round conflicted (%s); reading again", exc)
                    delay = RETRY_ROUND
                except MetaStoreError as exc:
                    log.warning("cluster: assignment round failed: %s", exc)
                    delay = RETRY_ROUND
            wake.wait(delay)  # a watch fired (a node, drain, move request or holder changed): at once
            wake.clear()

    def _watch_holders(self, names: Collection[str]) -> None:
        """While leading: wake a round when a pipeline's mainstem changes hands (a hand-over done,
        a standby took over, a holder stopped)."""
        wake = self._wake
        if wake is None:
            return

        def changed(_node: ZNode | None) -> None:
            wake.set()

        for name in names:
            if name not in self._watched:
                self._watched[name] = self.coordinator.watch(f"/pipelines/{name}/mainstem", changed)

    # -- one round

    def round(self, election: LeaderElection) -> None:
        """Read the cluster, plan, and write what changed (each write fenced by `election`)."""
        co = self.coordinator
        now = self.clock()
        co.ensure(ASSIGNMENTS)
        nodes = read_nodes(co)
        draining = set(co.children(DRAIN))
        specs: dict[str, PipelineSpec] = {}
        configured: dict[str, set[str]] = {}
        for info in nodes.values():
            for name, spec in info.pipelines.items():
                configured.setdefault(name, set()).add(info.name)
                if name not in specs:
                    pinned = spec.get("nodes")
                    specs[name] = PipelineSpec(name, int(spec.get("weight") or 1),
                                               frozenset(pinned) if pinned is not None else None)
        specs = {name: attrs.evolve(spec, configured_on=frozenset(configured[name])) for name, spec in specs.items()}
        node_specs = {n: NodeSpec(n, info.capacity, n in draining) for n, info in nodes.items()}
        assignments = {name: Assignment.from_znode(co.get(f"{ASSIGNMENTS}/{name}")) for name in specs}
        self._watch_holders(specs)  # before reading the holders: a change after the read wakes the next round
        holders = {name: holder_of(co, name) for name in specs}
        settling = self._settling(now, specs, assignments, set(nodes))

        for gone in [n for n in self._gone_since if n in nodes]:
            del self._gone_since[gone]
        self._remember_lost(assignments, holders, set(nodes), election)
        current: dict[str, str | None] = {}
        standbys: dict[str, str | None] = {}
        updates: dict[str, tuple[Assignment, str]] = {}  # pipeline -> (new assignment, why)
        waiting: set[str] = set()  # owner gone, not yet reassigned: left alone this round
        moving = False
        for name in specs:
            old = assignments[name]
            holder = holders[name]
            owner = old.node if old is not None else None
            if old is not None and old.source is not None:
                started = self._moving_since.setdefault(name, now)
                if holder == old.source and now - started < MOVE_TIMEOUT:
                    moving = True
                else:
                    if holder == old.source:
                        log.warning("pipeline=%s cluster: %s did not hand over to %s in %.0fs; giving the move up",
                                    name, old.source, old.node, MOVE_TIMEOUT)
                    self._moving_since.pop(name, None)
                    updates[name] = (attrs.evolve(old, source=None), "")
            elif holder is not None and holder != owner and holder in nodes:
                owner = holder  # a standby took it over: it runs there now
                updates[name] = (Assignment(holder, held=False, since=time.time(), reason="taken over by a standby"),
                                 "taken over by a standby")
            elif owner is not None and owner not in nodes:
                gone_at = self._gone_since.setdefault(owner, now)
                if now - gone_at < self.reassign_after:
                    waiting.add(name)
            current[name] = owner
            standbys[name] = old.standby if old is not None else None

        held = {name for name, a in assignments.items() if a is not None and a.held}
        requested = self._move_requests(specs, node_specs, current, moving)
        if requested is not None:
            name, target = requested
            old_owner = current[name]
            current[name] = target
            held.add(name)
            moving = True
            reason = "moved by an operator"
            self._moving_since[name] = now
            updates[name] = (Assignment(target, source=holders[name] or old_owner, held=True, since=time.time(),
                                        reason=reason), reason)

        planned_specs = {n: s for n, s in specs.items() if n not in waiting}
        if settling:  # the start-up grace: only pipelines running on a live node, nothing placed or moved
            planned_specs = {n: s for n, s in planned_specs.items() if current[n] in nodes}
        result = plan(planned_specs, node_specs, current, standbys=standbys, held=held,
                      balance=not moving and not settling)
        moved_one = moving
        for name in sorted(planned_specs):
            owner = result.owners[name]
            if owner == current[name]:
                base = updates[name][0] if name in updates else assignments[name]
                if base is not None and base.standby != result.standbys[name]:
                    why = updates[name][1] if name in updates else ""
                    updates[name] = (attrs.evolve(base, standby=result.standbys[name]), why)
                continue
            running_on = holders[name] if holders[name] in nodes else None
            if running_on is not None and running_on != owner:
                # it runs now: this is a hand-over, one at a time
                if moved_one:
                    continue
                moved_one = True
                self._moving_since[name] = now
                why = "drained or unpinned" if name in result.placed else "rebalanced"
            else:
                running_on = None
                why = "placed"
            if owner is None:
                why = "no eligible node"
            updates[name] = (Assignment(owner, result.standbys[name], running_on, name in held and owner is not None,
                                        time.time(), why), why)

        dues = [since + self.reassign_after for since in self._gone_since.values()]
        dues += [since + MOVE_TIMEOUT for since in self._moving_since.values()]
        if settling and self._grace_until is not None:
            dues.append(self._grace_until)
        dues = [due for due in dues if due > now]
        if updates:  # what it wrote may allow the next step (a move without a running holder is done)
            dues.append(now)
        self._due = min(dues) if dues else None
        for name, (new, why) in sorted(updates.items()):
            self._write(name, assignments[name], new, election)
            old = assignments[name]
            if why and (old is None or old.node != new.node):
                details = {"from": old.node if old is not None else None, "to": new.node, "reason": why}
                log.info("pipeline=%s cluster: %s -> %s (%s)", name, details["from"], new.node, why)
                if old is not None:  # a first placement is no rebalance
                    self._rebalanced(name, details, election)

    def _remember_lost(self, assignments: Mapping[str, Assignment | None], holders: Mapping[str, str | None],
                       live: set[str], election: LeaderElection) -> None:
        """Keep the nodes that left while an assignment or a mainstem named them in the state's
        ``lost`` (with when they were first missed) until they register again, so that the view
        shows them lost after their pipelines went elsewhere, rather than dropping them."""
        named = {n for a in assignments.values() if a is not None for n in (a.node, a.standby, a.source) if n}
        named |= {h for h in holders.values() if h}
        znode = self.coordinator.get(STATE)
        known: dict[str, float] = dict((znode.json() if znode is not None else {}).get("lost") or {})
        lost = {n: since for n, since in known.items() if n not in live}
        lost.update({n: time.time() for n in named - live if n not in lost})
        if lost != known:
            self._write_state({"lost": lost}, election)

    def _settling(self, now: float, specs: Mapping[str, PipelineSpec], assignments: Mapping[str, Assignment | None],
                  live: set[str]) -> bool:
        """Whether the start-up grace still holds: it ends when it has lasted `join_grace`, or once
        every expected node is live: `expected` (``ha.expected_nodes``) when given, else the pinned
        nodes and the nodes named in the assignments (docs/cluster.md)."""
        if self._grace_until is None:
            return False
        expected = set(self.expected)
        if not expected:
            for spec in specs.values():
                expected |= spec.nodes or set()
            for assignment in assignments.values():
                if assignment is not None:
                    expected |= {n for n in (assignment.node, assignment.standby) if n is not None}
        if now < self._grace_until and not (expected and expected <= live):
            return True
        waited = self.join_grace - max(0.0, self._grace_until - now)
        log.info("cluster: start-up grace over after %.1fs (%s)", waited,
                 "every expected node is live" if now < self._grace_until else
                 f"live: {', '.join(sorted(live))}; not yet: {', '.join(sorted(expected - live)) or '-'}")
        self._grace_until = None
        return False

    def _move_requests(self, specs: Mapping[str, PipelineSpec], nodes: Mapping[str, NodeSpec],
                       current: Mapping[str, str | None], moving: bool) -> tuple[str, str] | None:
        """The next operator's move request to carry out (one, and none while a move is in flight);
        requests that cannot be carried out are dropped with a warning."""
        co = self.coordinator
        for name in co.children(MOVES):
            znode = co.get(f"{MOVES}/{name}")
            if znode is None:
                continue
            target = str(znode.json().get("to"))
            spec = specs.get(name)
            problem = None
            if spec is None:
                problem = "no live node is configured with it"
            elif target not in nodes:
                problem = f"node {target} is not live"
            elif nodes[target].draining or (spec.nodes is not None and target not in spec.nodes) or (
                    spec.configured_on is not None and target not in spec.configured_on):
                problem = f"node {target} may not run it (draining, pinned elsewhere or not configured)"
            if problem is None and current.get(name) == target:
                problem = "it is assigned there already"
            if problem is None and moving:
                return None  # next round
            try:
                co.delete(f"{MOVES}/{name}", znode.version)
            except Conflict:
                continue
            if problem is not None:
                log.warning("pipeline=%s cluster: move to %s not done: %s", name, target, problem)
                continue
            return name, str(target)
        return None

    def _write(self, name: str, old: Assignment | None, new: Assignment, election: LeaderElection) -> None:
        path = f"{ASSIGNMENTS}/{name}"
        op: Op = Create(path, new.dumps()) if old is None else SetData(path, new.dumps(), old.version)
        self.coordinator.commit([election.fence(), op])

    def _rebalanced(self, name: str, details: dict[str, Any], election: LeaderElection) -> None:
        self._write_state({"last_rebalance": {"time": time.time(), "pipeline": name, **details}}, election)
        if self.on_rebalanced is not None:
            try:
                self.on_rebalanced(name, details)
            except Exception:
                log.exception("cluster: the rebalanced callback failed")

    def _write_state(self, changes: dict[str, Any], election: LeaderElection) -> None:
        co = self.coordinator
        znode = co.get(STATE)
        state = znode.json() if znode is not None else {}
        if "last_rebalance" in changes:
            state["moves"] = int(state.get("moves") or 0) + 1
        state.update(changes)
        if znode is None:
            co.commit([election.fence(), Create(STATE, dumps(state))])
        else:
            co.commit([election.fence(), SetData(STATE, dumps(state), znode.version)])


# --- reading and asking (CLI, status page) ------------------------------------------------------


def cluster_view(coordinator: Coordinator, *,
                 dead: Callable[[list[str]], Mapping[str, tuple[str, str, int]]] | None = None) -> dict[str, Any]:
    """The whole cluster as any node or the CLI sees it: nodes (capacity, draining, pipelines and
    their weights), each pipeline's assignment and holder, the coordinator and the last rebalance.

    A node is *lost* when it is no longer registered (its session ended), or when `setl status`
    reports a pipeline of it ``dead``: `dead(names)` gives, per pipeline so reported, the node, host
    and pid of its stale liveness record (`setl.status.dead_runs`), and the registered node of that
    host and pid is the process that stopped. A lost node is never shown as a pipeline's owner,
    holder or standby (the row's ``lost`` names it instead); it stays in the view, not live, while
    anything names it or the coordinator remembers it (the state's ``lost``) until it registers again.
    """
    nodes = read_nodes(coordinator)
    draining = set(coordinator.children(DRAIN))
    names = sorted(set(coordinator.children(ASSIGNMENTS)) | {p for n in nodes.values() for p in n.pipelines})
    weights: dict[str, int] = {}
    for info in nodes.values():
        for name, spec in info.pipelines.items():
            weights.setdefault(name, int(spec.get("weight") or 1))
    state_node = coordinator.get(STATE)
    state = state_node.json() if state_node is not None else {}
    pipelines: dict[str, dict[str, Any]] = {}
    for name in names:
        assignment = Assignment.from_znode(coordinator.get(f"{ASSIGNMENTS}/{name}"))
        pipelines[name] = {
            "node": assignment.node if assignment else None,
            "standby": assignment.standby if assignment else None,
            "moving_from": assignment.source if assignment else None,
            "held": assignment.held if assignment else False,
            "reason": assignment.reason if assignment else "",
            "version": assignment.version if assignment else None,
            "holder": holder_of(coordinator, name),
            "weight": weights.get(name, 1),
            "lost": None,
        }
    stopped = set()  # registered nodes whose process `setl status` reports dead
    for node, host, pid in (dead(names) if dead is not None else {}).values():
        found = nodes.get(node)
        if found is not None and (found.host, found.pid) == (host, pid):
            stopped.add(node)
    # A node gone from the registrations stays in the view, not live, while anything still names it:
    # an assignment, a held mainstem, the last rebalance's origin, the coordinator's memory of it.
    named = {a[key] for a in pipelines.values() for key in ("node", "standby", "holder", "moving_from") if a[key]}
    last = state.get("last_rebalance") or {}
    named |= {str(last[key]) for key in ("from",) if isinstance(last, dict) and last.get(key)}
    named |= set(state.get("lost") or {})
    lost = stopped | (named - set(nodes))
    was: dict[str, list[str]] = {}
    for name, row in pipelines.items():
        for key in ("node", "holder", "standby"):
            if row[key] in lost:
                if key != "standby":
                    row["lost"] = row[key]
                    was.setdefault(row[key], []).append(name)
                row[key] = None
    view_nodes = {}
    for name in sorted(set(nodes) | draining | named):
        found = nodes.get(name)
        mine = sorted(p for p, a in pipelines.items() if a["node"] == name)
        view_nodes[name] = {
            "live": name not in lost and found is not None,
            "lost": name in lost or found is None,
            "capacity": found.capacity if found else None,
            "draining": name in draining,
            "pipelines": mine,
            "lost_pipelines": sorted(set(was.get(name, []))),
            "weight": sum(pipelines[p]["weight"] for p in mine),
        }
    return {"coordinator": state.get("coordinator"), "nodes": view_nodes, "pipelines": pipelines,
            "last_rebalance": state.get("last_rebalance"), "moves": int(state.get("moves") or 0)}


def request_drain(coordinator: Coordinator, node: str, *, undo: bool = False) -> None:
    """Mark `node` draining (its pipelines move away; nothing is placed on it), or clear the mark."""
    path = f"{DRAIN}/{node}"
    if undo:
        try:
            coordinator.delete(path)
        except Conflict:
            pass
        return
    coordinator.ensure(DRAIN)
    try:
        coordinator.create(path, dumps({"since": time.time()}))
    except Conflict:
        pass


def request_move(coordinator: Coordinator, pipeline: str, node: str) -> None:
    """Ask the coordinator to move `pipeline` to `node` (it hands over at a batch boundary)."""
    coordinator.ensure(MOVES)
    path = f"{MOVES}/{pipeline}"
    data = dumps({"to": node, "since": time.time()})
    try:
        coordinator.create(path, data)
    except Conflict:
        coordinator.set(path, data)
