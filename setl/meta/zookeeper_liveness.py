"""The run claims and heartbeats of the ZooKeeper meta store: one persistent node per pipeline,
``/pipelines/NAME/liveness``, so that a dead holder's last beat stays readable."""

from __future__ import annotations

import attrs

from setl.errors import MetaStoreError
from setl.ha import Conflict, Delete, SetData, dumps
from setl.meta.base import STALE_AFTER, Liveness
from setl.meta.zookeeper_part import StorePart


class ZooKeeperLiveness(StorePart):
    """The liveness records of `ZooKeeperMetaStore` on its `Coordinator` session.

    Every write is a versioned set (or a create) after a read, retried a bounded number of times
    on a conflict: a claim takes the node only when it is empty, this run's own, or stale; a beat
    only while the node is still this run's; a release only deletes the run's own record. It keeps
    no state but the session.
    """

    @staticmethod
    def _path(pipeline: str) -> str:
        return f"/pipelines/{pipeline}/liveness"

    def _node(self, pipeline: str) -> tuple[Liveness | None, int | None]:
        node = self.coordinator.get(self._path(pipeline))
        if node is None:
            return None, None
        data = node.json()
        return (Liveness.from_dict(pipeline, data) if data else None), node.version

    def claim_run(self, live: Liveness, stale_after: float = STALE_AFTER) -> Liveness | None:
        self._prepare(live.pipeline)
        path = self._path(live.pipeline)
        for _ in range(100):
            now = self._clock()
            holder, version = self._node(live.pipeline)
            if holder is not None and holder.token != live.token and stale_after > 0 \
                    and not holder.stale(now, stale_after):
                return holder
            data = dumps(attrs.evolve(live, time=now).to_dict())
            try:
                if version is None:
                    self.coordinator.create(path, data)
                else:
                    self.coordinator.commit([SetData(path, data, version)])
                return None
            except Conflict:
                continue  # another claimant or beat in between: read again
        raise MetaStoreError(f"could not claim {path}: it keeps changing", pipeline=live.pipeline)

    def beat(self, live: Liveness) -> bool:
        path = self._path(live.pipeline)
        for _ in range(10):
            holder, version = self._node(live.pipeline)
            if holder is None or holder.token != live.token or version is None:
                return False
            try:
                self.coordinator.commit([SetData(path, dumps(attrs.evolve(
                    holder, time=self._clock(), figures=dict(live.figures)).to_dict()), version)])
                return True
            except Conflict:
                continue
        return False

    def release_run(self, pipeline: str, token: str) -> None:
        holder, version = self._node(pipeline)
        if holder is not None and holder.token == token and version is not None:
            try:
                self.coordinator.commit([Delete(self._path(pipeline), version)])
            except Conflict:
                pass  # taken over meanwhile: the new holder's record stays

    def liveness(self, pipeline: str) -> Liveness | None:
        return self._node(pipeline)[0]
