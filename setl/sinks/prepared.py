"""What an SQL sink worked out ahead for a batch (`setl.stages.load.Load.prepare`), kept until that
batch object is loaded."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

from setl.model import Batch

T = TypeVar("T")

#: Batches prepared and not loaded yet that a sink keeps: the scheduler prepares at most its
#: `parallelism` ahead; more only when batches are discarded before their load (a rollback).
MAX_PREPARED = 8


class PreparedBatches(Generic[T]):
    """Per batch object (by identity, never by id or contents): what was prepared for it. Safe
    for the workers that prepare and the thread that loads; the oldest entries go first past
    `limit`."""

    def __init__(self, limit: int = MAX_PREPARED) -> None:
        self.limit = limit
        self._items: dict[int, tuple[Batch, T]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, batch: Batch, value: T) -> None:
        with self._lock:
            self._items.pop(id(batch), None)
            while len(self._items) >= self.limit:
                del self._items[next(iter(self._items))]
            self._items[id(batch)] = (batch, value)

    def get(self, batch: Batch) -> T | None:
        with self._lock:
            found = self._items.get(id(batch))
        return found[1] if found is not None and found[0] is batch else None

    def drop(self, batch: Batch) -> None:
        with self._lock:
            found = self._items.get(id(batch))
            if found is not None and found[0] is batch:
                del self._items[id(batch)]

    def values(self) -> list[T]:
        with self._lock:
            return [value for _, value in self._items.values()]
