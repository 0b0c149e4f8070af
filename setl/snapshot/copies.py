"""The table copies in progress, as the poll thread, the reader threads and the acks share them
under one lock (`CopyBook`), and one copy (`Copy`)."""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any

import attrs

from setl.model import Position, TableName, Transaction
from setl.snapshot.ledger import Chunk
from setl.snapshot.merge import StreamMerge
from setl.snapshot.reader import TablePlan
from setl.tablecopy import TableProgress


@attrs.define(eq=False)
class Copy:
    """A table being copied, as the reader threads and the poll thread see it."""

    plan: TablePlan
    progress: TableProgress
    truncated: bool = False  # its TRUNCATE was handed on: chunks may be read
    lower: tuple[Any, ...] | None = None  # the next chunk starts after this key
    exhausted: bool = False  # the final chunk was claimed
    claiming: bool = False  # a reader is finding the next boundary
    next_index: int = 0
    handed_rows: int = 0
    serial: int = 0  # tells this copy's chunks from those of an earlier copy of the table
    handed_final: bool = False  # all its chunks were handed on
    last_handed: bool = False  # its last chunk (`Chunk.final`) was handed on
    handed_chunks: int = 0  # its chunks (keyed tables) handed on
    marked: bool = False  # its end marker (`DdlChange.end_of_copy`) was handed on


class CopyBook:
    """The copies' shared state. Every field is read and written under `lock` only (a Condition:
    notified when a read is placed or ends, a chunk is handed on, a copy may be claimed, or a
    reader failed), which the repair requests' state shares.

    `generation` tells the work of the current open or seek from that of an earlier one: it goes
    up on every restart and stop, and a read, a TRUNCATE or a repair begun under another
    generation is dropped when it comes back. This object only holds the state and the merge's
    read bookkeeping; `SnapshotSelect` and its collaborators make the transitions."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.generation = 0
        self.copies: dict[TableName, Copy] = {}
        self.waiting: list[TableName] = []  # tables whose TRUNCATE is to be handed on
        self.keyless_open: set[TableName] = set()
        self.serials = itertools.count(1)
        self.abandoned: set[int] = set()  # serials of copies a DDL started again: their chunks are dropped
        #: tables whose copy is not done but which no longer exist, with the binlog head when found so:
        #: the DDL that removed them is still ahead in the stream (and may rename them)
        self.gone: dict[TableName, Position | None] = {}
        self.handed: Position | None = None  # the end of the last binlog transaction handed on
        #: keyless tables the snapshot does not cover (MyISAM), read as of some time in (Pc, head]:
        #: (Pc, head, copy serial); a write to the table in there may be in the copy and replayed too
        self.windows: dict[TableName, tuple[Position, Position | None, int]] = {}
        self.merge: StreamMerge[Chunk] = StreamMerge()
        #: chunks (keyless pieces included) in the merge and not handed on, by copy serial
        self.queued: collections.Counter[int] = collections.Counter()
        self.out: collections.deque[Transaction] = collections.deque()
        self.failure: BaseException | None = None

    def reset(self, frontier: Position | None) -> None:
        """Under the lock: forget every copy and read (a new generation), the stream at `frontier`."""
        self.generation += 1
        self.copies.clear()
        self.waiting.clear()
        self.keyless_open.clear()
        self.abandoned.clear()
        self.gone.clear()
        self.windows.clear()
        self.handed = frontier
        self.merge.clear(frontier)
        self.queued.clear()
        self.out.clear()
        self.failure = None

    def register(self, generation: int) -> int:
        """Under the lock: a read about to start (-1 for one no longer wanted)."""
        return self.merge.read_started() if generation == self.generation else -1

    def started(self, generation: int, rid: int, position: Position) -> None:
        """A read's snapshot stands at `position` (the stream may pass what is before it)."""
        with self.lock:
            if generation == self.generation:
                self.merge.read_positioned(rid, position)
                self.lock.notify_all()

    def ended(self, generation: int, rid: int, chunk: Chunk | None = None) -> None:
        """Under the lock: a read is over (with its chunk, or its last piece)."""
        if generation != self.generation:
            return
        if chunk is not None:
            self.merge.add(chunk.position, chunk)
            self.queued[chunk.copy] += 1
        self.merge.read_ended(rid)
        self.lock.notify_all()
