"""The table copies in progress: one copy's state machine (`Copy`, its `Phase`), and the book the
poll thread, the reader threads and the acks share under one lock (`CopyBook`), which alone
changes which copies exist, wait, fail or are dropped."""

from __future__ import annotations

import collections
import enum
import itertools
import threading
from typing import Any

from setl.model import Position, TableName, Transaction
from setl.snapshot.ledger import Chunk
from setl.snapshot.merge import StreamMerge
from setl.snapshot.reader import TablePlan


class Phase(enum.Enum):
    """Where a copy stands, after its TRUNCATE was handed on (or its resume was planned)."""

    READING = "reading"  # chunks are left to claim
    CLAIMING = "claiming"  # a reader is finding the next chunk's boundary
    READ = "read"  # every chunk was claimed, some are not handed on yet
    EMPTY = "empty"  # the table was empty at its TRUNCATE: nothing to read
    HANDED = "handed"  # every chunk was handed on
    MARKED = "marked"  # its end marker (`DdlChange.end_of_copy`) was queued after its last chunk


class CopyStateError(RuntimeError):
    """A transition a copy in its phase cannot take (a bug in its callers, never bad input)."""


class Copy:
    """A table being copied, and where its copy stands: a state machine driven under the book's
    lock, by a reader (`claim`, then `claimed` or `claimed_whole`, or `released` when finding a
    boundary failed) and by the poll thread (`handed`, `mark`).

    ``READING -claim-> CLAIMING -claimed-> READING | READ``, ``CLAIMING -released-> READING``,
    ``CLAIMING -claimed_whole-> READ`` (a keyless copy: one read in pieces),
    ``READING | CLAIMING | READ -handed-> HANDED`` once its final chunk and every chunk claimed
    before it are handed on (chunks may be placed out of index order), and
    ``HANDED | EMPTY -mark-> MARKED``. `serial` tells this copy's chunks from those of an earlier
    copy of the table."""

    def __init__(self, plan: TablePlan, serial: int, *, after: tuple[Any, ...] | None = None,
                 empty: bool = False) -> None:
        self.plan = plan
        self.serial = serial
        self._phase = Phase.EMPTY if empty else Phase.READING
        self._lower = after  # the next chunk starts after this key (None: at the table's start)
        self._claimed = 0  # chunks (keyed tables) claimed: the next one's index
        self._handed = 0  # chunks (keyed tables) handed on
        self._final_handed = False  # its final chunk (`Chunk.final`) was handed on

    def __repr__(self) -> str:
        return f"Copy({self.plan.name}, serial={self.serial}, {self._phase.value}, claimed={self._claimed})"

    @property
    def phase(self) -> Phase:
        """Where the copy stands."""
        return self._phase

    @property
    def lower(self) -> tuple[Any, ...] | None:
        """The key the next chunk starts after (None: the table's start)."""
        return self._lower

    @property
    def handed_on(self) -> bool:
        """Every chunk of the copy was handed on (and its marker queued, if any): a DDL after this
        point follows the whole copy in the stream."""
        return self._phase in (Phase.HANDED, Phase.MARKED)

    def _require(self, transition: str, *phases: Phase) -> None:
        if self._phase not in phases:
            raise CopyStateError(f"copy of {self.plan.name} (serial {self.serial}): {transition} in phase "
                                 f"{self._phase.value}")

    def claim(self) -> bool:
        """A reader takes the copy's next chunk (True), unless no chunk is left to claim or another
        reader is finding its boundary (False)."""
        if self._phase is not Phase.READING:
            return False
        self._phase = Phase.CLAIMING
        return True

    def claimed(self, upper: tuple[Any, ...] | None) -> int:
        """The claimed chunk ends at key `upper` (None: the table's end, the final chunk): its index."""
        self._require("claimed", Phase.CLAIMING)
        index = self._claimed
        self._claimed += 1
        self._lower = upper
        self._phase = Phase.READ if upper is None else Phase.READING
        return index

    def claimed_whole(self) -> None:
        """The claim is the whole (keyless) table, read as one chunk in pieces."""
        self._require("claimed_whole", Phase.CLAIMING)
        self._phase = Phase.READ

    def released(self) -> None:
        """The claiming reader failed before its chunk was placed: the chunk may be claimed again."""
        if self._phase is Phase.CLAIMING:
            self._phase = Phase.READING

    def handed(self, *, keyed: bool, final: bool) -> bool:
        """A chunk (or a keyless piece) of this copy was handed on: True if the copy is now all
        handed on."""
        self._require("handed", Phase.READING, Phase.CLAIMING, Phase.READ)
        if keyed:
            self._handed += 1
        self._final_handed = self._final_handed or final
        if self._final_handed and self._handed >= self._claimed:
            self._phase = Phase.HANDED
            return True
        return False

    def mark(self) -> bool:
        """Its end marker is queued: True the first time, False if it was already."""
        if self._phase is Phase.MARKED:
            return False
        self._require("mark", Phase.HANDED, Phase.EMPTY)
        self._phase = Phase.MARKED
        return True


class CopyBook:
    """The copies' shared state: every field is read under `lock` only, and changed only by the
    book's own transitions (a Condition: notified when a read is placed or ends, a chunk is handed
    on, a copy may be claimed, or a reader failed), which the repair requests' state shares.

    `generation` tells the work of the current open or seek from that of an earlier one: it goes
    up on every restart and stop, and a read, a TRUNCATE or a repair begun under another
    generation is dropped when it comes back. The merge (`StreamMerge`) is the book's: its
    lookahead, frontier and reads are its own transitions."""

    def __init__(self, *, interleave: bool = False) -> None:
        self.lock = threading.Condition()
        #: claims go round the copies, a chunk of each in turn (the target loads chunks of different
        #: tables at once: ``load.mode``/``load.chunks: per_table``); otherwise the first copy's chunks first
        self.interleave = interleave
        self.generation = 0
        self.copies: dict[TableName, Copy] = {}
        self.waiting: list[TableName] = []  # tables whose TRUNCATE is to be handed on
        self.keyless_open: set[TableName] = set()  # keyless copies whose binlog changes are dropped
        self._serials = itertools.count(1)
        self._turn = 0  # with `interleave`: where the next claim starts looking
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

    # --- the whole book -----------------------------------------------------------------------

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

    def stop_reads(self) -> None:
        """Under the lock: the reads in flight are no longer wanted (a new generation)."""
        self.generation += 1
        self.lock.notify_all()

    def fail(self, error: BaseException) -> None:
        """Under the lock: a reader failed; the poll thread raises `error`."""
        self.failure = error
        self.lock.notify_all()

    @property
    def active(self) -> bool:
        """Under the lock: a copy is under way or waits for its TRUNCATE."""
        return bool(self.copies or self.waiting)

    @property
    def idle(self) -> bool:
        """Under the lock: no copy, read, marker or watched table: the source's stream as it is."""
        return not (self.copies or self.waiting or self.out or self.gone or self.windows) and self.merge.idle

    def busy(self, name: TableName) -> bool:
        """Under the lock: `name` is being copied, or waits for its TRUNCATE."""
        return name in self.copies or name in self.waiting

    # --- copies -------------------------------------------------------------------------------

    def queue(self, name: TableName) -> None:
        """Under the lock: `name` waits for its TRUNCATE (its copy begins)."""
        self.waiting.append(name)

    def take_waiting(self) -> list[TableName]:
        """Under the lock: the tables waiting for their TRUNCATE, no longer waiting."""
        waiting, self.waiting = self.waiting, []
        return waiting

    def new_copy(self, plan: TablePlan, *, after: tuple[Any, ...] | None = None, empty: bool = False) -> Copy:
        """A copy of `plan`'s table with a serial of its own (not in the book until `open`)."""
        return Copy(plan, next(self._serials), after=after, empty=empty)

    def open(self, copy: Copy, *, keyless_open: bool = False) -> None:
        """Under the lock: `copy` is under way (its TRUNCATE handed on, or resumed); `keyless_open`:
        the table's binlog changes are dropped until its copy is handed on (they are in it)."""
        self.copies[copy.plan.name] = copy
        if keyless_open:
            self.keyless_open.add(copy.plan.name)
        self.lock.notify_all()

    def gone_since(self, name: TableName, head: Position | None) -> None:
        """Under the lock: `name` no longer exists, and the DDL that removed it is before `head`."""
        self.gone[name] = head

    def drop(self, name: TableName) -> None:
        """Under the lock: forget the table's copy; its chunks still to come are dropped."""
        copy = self.copies.pop(name, None)
        if copy is not None:
            self.abandoned.add(copy.serial)
        self.gone.pop(name, None)
        self.windows.pop(name, None)
        self.keyless_open.discard(name)

    def finished(self, name: TableName, serial: int) -> None:
        """Under the lock: the copy `serial` of `name` was acked to its end (a later copy goes on)."""
        copy = self.copies.get(name)
        if copy is not None and copy.serial == serial:
            del self.copies[name]

    def claim(self, max_chunks: int) -> Copy | None:
        """Under the lock: a copy with a chunk to read, claimed, if there is room: at most
        `max_chunks` read, claimed or queued and not handed on.

        A claim counts as a chunk from here: a reader finding its boundary has not registered its
        read with the merge yet, and readers claiming together must not take more than the room."""
        claims = sum(1 for c in self.copies.values() if c.phase is Phase.CLAIMING)
        if self.merge.pending + claims >= max_chunks:
            return None
        copies = list(self.copies.values())
        start = self._turn if self.interleave else 0
        for n in range(len(copies)):
            copy = copies[(start + n) % len(copies)]
            if copy.claim():
                self._turn = start + n + 1
                return copy
        return None

    def window(self, copy: Copy, since: Position, until: Position | None, generation: int) -> None:
        """Under the lock: a keyless `copy` read as of some time in (`since`, `until`] (if it is
        still wanted)."""
        if generation == self.generation and copy.serial not in self.abandoned:
            self.windows[copy.plan.name] = (since, until, copy.serial)

    def window_closed(self, name: TableName) -> None:
        """Under the lock: the stream passed `name`'s window with no write to it: its copy holds."""
        del self.windows[name]

    # --- reads and the stream ----------------------------------------------------------------

    def register(self, generation: int) -> int:
        """Under the lock: a read about to start (-1 for one no longer wanted)."""
        return self.merge.read_started() if generation == self.generation else -1

    def started(self, generation: int, rid: int, position: Position) -> None:
        """A read's snapshot stands at `position` (the stream may pass what is before it)."""
        with self.lock:
            if generation == self.generation:
                self.merge.read_positioned(rid, position)
                self.lock.notify_all()

    def place(self, chunk: Chunk) -> None:
        """Under the lock: `chunk` (a keyed chunk, or a keyless piece) waits in the merge."""
        self.merge.add(chunk.position, chunk)
        self.queued[chunk.copy] += 1

    def ended(self, generation: int, rid: int, chunk: Chunk | None = None) -> None:
        """Under the lock: a read is over (with its chunk, or its last piece)."""
        if generation != self.generation:
            return
        if chunk is not None:
            self.place(chunk)
        self.merge.read_ended(rid)
        self.lock.notify_all()

    def taken(self, chunk: Chunk) -> None:
        """Under the lock: `chunk` left the merge to be handed on (room for another)."""
        self.queued[chunk.copy] -= 1
        if self.queued[chunk.copy] <= 0:
            del self.queued[chunk.copy]
        self.lock.notify_all()

    def passed(self, tx: Transaction) -> None:
        """Under the lock: the source's `tx` was handed on."""
        self.handed = tx.end

    def then(self, tx: Transaction) -> None:
        """Under the lock: `tx` (a TRUNCATE, an end marker) is handed on next, as its own transaction."""
        self.out.append(tx)

    def next_out(self) -> Transaction | None:
        """Under the lock: the next transaction queued by `then`, taken."""
        return self.out.popleft() if self.out else None

    def keyless_read(self, name: TableName) -> None:
        """Under the lock: the keyless copy of `name` was handed on: its binlog changes pass again."""
        self.keyless_open.discard(name)
