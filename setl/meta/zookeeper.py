"""The meta store for HA deployments: positions, ack history, pipeline state and epochs in
ZooKeeper, shared by every node, with the holder's writes fenced by its mainstem term.

Path layout, under the configured root (``ha.chroot``, default ``/setl``); the election's own
nodes (``mainstem``, ``term``, ``standbys``, ``switch``, ``/nodes``) are described in `setl.ha`:

``/pipelines/NAME/position``
    the last acked (or operator-reset) position:
    ``{"batch", "epoch", "log", "offset", "gtid", "origin": "ack"|"reset", "time"}``, or
    ``{"batch", "epoch", "origin": "forgotten", "time"}`` after a reset to the configured start; empty
    until the first ack.
``/pipelines/NAME/acks/ack-NNNNNNNNNN``
    ack history, one sequential node per ack (the newest `HISTORY_KEEP` are kept):
    ``{"batch", "epoch", "log", "offset", "gtid", "rows", "time"}``.
``/pipelines/NAME/state``
    ``{"status", "error", "node", "updated", "retrying_since"}``.
``/pipelines/NAME/epoch``
    the pipeline's epoch, a decimal number. It only grows: every bump is a versioned set, so two
    nodes can never take the same epoch, and a new leader's epoch is higher than any before it.
``/pipelines/NAME/ddl_tasks/t-ID``
    one batch DDL task (ID percent-encoded): the `DdlTask` fields as JSON. Claims and finishes
    are versioned sets; an overwrite's deprecations go in the claim's transaction.

``/pipelines/NAME/snapshot/SCHEMA.TABLE``
    a table's snapshot progress (names percent-encoded): `setl.tablecopy.TableProgress` as JSON;
    set in the multi-op of the ack that makes it durable, or (a table begun or abandoned) on its
    own, fenced like an ack while this process holds the pipeline.
``/pipelines/NAME/snapshot_requests/SCHEMA.TABLE``
    an operator's request to copy the table again (``setl snapshot``), until the source takes it.
``/pipelines/NAME/verify``
    the last scheduled check (`setl.verify.schedule`) as JSON.
``/pipelines/NAME/reload``
    the last reload request (``setl reload``): its id and time as JSON, replaced by the next one.
``/pipelines/NAME/repair_requests/ID``
    an operator's request to copy some keys again (``setl repair``): `RepairRequest` as JSON, until
    the batch that carries it is acked.

Fencing: `ack` and `next_epoch` need this process to hold the pipeline's mainstem; they are one
ZooKeeper transaction with a check on the term version the holder wrote (and, for an ack, on the
epoch version of its own last bump), so a deposed holder's write fails with `LeadershipLost`
however late it arrives. `set_state` is fenced the same way while this process holds the
pipeline; operators' writes from the CLI (pause, resume, position reset) are not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from setl.errors import LeadershipLost, MetaStoreError
from setl.ha import Check, Conflict, Coordinator, Create, Delete, Fence, SetData, dumps
from setl.meta.base import (
    FORGOTTEN,
    STALE_AFTER,
    DdlTasksInPart,
    Liveness,
    PipelineState,
    RepairRequest,
    Status,
)
from setl.meta.zookeeper_liveness import ZooKeeperLiveness
from setl.meta.zookeeper_requests import ZooKeeperRequests, table_node
from setl.meta.zookeeper_tasks import ZooKeeperDdlTasks
from setl.model import Ack, Position, TableName
from setl.tablecopy import TableProgress

#: How many ack history nodes to keep per pipeline; pruned every `PRUNE_EVERY` acks.
HISTORY_KEEP = 1000
PRUNE_EVERY = 100


class ZooKeeperMetaStore(DdlTasksInPart):
    """Meta store on a `Coordinator` session; safe for many threads, nodes and CLI processes.

    It keeps positions, acks, state, epochs and snapshot progress itself (the fenced writes), and
    hands the batch DDL tasks to a `ZooKeeperDdlTasks`, the run claims to a `ZooKeeperLiveness` and
    the operators' requests (copies, repairs, reloads, switches) and views to a `ZooKeeperRequests`,
    on the same session.
    """

    def __init__(self, coordinator: Coordinator, *, clock: Callable[[], float] = time.time,
                 owns_session: bool = True) -> None:
        self.coordinator = coordinator
        self._clock = clock
        self._owns = owns_session
        self._lock = threading.Lock()
        self._prepared: set[str] = set()
        self._epochs: dict[str, tuple[int, int]] = {}  # pipeline -> (epoch, its node's version)
        self._acks = 0
        self._tasks = ZooKeeperDdlTasks(coordinator, clock, self._prepare)
        self._liveness = ZooKeeperLiveness(coordinator, clock, self._prepare)
        self._requests = ZooKeeperRequests(coordinator, clock, self._prepare)

    @classmethod
    def from_settings(cls, settings: Any) -> "ZooKeeperMetaStore":
        ha = settings.ha
        session = ha.session_timeout_ms / 1000.0
        coordinator = Coordinator(ha.zookeeper, root=ha.chroot, session_timeout=session,
                                  connect_timeout=max(2.0, 2 * session))
        return cls(coordinator.start())

    # -- paths and helpers

    @staticmethod
    def _base(pipeline: str) -> str:
        return f"/pipelines/{pipeline}"

    def _prepare(self, pipeline: str) -> None:
        """Create the pipeline's persistent nodes if missing (idempotent, race-free)."""
        if pipeline in self._prepared:
            return
        base = self._base(pipeline)
        self.coordinator.ensure(f"{base}/acks")
        for name, data in (("position", b""), ("state", b""), ("epoch", b"0"), ("term", dumps({}))):
            try:
                self.coordinator.create(f"{base}/{name}", data)
            except Conflict:
                pass
        with self._lock:
            self._prepared.add(pipeline)

    def _read(self, path: str) -> dict[str, Any]:
        node = self.coordinator.get(path)
        return node.json() if node is not None else {}

    def _lease(self, pipeline: str, what: str) -> Fence:
        lease = self.coordinator.lease(pipeline)
        if lease is None:
            raise LeadershipLost(f"cannot {what}: this node does not hold the mainstem", pipeline=pipeline)
        lease.check()
        return lease

    def _fenced(self, lease: Fence, ops: list, what: str, applied: Callable[[], bool] | None = None) -> list[Any]:
        """Commit `ops` after a check on the holder's term; a failed check means deposed.
        `applied`: see `Coordinator.commit`."""
        try:
            return self.coordinator.commit([Check(f"{self._base(lease.pipeline)}/term", lease.term), *ops],
                                           guard=lease.check, applied=applied)
        except Conflict as exc:
            if exc.index == 0:
                lease.lose("another node took the mainstem")
                raise LeadershipLost(f"cannot {what}: another node took the mainstem",
                                     pipeline=lease.pipeline) from exc
            raise

    # -- positions

    def position(self, pipeline: str) -> Ack | None:
        data = self._read(f"{self._base(pipeline)}/position")
        if not data or data.get("origin") == FORGOTTEN:
            return None
        return Ack(pipeline, int(data["batch"]), int(data["epoch"]), Position.from_dict(data), float(data["time"]))

    def ack(self, pipeline: str, batch_id: int, epoch: int, position: Position, rows: int = 0, *,
            progress: Sequence[TableProgress] = ()) -> Ack:
        lease = self._lease(pipeline, "ack")
        copies = self._progress_ops(pipeline, progress)  # before the check: its nodes exist first
        with self._lock:
            current = self._epochs.get(pipeline)
        if current is None or current[0] != epoch:
            raise LeadershipLost(f"cannot ack batch {batch_id}: epoch {epoch} is not this holder's "
                                 f"current epoch", pipeline=pipeline, batch=batch_id)
        now = self._clock()
        record = {"batch": batch_id, "epoch": epoch, **position.to_dict(), "time": now}
        base = self._base(pipeline)
        acked = dumps({**record, "origin": "ack"})

        def applied() -> bool:  # a retry after a lost connection: did the first attempt apply?
            node = self.coordinator.get(f"{base}/position")
            return node is not None and node.data == acked  # its time makes the record unique

        try:
            self._fenced(lease, [
                Check(f"{base}/epoch", current[1]),
                SetData(f"{base}/position", acked),
                Create(f"{base}/acks/ack-", dumps({**record, "rows": rows}), sequence=True),
                *copies,
            ], f"ack batch {batch_id}", applied=applied)
        except Conflict as exc:
            if exc.index == 1:
                raise LeadershipLost(f"cannot ack batch {batch_id}: the epoch moved past {epoch}",
                                     pipeline=pipeline, batch=batch_id) from exc
            raise MetaStoreError(f"cannot ack batch {batch_id}: {exc}", pipeline=pipeline) from exc
        with self._lock:
            self._acks += 1
            prune = self._acks % PRUNE_EVERY == 0
        if prune:
            self._prune(pipeline)
        return Ack(pipeline, batch_id, epoch, position, now)

    def _prune(self, pipeline: str) -> None:
        path = f"{self._base(pipeline)}/acks"
        old = self.coordinator.children(path)[:-HISTORY_KEEP]
        if old:
            try:  # one round trip for the lot
                self.coordinator.commit([Delete(f"{path}/{name}") for name in old])
            except Conflict:
                pass  # another pruner was first; the next prune catches up

    def reset_position(self, pipeline: str, position: Position | None) -> None:
        self._prepare(pipeline)
        path = f"{self._base(pipeline)}/position"
        current = self.position(pipeline)
        if position is None:  # a marker: no position, and the target's own record is ignored
            self.coordinator.set(path, dumps({
                "batch": current.batch_id if current else 0, "epoch": current.epoch if current else 0,
                "origin": FORGOTTEN, "time": self._clock()}))
            return
        self.coordinator.set(path, dumps({
            "batch": current.batch_id if current else 0,
            "epoch": current.epoch if current else 0,
            **position.to_dict(), "origin": "reset", "time": self._clock(),
        }))

    def position_was_reset(self, pipeline: str) -> bool:
        return self._read(f"{self._base(pipeline)}/position").get("origin") in ("reset", FORGOTTEN)

    def history(self, pipeline: str, limit: int = 20) -> list[Ack]:
        path = f"{self._base(pipeline)}/acks"
        acks: list[Ack] = []
        for name in reversed(self.coordinator.children(path)):
            if len(acks) >= limit:
                break
            data = self._read(f"{path}/{name}")
            if data:
                acks.append(Ack(pipeline, int(data["batch"]), int(data["epoch"]), Position.from_dict(data),
                                float(data["time"])))
        return acks

    # -- state and epochs

    def state(self, pipeline: str) -> PipelineState:
        base = self._base(pipeline)
        data = self._read(f"{base}/state")
        epoch_node = self.coordinator.get(f"{base}/epoch")
        epoch = int(epoch_node.data or b"0") if epoch_node is not None else 0
        if not data:
            return PipelineState(pipeline, epoch=epoch)
        since = data.get("retrying_since")
        return PipelineState(pipeline, Status(data["status"]), data.get("error"), epoch, data.get("node"),
                             float(data.get("updated", 0.0)), float(since) if since is not None else None)

    def set_state(
        self, pipeline: str, status: Status, error: str | None = None, node: str | None = None,
        *, retrying_since: float | None = None,
    ) -> PipelineState:
        self._prepare(pipeline)
        op = SetData(f"{self._base(pipeline)}/state", dumps({
            "status": Status(status).value, "error": error, "node": node, "updated": self._clock(),
            "retrying_since": retrying_since}))
        lease = self.coordinator.lease(pipeline)
        if lease is not None:
            lease.check()
            self._fenced(lease, [op], f"set the state to {Status(status).value}")
        else:
            self.coordinator.commit([op])
        return self.state(pipeline)

    def next_epoch(self, pipeline: str, at_least: int = 1) -> int:
        lease = self._lease(pipeline, "take a new epoch")
        self._prepare(pipeline)
        path = f"{self._base(pipeline)}/epoch"
        for _ in range(100):
            node = self.coordinator.get(path)
            if node is None:
                raise MetaStoreError(f"{path} is missing", pipeline=pipeline)
            epoch = max(int(node.data or b"0") + 1, at_least)
            try:
                results = self._fenced(lease, [SetData(path, str(epoch).encode(), node.version)],
                                       "take a new epoch")
            except Conflict:
                continue  # another writer bumped it first: read again
            with self._lock:
                self._epochs[pipeline] = (epoch, results[1].version)
            return epoch
        raise MetaStoreError(f"could not take a new epoch: {path} keeps changing", pipeline=pipeline)

    def pipelines(self) -> list[str]:
        return self.coordinator.children("/pipelines")

    # -- liveness (`ZooKeeperLiveness`; the batch DDL tasks are `ZooKeeperDdlTasks`, through `DdlTasksInPart`)

    def claim_run(self, live: Liveness, stale_after: float = STALE_AFTER) -> Liveness | None:
        return self._liveness.claim_run(live, stale_after)

    def beat(self, live: Liveness) -> bool:
        return self._liveness.beat(live)

    def release_run(self, pipeline: str, token: str) -> None:
        self._liveness.release_run(pipeline, token)

    def liveness(self, pipeline: str) -> Liveness | None:
        return self._liveness.liveness(pipeline)

    # -- operators' requests and views (`ZooKeeperRequests`)

    def members(self, pipeline: str) -> tuple[str | None, list[str]]:
        """The node holding the pipeline's mainstem (or None) and the nodes standing by."""
        return self._requests.members(pipeline)

    def request_switch(self, pipeline: str, to: str | None = None) -> str:
        """Ask the holder to hand the pipeline over (to `to`, or any standby); returns the holder."""
        return self._requests.request_switch(pipeline, to)

    def request_snapshot(self, pipeline: str, table: TableName) -> None:
        self._requests.request_snapshot(pipeline, table)

    def snapshot_requests(self, pipeline: str) -> list[TableName]:
        return self._requests.snapshot_requests(pipeline)

    def drop_snapshot_request(self, pipeline: str, table: TableName) -> None:
        self._requests.drop_snapshot_request(pipeline, table)

    def save_verify_result(self, pipeline: str, result: Mapping[str, Any]) -> None:
        self._requests.save_verify_result(pipeline, result)

    def verify_result(self, pipeline: str) -> dict[str, Any] | None:
        return self._requests.verify_result(pipeline)

    def request_reload(self, pipeline: str, request_id: str) -> None:
        self._requests.request_reload(pipeline, request_id)

    def reload_request(self, pipeline: str) -> str | None:
        return self._requests.reload_request(pipeline)

    def request_repair(self, pipeline: str, request: RepairRequest) -> None:
        self._requests.request_repair(pipeline, request)

    def repair_requests(self, pipeline: str) -> list[RepairRequest]:
        return self._requests.repair_requests(pipeline)

    def drop_repair_request(self, pipeline: str, request_id: str) -> None:
        self._requests.drop_repair_request(pipeline, request_id)

    # -- snapshots

    def snapshot_progress(self, pipeline: str) -> list[TableProgress]:
        folder = f"{self._base(pipeline)}/snapshot"
        found = []
        for name in sorted(self.coordinator.children(folder)):
            data = self._read(f"{folder}/{name}")
            if data:
                found.append(TableProgress.from_dict(data))
        return sorted(found, key=lambda t: (t.schema, t.table))

    def _progress_ops(self, pipeline: str, progress: Sequence[TableProgress]) -> list[Any]:
        """The writes of `progress`, for a transaction: one SetData per table. A table's node is
        created (empty, which reads as no progress) first if missing, so the transaction only sets."""
        if not progress:
            return []
        self._prepare(pipeline)
        folder = f"{self._base(pipeline)}/snapshot"
        self.coordinator.ensure(folder)
        ops: list[Any] = []
        for table in progress:
            path = f"{folder}/{table_node(table.name)}"
            if self.coordinator.get(path) is None:
                try:
                    self.coordinator.create(path, b"")
                except Conflict:
                    pass
            ops.append(SetData(path, dumps(table.to_dict())))
        return ops

    def save_snapshot_progress(self, pipeline: str, progress: list[TableProgress]) -> None:
        ops = self._progress_ops(pipeline, progress)
        if not ops:
            return
        lease = self.coordinator.lease(pipeline)
        if lease is not None:
            lease.check()
            self._fenced(lease, ops, "record snapshot progress")
        else:
            self.coordinator.commit(ops)

    def close(self) -> None:
        if self._owns:
            self.coordinator.stop()
