"""How far behind its source a pipeline is: lag in seconds, bytes and events behind, rows acked per
second, as a frozen `Figures` value per pipeline (`LagTracker`, a scheduler `Listener`).

Lag is the age of what the target lacks, honest on an idle source:

* **caught up** (lag 0): the acked position is at the end of what the binlog reader has read, and
  the reader heard from the server within its heartbeat period (an idle server sends heartbeat
  events, so silence means the connection, not the source, is idle). A reader not heard from for
  longer reports the silence as lag: a dead stream never looks caught up.
* **behind**: now minus the newest of the commit time of the last acked change and the last time
  the pipeline was seen caught up. The binlog's commit times have whole seconds: a transaction the
  reader read within its commit's second is timed by when it was read (the source's `arrivals`),
  which a reader following the log does within milliseconds. Change values are never touched:
  `RowChange.commit_time` stays the binlog's, the same on every replay.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from setl.model import Ack, Batch, Position, RowChange
from setl.scheduler.events import Listener
from setl.stages.layers import unwrap

#: Seconds of acks the rate is averaged over.
RATE_WINDOW = 10.0
#: Rollbacks kept for the status page.
RECENT_ROLLBACKS = 10


@attrs.frozen
class Figures:
    """One pipeline's figures at `time` (seconds since the epoch); None where not known yet."""

    time: float
    lag_seconds: float | None  # seconds behind the source (0 when caught up)
    bytes_behind: int | None  # binlog bytes between the acked position and the log's end
    events_behind: int  # row changes read from the binlog and not acked yet
    rows_per_second: float  # rows acked per second, over the last RATE_WINDOW seconds
    caught_up: bool  # the ack is at the log's end as last heard
    acked_rows: int  # rows acked since the node started
    acked_batches: int  # batches acked since the node started
    in_flight: int  # batches between Select and Termin
    source_heard_ago: float | None  # seconds since the binlog reader last heard from the server
    position: Position | None = None  # the acked position

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: numbers rounded, the position as fields."""
        return {
            "time": round(self.time, 3),
            "lag_seconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
            "bytes_behind": self.bytes_behind,
            "events_behind": self.events_behind,
            "rows_per_second": round(self.rows_per_second, 1),
            "caught_up": self.caught_up,
            "acked_rows": self.acked_rows,
            "acked_batches": self.acked_batches,
            "in_flight": self.in_flight,
            "source_heard_ago": None if self.source_heard_ago is None else round(self.source_heard_ago, 3),
            "position": self.position.to_dict() if self.position is not None else None,
        }


def _innermost(select: Any, attribute: str) -> Any:
    """The first stage in `select`'s wrapper chain (through `inner`) that has `attribute`."""
    return next((layer for layer in unwrap(select) if hasattr(layer, attribute)), None)


class LagTracker(Listener):
    """A pipeline's lag figures, fed by its scheduler's hooks and by `refresh` (the node's sampler).

    Hooks run on scheduler threads and only record; `figures` computes on demand. `select` is the
    pipeline's source as composed (wrappers are looked through): a binlog source's `heard` and
    `heartbeat` tell whether it is caught up, its `bytes_behind` the bytes behind (`refresh`).
    """

    def __init__(self, pipeline: str, select: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.pipeline = pipeline
        self.clock = clock
        self._lock = threading.Lock()
        self.read_from(select)
        self._acked: Position | None = None
        self._acked_commit: float | None = None  # commit time of the last acked row change
        self._caught_up_at: float | None = None  # the last time the ack was seen at the log's end
        self._head: tuple[Position, int, float] | None = None  # (log end, bytes behind it, when) from refresh
        self.acked_rows = 0
        self.acked_batches = 0
        self._rows_in_flight = 0
        self._in_flight = 0
        self._rates: collections.deque[tuple[float, int]] = collections.deque()
        self.rollbacks: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_ROLLBACKS)

    # --- hooks (scheduler threads) -------------------------------------------------------------

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        self._in_flight = in_flight
        self._rows_in_flight += len(batch)

    def on_retire(self, batch: Batch, in_flight: int) -> None:
        self._in_flight = in_flight
        self._rows_in_flight = max(0, self._rows_in_flight - len(batch))

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        commit = None
        for change in reversed(batch.changes):
            if isinstance(change, RowChange) and change.commit_time is not None:
                commit = change.commit_time
                break
        if commit is not None:
            commit = self._refined(commit, ack.position)
        with self._lock:
            self._acked = ack.position
            if commit is not None and (self._acked_commit is None or commit > self._acked_commit):
                self._acked_commit = commit
            self.acked_rows += len(batch)
            self.acked_batches += 1
            self._check_caught_up()

    def on_rollback(self, batch_id: int, epoch: int, error: BaseException, attempt: int) -> None:
        self.rollbacks.append({"time": round(self.clock(), 3), "batch": batch_id, "epoch": epoch,
                               "attempt": attempt, "error": str(error)})

    def start_at(self, position: Position | None) -> None:
        """The pipeline (re)starts from `position` (its ack)."""
        with self._lock:
            if position is not None and (self._acked is None or position > self._acked):
                self._acked = position

    # --- figures -------------------------------------------------------------------------------

    def _refined(self, commit: float, position: Position) -> float:
        """The commit time of the change acked at `position`: the binlog's whole second, refined by
        when the reader read it if that was within the same second (a reader following the log)."""
        arrivals = getattr(self._reader, "arrivals", None)
        read_at = None
        while arrivals:
            end, when = arrivals[0]
            if end > position:
                break
            arrivals.popleft()
            read_at = when
        if read_at is not None and commit <= read_at < commit + 1:
            return read_at
        return commit

    def read_from(self, select: Any) -> None:
        """Take the figures from `select` from now on: a reload or a restart builds a new source, and
        the old one, closed, is never heard again (its last hearing would age into a false lag)."""
        with self._lock:
            self._reader = _innermost(select, "heard")
            self._backlogs = _innermost(select, "bytes_behind")
            self._heads = _innermost(select, "head")
            self._head = None

    def _heard(self) -> tuple[Position, float] | None:
        return getattr(self._reader, "heard", None) if self._reader is not None else None

    def _fresh_after(self) -> float:
        """How long after the reader last heard from the server its silence means no news."""
        heartbeat = getattr(self._reader, "heartbeat", None)
        return 2.0 * float(heartbeat) + 0.5 if heartbeat else 3.0

    def _check_caught_up(self) -> bool:
        """Under the lock: whether the ack is at the end of what the reader read; notes when."""
        heard = self._heard()
        # A checkpoint inside a transaction delivered in pieces (`Position.row`) sorts after the
        # transaction's start, which is where the reader last stood between transactions: the rest
        # of that transaction is still to come, so it is never caught up.
        if heard is not None and self._acked is not None and not self._acked.within_transaction \
                and self._acked >= heard[0]:
            if self._caught_up_at is None or heard[1] > self._caught_up_at:
                self._caught_up_at = heard[1]
            return True
        return False

    def figures(self, now: float | None = None) -> Figures:
        now = self.clock() if now is None else now
        with self._lock:
            heard = self._heard()
            caught_up = self._check_caught_up()
            heard_ago = None if heard is None else max(0.0, now - heard[1])
            if heard is None and self._head is not None and self._acked is not None:
                head, _behind, when = self._head
                caught_up = self._acked >= head  # a source without a reader: as of the last refresh
                if caught_up and (self._caught_up_at is None or when > self._caught_up_at):
                    self._caught_up_at = when
            lag: float | None
            if caught_up and heard_ago is not None and heard_ago > self._fresh_after():
                lag = heard_ago  # caught up with a reader that has gone quiet: its silence is the lag
            elif caught_up:
                lag = 0.0
            else:
                since = max((t for t in (self._acked_commit, self._caught_up_at) if t is not None), default=None)
                lag = None if since is None else max(0.0, now - since)
            bytes_behind: int | None
            if caught_up:
                bytes_behind = 0
            elif self._head is not None and self._acked is not None and self._head[0].log == self._acked.log:
                bytes_behind = max(0, self._head[0].offset - self._acked.offset)
            elif self._head is not None:
                bytes_behind = self._head[1]  # across files: as of the last refresh
            else:
                bytes_behind = None
            queued = int(getattr(self._reader, "_queued_rows", 0) or 0) if self._reader is not None else 0
            events = 0 if caught_up else self._rows_in_flight + queued
            return Figures(time=now, lag_seconds=lag, bytes_behind=bytes_behind, events_behind=events,
                           rows_per_second=self._rate(now), caught_up=caught_up, acked_rows=self.acked_rows,
                           acked_batches=self.acked_batches, in_flight=self._in_flight,
                           source_heard_ago=heard_ago, position=self._acked)

    def _rate(self, now: float) -> float:
        rates = self._rates
        rates.append((now, self.acked_rows))
        while len(rates) > 2 and now - rates[1][0] >= RATE_WINDOW:
            rates.popleft()
        first_time, first_rows = rates[0]
        span = now - first_time
        return (self.acked_rows - first_rows) / span if span > 0.2 else 0.0

    def refresh(self) -> None:
        """Ask the source where its log ends and how many bytes the ack is behind it (blocks on the
        source; the node's sampler calls it every few seconds, never a scheduler thread)."""
        with self._lock:
            acked = self._acked
        if acked is None:
            return
        when = self.clock()
        found: tuple[Position, int] | None = None
        if self._backlogs is not None:
            found = self._backlogs.bytes_behind(acked)
        elif self._heads is not None:
            head = self._heads.head()
            if head is not None and head.log == acked.log:
                found = (head, max(0, head.offset - acked.offset))
        if found is not None:
            with self._lock:
                self._head = (found[0], found[1], when)
