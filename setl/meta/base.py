"""The meta store interface: acknowledged positions, pipeline state, ack history and batch DDL tasks."""

from __future__ import annotations

import abc
import enum
import hashlib
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from setl.model import Ack, Position, TableName
from setl.tablecopy import CopyStatus, TableProgress


class Status(str, enum.Enum):
    """A pipeline's persisted state, as `setl status` shows it: STOPPED (no node runs it, or it was
    stopped), RUNNING (a holder runs it; it may be riding out a transient failure), PAUSED
    (retries ran out or `setl pause`: it stays paused, across restarts, until `setl resume`)."""

    STOPPED = "stopped"
    RUNNING = "running"
    PAUSED = "paused"


@attrs.frozen
class RepairRequest:
    """An operator's request (`setl repair`) to copy some keys of a table again through the
    pipeline: `keys` are the key columns' canonical texts (`setl.verify.canonical`), one tuple per
    key, in the order of `columns` (the table's primary key when requested). `id` orders requests."""

    id: str
    table: TableName
    columns: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "schema": self.table.schema, "table": self.table.table, "columns": list(self.columns),
                "keys": [list(k) for k in self.keys], "time": self.time}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RepairRequest":
        return cls(str(data["id"]), TableName(str(data["schema"]), str(data["table"])),
                   tuple(str(c) for c in data["columns"]), tuple(tuple(str(v) for v in k) for k in data["keys"]),
                   float(data.get("time") or 0.0))


@attrs.frozen
class PipelineState:
    """What a pipeline is doing. `error` says why it paused, when it paused on an error.

    A RUNNING pipeline with `retrying_since` (seconds since the epoch) is riding out a transient
    failure (`error`) that began then: `setl status` shows ``retrying since T: ERROR``.
    `epoch` only grows: every start and every rollback takes a new one, so a
    target can refuse the writes of an older run.
    """

    pipeline: str
    status: Status = Status.STOPPED
    error: str | None = None
    epoch: int = 0
    node: str | None = None
    updated: float = 0.0
    retrying_since: float | None = None

    @property
    def retrying(self) -> bool:
        return self.status is Status.RUNNING and self.retrying_since is not None


#: How often a running node writes a pipeline's liveness record (seconds).
BEAT_INTERVAL = 2.0
#: A liveness record older than this (seconds) belongs to a dead, frozen or cut-off process.
STALE_AFTER = 10.0


@attrs.frozen
class Liveness:
    """The record a process running a pipeline keeps fresh in the meta store: who, where, since when.

    `token` identifies one run of one process (a new start takes a new token); `time` is the last
    beat (seconds since the epoch); `figures` are the live figures the process last reported (lag,
    rates: JSON values). In single-node mode the record is also the pipeline's run lock: a second
    process finds a fresh record and refuses to start (`MetaStore.claim_run`).
    """

    pipeline: str
    token: str
    node: str | None
    host: str
    pid: int
    started: float
    time: float = 0.0
    figures: Mapping[str, Any] = attrs.field(factory=dict, eq=False)

    @classmethod
    def mine(cls, pipeline: str, node: str | None, token: str, now: float) -> "Liveness":
        """This process's record for `pipeline`."""
        return cls(pipeline, token, node, socket.gethostname(), os.getpid(), now, now)

    def age(self, now: float) -> float:
        return max(0.0, now - self.time)

    def stale(self, now: float, stale_after: float = STALE_AFTER) -> bool:
        """Whether the holder has stopped beating, or (on this host) its process is gone."""
        return self.age(now) > stale_after or self.process_gone()

    def process_gone(self) -> bool:
        """True only when the holder ran on this host and its pid no longer exists (a kill -9)."""
        if self.host != socket.gethostname() or self.pid == os.getpid():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # exists, owned by someone else
            return False
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "node": self.node, "host": self.host, "pid": self.pid,
                "started": self.started, "time": self.time, "figures": dict(self.figures)}

    @classmethod
    def from_dict(cls, pipeline: str, data: Mapping[str, Any]) -> "Liveness":
        return cls(pipeline, str(data["token"]), data.get("node"), str(data.get("host") or ""),
                   int(data.get("pid") or 0), float(data.get("started") or 0.0), float(data.get("time") or 0.0),
                   dict(data.get("figures") or {}))


#: The origin of a position record that `reset_position(pipeline, None)` left: no position (the
#: source's configured start), and the target's own record of what it holds is ignored too.
FORGOTTEN = "forgotten"


class DdlTaskStatus(str, enum.Enum):
    """Where a batch DDL task is in its life (see docs/batch-ddl-tasks.md for the state machine)."""

    DECLARED = "declared"  # its signal row was read; its pre-write action has not run
    RUNNING = "running"  # claimed by `owner`, which is running (or died running) the action
    SUCCEEDED = "succeeded"  # the action ran; the task's data is loaded
    DEPRECATED = "deprecated"  # overwritten, or its action failed; the task's data is dropped


#: The reason a task deprecated by an overwrite carries, followed by the overwriting task's id.
OVERWRITTEN_BY = "overwritten by task "


def ddl_op_id(op_system: str, op_type: str, op_db: str, op_table: str, op_partition: str) -> str:
    """The id of an operation on a target slice: equal ops of different tasks share it."""
    text = "\x1f".join((op_system, op_type, op_db, op_table, op_partition))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@attrs.frozen
class DdlTask:
    """One batch DDL task of a pipeline, as the meta store holds it.

    `task_id` is the upstream job's batch id, unique within the pipeline. `op_db` and `op_table`
    name the *target* table the pre-write action acts on (the source table of the signal row,
    mapped through the pipeline's table rules); `op_system` names the target system.
    `position` is the source position of the transaction that declared the task (the position of
    its first piece for a split transaction): tasks of one op are ordered by it, and a change of
    the task's table at or after it belongs to the task until the next declaration for that table.
    `owner` is the claimant of a RUNNING task (None otherwise); `reason` says why a task was
    deprecated. Times are seconds since the epoch.
    """

    pipeline: str
    task_id: str
    op_type: str
    op_db: str
    op_table: str
    position: Position
    op_partition: str = ""
    op_system: str = ""
    overwrite: bool = False
    op_id: str = attrs.field()
    status: DdlTaskStatus = DdlTaskStatus.DECLARED
    owner: str | None = None
    reason: str | None = None
    create_time: float = 0.0
    update_time: float = 0.0

    @op_id.default
    def _op_id(self) -> str:
        return ddl_op_id(self.op_system, self.op_type, self.op_db, self.op_table, self.op_partition)

    @property
    def target(self) -> str:
        return f"{self.op_db}.{self.op_table}"

    def describe(self) -> str:
        """``task T (op on target[/partition])``, for messages."""
        part = f" partition {self.op_partition}" if self.op_partition else ""
        return f"task {self.task_id} ({self.op_type} on {self.target}{part})"

    def claimable(self, expected_owner: str | None) -> bool:
        """Whether `claim_ddl_task` wins this task: a first claim needs it DECLARED, a take-over
        needs it RUNNING under `expected_owner`."""
        if expected_owner is None:
            return self.status is DdlTaskStatus.DECLARED
        return self.status is DdlTaskStatus.RUNNING and self.owner == expected_owner

    def overwrites(self, other: "DdlTask") -> bool:
        """Whether claiming this (overwrite) task deprecates `other`: a live task of the same op
        declared before it."""
        return (other.op_id == self.op_id and other.task_id != self.task_id
                and other.position < self.position and other.status is not DdlTaskStatus.DEPRECATED)


def never_declared(pipeline: str, task_id: str) -> KeyError:
    """The error of a store asked to claim or finish a task it does not hold."""
    return KeyError(f"ddl task {task_id!r} of pipeline {pipeline!r} was never declared")


def finishing_status(status: DdlTaskStatus | str) -> DdlTaskStatus:
    """`status` as `finish_ddl_task` accepts it: SUCCEEDED or DEPRECATED, else ValueError."""
    status = DdlTaskStatus(status)
    if status not in (DdlTaskStatus.SUCCEEDED, DdlTaskStatus.DEPRECATED):
        raise ValueError(f"a ddl task finishes as succeeded or deprecated, not {status.value}")
    return status


@attrs.frozen
class DdlClaim:
    """What `MetaStore.claim_ddl_task` decided: `won` says the caller now owns the task's action."""

    won: bool
    task: DdlTask


class MetaStore(abc.ABC):
    """Durable pipeline bookkeeping shared by the nodes and the CLI.

    Every write is atomic: an ack writes the position and its history row
    together or not at all. Implementations are safe to use from many threads,
    and from several processes at once (the CLI beside a running node).
    """

    @abc.abstractmethod
    def position(self, pipeline: str) -> Ack | None:
        """The last acknowledged (or reset) position, or None if the pipeline never ran."""

    @abc.abstractmethod
    def ack(self, pipeline: str, batch_id: int, epoch: int, position: Position, rows: int = 0, *,
            progress: Sequence[TableProgress] = ()) -> Ack:
        """Persist that everything before `position` is applied in the target.

        `progress` is the table-copy progress this ack makes durable (`Select.acknowledge`):
        each table's record replaces the stored one in the same atomic write as the position
        and its history row (one transaction, one ZooKeeper multi-op), so a restart never finds
        the one without the other.
        """

    @abc.abstractmethod
    def reset_position(self, pipeline: str, position: Position | None) -> None:
        """Set (or, with None, forget) the position an operator wants to restart from.

        Either way `position_was_reset` is true until the next ack, so the target's own record
        of the position it holds does not override the operator's choice on the next start.
        """

    @abc.abstractmethod
    def position_was_reset(self, pipeline: str) -> bool:
        """True if the current position was set by an operator and not acked since."""

    @abc.abstractmethod
    def history(self, pipeline: str, limit: int = 20) -> list[Ack]:
        """The latest acks, newest first."""

    @abc.abstractmethod
    def state(self, pipeline: str) -> PipelineState:
        """The pipeline's state; STOPPED with epoch 0 if it never ran."""

    @abc.abstractmethod
    def set_state(
        self, pipeline: str, status: Status, error: str | None = None, node: str | None = None,
        *, retrying_since: float | None = None,
    ) -> PipelineState:
        """Persist a status (and its error, or none) without touching the epoch.

        `retrying_since` marks a RUNNING pipeline retrying `error` since then; any other write clears it.
        """

    @abc.abstractmethod
    def next_epoch(self, pipeline: str, at_least: int = 1) -> int:
        """Take and persist a new epoch, higher than any taken before and at least `at_least`."""

    @abc.abstractmethod
    def pipelines(self) -> list[str]:
        """Every pipeline the store knows about."""

    # --- liveness: which process runs a pipeline, and is it alive -----------------------------

    @abc.abstractmethod
    def claim_run(self, live: Liveness, stale_after: float = STALE_AFTER) -> Liveness | None:
        """Take the pipeline's liveness record for `live`; None when taken, else the live holder.

        Compare-and-set, one atomic step: it is taken when there is no record, the record is
        `live`'s own token, or the holder is stale (`Liveness.stale`: no beat for `stale_after`
        seconds, or its process is gone from this host). `stale_after` 0 always takes it (an HA
        leader, whose election already made it the only writer). The stored `time` is now.
        """

    @abc.abstractmethod
    def beat(self, live: Liveness) -> bool:
        """Refresh the record's time and figures if it still holds `live.token`; False if another took it."""

    @abc.abstractmethod
    def release_run(self, pipeline: str, token: str) -> None:
        """Remove the record if it still holds `token` (a clean stop)."""

    @abc.abstractmethod
    def liveness(self, pipeline: str) -> Liveness | None:
        """The pipeline's liveness record, fresh or not, or None."""

    # --- batch DDL tasks (docs/batch-ddl-tasks.md) ------------------------------------------
    #
    # The store is the only source of truth for a task's status: many load threads of one
    # process, and the two nodes of an HA pair, decide through these calls alone. Each call is
    # one atomic step (one transaction, or one conditional multi-op); none blocks waiting for
    # another caller. Tasks are scoped by pipeline: the same task id in two pipelines is two
    # tasks (each pipeline clears its own target).

    @abc.abstractmethod
    def declare_ddl_task(self, task: DdlTask) -> DdlTask:
        """Record `task` as DECLARED if `(task.pipeline, task.task_id)` is unknown; return the stored task.

        Idempotent: declaring a known task id changes nothing and returns the stored task,
        whatever its status (a replayed signal row never revives or resets a task). The caller
        compares the returned op with its own to detect a reused task id. `create_time` and
        `update_time` are set by the store; `status`, `owner` and `reason` of `task` are ignored.
        """

    @abc.abstractmethod
    def ddl_task(self, pipeline: str, task_id: str) -> DdlTask | None:
        """The stored task, or None if it was never declared."""

    @abc.abstractmethod
    def ddl_tasks(self, pipeline: str, op_id: str | None = None) -> list[DdlTask]:
        """The pipeline's tasks (only those of `op_id` if given), ordered by `position`, then task id."""

    @abc.abstractmethod
    def claim_ddl_task(
        self, pipeline: str, task_id: str, owner: str, *, expected_owner: str | None = None
    ) -> DdlClaim:
        """Atomically take a task's pre-write action for `owner` (a token unique to this claim attempt).

        Compare-and-set, in one atomic step:

        * `expected_owner` None and the task DECLARED: it becomes RUNNING with `owner`; won.
          This is the "first arrival": of any number of concurrent claims (threads, processes,
          nodes), exactly one wins.
        * `expected_owner` given and the task RUNNING with exactly that owner: the owner becomes
          `owner`; won. This takes over a claim whose owner is known to be dead (a previous
          process, a deposed leader, or an attempt of this process that failed before recording
          its result). Of concurrent take-overs from the same owner, exactly one wins.
        * Otherwise nothing changes and the claim is lost; `task` is the stored task.

        When a claim is won by a task with `overwrite`, the same step sets DEPRECATED, with
        reason ``OVERWRITTEN_BY + <winner's task id>`` and no owner, on every other task of the
        pipeline with the same `op_id`, a lower `position`, and a status other than DEPRECATED.
        Tasks at a higher position are never touched, and `overwrite` false deprecates nothing.

        Raises KeyError if the task was never declared.
        """

    @abc.abstractmethod
    def finish_ddl_task(
        self, pipeline: str, task_id: str, owner: str, status: DdlTaskStatus, reason: str | None = None
    ) -> DdlTask:
        """Record the outcome of `owner`'s action: `status` is SUCCEEDED or DEPRECATED.

        Compare-and-set: it applies only if the task is RUNNING with `owner`; it clears `owner`.
        Otherwise (taken over, or deprecated by an overwrite meanwhile) nothing changes. Either
        way the stored task is returned, and the caller acts on *its* status, never on the one
        it asked for. Raises KeyError if the task was never declared.
        """

    # --- snapshots (setl.snapshot) --------------------------------------------------------------
    #
    # Per pipeline and source table, the copy's progress (written by the ack of the batch holding a
    # chunk, in the ack's own write, so a restart resumes after the last acked chunk; a table begun
    # or abandoned is written on its own), and an operator's requests to copy a table again
    # (`setl snapshot --table`), which the running source takes.

    @abc.abstractmethod
    def snapshot_progress(self, pipeline: str) -> list[TableProgress]:
        """Every table's copy progress of the pipeline, ordered by (schema, table)."""

    @abc.abstractmethod
    def save_snapshot_progress(self, pipeline: str, progress: list[TableProgress]) -> None:
        """Store (replace) the progress of each table in `progress`, atomically. While this process
        holds the pipeline under HA the write is fenced like an ack."""

    @abc.abstractmethod
    def request_snapshot(self, pipeline: str, table: TableName) -> None:
        """Record an operator's request to copy `table` again (idempotent)."""

    @abc.abstractmethod
    def snapshot_requests(self, pipeline: str) -> list[TableName]:
        """The tables whose copy was requested and not yet taken, ordered."""

    @abc.abstractmethod
    def drop_snapshot_request(self, pipeline: str, table: TableName) -> None:
        """Forget a request once the source has recorded the table as PENDING."""

    def copies_not_done(self, pipeline: str) -> dict[TableName, str]:
        """The source tables whose copy is requested or under way, with its state (``requested``,
        or the stored progress's status): their target tables are stale or partial until it is done."""
        found = {p.name: p.status.value for p in self.snapshot_progress(pipeline) if p.status is not CopyStatus.DONE}
        for name in self.snapshot_requests(pipeline):
            found.setdefault(name, "requested")
        return found

    # --- repairs (setl repair) ---------------------------------------------------------------------
    #
    # Keys to copy again, each request served by the running source as one snapshot read placed at
    # its binlog position, and dropped once the batch holding it is acked (a crash before that
    # serves it again: a repair is idempotent).

    @abc.abstractmethod
    def request_repair(self, pipeline: str, request: RepairRequest) -> None:
        """Record `request` (its id unique: a request with the same id is replaced)."""

    @abc.abstractmethod
    def repair_requests(self, pipeline: str) -> list[RepairRequest]:
        """The requests not yet served and acked, ordered by id."""

    @abc.abstractmethod
    def drop_repair_request(self, pipeline: str, request_id: str) -> None:
        """Forget a request (served and acked); a missing one is no error."""

    # --- scheduled checks (setl.verify.schedule) ------------------------------------------------------

    @abc.abstractmethod
    def save_verify_result(self, pipeline: str, result: Mapping[str, Any]) -> None:
        """Store (replace) the pipeline's last scheduled check (a JSON-able mapping with its `time`)."""

    @abc.abstractmethod
    def verify_result(self, pipeline: str) -> dict[str, Any] | None:
        """The pipeline's last scheduled check, or None when none ran."""

    # --- reloads (setl reload) ---------------------------------------------------------------------
    #
    # A request that the node running a pipeline re-read its file, for a node on any host: each node
    # running the pipeline (holder and standbys) reloads once per new request id it sees.

    @abc.abstractmethod
    def request_reload(self, pipeline: str, request_id: str) -> None:
        """Record an operator's reload request `request_id`, replacing the last one."""

    @abc.abstractmethod
    def reload_request(self, pipeline: str) -> str | None:
        """The id of the last reload requested, or None when none was."""

    def close(self) -> None:  # noqa: B027 - an optional hook: stores without connections keep it
        """Release connections. Idempotent."""


class DdlTaskTable(Protocol):
    """The ``ddl_task`` table of a meta store, kept by a part of its own (`SqliteDdlTasks`,
    `ZooKeeperDdlTasks`): the `MetaStore` calls of the same names, as documented there."""

    def declare(self, task: DdlTask) -> DdlTask: ...

    def get(self, pipeline: str, task_id: str) -> DdlTask | None: ...

    def list(self, pipeline: str, op_id: str | None = None) -> list[DdlTask]: ...

    def claim(self, pipeline: str, task_id: str, owner: str, *, expected_owner: str | None = None) -> DdlClaim: ...

    def finish(self, pipeline: str, task_id: str, owner: str, status: DdlTaskStatus,
               reason: str | None = None) -> DdlTask: ...


class DdlTasksInPart(MetaStore, abc.ABC):
    """A meta store whose batch DDL tasks are its `_tasks` part (`DdlTaskTable`)."""

    _tasks: DdlTaskTable

    def declare_ddl_task(self, task: DdlTask) -> DdlTask:
        return self._tasks.declare(task)

    def ddl_task(self, pipeline: str, task_id: str) -> DdlTask | None:
        return self._tasks.get(pipeline, task_id)

    def ddl_tasks(self, pipeline: str, op_id: str | None = None) -> list[DdlTask]:
        return self._tasks.list(pipeline, op_id)

    def claim_ddl_task(
        self, pipeline: str, task_id: str, owner: str, *, expected_owner: str | None = None
    ) -> DdlClaim:
        return self._tasks.claim(pipeline, task_id, owner, expected_owner=expected_owner)

    def finish_ddl_task(
        self, pipeline: str, task_id: str, owner: str, status: DdlTaskStatus, reason: str | None = None
    ) -> DdlTask:
        return self._tasks.finish(pipeline, task_id, owner, status, reason)
