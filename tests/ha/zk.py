"""Helpers for HA tests: coordinators on a per-test ZooKeeper root, and session expiry as kazoo's
test harness does it (a second client attaches to the session with its id and password, then
closes it)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator

from kazoo.client import KazooClient

from setl.ha import Coordinator, Lease, Mainstem
from setl.meta.zookeeper import ZooKeeperMetaStore

SESSION_TIMEOUT = 1.5


def unique_root() -> str:
    return f"/t-{uuid.uuid4().hex[:10]}"


def expire_session(hosts: str, session_id: int, password: bytes) -> None:
    """Close the ZooKeeper session `session_id` from outside, as if it had expired."""
    client = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=SESSION_TIMEOUT)
    client.start(timeout=10)
    client.stop()
    client.close()


def expire(coordinator: Coordinator) -> None:
    session_id, password = coordinator._client.client_id
    expire_session(coordinator.hosts, session_id, password)


@contextlib.contextmanager
def stores(hosts: str, count: int, root: str | None = None, session_timeout: float = SESSION_TIMEOUT
           ) -> Iterator[list[ZooKeeperMetaStore]]:
    """`count` meta stores, each on its own session, all under one fresh root."""
    root = root or unique_root()
    made = [ZooKeeperMetaStore(Coordinator(hosts, root=root, session_timeout=session_timeout).start())
            for _ in range(count)]
    try:
        yield made
    finally:
        for store in made:
            store.close()


def hold(store: ZooKeeperMetaStore, pipeline: str, node: str, delay: float = 0.3) -> tuple[Mainstem, Lease]:
    """Take `pipeline`'s mainstem for `store` (blocking) and let the store fence with it."""
    mainstem = Mainstem(store.coordinator, pipeline, node, standby_delay=delay)
    lease = mainstem.acquire(threading.Event())
    assert lease is not None
    store.coordinator.hold(lease)
    return mainstem, lease
