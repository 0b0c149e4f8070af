"""What operators ask of a pipeline through the ZooKeeper meta store, and what they read about it
(`ZooKeeperRequests`): ``setl snapshot``, ``setl repair``, ``setl reload`` and ``setl switch``
requests, the holder and standbys, and the scheduled check's last result. None of these writes is
fenced: the CLI writes them from outside the pipeline's holder."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from setl.errors import MetaStoreError
from setl.ha import Conflict, dumps
from setl.meta.base import RepairRequest
from setl.meta.zookeeper_part import StorePart
from setl.model import TableName


def table_node(table: TableName) -> str:
    """The node name of a table under a pipeline's ``snapshot`` or ``snapshot_requests``."""
    def part(name: str) -> str:  # a dot separates the two parts, so none is left inside one
        return urllib.parse.quote(name, safe="").replace(".", "%2E")

    return f"{part(table.schema)}.{part(table.table)}"


def node_table(name: str) -> TableName:
    """The table a node name (`table_node`) stands for."""
    schema, _, table = name.partition(".")
    return TableName(urllib.parse.unquote(schema), urllib.parse.unquote(table))


class ZooKeeperRequests(StorePart):
    """The operators' nodes of `ZooKeeperMetaStore` (paths in `setl.meta.zookeeper`): a request is
    a node created (or replaced) by the CLI and deleted by the pipeline once served; deleting one
    already gone is not an error (the pipeline and a restart may both drop it)."""

    @staticmethod
    def _base(pipeline: str) -> str:
        return f"/pipelines/{pipeline}"

    def _put(self, path: str, data: bytes) -> None:
        """Create the node at `path` with `data`, or replace what it holds."""
        try:
            self.coordinator.create(path, data)
        except Conflict:
            self.coordinator.set(path, data)

    def _drop(self, path: str) -> None:
        try:
            self.coordinator.delete(path)
        except Conflict:
            pass  # dropped already

    # -- HA views and switches

    def members(self, pipeline: str) -> tuple[str | None, list[str]]:
        """The node holding the pipeline's mainstem (or None) and the nodes standing by."""
        base = self._base(pipeline)
        holder = self._read(f"{base}/mainstem").get("node")
        # The holder is never its own standby, even in the moment before its registration is gone.
        return holder, [name for name in self.coordinator.children(f"{base}/standbys") if name != holder]

    def request_switch(self, pipeline: str, to: str | None = None) -> str:
        """Ask the holder to hand the pipeline over (to `to`, or any standby); returns the holder."""
        holder, standbys = self.members(pipeline)
        if holder is None:
            raise MetaStoreError("nobody holds the mainstem; nothing to switch", pipeline=pipeline)
        if not standbys:
            raise MetaStoreError(f"no node stands by for it (holder {holder}); nothing to switch to",
                                 pipeline=pipeline)
        if to is not None and to not in standbys:
            raise MetaStoreError(f"node {to!r} is not standing by (standbys: {', '.join(standbys)})",
                                 pipeline=pipeline)
        self._put(f"{self._base(pipeline)}/switch", dumps({"from": holder, "to": to, "time": self._clock()}))
        return holder

    # -- copies and repairs

    def request_snapshot(self, pipeline: str, table: TableName) -> None:
        self._prepare(pipeline)
        path = f"{self._base(pipeline)}/snapshot_requests/{table_node(table)}"
        try:
            self.coordinator.create(path, dumps({"time": self._clock()}), makepath=True)
        except Conflict:
            pass  # requested already: one copy serves both

    def snapshot_requests(self, pipeline: str) -> list[TableName]:
        folder = f"{self._base(pipeline)}/snapshot_requests"
        return sorted(node_table(name) for name in self.coordinator.children(folder))

    def drop_snapshot_request(self, pipeline: str, table: TableName) -> None:
        self._drop(f"{self._base(pipeline)}/snapshot_requests/{table_node(table)}")

    def request_repair(self, pipeline: str, request: RepairRequest) -> None:
        self._prepare(pipeline)
        self.coordinator.ensure(f"{self._base(pipeline)}/repair_requests")
        self._put(self._repair_path(pipeline, request.id), dumps(request.to_dict()))

    def repair_requests(self, pipeline: str) -> list[RepairRequest]:
        folder = f"{self._base(pipeline)}/repair_requests"
        found = []
        for name in self.coordinator.children(folder):
            data = self._read(f"{folder}/{name}")
            if data:
                found.append(RepairRequest.from_dict(data))
        return sorted(found, key=lambda r: r.id)

    def drop_repair_request(self, pipeline: str, request_id: str) -> None:
        self._drop(self._repair_path(pipeline, request_id))

    def _repair_path(self, pipeline: str, request_id: str) -> str:
        return f"{self._base(pipeline)}/repair_requests/{urllib.parse.quote(request_id, safe='')}"

    # -- reloads and checks

    def request_reload(self, pipeline: str, request_id: str) -> None:
        self._prepare(pipeline)
        self._put(f"{self._base(pipeline)}/reload", dumps({"request": request_id, "time": self._clock()}))

    def reload_request(self, pipeline: str) -> str | None:
        request = self._read(f"{self._base(pipeline)}/reload").get("request")
        return str(request) if request is not None else None

    def save_verify_result(self, pipeline: str, result: Mapping[str, Any]) -> None:
        self._prepare(pipeline)
        self._put(f"{self._base(pipeline)}/verify", dumps(dict(result)))

    def verify_result(self, pipeline: str) -> dict[str, Any] | None:
        return self._read(f"{self._base(pipeline)}/verify") or None
