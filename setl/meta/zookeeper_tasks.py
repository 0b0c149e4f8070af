"""The batch DDL tasks of the ZooKeeper meta store: one node per task under
``/pipelines/NAME/ddl_tasks/t-ID`` (ID percent-encoded), its `DdlTask` fields as JSON."""

from __future__ import annotations

import urllib.parse
from typing import Any

import attrs

from setl.ha import Conflict, SetData, dumps
from setl.meta.base import OVERWRITTEN_BY, DdlClaim, DdlTask, DdlTaskStatus, finishing_status, never_declared
from setl.meta.zookeeper_part import StorePart
from setl.model import Position


class ZooKeeperDdlTasks(StorePart):
    """The ``ddl_task`` table of `ZooKeeperMetaStore` on its `Coordinator` session.

    A declare is a create (the stored task wins when one exists); claims and finishes are
    versioned sets, retried on a conflict after reading again, so two nodes never both claim a
    task; an overwrite's deprecations of earlier tasks go in the claim's own transaction. Safe for
    many threads and processes: it keeps no state but the session.
    """

    @staticmethod
    def path(pipeline: str, task_id: str) -> str:
        return f"/pipelines/{pipeline}/ddl_tasks/t-{urllib.parse.quote(task_id, safe='')}"

    @staticmethod
    def _data(task: DdlTask) -> bytes:
        data = attrs.asdict(task, recurse=False)
        data.update(position=task.position.to_dict(), status=task.status.value)
        return dumps(data)

    def _task(self, path: str) -> tuple[DdlTask, int] | None:
        node = self.coordinator.get(path)
        if node is None:
            return None
        data = node.json()
        data.update(position=Position.from_dict(data["position"]), status=DdlTaskStatus(data["status"]))
        return DdlTask(**data), node.version

    def _declared(self, pipeline: str, task_id: str) -> tuple[DdlTask, int]:
        """A stored task and its node version, for a claim or finish: one never declared is a KeyError."""
        found = self._task(self.path(pipeline, task_id))
        if found is None:
            raise never_declared(pipeline, task_id)
        return found

    def _all(self, pipeline: str) -> list[tuple[DdlTask, int]]:
        folder = f"/pipelines/{pipeline}/ddl_tasks"
        found = [self._task(f"{folder}/{name}") for name in self.coordinator.children(folder)]
        return [f for f in found if f is not None]

    def declare(self, task: DdlTask) -> DdlTask:
        """Store `task` as declared unless it is stored already; the stored task."""
        self._prepare(task.pipeline)
        now = self._clock()
        fresh = attrs.evolve(task, status=DdlTaskStatus.DECLARED, owner=None, reason=None,
                             create_time=now, update_time=now)
        path = self.path(task.pipeline, task.task_id)
        try:
            self.coordinator.create(path, self._data(fresh), makepath=True)
        except Conflict:
            pass  # declared before: the stored task wins
        stored = self._task(path)
        assert stored is not None
        return stored[0]

    def get(self, pipeline: str, task_id: str) -> DdlTask | None:
        found = self._task(self.path(pipeline, task_id))
        return found[0] if found else None

    def list(self, pipeline: str, op_id: str | None = None) -> list[DdlTask]:
        tasks = [t for t, _ in self._all(pipeline) if op_id is None or t.op_id == op_id]
        return sorted(tasks, key=lambda t: (t.position, t.task_id))

    def claim(self, pipeline: str, task_id: str, owner: str, *, expected_owner: str | None = None) -> DdlClaim:
        path = self.path(pipeline, task_id)
        while True:
            task, version = self._declared(pipeline, task_id)
            if not task.claimable(expected_owner):
                return DdlClaim(False, task)
            now = self._clock()
            claimed = attrs.evolve(task, status=DdlTaskStatus.RUNNING, owner=owner, update_time=now)
            ops: list[Any] = [SetData(path, self._data(claimed), version)]
            if task.overwrite:
                for other, other_version in self._all(pipeline):
                    if task.overwrites(other):
                        gone = attrs.evolve(other, status=DdlTaskStatus.DEPRECATED, owner=None,
                                            reason=OVERWRITTEN_BY + task_id, update_time=now)
                        ops.append(SetData(self.path(pipeline, other.task_id), self._data(gone), other_version))
            try:
                self.coordinator.commit(ops)
            except Conflict:
                continue  # a task changed under us: decide again on what is stored now
            return DdlClaim(True, claimed)

    def finish(self, pipeline: str, task_id: str, owner: str, status: DdlTaskStatus,
               reason: str | None = None) -> DdlTask:
        status = finishing_status(status)
        path = self.path(pipeline, task_id)
        while True:
            task, version = self._declared(pipeline, task_id)
            if task.status is not DdlTaskStatus.RUNNING or task.owner != owner:
                return task
            done = attrs.evolve(task, status=status, owner=None, reason=reason, update_time=self._clock())
            try:
                self.coordinator.set(path, self._data(done), version)
            except Conflict:
                continue
            return done
