"""The Select contract: a source that hands the scheduler whole transactions in log order."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TypeVar

import attrs

from setl.model import Batch, Position, TableSchema, Transaction
from setl.tablecopy import TableProgress

#: What an ack's write returns (`Select.acknowledge`): the meta store's `setl.model.Ack`.
A = TypeVar("A")


@attrs.frozen
class SelectCapabilities:
    """What a source can do, declared by its connector (`setl.connectors.SourceConnector`).

    * `reports_head`: `head()` tells the end of the source log, so ``setl start
      --until-caught-up`` can stop there.
    * `snapshots`: its tables can be copied into the stream (``source.start: snapshot``,
      ``setl snapshot``); the Select it builds implements `setl.stages.snapshot.SnapshotCapable`.
    """

    reports_head: bool = False
    snapshots: bool = False


class Select(abc.ABC):
    """A source of transactions, read by exactly one thread of one pipeline.

    Contract for implementations:

    * `open` and `poll` may block (network reads); `poll` returns within about
      `timeout` seconds, with None when nothing arrived.
    * Transactions come out in source log order, each once per `open`/`seek`.
      A transaction's `end` is the position *after* it: resuming from it
      re-reads nothing the transaction covers and skips nothing after it.
    * A transaction too large to hold may come in pieces with `complete=False`;
      only the last piece is complete and ends at the transaction's end. A
      piece's `end` is a checkpoint inside the transaction (`Position.row` =
      the row changes of the transaction handed on so far, counted from its
      start) and may be acknowledged: resuming from it yields exactly the
      transaction's later changes, then what follows. Each change of a split
      transaction carries its own position (its 1-based ordinal as `row`), so
      ends and change positions are strictly increasing.
    * `seek(p)` rewinds (or advances) so that the next `poll` returns the first
      change after `p` (after a piece end: the rest of its transaction). The
      scheduler calls it after every rollback.
    * `head()` is the end of the source log as it stands now, or None if the
      source cannot tell; `setl start --until-caught-up` stops there.
    * `close()` releases connections. It may never be called if the process
      is killed, so nothing may depend on it for correctness.
    * `poll(0)` should return at once: Select then runs as a task on the node's
      shared threads. A source that can only wait in `poll` (it reads a socket
      itself, with no reader thread) sets `blocking = True` and gets a thread of
      its own, where `poll` is called with a short timeout.
    """

    blocking: bool = False
    #: Set by the connector registry from the connector's declaration.
    capabilities: SelectCapabilities = SelectCapabilities()

    @abc.abstractmethod
    def open(self, start: Position | None) -> None:
        """Connect and position the reader after `start` (None: the configured start)."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> Transaction | None:
        """The next transaction, or None if none arrived within `timeout` seconds."""

    def seek(self, position: Position | None) -> None:
        """Continue reading after `position`; by default reopen there."""
        self.close()
        self.open(position)

    def tell(self) -> Position | None:
        """Where reading continues now (after `open` or `seek`), if the source can tell."""
        return None

    def head(self) -> Position | None:
        """The end of the source log now, if the source can tell."""
        return None

    def behind(self) -> bool:
        """Whether the source reads a backlog now, well behind its log's end (a catch-up); False
        when it reads at the end or cannot tell. The batch cutter then lets a batch of changes fill
        past `max_wait_ms` (`setl.scheduler.cutter.BEHIND_WAIT_SECONDS`). Asked on the Select thread
        at most every few tens of milliseconds per batch; it must be cheap and must not block."""
        return False

    def passed(self) -> tuple[Position, Position] | None:
        """(after, through): the source read from `after`, an end it handed on, up to `through` and
        found nothing to hand on, not even a position (a two-way channel's echoes, which must not be
        acked: docs/bidirectional.md); None if it has not, or cannot tell. ``--until-caught-up`` ends
        once the ack reached `after`, `through` is at its target and no batch is in flight."""
        return None

    def listen(self, ready: Callable[[], None]) -> None:  # noqa: B027 - an optional hook
        """Register `ready`: while `notifies()` is true, the source calls it (from any thread; it
        must be cheap and never block) whenever a `poll` may return something it would not have
        returned before: rows, a failure, a change of stream. Position marks need not call it.
        Called once, by the scheduler built for it (maybe after `open`); by default ignored."""

    def notifies(self) -> bool:
        """Whether the source calls `listen`'s `ready` now (see there), so that a caller with
        nothing to read may wait for it instead of polling again soon (it still polls at least
        every `setl.scheduler.cutter.NOTIFIED_IDLE` seconds, for position marks and whatever
        else does not call `ready`). Asked on the scheduler's threads after each empty slice;
        it must be cheap, lock-free and must not block. False by default."""
        return False

    def describe(self) -> tuple[TableSchema, ...] | None:
        """The columns of every source table the pipeline selects as they stand now, before any row
        arrives, on a short-lived connection of its own; None when the source cannot tell.

        Used once at startup to analyse transform steps against each table's columns (a table
        created later is analysed at its first batch instead). May raise `SourceError` when the
        source cannot be reached; the caller then falls back to the first-batch analysis.
        """
        return None

    def backlog(self) -> bool:
        """True while the source has changes to hand on that its log position does not tell (a
        table copy in progress, `setl.snapshot`): ``--until-caught-up`` waits for them too."""
        return False

    def handed_on(self, batch: Batch) -> None:  # noqa: B027 - an optional hook
        """The scheduler cut `batch` from what `poll` returned since the last batch (its changes
        are the very objects `poll` handed on) and hands it on, before its Extract starts.

        Called on the Select thread, in batch-id order; a rewind (`seek`) forgets every batch
        handed on and not acked. A source whose acks carry state of its own (`acknowledge`) notes
        here which batch holds what. It must not block."""

    def acknowledge(self, batch: Batch, write: Callable[[tuple[TableProgress, ...]], A]) -> A:
        """Termin acks `batch` (handed on by this source, loaded, every earlier batch acked): call
        `write` exactly once with the table-copy progress (`setl.tablecopy.TableProgress`) that
        this ack makes durable, and return what it returns.

        `write` is the meta store's ack: the position and that progress are persisted in one
        atomic write, or neither is. When it raises, the source's state is as before the call
        and the error propagates (Termin rolls back and retries, as for any failed ack). Called
        on the Termin thread, in batch-id order. By default there is no progress: ``write(())``."""
        return write(())

    def close(self) -> None:  # noqa: B027 - an optional hook: sources without resources keep it
        """Release resources. Idempotent."""


class SelectWrapper(Select):
    """A Select around another (`inner`) that forwards every call and the inner's `blocking`
    hint; subclasses override what they change (fencing, signal rows).

    `listen` and `notifies` are not forwarded: a wrapper may hand on what its inner source never
    announces (copies, injected faults), so only one whose `poll` is the inner's (or less) forwards
    them (`forward_ready`)."""

    #: Whether `poll` returns nothing the inner source would not announce by `ready` (`listen`).
    forward_ready: bool = False

    def listen(self, ready: Callable[[], None]) -> None:
        if self.forward_ready:
            self.inner.listen(ready)

    def notifies(self) -> bool:
        return self.forward_ready and self.inner.notifies()

    def __init__(self, inner: Select) -> None:
        self.inner = inner

    @property
    def blocking(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner, "blocking", False))

    @property
    def capabilities(self) -> SelectCapabilities:  # type: ignore[override]
        return self.inner.capabilities

    def open(self, start: Position | None) -> None:
        self.inner.open(start)

    def poll(self, timeout: float) -> Transaction | None:
        return self.inner.poll(timeout)

    def seek(self, position: Position | None) -> None:
        self.inner.seek(position)

    def tell(self) -> Position | None:
        return self.inner.tell()

    def head(self) -> Position | None:
        return self.inner.head()

    def behind(self) -> bool:
        return self.inner.behind()

    def passed(self) -> tuple[Position, Position] | None:
        return self.inner.passed()

    def describe(self) -> tuple[TableSchema, ...] | None:
        return self.inner.describe()

    def backlog(self) -> bool:
        return self.inner.backlog()

    def handed_on(self, batch: Batch) -> None:
        self.inner.handed_on(batch)

    def acknowledge(self, batch: Batch, write: Callable[[tuple[TableProgress, ...]], A]) -> A:
        return self.inner.acknowledge(batch, write)

    def close(self) -> None:
        self.inner.close()
