"""A node-wide cap on batches in flight, shared by the schedulers of a node's pipelines."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable


class BatchCap:
    """A node-wide cap on batches in flight, shared by the schedulers of a node's pipelines.

    Contract: at most `limit` permits are out at any time. `try_acquire` never blocks: when
    no permit is free it queues the caller (once, however often it asks) and returns False;
    `release` then hands the permit straight to the first caller in the queue and calls the
    `wake` it gave, so waiters are served in FIFO order and a newcomer never overtakes one.
    A granted permit is the waiter's until it takes it with `try_acquire`, or `cancel`s.
    `wake` is called without this object's lock held and must not block.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a batch cap must be at least 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._free = limit
        self._waiting: collections.OrderedDict[Hashable, Callable[[], None]] = collections.OrderedDict()
        self._granted: set[Hashable] = set()

    @property
    def available(self) -> int:
        """Permits neither held nor granted to a waiter."""
        with self._lock:
            return self._free

    def try_acquire(self, waiter: Hashable, wake: Callable[[], None]) -> bool:
        """Take a permit for `waiter`, or queue it to be woken with `wake` when one is handed to it."""
        with self._lock:
            if waiter in self._granted:
                self._granted.discard(waiter)
                return True
            if self._free:  # none is free while anyone waits: release hands it over
                self._free -= 1
                return True
            self._waiting.setdefault(waiter, wake)
            return False

    def release(self) -> None:
        """Give a permit back: to the first waiter if there is one."""
        with self._lock:
            if not self._waiting:
                if self._free >= self.limit:
                    raise RuntimeError("a batch cap permit was released more often than taken")
                self._free += 1
                return
            waiter, wake = self._waiting.popitem(last=False)
            self._granted.add(waiter)
        wake()

    def cancel(self, waiter: Hashable) -> None:
        """`waiter` no longer wants a permit: leave the queue, and pass on one granted and not taken."""
        with self._lock:
            self._waiting.pop(waiter, None)
            if waiter not in self._granted:
                return
            self._granted.discard(waiter)
        self.release()
