"""The order of a snapshot stream: binlog transactions and table chunks, by binlog position.

A chunk read in a consistent snapshot at position Pc goes after every binlog transaction ending at
or before Pc and before any ending after it. Reads still running hold the stream back: a read that
began when the stream had handed on everything up to F will place its chunk at some Pc >= F, so
nothing ending after F goes on until its Pc is known (the server tells it right after the read's
transaction starts, well before its rows arrive).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, TypeVar

from setl.model import Position, Transaction

C = TypeVar("C")


class StreamMerge(Generic[C]):
    """Merges a source's transactions (`offer`) with chunks (`add`) in position order (`next`).

    Not thread-safe: its owner calls it under one lock. `frontier` is the end of the last binlog
    transaction handed on (where a chunk handed on now sits in the stream).
    """

    def __init__(self, frontier: Position | None = None) -> None:
        self.frontier = frontier
        self.lookahead: Transaction | None = None  # taken from the source, not handed on yet
        self._reads: dict[int, Position] = {}  # read id -> the least position its chunk can have
        self._ready: list[tuple[Position, int, C]] = []
        self._seq = itertools.count()

    def clear(self, frontier: Position | None) -> None:
        self.__init__(frontier)  # type: ignore[misc]

    @property
    def idle(self) -> bool:
        return not (self._reads or self._ready or self.lookahead is not None)

    @property
    def pending(self) -> int:
        """Chunks read or being read and not handed on."""
        return len(self._reads) + len(self._ready)

    @property
    def ready(self) -> int:
        return len(self._ready)

    def read_started(self) -> int:
        """A chunk read begins now: its id. Its chunk will sit at or after the frontier."""
        rid = next(self._seq)
        self._reads[rid] = self.frontier or Position("", 0)
        return rid

    def read_positioned(self, rid: int, position: Position) -> None:
        """The read's snapshot is at `position` (its chunk's place)."""
        if rid in self._reads:
            self._reads[rid] = position

    def read_ended(self, rid: int) -> None:
        self._reads.pop(rid, None)

    def add(self, position: Position, chunk: C) -> None:
        """A chunk read at `position`; chunks of equal position keep the order they were added in."""
        heapq.heappush(self._ready, (position, next(self._seq), chunk))

    def offer(self, tx: Transaction | None) -> None:
        """The source's next transaction (None: nothing yet); only when `lookahead` is None."""
        assert self.lookahead is None
        self.lookahead = tx

    def next(self) -> Transaction | tuple[Position, C] | None:
        """The next transaction or (position, chunk) in stream order, or None until it can be told."""
        bound = min(self._reads.values(), default=None)
        lookahead = self.lookahead
        if self._ready:
            position, _, chunk = self._ready[0]
            if bound is None or position <= bound:
                if (lookahead is not None and lookahead.end > position) or (
                        lookahead is None and self.frontier is not None and self.frontier >= position):
                    heapq.heappop(self._ready)
                    return position, chunk
            if lookahead is not None and lookahead.end > position:
                return None  # the chunk goes first, once the reads that may precede it are in
        if lookahead is None or (bound is not None and lookahead.end > bound):
            return None
        self.lookahead = None
        self.frontier = lookahead.end
        return lookahead
