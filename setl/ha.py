"""High availability on ZooKeeper: the one adapter to kazoo, the per-pipeline *mainstem* election
that keeps a hot standby, and the fences that stop a deposed leader from selecting, loading or
acking.

Every ZooKeeper path setl uses (under the configured root, ``ha.chroot``, ``/setl`` by default):

``/nodes/ID``
    ephemeral, one per running node: ``{"host", "pid", "started"}``.
``/pipelines/NAME/mainstem``
    ephemeral, the holder of the pipeline: ``{"node", "since"}``. Only its owner reads the
    binlog, writes the target or acks.
``/pipelines/NAME/term``
    persistent. Every holder sets it when it takes the mainstem, in the same transaction as the
    create, so its *version* is the holder's fencing token; the data names the last holder and
    whether it released the mainstem on purpose (``{"node", "released", "to"}``).
``/pipelines/NAME/standbys/ID``
    ephemeral, one per node waiting as a hot standby.
``/pipelines/NAME/switch``
    an operator's request (`setl switch`) that the holder hand over: ``{"from", "to"}``.
``/pipelines/NAME/{position,state,epoch,acks/ack-N}``
    the meta store's records (see `setl.meta.zookeeper`).

Fencing: the holder's acks and epoch bumps are transactions that check the term version it
wrote; a node that lost the mainstem (session expired, process frozen) fails them with
`LeadershipLost` however late they arrive. Select and Load are wrapped to check the lease
before each poll and each load: on SUSPENDED (no connection) they wait, and once the
connection has been gone longer than the session timeout, or the session is LOST, the lease is
lost and they raise `LeadershipLost`, which the scheduler turns into `Outcome.LOST`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry

from setl.errors import ConfigError, LeadershipLost, MetaStoreError
from setl.model import Batch, Position, Transaction
from setl.stages import Load, LoadWrapper, Select, SelectWrapper

log = logging.getLogger("setl.ha")

#: Fault-injection tests set this to a file path; the node writes its ZooKeeper session id and
#: password there (hex, mode 0600) so a test can expire the session as kazoo's harness does.
SESSION_FILE_ENV = "SETL_TEST_ZK_SESSION_FILE"

_DISCONNECTED = (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError)


@attrs.frozen
class ZNode:
    """A node's data and the parts of its stat setl uses."""

    data: bytes
    version: int
    owner: int  # the owning session of an ephemeral node; 0 for a persistent one

    def json(self) -> dict[str, Any]:
        """The data as a JSON object ({} when empty)."""
        return json.loads(self.data) if self.data else {}


# --- transaction operations --------------------------------------------------------------------


@attrs.frozen
class Check:
    path: str
    version: int


@attrs.frozen
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False


@attrs.frozen
class SetData:
    path: str
    data: bytes
    version: int = -1


@attrs.frozen
class Delete:
    path: str
    version: int = -1


Op = Check | Create | SetData | Delete


class Conflict(MetaStoreError):
    """A conditional write found another version, a missing node or an existing one.

    `index` is the position of the operation that failed in its transaction.
    """

    def __init__(self, message: str, index: int = 0, **context: object) -> None:
        super().__init__(message, **context)
        self.index = index


def dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# --- the session -------------------------------------------------------------------------------


class Coordinator:
    """One ZooKeeper session per process, shared by the meta store and the elections.

    All paths are relative to `root`. An operation that meets a lost connection is tried again
    once it is back, each attempt bounded by the session timeout; after `give_up_after` seconds
    (default twice the session timeout; ``math.inf`` for a node, which rides out a ZooKeeper
    outage) without a connection it raises `MetaStoreError`. Writes are safe to repeat because they are conditional or
    idempotent. Listeners run on kazoo's thread and only set events. Ephemeral nodes registered
    with `keep` are re-created on every new session by one owned thread.
    """

    def __init__(
        self,
        hosts: str,
        *,
        root: str = "/setl",
        session_timeout: float = 10.0,
        give_up_after: float | None = None,
        connect_timeout: float = 15.0,
    ) -> None:
        if not root.startswith("/") or (len(root) > 1 and root.endswith("/")):
            raise ConfigError(f"ha.chroot {root!r} must start with '/' and not end with one")
        self.hosts = hosts
        self.root = "" if root == "/" else root
        self.session_timeout = session_timeout
        self.give_up_after = 2 * session_timeout if give_up_after is None else give_up_after
        self.connect_timeout = connect_timeout
        # kazoo logs every failed reconnect attempt; setl.ha logs each state change once instead.
        kazoo_log = log.getChild("kazoo")
        if not kazoo_log.isEnabledFor(logging.DEBUG):
            kazoo_log.setLevel(logging.ERROR)
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=0.5),
            logger=kazoo_log,
        )
        self._client.add_listener(self._on_state)
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._new_session = threading.Event()
        self._closing = threading.Event()
        self._session_id = 0
        self._suspended_at: float | None = None
        self._leases: dict[str, Lease] = {}  # the leases the meta store fences writes with
        self._taken: weakref.WeakSet[Lease] = weakref.WeakSet()  # every live lease: lost with the session
        self._kept: dict[str, bytes] = {}
        self._keep_lock = threading.Lock()  # the keeper's check-and-create vs unkeep's remove-and-delete
        self._keeper: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> "Coordinator":
        """Connect (within `connect_timeout`) and make sure the root exists."""
        try:
            self._client.start(timeout=self.connect_timeout)
        except KazooTimeoutError as exc:
            self._client.stop()
            raise MetaStoreError(
                f"cannot reach ZooKeeper at {self.hosts} within {self.connect_timeout:.0f}s"
            ) from exc
        if not self._session_id:  # the listener may not have run yet
            self._on_state(KazooState.CONNECTED)
        if self.root:
            self.ensure("")
        self._keeper = threading.Thread(target=self._keep_loop, name="setl-ha-keeper", daemon=True)
        self._keeper.start()
        return self

    def stop(self) -> None:
        """Close the session (its ephemeral nodes go at once). Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._new_session.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        try:
            self._client.stop()
            self._client.close()
        except KazooException:  # already gone
            log.debug("closing the ZooKeeper client failed", exc_info=True)

    @property
    def session_id(self) -> int:
        return self._session_id

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def disconnected_for(self) -> float:
        """Seconds since the connection was lost (0 while connected)."""
        since = self._suspended_at
        return 0.0 if since is None or self.connected else time.monotonic() - since

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def _on_state(self, state: str) -> None:
        # kazoo's thread: only set events and log.
        if state == KazooState.CONNECTED:
            client_id = self._client.client_id
            session = client_id[0] if client_id else 0
            new = session != self._session_id
            was_suspended = self._suspended_at is not None
            self._session_id = session
            self._suspended_at = None
            self._connected.set()
            if new:
                # The first session is routine (the CLI opens one per command); a later one is news.
                log.log(logging.INFO if was_suspended else logging.DEBUG,
                        "ha: ZooKeeper session 0x%x at %s", session, self.hosts)
                self._write_session_file(client_id)
                self._new_session.set()
            elif was_suspended:
                log.info("ha: ZooKeeper connection is back (session 0x%x)", session)
        elif state == KazooState.SUSPENDED:
            self._suspended_at = time.monotonic()
            self._connected.clear()
            log.warning("ha: ZooKeeper connection lost; holders stop selecting and loading until it is back")
        elif state == KazooState.LOST:
            self._connected.clear()
            if self._suspended_at is None:
                self._suspended_at = time.monotonic()
            if self._closing.is_set():
                log.debug("ha: ZooKeeper session 0x%x closed", self._session_id)
            else:
                log.warning("ha: ZooKeeper session 0x%x expired", self._session_id)
            with self._lock:
                leases = list(self._taken)
            for lease in leases:
                lease.lose("the ZooKeeper session expired", quiet=self._closing.is_set())

    def _write_session_file(self, client_id: tuple[int, bytes] | None) -> None:
        path = os.environ.get(SESSION_FILE_ENV)
        if not path or not client_id:
            return
        try:
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"{client_id[0]:x} {client_id[1].hex()}\n")
            os.replace(path + ".tmp", path)
        except OSError:
            log.exception("ha: cannot write the session file %s", path)

    # -- ephemeral registrations

    def keep(self, path: str, data: bytes) -> None:
        """Hold ephemeral node `path` on this and every later session, until `unkeep`."""
        with self._lock:
            self._kept[path] = data
        self._new_session.set()

    def unkeep(self, path: str) -> None:
        """Stop holding `path` and delete it. Serialised with the keeper's re-registration
        (`_keep_lock`): a keeper that read `path` among the kept ones before this call must not
        create it again after it (a new holder would be listed among its own standbys)."""
        with self._keep_lock:
            with self._lock:
                self._kept.pop(path, None)
            try:
                node = self.get(path)
                if node is not None and node.owner == self._session_id:
                    self.delete(path, node.version)
            except MetaStoreError:  # it goes with the session anyway
                log.debug("ha: could not delete %s", path, exc_info=True)

    def _keep_loop(self) -> None:
        while not self._closing.is_set():
            self._new_session.wait()
            self._new_session.clear()
            if self._closing.is_set():
                return
            with self._lock:
                kept = dict(self._kept)
            for path, data in kept.items():
                try:
                    with self._keep_lock:
                        with self._lock:
                            if path not in self._kept:
                                continue  # unkept since the snapshot: do not bring it back
                        self.claim(path, data)
                except MetaStoreError as exc:
                    log.warning("ha: cannot register %s: %s", path, exc)
                    self._closing.wait(0.5)
                    self._new_session.set()
                except Exception:  # never let the keeper die silently
                    log.exception("ha: registering %s failed", path)

    def claim(self, path: str, data: bytes, *, wait: float = 0.0) -> None:
        """Create ephemeral `path` for this session (or keep ours). If another live session
        holds it, wait up to `wait` seconds for it to go, then raise `Conflict`."""
        deadline = time.monotonic() + wait
        while True:
            try:
                self.create(path, data, ephemeral=True, makepath=True)
                return
            except Conflict:
                node = self.get(path)
                if node is not None and node.owner == self._session_id:
                    return
                if node is not None and time.monotonic() >= deadline:
                    raise
            time.sleep(0.1)

    # -- leases (the meta store fences its writes with them)

    def track(self, lease: "Lease") -> None:
        """Lose `lease` when this session expires."""
        with self._lock:
            self._taken.add(lease)

    def hold(self, lease: "Lease") -> None:
        with self._lock:
            self._leases[lease.pipeline] = lease

    def drop(self, lease: "Lease") -> None:
        with self._lock:
            if self._leases.get(lease.pipeline) is lease:
                del self._leases[lease.pipeline]

    def lease(self, pipeline: str) -> "Lease | None":
        with self._lock:
            return self._leases.get(pipeline)

    # -- operations

    def path(self, relative: str) -> str:
        return self.root + relative

    def _call(self, what: str, fn: Callable[[], Any], guard: Callable[[], None] | None = None) -> Any:
        """Run `fn`, again after a lost connection comes back; `guard` runs before every attempt
        (a lease check, so a retry never writes for a holder that lost its lease meanwhile)."""
        deadline = time.monotonic() + self.give_up_after
        while True:
            try:
                if guard is not None:
                    guard()
                return fn()
            except _DISCONNECTED as exc:
                if self._closing.is_set() or time.monotonic() >= deadline:
                    raise MetaStoreError(
                        f"ZooKeeper at {self.hosts}: {what}: no connection for {self.give_up_after:.0f}s"
                    ) from exc
                self._connected.wait(0.2)
            except KazooException as exc:
                raise MetaStoreError(f"ZooKeeper at {self.hosts}: {what}: {type(exc).__name__}") from exc

    def _wait(self, result: Any) -> Any:
        # kazoo queues requests while it reconnects: bound each attempt, so that `_call` can run
        # its guard and give up in time (a write that timed out may still apply: all are
        # conditional or idempotent).
        return result.get(timeout=self.session_timeout)

    def get(self, path: str, watch: Callable[[Any], None] | None = None) -> ZNode | None:
        """The node at `path`, or None. `watch` fires once on its next change (or creation)."""
        full = self.path(path)

        def read() -> ZNode | None:
            try:
                data, stat = self._wait(self._client.get_async(full, watch=watch))
            except NoNodeError:
                if watch is not None and self._wait(self._client.exists_async(full, watch=watch)) is not None:
                    return read()
                return None
            return ZNode(data or b"", stat.version, stat.ephemeralOwner)

        return self._call(f"read {full}", read)

    def children(self, path: str) -> list[str]:
        full = self.path(path)

        def read() -> list[str]:
            try:
                return sorted(self._wait(self._client.get_children_async(full)))
            except NoNodeError:
                return []

        return self._call(f"list {full}", read)

    def ensure(self, path: str) -> None:
        full = self.path(path) or "/"
        self._call(f"create {full}", lambda: self._wait(self._client.ensure_path_async(full)))

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False) -> str:
        """Create a node; `Conflict` if it exists. Returns the created path (relative)."""
        full = self.path(path)

        def create() -> str:
            try:
                made = self._wait(self._client.create_async(full, data, ephemeral=ephemeral, sequence=sequence,
                                                            makepath=makepath))
            except NodeExistsError as exc:
                raise Conflict(f"{full} exists") from exc
            return made[len(self.root):]

        return self._call(f"create {full}", create)

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Set a node's data (if at `version`, unless -1); returns the new version."""
        return self.commit([SetData(path, data, version)])[0].version

    def delete(self, path: str, version: int = -1) -> None:
        full = self.path(path)

        def delete() -> None:
            try:
                self._wait(self._client.delete_async(full, version=version))
            except (NoNodeError, NotEmptyError, BadVersionError) as exc:
                raise Conflict(f"cannot delete {full}: {type(exc).__name__}") from exc

        self._call(f"delete {full}", delete)

    def commit(self, ops: Sequence[Op], guard: Callable[[], None] | None = None) -> list[Any]:
        """Apply `ops` atomically. Results: a created path, a stat (`.version`) or True.

        Raises `Conflict` (with the failing op's index) if a check, version, create or delete
        does not hold; then nothing was applied. `guard` runs before every attempt.
        """

        def commit() -> list[Any]:
            tx = self._client.transaction()
            for op in ops:
                full = self.path(op.path)
                if isinstance(op, Check):
                    tx.check(full, op.version)
                elif isinstance(op, Create):
                    tx.create(full, op.data, ephemeral=op.ephemeral, sequence=op.sequence)
                elif isinstance(op, SetData):
                    tx.set_data(full, op.data, op.version)
                else:
                    tx.delete(full, op.version)
            results = self._wait(tx.commit_async())
            for index, result in enumerate(results):
                if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                    if isinstance(result, _DISCONNECTED):
                        raise result
                    raise Conflict(f"{type(result).__name__} on {ops[index]}", index=index)
            return [r[len(self.root):] if isinstance(r, str) else r for r in results]

        return self._call(f"transaction on {ops[0].path if ops else '-'}", commit, guard)

    def watch(self, path: str, callback: Callable[[ZNode | None], None]) -> Callable[[], None]:
        """Call `callback` with the node (or None) now and on every change, on kazoo's thread,
        until the returned function is called."""
        cancelled = threading.Event()

        def changed(data: bytes | None, stat: Any) -> bool | None:
            if cancelled.is_set():
                return False
            try:
                callback(None if stat is None else ZNode(data or b"", stat.version, stat.ephemeralOwner))
            except Exception:  # a watcher must not die silently
                log.exception("ha: watcher of %s failed", path)
            return None

        self._call(f"watch {self.path(path)}", lambda: DataWatch(self._client, self.path(path), changed))
        return cancelled.set


# --- the lease a holder keeps ----------------------------------------------------------------


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

    def request_switch(self, to: str | None) -> None:
        """An operator asked for a handover (called on kazoo's thread)."""
        if self.switch_requested.is_set() or self.lost:
            return
        self.switch_to = to
        self.switch_requested.set()
        log.info("pipeline=%s ha: switch requested%s; finishing in-flight batches, then releasing",
                 self.pipeline, f" to {to}" if to else "")
        if self._on_switch is not None:
            self._on_switch()


class FencedSelect(SelectWrapper):
    """Select that only reads while its lease holds: a poll during a lost connection returns
    nothing, and any call after the lease is lost raises `LeadershipLost`."""

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


# --- the election ------------------------------------------------------------------------------


class Mainstem:
    """One pipeline's election: `acquire` waits as a hot standby until this node holds it.

    A standby contends `standby_delay` seconds after the holder disappears, so a holder's blip
    does not hand the pipeline over; the node that held it last and did not release it may take
    it back at once, as may anyone after a deliberate release (a stop or a switch; after a switch
    to a named node, only that node contends at once). The node that released for a switch
    waits `handover_timeout` for another to take it before contending itself.
    """

    def __init__(self, coordinator: Coordinator, pipeline: str, node_id: str, *,
                 standby_delay: float = 3.0, handover_timeout: float = 10.0) -> None:
        self.coordinator = coordinator
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
        last_holder: str | None = None
        try:
            while not stop.is_set():
                if not co.wait_connected(0.2):
                    continue
                changed.clear()
                try:
                    holder = co.get(self.mainstem_path, watch=on_change)
                    if holder is not None and holder.owner != co.session_id:
                        name = holder.json().get("node")
                        if name != last_holder:
                            log.info("pipeline=%s ha: hot standby; %s holds the mainstem", self.pipeline, name)
                            last_holder = name
                        changed.wait(0.5)
                        continue
                    if holder is None:
                        delay = self._delay(co.get(self.term_path))
                        if delay is None:
                            changed.wait(0.2)
                            continue
                        if delay > 0:
                            log.info("pipeline=%s ha: the mainstem is free; contending in %.1fs",
                                     self.pipeline, delay)
                            if stop.wait(delay) or changed.is_set():
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
            co.unkeep(self.standby_path)

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

    def release(self, lease: Lease, *, to: str | None = None) -> None:
        """Give the mainstem up deliberately (a stop, a pause or a switch)."""
        if lease.lost:
            return
        lease.lose("released", quiet=True)
        data = dumps({"node": self.node_id, "released": True, "to": to, "since": time.time()})
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
    """A node's elections: registers the node, and runs each pipeline's scheduler only while
    this node holds its mainstem."""

    def __init__(self, coordinator: Coordinator, node_id: str, *, standby_delay: float = 3.0) -> None:
        self.coordinator = coordinator
        self.node_id = node_id
        self.standby_delay = standby_delay
        self._mainstems: dict[str, Mainstem] = {}

    @classmethod
    def for_node(cls, settings: Any, meta: Any) -> "Elections | None":
        """The elections of a node whose meta store is ZooKeeper; None in single-node mode."""
        coordinator = getattr(meta, "coordinator", None)
        if coordinator is None:
            return None
        coordinator.give_up_after = math.inf  # a node rides out a ZooKeeper outage; its holders stop meanwhile
        elections = cls(coordinator, settings.node.id, standby_delay=settings.ha.standby_delay_ms / 1000.0)
        elections.register()
        return elections

    def register(self) -> None:
        """Hold `/nodes/ID`; a node id already running elsewhere is a `ConfigError`."""
        path = f"/nodes/{self.node_id}"
        data = dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
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
            self._mainstems[pipeline] = Mainstem(self.coordinator, pipeline, self.node_id,
                                                 standby_delay=self.standby_delay)
        return self._mainstems[pipeline]

    def run(self, scheduler: Any, *, stop: threading.Event, until_caught_up: bool = False) -> Any:
        """Wait as a hot standby until this node holds `scheduler`'s pipeline, then run it with
        fenced Select and Load, and release or give up the mainstem when it ends.

        Returns the scheduler's outcome: LOST when leadership went, STOPPED when `stop` was set
        while waiting or a switch handed the pipeline over.
        """
        from setl.meta.base import Status
        from setl.scheduler import Outcome

        name = scheduler.name
        mainstem = self.mainstem(name)
        lease = mainstem.acquire(stop)
        if lease is None:
            return Outcome.STOPPED
        mainstem.finish_switch()
        cancel = mainstem.watch(lease)
        handover: str | None = None
        try:
            if scheduler.meta.state(name).status is Status.PAUSED:
                log.info("pipeline=%s ha: paused; not starting it", name)
                return Outcome.STOPPED
            scheduler.select = FencedSelect(lease, scheduler.select)
            scheduler.load = FencedLoad(lease, scheduler.load)
            lease.on_switch(scheduler.stop)
            self.coordinator.hold(lease)
            try:
                outcome = scheduler.run(until_caught_up=until_caught_up)
            except LeadershipLost as exc:
                scheduler.error, outcome = exc, Outcome.LOST
            if lease.lost and outcome is not Outcome.LOST:
                outcome = Outcome.LOST
            if outcome is Outcome.LOST:
                lease.lose(str(scheduler.error or "leadership lost"))
            elif lease.switch_requested.is_set():
                handover = lease.switch_to or ""
            return outcome
        finally:
            cancel()
            self.coordinator.drop(lease)
            mainstem.release(lease, to=handover or None)
