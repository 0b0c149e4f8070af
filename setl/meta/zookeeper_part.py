"""What the parts of the ZooKeeper meta store share (`StorePart`): the store's `Coordinator`
session, its clock, and its creation of a pipeline's persistent nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from setl.ha import Coordinator


class StorePart:
    """A part of `ZooKeeperMetaStore` on its session: it keeps no state but the session, and
    `prepare` (the store's, shared) creates a pipeline's persistent nodes before a first write."""

    def __init__(self, coordinator: Coordinator, clock: Callable[[], float],
                 prepare: Callable[[str], None]) -> None:
        self.coordinator = coordinator
        self._clock = clock
        self._prepare = prepare

    def _read(self, path: str) -> dict[str, Any]:
        """The JSON of the node at `path` ({} when it is missing or empty)."""
        node = self.coordinator.get(path)
        return node.json() if node is not None else {}
