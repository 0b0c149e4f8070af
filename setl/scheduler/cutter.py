"""Batch cutting, Select's side of the scheduler: transactions from the source become batches.

Touched only by the Select task, so it needs no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from setl.config import BatchSettings
from setl.model import Batch, Change, Position, Transaction
from setl.runtime import Progress
from setl.stages import Select

#: Longest one Select call reads from a source before it gives the thread back (real time).
SELECT_SLICE = 0.02
#: Longest a blocking Select waits in one poll: bounds how long a stop waits for it.
BLOCKING_POLL = 0.02
#: Longest the Select task of a source that announces new rows (`Select.notifies`) stays parked with
#: nothing to read, unless the source wakes it or its batch falls due first: it still polls this
#: often for position marks (acked at most once a second, `IDLE_ACK_SECONDS`) and for what the
#: source does not announce. A source that does not announce is polled every `idle_backoff_ms`.
NOTIFIED_IDLE = 0.25
#: A batch that holds no change yet (transactions of tables the pipeline does not read, which only
#: move its position) waits this long (or `max_wait_ms` if longer) for one: an idle pipeline writes
#: its position at most about once a second, not once per `max_wait_ms`. A change cuts it as usual.
IDLE_ACK_SECONDS = 1.0
#: While the source reads a backlog (`Select.behind`: a catch-up), a batch of changes past its
#: `max_wait_ms` keeps taking transactions until this long after its first change (or `max_rows`,
#: `max_bytes`): fewer, larger batches (each costs a target transaction, a position write and an
#: ack), where waiting adds nothing to the lag. At the log's end it is cut at `max_wait_ms` as ever.
BEHIND_WAIT_SECONDS = 1.0
#: How often a batch held past its `max_wait_ms` asks the source again whether it is still behind.
BEHIND_RECHECK = 0.05


@attrs.define(eq=False)
class _Cut:
    """The batch Select is reading; it lives across Select calls."""

    batch_id: int
    epoch: int
    start: Position | None
    end: Position | None
    changes: list[Change] = attrs.Factory(list)
    rows: int = 0
    size: int = 0
    deadline: float | None = None
    late_deadline: float | None = None  # the latest a batch of changes is cut while the source is behind
    taken: bool = False  # a transaction was read, maybe one with no changes that only moves the position
    first_at: float = 0.0  # when it was (perf_counter): the batch's age, for the select stage's latency


class BatchCutter:
    """Reads the source's transactions into batches of at most `limits` rows, bytes and wait.

    A batch ends after a transaction, or after a piece of a transaction delivered in pieces
    (whose end is a checkpoint inside it, `Position.row`), and a DDL is a batch of its own.
    The next batch starts where the last one handed on ended (`end`), with the next id.

    `node_permit` is asked before a cut takes its first transaction: False means the node's
    batch cap queued this pipeline, and `read` returns BLOCKED keeping the transaction for
    the next call. A source error after some transactions were read hands those on first
    and is kept in `deferred_error` for the next call.

    The first batch after a start or a rewind (`reset`) does not wait for more: it is cut as soon
    as the source has nothing more ready, so a new leader (or a retry) acks its first batch
    without lingering `max_wait_ms` over a backlog it has already read.
    """

    def __init__(self, name: str, select: Select, limits: BatchSettings, clock: Callable[[], float],
                 node_permit: Callable[[], bool]) -> None:
        self.name = name
        self.select = select
        self.limits = limits
        self.clock = clock
        self.node_permit = node_permit
        self.blocking = False  # the source waits in poll (it has a thread of its own)
        self.next_id = 1
        self.end: Position | None = None
        self.deferred_error: BaseException | None = None
        self._cut: _Cut | None = None
        self._pending: list[Transaction] = []
        self._eager = True  # the first batch since `reset`: cut once the source has nothing ready

    def reset(self, position: Position | None, next_id: int) -> None:
        """Cut again from `position` with id `next_id` (a start or a rewind): nothing read is kept."""
        self.next_id, self.end = next_id, position
        self._pending.clear()
        self._cut = None
        self.deferred_error = None
        self._eager = True

    @property
    def cutting(self) -> bool:
        return self._cut is not None

    def begin(self, epoch: int) -> None:
        """Start the next batch, of `epoch`, where the last one ended."""
        self._cut = _Cut(self.next_id, epoch, self.end, self.end)

    def age(self) -> float:
        """Seconds since the batch being cut took its first transaction (0 before)."""
        cut = self._cut
        return time.perf_counter() - cut.first_at if cut is not None and cut.taken else 0.0

    def drop(self) -> None:
        """Abandon the batch being read (a stop or a rewind)."""
        self._cut = None

    def handed_on(self, batch: Batch) -> None:
        """`batch` (the last `read` returned) is in flight: the next one follows it."""
        self._cut = None
        self._eager = False
        self.next_id = batch.id + 1
        self.end = batch.end

    def idle_for(self) -> float | None:
        """After a read that found nothing: how long the Select task may wait for the source to wake
        it (`Select.notifies`), until the batch being cut falls due and at most `NOTIFIED_IDLE`;
        None (poll again after the usual back-off) when the source does not announce new rows or
        polls block in the source itself (`blocking`)."""
        if self.blocking or not self.select.notifies():
            return None
        cut = self._cut
        deadline = None if cut is None else cut.deadline
        if deadline is None:
            return NOTIFIED_IDLE
        return max(0.0, min(NOTIFIED_IDLE, deadline - self.clock()))

    def _due(self, cut: _Cut, now: float) -> bool:
        """Whether the batch is due at `now`: past its deadline, and not a batch of changes that the
        source, still behind its log's end, fills on until `late_deadline` (its deadline then moves
        on by `BEHIND_RECHECK`, so that the source is asked again soon and the batch is cut as soon
        as it is no longer behind)."""
        deadline = cut.deadline
        if deadline is None or now < deadline:
            return False
        late = cut.late_deadline
        if cut.rows and late is not None and now < late and self.select.behind():
            cut.deadline = min(late, now + BEHIND_RECHECK)
            return False
        return True

    def read(self) -> Batch | Progress:
        """Read transactions into the current cut: the batch if it is complete, else how the call went."""
        cut = self._cut
        assert cut is not None
        limits = self.limits
        pending = self._pending
        slice_end = time.perf_counter() + SELECT_SLICE
        progressed = False
        while True:
            if pending:
                tx = pending.pop()
            else:
                now = self.clock()
                if cut.taken and self._due(cut, now):
                    break
                if time.perf_counter() >= slice_end:
                    return Progress.PROGRESS if progressed else Progress.NO_PROGRESS
                timeout = 0.0
                if self.blocking:
                    timeout = BLOCKING_POLL if cut.deadline is None else min(
                        BLOCKING_POLL, max(0.0, cut.deadline - now))
                try:
                    polled = self.select.poll(timeout)
                except BaseException as exc:
                    if not cut.taken:
                        raise
                    # Hand on what was read so far (it ends at a checkpoint); report the error next.
                    self.deferred_error = exc
                    break
                if polled is None:
                    if self._eager and cut.taken:
                        break
                    return Progress.PROGRESS if progressed else Progress.NO_PROGRESS
                tx = polled
            if not cut.taken and not self.node_permit():
                pending.append(tx)
                return Progress.BLOCKED  # the node cap hands us a permit, in turn, and wakes us
            progressed = True
            ddl = tx.is_ddl
            if ddl and cut.changes:
                pending.append(tx)
                break
            if not cut.taken:
                cut.first_at = time.perf_counter()
            cut.taken = True
            changes = tx.changes
            if changes:
                if not cut.rows:  # its first change: `max_wait_ms` from now at most
                    now = self.clock()
                    wait = now + limits.max_wait_ms / 1000.0
                    cut.deadline = wait if cut.deadline is None else min(cut.deadline, wait)
                    cut.late_deadline = max(wait, now + BEHIND_WAIT_SECONDS)
                cut.changes.extend(changes)
                cut.rows += len(changes)
            elif cut.deadline is None:
                cut.deadline = self.clock() + max(IDLE_ACK_SECONDS, limits.max_wait_ms / 1000.0)
            cut.size += tx.nbytes
            # A piece of a split transaction ends at a checkpoint too (Position.row).
            cut.end = tx.end
            if ddl:
                break
            if cut.rows >= limits.max_rows or cut.size >= limits.max_bytes:
                break
            if self._due(cut, self.clock()):
                break
        assert cut.end is not None
        return Batch(
            pipeline=self.name,
            id=cut.batch_id,
            epoch=cut.epoch,
            start=cut.start if cut.start is not None else cut.end,
            end=cut.end,
            changes=tuple(cut.changes),
        )
