"""What passes from the binlog reader thread to `poll`: `Handoff`, the queue bounded by rows between
them, `Failure`, the thread's end by an error, and `ReaderFigures`, what the reader has done so far
(the lag figures' "heard" and arrival times, reconnects, the most rows held).

Each is one owner of its state with a narrow interface, so the hand-off and the figures can be
driven without a server or a thread (tests/sources/test_binlog_handoff.py).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Container, Sequence

import attrs

from setl.model import Position, Transaction

#: Arrival times kept for the lag figures (a reader that nobody asks drops the oldest).
ARRIVALS = 10_000
#: A transaction read this many seconds or more after its commit's second was read from a backlog.
LATE_SECONDS = 2.0
#: The reader counts as behind its log's end (`ReaderFigures.behind`) while it handed on such a
#: transaction within this many seconds.
LATE_FRESH = 0.5


class Stopped(Exception):
    """The reader was closed; its thread ends quietly."""


@attrs.frozen
class Failure:
    """The reader thread's end by an error, queued for `poll` to raise; `position`: the last end handed on."""

    error: BaseException
    position: Position | None


Item = Transaction | Failure


def weight(item: Item) -> int:
    """What an item counts for in the queue: its rows, at least one."""
    return max(1, len(item.changes)) if isinstance(item, Transaction) else 1


class ReaderFigures:
    """What a source's reader threads have done, kept across opens (a rewind keeps them): written by
    the reader thread through its methods, read by the lag figures and by tests."""

    def __init__(self) -> None:
        self.peak_buffered_rows = 0  # the most rows queued and held by the assembler at once
        self.reconnects = 0  # streams re-established after a lost connection
        #: (position, time.time()): where the reader last stood between transactions, and when.
        #: A heartbeat from an idle server renews the time: the log ended there then (lag figures).
        self.heard: tuple[Position, float] | None = None
        #: (end, time.time()) of transactions read within the second of their commit timestamp, oldest
        #: first: the binlog's timestamps have whole seconds, the time read refines them (lag figures).
        self.arrivals: collections.deque[tuple[Position, float]] = collections.deque(maxlen=ARRIVALS)
        #: (after, through): the reader read from `after`, an end it handed on, to `through` and found
        #: only echoes of a marker loop guard (`marks.MarkGuard.passing`), which hand on no position.
        #: A fact of the binlog, true across rewinds: `--until-caught-up` ends once the ack reached
        #: `after` and `through` its target (`setl.stages.Select.passed`).
        self.passed: tuple[Position, Position] | None = None
        #: time.time() when the reader last handed on a transaction read `LATE_SECONDS` or more after
        #: its commit's second (a backlog); 0.0: never
        self.late = 0.0

    def behind(self, now: float) -> bool:
        """Whether the reader reads a backlog at `now`: it handed on a transaction read late
        (`LATE_SECONDS` after its commit) within `LATE_FRESH`. A reader at the log's end reads each
        transaction within its commit's second (assuming the server's and node's clocks agree to
        about a second, as the lag figures do); an idle one hands on nothing late."""
        return now - self.late < LATE_FRESH

    def buffered(self, rows: int) -> None:
        """`rows` are queued or held at once now."""
        if rows > self.peak_buffered_rows:
            self.peak_buffered_rows = rows

    def reconnected(self) -> None:
        self.reconnects += 1

    def hear(self, position: Position, now: float) -> None:
        """The reader stood at `position` between transactions at `now`, and the log ended there."""
        self.heard = (position, now)

    def passing(self, passed: tuple[Position, Position] | None) -> None:
        """The reader read past echoes (`passed`, see the attribute; None: nothing new)."""
        if passed is not None:
            self.passed = passed

    def arrived(self, end: Position, now: float) -> None:
        """A transaction ending at `end` was read at `now`, within its commit's second."""
        self.arrivals.append((end, now))


class Handoff:
    """The queue of one open between the reader (`put`, or `put_all` a frame of them) and `poll`
    (`take`), bounded by rows.

    The reader runs ahead by up to `max_rows` rows (an item without rows counting as one); an item
    that would pass the bound waits until the queue is empty enough, so one bigger than the bound
    waits for an empty queue. `put` gives up with `Stopped` once `stop` is set. One lock guards the
    items and their count (a deque, not a `queue.Queue` with a lock of its own besides).
    """

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._items: collections.deque[Item] = collections.deque()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # the reader waits here for the queue to drain
        self._ready = threading.Condition(self._lock)  # `take` waits here for an item
        self._queued = 0  # rows in the queue

    def put(self, item: Item, stop: threading.Event) -> None:
        """Queue `item` once there is room for it (blocks; raises `Stopped` when `stop` is set)."""
        rows = weight(item)
        with self._lock:
            while self._queued and self._queued + rows > self.max_rows:
                if stop.is_set():
                    raise Stopped()
                self._room.wait(0.1)
            self._queued += rows
            self._items.append(item)
            self._ready.notify()

    def put_all(self, items: Sequence[Item], stop: threading.Event, late: Container[int] = (),
                mark: Callable[[], None] | None = None) -> None:
        """Queue `items` in order as `put` would one by one, under one taking of the lock while each
        finds room; `mark()` is called before queuing each item whose index is in `late` (the
        reader process's receiver: `ReaderFigures.late` set, then the transaction read late handed on)."""
        items_ = self._items
        with self._lock:
            for i, item in enumerate(items):
                if mark is not None and i in late:
                    mark()
                rows = weight(item)
                while self._queued and self._queued + rows > self.max_rows:
                    if stop.is_set():
                        self._ready.notify()
                        raise Stopped()
                    self._ready.notify()  # what is queued so far can be taken meanwhile
                    self._room.wait(0.1)
                self._queued += rows
                items_.append(item)
            self._ready.notify()

    def take(self, timeout: float | None) -> Item | None:
        """The next item, waiting at most `timeout` seconds (None: not at all); None when there is none."""
        with self._lock:
            items = self._items
            if not items:
                if timeout is None:
                    return None
                deadline = time.monotonic() + timeout
                while not items:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._ready.wait(left)
            item = items.popleft()
            self._queued -= weight(item)
            self._room.notify()
            return item

    def queued_with(self, held: int) -> int:
        """The rows queued, plus `held` (the rows the assembler holds)."""
        with self._lock:
            return self._queued + held
