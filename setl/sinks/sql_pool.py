"""The connections of an SQL target sink (`ConnectionPool`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from setl.errors import LoadError, TransientLoadError
from setl.model import Batch

C = TypeVar("C")  # a driver connection
T = TypeVar("T")


class ConnectionPool(Generic[C]):
    """At most `size` connections in use at once, one per calling thread, kept open between uses.

    `run` lends a connection to one piece of work: an idle one, or a new one from `open`. It goes
    back to the pool unless the work raised a `TransientLoadError` or the connection was marked
    broken (`mark_broken`); then it is closed with `close`, which must not raise. With a `table`
    (a per-table part), the connection that loaded that table last is taken when it is idle: each
    table's statements then go to few connections, which a server keeping prepared statements per
    session (PostgreSQL) parses and plans once each, not once on every connection of the pool.
    Safe for many threads; `run` blocks while `size` connections are lent.
    """

    def __init__(self, size: int, open: Callable[[Batch | None], C], close: Callable[[C], None]) -> None:
        """`open(batch)` connects (raising a setl error naming `batch`); `close` disconnects."""
        self._open = open
        self._close = close
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self.idle: list[C] = []
        self._affinity: dict[str, C] = {}  # target table -> the connection that last loaded a part of it
        self._local = threading.local()  # per thread: the connection lent, whether it broke

    @property
    def held(self) -> C | None:
        """The connection lent to the calling thread (inside `run`), or None."""
        return getattr(self._local, "conn", None)

    def mark_broken(self) -> None:
        """The connection lent to the calling thread is not to be reused."""
        self._local.broken = True

    def run(self, work: Callable[[C], T], batch: Batch | None, table: str | None = None) -> T:
        """`work` on a connection of the calling thread's own (see the class docstring)."""
        with self._slots:
            conn = self.checkout(batch, table)
            self._local.conn = conn
            healthy = False
            try:
                result = work(conn)
                healthy = True
                return result
            except LoadError as exc:
                healthy = not isinstance(exc, TransientLoadError) and not getattr(self._local, "broken", False)
                raise
            finally:
                self._local.conn = None
                self._local.broken = False
                with self._lock:
                    if healthy:
                        self.idle.append(conn)
                        if table is not None:
                            self._affinity[table] = conn
                    else:
                        for name in [n for n, c in self._affinity.items() if c is conn]:
                            del self._affinity[name]
                if not healthy:
                    self._close(conn)

    def checkout(self, batch: Batch | None, table: str | None = None) -> C:
        """An idle connection (for a `table`: the one that loaded it last, else one no table has
        loaded last, else any), or a new one; the caller gives it back or closes it."""
        with self._lock:
            if self.idle:
                return self.idle.pop(self._pick(table))
        return self._open(batch)

    def _pick(self, table: str | None) -> int:
        """Under the lock: the index in the non-empty `idle` of the connection to check out."""
        if table is None:
            return -1
        mine = self._affinity.get(table)
        claimed = {id(c) for c in self._affinity.values()}
        spare = -1
        for index in range(len(self.idle) - 1, -1, -1):
            conn = self.idle[index]
            if conn is mine:
                return index
            if spare == -1 and id(conn) not in claimed:
                spare = index
        return spare

    def close(self) -> None:
        """Close the idle connections (lent ones are closed or pooled when given back)."""
        with self._lock:
            idle, self.idle = self.idle, []
            self._affinity.clear()
        for conn in idle:
            self._close(conn)
