"""The per-pipeline *mainstem* election that keeps a hot standby (`Mainstem`), and a node's
elections (`Elections`), which run a leadership callable while this node holds a pipeline,
as kazoo's ``recipe/election.py`` runs its ``func``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from setl.errors import ConfigError, MetaStoreError
from setl.ha.cluster import SAFETY_POLL, ClusterCoordinator, ClusterMember, cluster_view, node_data
from setl.ha.coordinator import (
    Check,
    Conflict,
    Coordinator,
    Create,
    Delete,
    Op,
    SetData,
    ZNode,
    dumps,
)
from setl.ha.fencing import Lease
from setl.status import dead_runs

log = logging.getLogger("setl.ha")

T = TypeVar("T")


class Mainstem:
    """One pipeline's election: `acquire` waits as a hot standby until this node holds it.

    A standby contends `standby_delay` seconds after the holder disappears, so a holder's blip
    does not hand the pipeline over; the node that held it last and did not release it may take
    it back at once, as may anyone after a deliberate release (a stop or a switch; after a switch
    to a named node, only that node contends at once). The node that released for a switch
    waits `handover_timeout` for another to take it before contending itself.
    """

    def __init__(self, coordinator: Coordinator, pipeline: str, node_id: str, *,
                 standby_delay: float = 3.0, handover_timeout: float = 10.0,
                 gate: Callable[[dict[str, Any]], bool] | None = None,
                 gate_changes: Callable[[Callable[[], None]], Callable[[], None]] | None = None) -> None:
        self.coordinator = coordinator
        #: in a cluster (`setl.ha.cluster.ClusterMember.may_contend`): whether this node may take the
        #: free mainstem now, given the term's data; an operator's switch naming this node (or none)
        #: passes it too
        self.gate = gate
        #: subscribes a callback to the changes that may turn the gate's answer
        #: (`ClusterMember.on_change`); returns the unsubscribe. Without it the gate is polled.
        self.gate_changes = gate_changes
        self.pipeline = pipeline
        self.node_id = node_id
        self.standby_delay = standby_delay
        self.handover_timeout = handover_timeout
        base = f"/pipelines/{pipeline}"
        self.mainstem_path = f"{base}/mainstem"
        self.term_path = f"{base}/term"
        self.standby_path = f"{base}/standbys/{node_id}"
        self.switch_path = f"{base}/switch"
        self._released_at: float | None = None

    def _prepare(self) -> None:
        self.coordinator.ensure(f"/pipelines/{self.pipeline}/standbys")
        try:
            self.coordinator.create(self.term_path, dumps({}))
        except Conflict:
            pass

    def acquire(self, stop: threading.Event) -> Lease | None:
        """Block as a hot standby until this node holds the mainstem (the lease), or None once
        `stop` is set."""
        co = self.coordinator
        self._prepare()
        co.keep(self.standby_path, dumps({"node": self.node_id, "since": time.time()}))
        changed = threading.Event()
        on_change = lambda event: changed.set()  # noqa: E731 -- one callback, so kazoo keeps one watch
        # Woken by the mainstem's watch and the gate's changes; the poll is only a safety net.
        poll = SAFETY_POLL if self.gate is None or self.gate_changes is not None else 0.2
        unsubscribe = self.gate_changes(changed.set) if self.gate_changes is not None else None
        last_holder: str | None = None
        # When this node first saw the mainstem free (None: held): the standby delay counts from
        # there, not from each wake-up (a gate or watch change during the wait restarted it).
        free_since: float | None = None
        try:
            while not stop.is_set():
                if not co.wait_connected(0.2):
                    continue
                changed.clear()
                try:
                    holder = co.get(self.mainstem_path, watch=on_change)
                    if holder is not None and holder.owner != co.session_id:
                        free_since = None
                        name = holder.json().get("node")
                        if name != last_holder:
                            log.info("pipeline=%s ha: hot standby; %s holds the mainstem", self.pipeline, name)
                            last_holder = name
                        changed.wait(SAFETY_POLL)
                        continue
                    if holder is None:
                        term = co.get(self.term_path)
                        if not self._may_contend(term):
                            changed.wait(poll)
                            continue
                        delay = self._delay(term)
                        if delay is None:
                            changed.wait(min(poll, self._handover_left()))
                            continue
                        now = time.monotonic()
                        first = free_since is None
                        if free_since is None:
                            free_since = now
                        left = delay - (now - free_since)
                        if left > 0:
                            if first:
                                log.info("pipeline=%s ha: the mainstem is free; contending in %.1fs",
                                         self.pipeline, left)
                            if stop.wait(left) or changed.is_set():
                                continue
                    if stop.is_set():  # stopping: a mainstem taken now would only be given back
                        continue
                    lease = self._take(holder)
                except MetaStoreError as exc:
                    log.warning("pipeline=%s ha: election: %s", self.pipeline, exc)
                    stop.wait(0.5)
                    continue
                if lease is not None:
                    return lease
            return None
        finally:
            if unsubscribe is not None:
                unsubscribe()
            co.unkeep(self.standby_path)

    def _may_contend(self, term: ZNode | None) -> bool:
        info = term.json() if term is not None else {}
        if self.gate is None or self.gate(info):
            return True
        # an operator's `setl switch`: the named node, or any other than the one that released
        return bool(info.get("released")) and info.get("switch") is True and (
            info.get("to") == self.node_id or (info.get("to") is None and info.get("node") != self.node_id))

    def _handover_left(self) -> float:
        """Seconds until the `handover_timeout` after our own release runs out (at least 0.05)."""
        if self._released_at is None:
            return 0.05
        return max(0.05, self._released_at + self.handover_timeout - time.monotonic())

    def _delay(self, term: ZNode | None) -> float | None:
        """How long to wait before contending for a free mainstem; None: not yet."""
        info = term.json() if term is not None else {}
        if not info:
            return 0.0
        if info.get("released"):
            if info.get("node") == self.node_id and info.get("to") != self.node_id:
                # We handed it over: give the others `handover_timeout` to take it.
                if self._released_at is not None and time.monotonic() - self._released_at < self.handover_timeout:
                    return None
                return 0.0
            to = info.get("to")
            return 0.0 if to in (None, self.node_id) else self.standby_delay
        if info.get("node") == self.node_id:
            return 0.0  # we lost it without releasing: take it back at once
        return self.standby_delay

    def _take(self, existing: ZNode | None) -> Lease | None:
        """Create the mainstem and bump the term in one transaction (or, if our own session
        still owns the mainstem, bump the term on it)."""
        co = self.coordinator
        session = co.session_id
        term = dumps({"node": self.node_id, "session": f"{session:x}", "since": time.time()})
        if existing is not None:
            ops: list[Op] = [Check(self.mainstem_path, existing.version), SetData(self.term_path, term)]
        else:
            ops = [Create(self.mainstem_path, dumps({"node": self.node_id, "since": time.time()}),
                          ephemeral=True), SetData(self.term_path, term)]
        try:
            results = co.commit(ops)
        except Conflict:
            return None  # another node was quicker
        lease = Lease(self.pipeline, self.node_id, results[1].version, session, co)
        co.track(lease)
        self._released_at = None
        log.info("pipeline=%s ha: took the mainstem (term %d)", self.pipeline, lease.term)
        return lease

    def watch(self, lease: Lease) -> Callable[[], None]:
        """Lose `lease` when its mainstem node goes or changes owner, and pass on switch
        requests naming this node. Returns the function that stops watching."""

        def mainstem_changed(node: ZNode | None) -> None:
            if node is None or node.owner != lease.session_id:
                lease.lose("the mainstem node is gone" if node is None else "another node holds the mainstem")

        def switch_changed(node: ZNode | None) -> None:
            if node is not None:
                request = node.json()
                if request.get("from") in (None, self.node_id) and request.get("to") != self.node_id:
                    lease.request_switch(request.get("to"))

        cancels = [self.coordinator.watch(self.mainstem_path, mainstem_changed),
                   self.coordinator.watch(self.switch_path, switch_changed)]

        def cancel() -> None:
            for one in cancels:
                one()

        return cancel

    def release(self, lease: Lease, *, to: str | None = None, switch: bool = False) -> None:
        """Give the mainstem up deliberately (a stop, a pause or a switch: `switch` marks an
        operator's, which lets the named node contend whatever the cluster's assignment says)."""
        if lease.lost:
            return
        lease.lose("released", quiet=True)
        data = dumps({"node": self.node_id, "released": True, "to": to, "switch": switch, "since": time.time()})
        try:
            self.coordinator.commit([SetData(self.term_path, data, lease.term), Delete(self.mainstem_path)])
        except Conflict:
            return  # someone else holds it already
        except MetaStoreError as exc:
            log.warning("pipeline=%s ha: could not release the mainstem (it goes with the session): %s",
                        self.pipeline, exc)
            return
        self._released_at = time.monotonic()
        log.info("pipeline=%s ha: released the mainstem%s", self.pipeline, f" to {to}" if to else "")

    def finish_switch(self) -> None:
        """The new holder clears the switch request it answered."""
        node = self.coordinator.get(self.switch_path)
        if node is not None:
            try:
                self.coordinator.delete(self.switch_path, node.version)
            except Conflict:
                pass


# --- what a node runs ------------------------------------------------------------------------


class Elections:
    """A node's elections: registers the node, and runs each pipeline's leadership (a callable)
    only while this node holds its mainstem."""

    def __init__(self, coordinator: Coordinator, node_id: str, *, standby_delay: float = 3.0,
                 cluster: ClusterMember | None = None, api_url: str | None = None) -> None:
        """`api_url`: the base URL of this node's control API, registered with the node so that the
        other nodes forward the requests for the pipelines it holds here (docs/api.md)."""
        self.coordinator = coordinator
        self.node_id = node_id
        self.standby_delay = standby_delay
        #: in a cluster: the assignments that gate which mainstems this node contends for
        self.cluster = cluster
        self.cluster_coordinator: ClusterCoordinator | None = None
        self._mainstems: dict[str, Mainstem] = {}
        self._published: dict[str, Any] = {"api": api_url} if api_url else {}
        #: the pipelines `setl status` reports dead, with the node of each (`setl.status.dead_runs`)
        self._dead: Callable[[list[str]], Any] | None = None

    @classmethod
    def for_node(cls, settings: Any, meta: Any, pipelines: Sequence[Any] = (),
                 on_rebalanced: Callable[[str, dict[str, Any]], None] | None = None,
                 api_url: str | None = None) -> "Elections | None":
        """The elections of a node whose meta store is ZooKeeper; None in single-node mode.

        The node joins the cluster (`setl.ha.cluster`): it publishes its capacity and its
        `pipelines` (configs: weight and pinned nodes), contends for the cluster's coordinator,
        and contends for a pipeline's mainstem only while the coordinator assigns it here.
        """
        coordinator = getattr(meta, "coordinator", None)
        if coordinator is None:
            return None
        coordinator.give_up_after = math.inf  # a node rides out a ZooKeeper outage; its holders stop meanwhile
        member = ClusterMember(coordinator, settings.node.id, [config.name for config in pipelines])
        elections = cls(coordinator, settings.node.id, standby_delay=settings.ha.standby_delay_ms / 1000.0,
                        cluster=member, api_url=api_url)
        elections._dead = functools.partial(dead_runs, meta)
        elections._published.update(node_data(settings.node.capacity, {
            config.name: (config.pipeline.weight, config.pipeline.nodes) for config in pipelines}))
        elections.register()
        member.start()
        elections.cluster_coordinator = ClusterCoordinator(coordinator, settings.node.id,
                                                           reassign_after=settings.ha.reassign_after,
                                                           join_grace=settings.ha.join_grace_ms / 1000.0,
                                                           expected=settings.ha.expected_nodes or (),
                                                           on_rebalanced=on_rebalanced)
        elections.cluster_coordinator.start()
        return elections

    def cluster_view(self) -> dict[str, Any]:
        """The whole cluster (`setl.ha.cluster.cluster_view`): what `/api/status` and the metrics show."""
        return cluster_view(self.coordinator, dead=self._dead)

    def close(self) -> None:
        """Leave the cluster's coordinator election and stop watching assignments (the node's
        registration goes with its session)."""
        if self.cluster_coordinator is not None:
            self.cluster_coordinator.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def register(self) -> None:
        """Hold `/nodes/ID`; a node id already running elsewhere is a `ConfigError`."""
        path = f"/nodes/{self.node_id}"
        data = dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), **self._published})
        self.coordinator.ensure("/nodes")
        try:
            # A killed predecessor's node stays until its session expires: wait that long.
            self.coordinator.claim(path, data, wait=self.coordinator.session_timeout + 1)
        except Conflict:
            raise ConfigError(f"node id {self.node_id!r} is already running (see ZooKeeper "
                              f"{self.coordinator.path(path)}); give each node its own node.id") from None
        self.coordinator.keep(path, data)

    def mainstem(self, pipeline: str) -> Mainstem:
        if pipeline not in self._mainstems:
            gate = changes = None
            if self.cluster is not None:
                gate = functools.partial(self.cluster.may_contend, pipeline)
                changes = functools.partial(self.cluster.on_change, pipeline)
            self._mainstems[pipeline] = Mainstem(self.coordinator, pipeline, self.node_id,
                                                 standby_delay=self.standby_delay, gate=gate, gate_changes=changes)
        return self._mainstems[pipeline]

    def run(self, pipeline: str, func: Callable[[Lease], T], *, stop: threading.Event) -> T | None:
        """Wait as a hot standby until this node holds `pipeline`'s mainstem, then call `func(lease)`
        (the leadership) and give the mainstem up when it returns or raises.

        As kazoo's ``Election.run``: the leadership is a callable, not a change to an object.
        While `func` runs, the meta store fences the pipeline's writes with `lease`, and an
        operator's switch request sets `lease.switch_requested` (`Lease.on_switch` to hear of
        it); `func` stops what it runs then, or when `lease` is lost, and calls `lease.lose` if
        it found out first. Afterwards the mainstem is released (to the switch's target, if one
        was asked for), unless the lease was lost. Returns what `func` returns; None when
        `stop` was set while standing by.
        """
        mainstem = self.mainstem(pipeline)
        lease = mainstem.acquire(stop)
        if lease is None:
            return None
        mainstem.finish_switch()
        cancel = mainstem.watch(lease)
        self.coordinator.hold(lease)
        if self.cluster is not None:
            self.cluster.leading(pipeline, lease)
        try:
            return func(lease)
        finally:
            if self.cluster is not None:
                self.cluster.not_leading(pipeline)
            cancel()
            self.coordinator.drop(lease)
            switched = lease.switch_requested.is_set()
            mainstem.release(lease, to=lease.switch_to if switched else None,
                             switch=switched and lease.switch_by_operator)
