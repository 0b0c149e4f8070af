"""The kazoo adapter against a real ZooKeeper: a transaction retried after a lost connection is
not applied twice when the first attempt had applied."""

from __future__ import annotations

import contextlib
import threading

import pytest

from setl.model import Position
from setl.testing.servers import wait_until
from tests.ha.proxy import TcpProxy
from tests.ha.zk import hold, stores, unique_root

pytestmark = pytest.mark.timeout(60)


def test_an_ack_retried_after_its_answer_was_lost_is_in_the_history_once(zookeeper_server):
    """The ack's transaction reaches ZooKeeper and applies, its answer is lost, the connection
    drops and comes back on the same session: the retry finds the ack there and does not write a
    second history record (nor a second position)."""
    proxy = TcpProxy(zookeeper_server.hosts).start()
    root = unique_root()
    with contextlib.closing(proxy), stores(proxy.address, 1, root=root, session_timeout=8) as (store,), \
            stores(zookeeper_server.hosts, 1, root=root) as (observer,):
        _, lease = hold(store, "p", "a", delay=0)
        epoch = store.next_epoch("p")
        store.ack("p", 1, epoch, Position("mysql-bin.000001", 100))
        proxy.muted.set()  # the next ack applies, its answer never comes back
        failures: list[BaseException] = []

        def ack() -> None:
            try:
                store.ack("p", 2, epoch, Position("mysql-bin.000001", 200))
            except BaseException as exc:  # re-raised below
                failures.append(exc)

        acking = threading.Thread(target=ack, name="test-ack")
        acking.start()
        try:
            wait_until(lambda: (a := observer.position("p")) is not None and a.batch_id == 2, timeout=20,
                       message="the muted ack to apply")
        finally:
            proxy.cut()  # the client finds its connection gone and reconnects, on the same session
            proxy.muted.clear()
            proxy.heal()
        acking.join(30)
        assert not acking.is_alive()
        assert failures == []
        assert not lease.lost
        history = observer.history("p", 10)
        assert [a.batch_id for a in history] == [2, 1], history
        store.ack("p", 3, epoch, Position("mysql-bin.000001", 300))  # the session goes on
        assert [a.batch_id for a in observer.history("p", 10)] == [3, 2, 1]
