"""Fencing: a holder's `Lease` on a pipeline's mainstem, and the Select and Load wrappers that
stop a deposed holder from reading the binlog or writing the target (`FencedSelect`,
`FencedLoad`). Acks and epoch bumps are fenced in the meta store (`setl.meta.zookeeper`), by
transactions that check the term version the lease holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import attrs

from setl.errors import LeadershipLost
from setl.ha.coordinator import Coordinator
from setl.model import Batch, Position, Transaction
from setl.stages import Load, LoadWrapper, Select, SelectWrapper

log = logging.getLogger("setl.ha")


@attrs.define(eq=False)
class Lease:
    """This node's hold on one pipeline's mainstem.

    `term` is the version of the term node it wrote when taking the mainstem: the fencing
    token its writes are conditional on. A lease is lost for good once its session expires, its
    mainstem node goes or changes owner, or the connection has been gone longer than the session
    timeout (another node may hold the mainstem by then).
    """

    pipeline: str
    node_id: str
    term: int
    session_id: int
    coordinator: Coordinator = attrs.field(repr=False)
    reason: str | None = attrs.field(default=None, init=False)
    switch_to: str | None = attrs.field(default=None, init=False)
    switch_by_operator: bool = attrs.field(default=True, init=False)  # False: the cluster moved it
    switch_requested: threading.Event = attrs.field(factory=threading.Event, init=False, repr=False)
    _lost: threading.Event = attrs.field(factory=threading.Event, init=False, repr=False)
    _on_switch: Callable[[], None] | None = attrs.field(default=None, init=False, repr=False)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def lose(self, reason: str, *, quiet: bool = False) -> None:
        """Mark the lease lost (idempotent; never blocks)."""
        if self._lost.is_set():
            return
        self.reason = reason
        self._lost.set()
        if not quiet:
            log.warning("pipeline=%s ha: lost the mainstem (term %d): %s; aborting in-flight batches",
                        self.pipeline, self.term, reason)

    def on_switch(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on kazoo's thread; it must not block) when a switch is requested."""
        self._on_switch = callback
        if self.switch_requested.is_set():
            callback()

    def check(self) -> None:
        """Raise `LeadershipLost` unless the lease still holds."""
        coordinator = self.coordinator
        if not self.lost and coordinator.session_id != self.session_id:
            self.lose("the ZooKeeper session it was taken on is gone")
        if not self.lost and coordinator.disconnected_for() > coordinator.session_timeout:
            self.lose(f"no ZooKeeper connection for over {coordinator.session_timeout:.1f}s")
        if self.lost:
            raise LeadershipLost(f"this node no longer holds the mainstem: {self.reason}",
                                 pipeline=self.pipeline)

    def usable(self, timeout: float) -> bool:
        """Whether the holder may select or load now: waits up to `timeout` seconds for a lost
        connection to come back (False if it does not); raises `LeadershipLost` once lost."""
        self.check()
        if self.coordinator.connected:
            return True
        self.coordinator.wait_connected(timeout)
        self.check()
        return self.coordinator.connected

    def request_switch(self, to: str | None, *, operator: bool = True) -> None:
        """An operator (or, with `operator` False, the cluster's coordinator) asked for a handover
        (called on kazoo's thread)."""
        if self.switch_requested.is_set() or self.lost:
            return
        self.switch_to = to
        self.switch_by_operator = operator
        self.switch_requested.set()
        log.info("pipeline=%s ha: switch requested%s; finishing in-flight batches, then releasing",
                 self.pipeline, f" to {to}" if to else "")
        if self._on_switch is not None:
            self._on_switch()


class FencedSelect(SelectWrapper):
    """Select that only reads while its lease holds: a poll during a lost connection returns
    nothing, and any call after the lease is lost raises `LeadershipLost`."""

    forward_ready = True  # it returns the inner's transactions or nothing (a lease back is seen by the next poll)

    def __init__(self, lease: Lease, inner: Select) -> None:
        super().__init__(inner)
        self.lease = lease

    def open(self, start: Position | None) -> None:
        self.lease.check()
        self.inner.open(start)

    def poll(self, timeout: float) -> Transaction | None:
        if not self.lease.usable(timeout):
            return None
        return self.inner.poll(timeout)

    def seek(self, position: Position | None) -> None:
        self.lease.check()
        self.inner.seek(position)


class FencedLoad(LoadWrapper):
    """Load that waits while the connection is lost and refuses once the lease is lost."""

    parts = True

    def __init__(self, lease: Lease, inner: Load) -> None:
        super().__init__(inner)
        self.lease = lease

    def _wait_usable(self) -> None:
        while not self.lease.usable(0.5):
            pass

    def load(self, batch: Batch) -> None:
        self._wait_usable()
        self.inner.load(batch)

    def load_part(self, batch: Batch) -> None:
        self._wait_usable()
        self.inner.load_part(batch)

    def mark_loaded(self, batch: Batch) -> None:
        self._wait_usable()
        self.inner.mark_loaded(batch)
