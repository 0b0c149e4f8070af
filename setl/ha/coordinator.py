"""The one adapter to kazoo: a ZooKeeper session (`Coordinator`) shared by the meta store and
the elections, its node snapshots (`ZNode`), and conditional multi-operation transactions
(`Check`, `Create`, `SetData`, `Delete`; `Conflict` when a condition fails).

Only this module and `setl.meta.zookeeper` import kazoo.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    CancelledError,
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
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry

from setl.errors import ConfigError, MetaStoreError
from setl.ha.keeper import Keeper

log = logging.getLogger("setl.ha")

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


class Fence(Protocol):
    """What the session keeps of a holder's lease (`setl.ha.fencing.Lease`): the meta store fences
    a pipeline's writes with it, and the session loses it when it expires."""

    pipeline: str
    term: int  # the fencing token: the version of the term node the holder wrote

    def check(self) -> None:
        """Raise `LeadershipLost` unless the lease still holds."""
        ...

    def lose(self, reason: str, *, quiet: bool = False) -> None:
        """Mark the lease lost (idempotent; never blocks)."""
        ...



class Coordinator:
    """One ZooKeeper session per process, shared by the meta store and the elections.

    All paths are relative to `root`. An operation that meets a lost connection is tried again
    once it is back, each attempt bounded by the session timeout; after `give_up_after` seconds
    (default twice the session timeout; ``math.inf`` for a node, which rides out a ZooKeeper
    outage) without a connection it raises `MetaStoreError`. Writes are safe to repeat because they are conditional or
    idempotent. Listeners run on kazoo's thread and only set events. Ephemeral nodes registered
    with `keep` are re-created on every new session by the session's `Keeper` (`setl.ha.keeper`).
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
        self._closing = threading.Event()
        self._session_id = 0
        self._suspended_at: float | None = None
        self._leases: dict[str, Fence] = {}  # the leases the meta store fences writes with
        self._taken: weakref.WeakSet[Fence] = weakref.WeakSet()  # every live lease: lost with the session
        self._keeper = Keeper(self)

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
        self._keeper.start()
        return self

    def stop(self) -> None:
        """Close the session (its ephemeral nodes go at once). Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._keeper.stop()
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
                self._keeper.new_session()
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

    # -- ephemeral registrations

    def keep(self, path: str, data: bytes) -> None:
        """Hold ephemeral node `path` on this and every later session, until `unkeep` (`Keeper.keep`)."""
        self._keeper.keep(path, data)

    def unkeep(self, path: str) -> None:
        """Stop holding `path` and delete it (`Keeper.unkeep`)."""
        self._keeper.unkeep(path)

    def unclaim(self, path: str) -> None:
        """Delete ephemeral `path` if this session holds it (it goes with the session anyway)."""
        try:
            node = self.get(path)
            if node is not None and node.owner == self._session_id:
                self.delete(path, node.version)
        except MetaStoreError:  # it goes with the session anyway
            log.debug("ha: could not delete %s", path, exc_info=True)

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

    def track(self, lease: Fence) -> None:
        """Lose `lease` when this session expires."""
        with self._lock:
            self._taken.add(lease)

    def hold(self, lease: Fence) -> None:
        with self._lock:
            self._leases[lease.pipeline] = lease

    def drop(self, lease: Fence) -> None:
        with self._lock:
            if self._leases.get(lease.pipeline) is lease:
                del self._leases[lease.pipeline]

    def lease(self, pipeline: str) -> Fence | None:
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

    def commit(self, ops: Sequence[Op], guard: Callable[[], None] | None = None,
               applied: Callable[[], bool] | None = None) -> list[Any]:
        """Apply `ops` atomically. Results: a created path, a stat (`.version`) or True.

        Raises `Conflict` (with the failing op's index) if a check, version, create or delete
        does not hold; then nothing was applied. `guard` runs before every attempt.

        An attempt that met a lost connection may have applied all the same. `applied`, for a
        transaction whose repetition would not be harmless (a sequential node), is asked before
        each attempt after such a one: True means the earlier attempt had applied, and `commit`
        returns ``[]`` without writing again. Its read cannot overtake the earlier attempt:
        ZooKeeper answers one session's requests in order.
        """
        attempts = 0

        def commit() -> list[Any]:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and applied is not None and applied():
                log.info("ha: a %s retried after a lost connection had applied; not repeated",
                         f"transaction on {ops[0].path}" if ops else "transaction")
                return []
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

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        """Call `callback` with the sorted children of `path` (created if missing) now and on every
        change, on kazoo's thread, until the returned function is called."""
        cancelled = threading.Event()
        self.ensure(path)

        def changed(children: list[str]) -> bool | None:
            if cancelled.is_set():
                return False
            try:
                callback(sorted(children))
            except Exception:  # a watcher must not die silently
                log.exception("ha: watcher of %s's children failed", path)
            return None

        self._call(f"watch {self.path(path)}", lambda: ChildrenWatch(self._client, self.path(path), changed))
        return cancelled.set

    def election(self, path: str, identifier: str) -> "LeaderElection":
        """kazoo's leader election recipe at `path` (`LeaderElection`)."""
        return LeaderElection(self, path, identifier)


class LeaderElection:
    """kazoo's ``Election`` recipe (a ``Lock`` whose holder runs a callable), with the holder's
    lock node as a fence: `fence()` is a `Check` that fails once this session no longer holds it,
    so a deposed leader's conditional writes fail however late they arrive."""

    def __init__(self, coordinator: Coordinator, path: str, identifier: str) -> None:
        self.coordinator = coordinator
        self.relative = path
        self._election = coordinator._client.Election(coordinator.path(path), identifier)

    def run(self, func: Callable[[], None]) -> None:
        """Block until elected, then call `func` (the leadership), releasing when it returns.
        Returns after `cancel` too; a ZooKeeper error is a `MetaStoreError`."""
        try:
            self._election.run(func)
        except CancelledError:
            return
        except KazooException as exc:
            raise MetaStoreError(f"ZooKeeper at {self.coordinator.hosts}: election {self.relative}: "
                                 f"{type(exc).__name__}") from exc

    def cancel(self) -> None:
        self._election.cancel()

    def contenders(self) -> list[str]:
        try:
            return list(self._election.contenders())
        except KazooException as exc:
            raise MetaStoreError(f"election {self.relative}: {type(exc).__name__}") from exc

    def fence(self) -> Check:
        """A check that this contender still holds the leadership node it won with."""
        node = self._election.lock.node
        return Check(f"{self.relative}/{node}", 0)

