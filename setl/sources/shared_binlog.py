"""One binlog read per (node, source): the pipelines of a node that read the same MySQL or MariaDB
server share one binlog stream, and each keeps its own position, acks and rollbacks.

A `SharedReader` owns one `MysqlBinlogSource` (a `_SharedStream`) whose reader thread hands each
bulk of transactions to every `_Subscription` itself (`_HandOn`), cut down to the rows of the tables
its pipeline selects and to what lies after its own position; the `SharedReader`'s own thread
opens and rewinds the stream and hands on what the reader left pending. A pipeline's Select is a
`SharedBinlogSource`: a `MysqlBinlogSource` that reads through a subscription when it can and
with a stream of its own when it cannot (a start without a position, a start far behind the shared
stream, a subscription dropped because its pipeline fell a whole buffer behind), and joins the
shared stream again once close to it.
"""

from __future__ import annotations

import collections
import copy
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Container, Hashable, Sequence
from typing import Any

import attrs

from setl.errors import SetlError, SourceError
from setl.model import Position, RowChange, Transaction
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.sources.mysql_binlog.handoff import Failure, Handoff, Stopped
from setl.sources.mysql_binlog.reader import failure_error

log = logging.getLogger("setl.sources.shared")

#: A pipeline at most this many bytes behind the shared stream (in the same binlog file) rewinds
#: it to its own position instead of reading alone: the others re-read that much and skip it.
REWIND_BYTES = 32 << 20
#: A pipeline's buffer in the shared stream holds this many batches (batch.max_rows) of its rows.
BUFFER_BATCHES = 4
#: How long a pipeline with a full buffer may go without asking for rows, while another waits for
#: rows, before it is dropped from the shared stream.
HOLD_SECONDS = 1.0
#: The longest the stream waits on pipelines that ask for no rows, even when no other waits for rows.
STUCK_SECONDS = 5.0
#: A new shared stream waits for the pipelines of its source built and not opened yet while one of
#: them was built or opened within this many seconds (a node opens its pipelines one by one).
SIBLINGS_SECONDS = 5.0
#: How often a pipeline reading alone checks whether it can join the shared stream (seconds).
MERGE_EVERY = 1.0
#: `take` hands a pipeline its queued whole transactions of rows as one, up to this share of its
#: batch (`max_rows_in_memory`): one poll and one cut step for many small transactions.
MERGE_SHARE = 8
#: The reader (or the pump) hands on at most this many transactions the stream has ready at once (and at most
#: `max_rows_in_memory / MERGE_SHARE` rows after the first): each pipeline gets its share of them
#: in one queue step and one wake-up instead of one per transaction.
PUMP_BULK = 64
#: A shared stream's reader hands on its bulk itself once it is full (`PUMP_BULK`); a bulk the reader
#: added nothing to for this long is handed on by the stream's own thread (`SharedReader._settle`).
SETTLE_SECONDS = 0.001


@attrs.frozen
class _Failed:
    """The shared stream's end by an error, queued for each subscriber to raise as its own."""

    error: SetlError


_DETACHED = object()  # `_Subscription.take`: the pump dropped this subscriber (its buffer was full)


def _weight(tx: Transaction) -> int:
    return max(1, len(tx.changes))


def _groups(tx: Transaction) -> dict[tuple[str, str], list[RowChange]] | None:
    """The row changes of `tx` by table, each in binlog order; None when it holds a DDL change."""
    groups: dict[tuple[str, str], list[RowChange]] = {}
    for change in tx.changes:
        if type(change) is not RowChange:
            return None
        name = (change.schema, change.table)
        group = groups.get(name)
        if group is None:
            groups[name] = [change]
        else:
            group.append(change)
    return groups


def _is_mark(item: object) -> bool:
    return isinstance(item, Transaction) and not item.changes and item.complete


class _Subscription:
    """One pipeline's part of a shared stream: the transactions queued for it after `after`, at
    most `limit` rows of them (a bigger transaction alone). The thread handing on (the stream's
    reader, or its own thread, one at a time: `SharedReader._flush`) calls `cut`, `pass_over`,
    `put`, `drop` and `fail`; the pipeline's Select thread calls `take`. "Pump thread" below means
    that thread.

    A transaction with nothing for it is not queued: `pass_over` only notes its end (`passed`),
    and `take` hands that on as one position mark once everything queued before it was taken."""

    def __init__(self, pipeline: str, after: Position, limit: int, keep: Callable[[str, str], bool] | None,
                 merge: int = 1, ready: Callable[[], None] | None = None) -> None:
        self.pipeline = pipeline
        self.after = after  # the end of the last transaction queued (or passed over) for it
        self.limit = limit
        self.keep = keep
        self.merge = merge  # `take` joins queued whole transactions of rows up to this many rows
        self._kept: dict[tuple[str, str], bool] = {}
        # (transaction, whether it is whole and of rows only, so that `take` may join it to the next)
        self._items: collections.deque[tuple[Transaction, bool] | _Failed] = collections.deque()
        self._rows = 0
        # The end of the last whole transaction passed over after everything queued: written by the
        # pump alone (a plain store, no lock), cleared by `put`; `take` hands it on once as a mark.
        self.passed: Position | None = None
        self._marked: Position | None = None  # the last `passed` handed on
        self.detached = False
        self.asked = time.monotonic()  # when its pipeline last asked for rows (`take`)
        self._ready = threading.Condition()
        #: called (pump thread, no lock held) when something is queued for `take` after its last
        #: `take` found nothing (`_announce`), a failure or a drop: it wakes the pipeline's Select
        #: task (`Select.listen`), which otherwise waits (`setl.scheduler.cutter.NOTIFIED_IDLE` at
        #: most) instead of polling
        self.ready = ready
        self._waiting = True  # its last `take` found nothing (under `_ready`): the next queuing wakes it

    def _keeps(self, name: tuple[str, str]) -> bool:
        kept = self._kept.get(name)
        if kept is None:
            assert self.keep is not None
            kept = self._kept[name] = self.keep(*name)
        return kept

    def _selected(self, change: object) -> bool:
        if self.keep is None or type(change) is not RowChange:
            return True  # DDL and marks reach every pipeline: Extract judges DDL against its rules
        return self._keeps((change.schema, change.table))

    def cut(self, tx: Transaction, groups: dict[tuple[str, str], list[RowChange]] | None = None
            ) -> Transaction | None:
        """What of `tx` this pipeline reads (pump thread), None for nothing; moves `after` past it.
        `groups`: the row changes of `tx` by table (`_groups`), so that a pipeline reading one of its
        tables takes that table's changes as they are instead of testing every change."""
        end, after = tx.end, self.after
        # `tx.end <= self.after`, without attrs' generated comparison (asked per pipeline per transaction)
        if self.detached or (end.log, end.offset, end.row) <= (after.log, after.offset, after.row):
            return None
        changes = tx.changes
        if self.after.row:  # resuming inside a split transaction: its first `row` changes were handed on
            changes = tuple(c for c in changes if c.position is None or c.position > self.after)
            groups = None
        if self.keep is not None:
            kept = None if groups is None else [group for name, group in groups.items() if self._keeps(name)]
            if kept is None or 1 < len(kept) < len(groups or ()):
                changes = tuple(c for c in changes if self._selected(c))
            elif len(kept) == 1 and len(groups or ()) > 1:
                changes = tuple(kept[0])
            elif not kept:
                changes = ()
        self.after = tx.end
        if not changes and not tx.complete:
            return None  # a piece with nothing for this pipeline: its next piece or its end says more
        return tx if len(changes) == len(tx.changes) else Transaction(changes, tx.end, tx.complete, tx.nbytes)

    def keeps(self, name: tuple[str, str]) -> bool:
        """Whether its pipeline reads table `name` (`keep` None: every table)."""
        return self.keep is None or self._keeps(name)

    def pass_over(self, end: Position, complete: bool, note: bool = True) -> Position | None:
        """A transaction (or piece) ending at `end` holds nothing for it (pump thread): move `after`
        past it and, for a whole one, note `end` for `take`'s mark (`note` False: return it instead,
        for the pump to note once what it queued before it is queued). Takes no lock."""
        after = self.after
        if self.detached or (end.log, end.offset, end.row) <= (after.log, after.offset, after.row):
            return None
        self.after = end
        if not complete:
            return None
        if note:
            self.passed = end
        return end

    def full(self, tx: Transaction) -> bool:
        """Whether queuing `tx` would pass the limit (an empty buffer takes anything)."""
        return self.full_for(_weight(tx))

    def full_for(self, weight: int) -> bool:
        """Whether queuing transactions of `weight` (`_weight` summed) would pass the limit (an empty
        buffer takes anything)."""
        with self._ready:
            return bool(self._rows) and self._rows + weight > self.limit

    def stalled(self, now: float) -> bool:
        """Whether its pipeline has not asked for rows for `HOLD_SECONDS` (paused, stuck, retrying)."""
        return now - self.asked >= HOLD_SECONDS

    def starving(self) -> bool:
        """Whether its pipeline has taken everything queued and waits for more."""
        with self._ready:
            return not self._items and not self.detached

    def put(self, tx: Transaction, plain: bool = False) -> None:
        """Queue `tx` (pump thread); never blocks. `plain`: whole and of row changes only (`take` may
        join it to the transactions queued next to it)."""
        with self._ready:
            idle, self._waiting = self._waiting, False
            self._items.append((tx, plain))
            self._rows += _weight(tx)
            self.passed = None  # `tx` ends after it: its end says as much
            self._ready.notify()
        if idle:
            self._announce()

    def put_all(self, items: list[tuple[Transaction, bool]], passed: Position | None = None) -> None:
        """Queue `items` ((transaction, plain) as `put` takes them, in order) in one step and one
        wake-up (pump thread); never blocks. `passed`: the end of a whole transaction passed over
        after the last of them, noted for `take`'s mark."""
        with self._ready:
            idle, self._waiting = self._waiting, False
            self._items.extend(items)
            self._rows += sum(_weight(tx) for tx, _ in items)
            self.passed = None  # they end after it
            self._ready.notify()
        if passed is not None:
            self.passed = passed
        if idle:
            self._announce()

    def _announce(self) -> None:
        """Wake its pipeline's Select (`ready`). Queuing calls it only when its last `take` found
        nothing (or it took nothing yet): otherwise its Select was woken already, or is still
        taking, and takes what was queued before it waits again."""
        ready = self.ready
        if ready is not None:
            ready()

    def drop(self) -> None:
        """Detach it (pump thread): its pipeline reads alone from what it took last."""
        with self._ready:
            self.detached = True
            self._items.clear()
            self._rows = 0
            self._ready.notify()
        self._announce()

    def fail(self, error: SetlError) -> None:
        """The shared stream failed: the pipeline raises `error` (as its own) once it took what came before."""
        with self._ready:
            self._items.append(_Failed(error))
            self._ready.notify()
        self._announce()

    def take(self, timeout: float) -> Transaction | _Failed | object | None:
        """The next item, None when none arrived within `timeout`, or `_DETACHED`. Whole transactions
        of rows queued one after another come as one (up to `merge` rows): the same changes in the
        same order, ending where the last ends, so every position handed on is still a
        transaction's end."""
        self.asked = time.monotonic()
        with self._ready:
            items = self._items
            if not items and not self.detached and self._unmarked() is None:
                self._ready.wait(max(0.0, timeout))
            if self.detached:
                return _DETACHED
            if not items:
                passed = self._unmarked()
                if passed is None:
                    self._waiting = True
                    return None
                self._marked = passed
                return Transaction((), passed, True, 0)
            item = items.popleft()
            if isinstance(item, _Failed):
                return item
            tx, plain = item
            self._rows -= _weight(tx)
            if _is_mark(tx):
                while items and not isinstance(items[0], _Failed) and _is_mark(items[0][0]):
                    self._rows -= 1  # a mark weighs 1 (`_weight`)
                    tx = items.popleft()[0]  # type: ignore[index]  # a later mark supersedes it
                return tx
            if not plain or not items:
                return tx
            joined: list[Transaction] = [tx]
            rows = len(tx.changes)
            while items:
                nxt = items[0]
                if isinstance(nxt, _Failed) or not nxt[1] or rows + len(nxt[0].changes) > self.merge:
                    break
                items.popleft()
                joined.append(nxt[0])
                rows += len(nxt[0].changes)
                self._rows -= _weight(nxt[0])
            if len(joined) == 1:
                return tx
            changes = tuple(itertools.chain.from_iterable(t.changes for t in joined))
            return Transaction(changes, joined[-1].end, True, sum(t.nbytes for t in joined))

    def _unmarked(self) -> Position | None:
        """`passed` when it was not handed on yet (under `_ready`)."""
        passed = self.passed
        return passed if passed is not None and passed is not self._marked else None

    def queued_rows(self) -> int:
        """The rows its buffer counts now (0 once it is empty)."""
        with self._ready:
            return self._rows


class _HandOn(Handoff):
    """The hand-off of one open of a shared stream (`_SharedStream`): `put`, on the reader's own
    thread, hands each transaction straight on to the subscriptions (`SharedReader._put`) instead of
    queuing it for a pump thread to take again. It queues nothing: back-pressure is the
    subscriptions' buffers (`_hand_on` waits on a full one as the pump did)."""

    def __init__(self, reader: SharedReader, max_rows: int) -> None:
        super().__init__(max_rows)
        self.reader = reader
        self.dead = False  # a rewind replaced this open: what its reader still reads is dropped

    def put(self, item: Transaction | Failure, stop: threading.Event) -> None:
        self.reader._put(self, item, stop)

    def put_all(self, items: Sequence[Transaction | Failure], stop: threading.Event, late: Container[int] = (),
                mark: Callable[[], None] | None = None) -> None:
        """`put` each of `items` in order (`mark()` first for an index in `late`): a reader that hands
        on a frame of them at once."""
        for i, item in enumerate(items):
            if mark is not None and i in late:
                mark()
            self.reader._put(self, item, stop)


class _SharedStream(MysqlBinlogSource):
    """The shared stream's own `MysqlBinlogSource`: each open's reader thread hands on through a
    `_HandOn` of its `SharedReader` (`owner`), so nobody polls it."""

    owner: SharedReader | None = None
    handon: _HandOn | None = None  # the open's

    def _new_handoff(self) -> Handoff:
        if self.owner is None:
            return super()._new_handoff()
        self.handon = _HandOn(self.owner, self.max_rows_in_memory)
        return self.handon


class SharedReader:
    """One binlog stream of a source shared by the subscriptions of a node's pipelines.

    It reads from the earliest position it was asked for: a subscription at or after the stream's
    position joins as it is; one behind it by at most `REWIND_BYTES` in the same file rewinds the
    stream (the others skip what they had); one further behind is refused (its pipeline reads
    alone until it is close). It stops when its last subscription leaves or the stream fails."""

    def __init__(self, key: Hashable, source: MysqlBinlogSource, start: Position,
                 siblings_until: Callable[[], float] = lambda: 0.0) -> None:
        self.key = key
        self.source = source
        self.pumped = start  # the end of the last transaction handed to the subscriptions
        self.siblings_until = siblings_until  # when to stop waiting for pipelines that have not opened yet
        self.opened = False
        self._rewind: Position | None = None
        self._subs: tuple[_Subscription, ...] = ()  # replaced, never changed in place (`_routes` keys on it)
        self._routed: tuple[_Subscription, ...] = ()  # the subscriptions `_routes` was built for
        self._routes: dict[tuple[str, str], tuple[_Subscription, ...]] = {}  # per table, who reads it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.ended = False
        self.rewinds = 0
        #: a `_SharedStream` hands each transaction on on its reader's thread (`_put`); the thread
        #: here only opens the stream and rewinds it. Any other source is polled by a pump thread.
        self.direct = isinstance(source, _SharedStream)
        if isinstance(source, _SharedStream):
            source.owner = self
        self._wake = threading.Event()  # a rewind asked for, or the stop
        self._pending: list[Transaction] = []  # read by the reader thread, not handed on yet (`_put`)
        self._pending_rows = 0
        self._added = 0  # transactions the reader added to `_pending` so far (`_settle`)
        self._most = max(1, source.max_rows_in_memory // MERGE_SHARE)  # the rows of a bulk (`PUMP_BULK`)
        self._handing = threading.Lock()  # one `_flush` at a time: the reader's or the control thread's
        self._thread = threading.Thread(target=self._control if self.direct else self._pump,
                                        name=f"setl-shared-binlog-{source.host}:{source.port}", daemon=True)

    def start(self) -> None:
        """Start the pump: it opens the stream once the node's other pipelines of this source built
        and not opened yet did (or none opened for `SIBLINGS_SECONDS`), at the earliest position
        asked for by then, so that pipelines started together read the binlog once."""
        self._thread.start()

    def selects(self, schema: str, table: str) -> bool:
        """Whether any subscriber's pipeline selects `schema.table` (the stream's refusals judge those)."""
        with self._lock:
            subs = list(self._subs)
        return any(s.keep is None or s.keep(schema, table) for s in subs)

    def attach(self, pipeline: str, at: Position, limit: int, keep: Callable[[str, str], bool] | None,
               ready: Callable[[], None] | None = None) -> _Subscription | None:
        """A subscription for what follows `at`, or None when `at` is too far behind (or the stream ended)."""
        with self._lock:
            if self.ended:
                return None
            if at < self.pumped and not self.opened:
                self.pumped = at  # nothing read yet: the stream starts there
            elif at < self.pumped:
                if at.log != self.pumped.log or self.pumped.offset - at.offset > REWIND_BYTES:
                    return None
                self._rewind = at if self._rewind is None else min(self._rewind, at)
            elif self.opened and self.source.passes_over():
                # The stream passed over the rows of tables none of its pipelines read (`skipping`),
                # maybe this one's, in what it read after `pumped`: it reads that again, knowing. (A
                # stream that passed over nothing yet asks `selects`, which sees this one, first.)
                self._rewind = self.pumped if self._rewind is None else min(self._rewind, self.pumped)
            if self._rewind is not None:
                self._wake.set()
            sub = _Subscription(pipeline, at, limit, keep, merge=max(1, limit // BUFFER_BATCHES // MERGE_SHARE),
                                ready=ready)
            self._subs = (*self._subs, sub)
            return sub

    def detach(self, sub: _Subscription) -> bool:
        """Drop `sub`; True when it was the last (the stream then stops, see `stop`)."""
        with self._lock:
            self._subs = tuple(s for s in self._subs if s is not sub)
            if not self._subs:
                self.ended = True
            return self.ended

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the pump (or the reader's hand-on) and close the stream."""
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _open(self) -> None:
        """On the stream's own thread: open the stream once the node's other pipelines of this source
        were built (`siblings_until`), where the earliest of their subscriptions starts (`pumped`)."""
        while not self._stop.is_set() and time.monotonic() < self.siblings_until():
            time.sleep(0.02)
        with self._lock:
            self.opened = True
            start = self.pumped
        if not self._stop.is_set():
            self.source.open(start)

    def _control(self) -> None:
        """The thread of a `_SharedStream`: open it once the siblings did (`start`), rewind it whenever
        a pipeline joins behind (`attach`), and hand on what its reader left pending (`_put`)."""
        source = self.source
        assert isinstance(source, _SharedStream)
        try:
            self._open()
            while not self._stop.is_set() and not self.ended:
                self._wake.wait(0.2)
                self._wake.clear()
                # A rewind waits for a hand-on under way to end (`_handing`), as the pump's did: that bulk
                # is then every subscription's, and `pumped` its end. Stopping the reader in the middle
                # of it (`seek`) would leave some subscriptions without it while the rewind, to `pumped`
                # or to a joining pipeline's position inside the bulk, reads it for nobody again.
                with self._lock:
                    asked = self._rewind is not None
                rewind = None
                if asked:  # (one asked after this look is taken at the next turn: `attach` wakes this thread)
                    with self._handing, self._lock:
                        rewind, self._rewind = self._rewind, None
                        if rewind is not None:
                            self.pumped = min(self.pumped, rewind)
                            self._pending = []  # read again from the rewind: nothing is lost by dropping them
                            if source.handon is not None:
                                source.handon.dead = True  # its reader hands on nothing more (`_put`)
                if rewind is not None:
                    self.rewinds += 1
                    log.info("shared binlog reader of %s:%s rewinds to %s for a pipeline joining there",
                             source.host, source.port, rewind)
                    source.seek(rewind)  # stops that reader (joined) before the next one starts
                else:
                    self._settle()
        except SetlError as exc:
            self._end(exc)
        except Exception as exc:  # every failure reaches each subscriber, none kills the thread silently
            log.exception("shared binlog reader of %s:%s failed", source.host, source.port)
            self._end(SourceError(f"the shared binlog reader of {source.host}:{source.port} failed after "
                                  f"{self.pumped}: {type(exc).__name__}: {exc}", position=self.pumped))
        finally:
            source.close()

    def _put(self, handon: _HandOn, item: Transaction | Failure, stop: threading.Event) -> None:
        """What the reader thread of `handon`'s open read: a transaction joins the pending bulk, which
        that thread hands on itself once it holds `PUMP_BULK` transactions (or `max_rows_in_memory /
        MERGE_SHARE` rows); a smaller one the control thread hands on as soon as it wakes, so that
        a bulk is what was read meanwhile, as the pump's was. A failure comes after the pending
        bulk, to each subscription as its own (`_end`). While a rewind waits (or after it) that
        open's reads are dropped: the next open reads them again. Raises `Stopped` to end the reader
        thread once the stream stops or hands on nothing more."""
        with self._lock:
            if handon.dead or self._stop.is_set() or self.ended:
                raise Stopped()
            if self._rewind is not None:
                return  # read again from the rewind (a failure too): nothing is lost by dropping it
            if isinstance(item, Transaction):
                pending = self._pending
                pending.append(item)
                self._added += 1
                self._pending_rows += len(item.changes)
                if len(pending) < PUMP_BULK and self._pending_rows < self._most:
                    if len(pending) == 1:
                        self._wake.set()
                    return
        try:
            self._flush(stop)
        except Stopped:
            raise
        except SetlError as exc:
            self._end(exc)
            raise Stopped() from exc
        except Exception as exc:  # every failure reaches each subscriber, none kills the thread silently
            log.exception("shared binlog reader of %s:%s failed", self.source.host, self.source.port)
            self._end(SourceError(f"the shared binlog reader of {self.source.host}:{self.source.port} failed after "
                                  f"{self.pumped}: {type(exc).__name__}: {exc}", position=self.pumped))
            raise Stopped() from exc
        if isinstance(item, Failure):
            self._end(failure_error(item, self.source.server, self.source.pipeline))
            raise Stopped()

    def _settle(self) -> None:
        """Hand on the pending bulk once the reader added nothing to it for `SETTLE_SECONDS` (it
        waits for the server, or stands at the log's end): in a catch-up the reader fills and hands
        on its bulks itself, and this thread only looks at the count now and then."""
        seen = -1
        while not self._stop.is_set():
            with self._lock:
                if not self._pending or self._rewind is not None:
                    return
                added = self._added
            if added == seen:
                self._flush(None)
                return
            seen = added
            time.sleep(SETTLE_SECONDS)

    def _flush(self, stop: threading.Event | None) -> None:
        """Hand on the pending bulk (`_put`), one thread at a time, in binlog order."""
        with self._handing:
            with self._lock:
                txs, self._pending, self._pending_rows = self._pending, [], 0
                if not txs or self._rewind is not None:
                    return
                self.pumped = txs[-1].end
                subs = self._subs
            self._hand_on(txs, subs, stop)

    def _pump(self) -> None:
        try:
            self._open()
            while not self._stop.is_set():
                with self._lock:
                    rewind, self._rewind = self._rewind, None
                    if rewind is not None:
                        self.pumped = min(self.pumped, rewind)
                if rewind is not None:
                    self.rewinds += 1
                    log.info("shared binlog reader of %s:%s rewinds to %s for a pipeline joining there",
                             self.source.host, self.source.port, rewind)
                    self.source.seek(rewind)
                tx = self.source.poll(0.2)
                if tx is None:
                    continue
                txs = [tx]  # with what else is ready now (`PUMP_BULK`)
                rows, most = len(tx.changes), max(1, self.source.max_rows_in_memory // MERGE_SHARE)
                failure: Exception | None = None
                while len(txs) < PUMP_BULK and rows < most and not self._stop.is_set():
                    try:
                        more = self.source.poll(0.0)
                    except Exception as exc:  # noqa: BLE001 - raised below, once what came before it is handed on
                        failure = exc
                        break
                    if more is None:
                        break
                    txs.append(more)
                    rows += len(more.changes)
                with self._lock:
                    if self._rewind is not None:
                        continue  # read again from the rewind (a failure too): nothing is lost by dropping them
                    self.pumped = txs[-1].end
                    subs = self._subs
                self._hand_on(txs, subs)
                if failure is not None:
                    raise failure
        except SetlError as exc:
            self._end(exc)
        except Exception as exc:  # every failure reaches each subscriber, none kills the thread silently
            log.exception("shared binlog reader of %s:%s failed", self.source.host, self.source.port)
            self._end(SourceError(f"the shared binlog reader of {self.source.host}:{self.source.port} failed after "
                                  f"{self.pumped}: {type(exc).__name__}: {exc}", position=self.pumped))
        finally:
            self.source.close()

    def _hand_on(self, txs: list[Transaction], subs: tuple[_Subscription, ...],
                 stop: threading.Event | None = None) -> None:
        """Queue what of each of `txs` (in binlog order) each subscription reads: each one's share in
        one step. A full buffer makes the pump wait: the pipelines go at the pace of the slowest one
        still asking for rows (in a catch-up they share the CPU, and a second stream would only take
        more of it). A full one whose pipeline has not asked for rows for `HOLD_SECONDS` (paused,
        stuck on its target, retrying) while another waits with nothing queued (or for
        `STUCK_SECONDS` in any case) is dropped and reads alone: it holds the others back no longer.
        `stop`: the reader thread's, when it hands on (`_put`): set, the wait raises `Stopped`."""
        shares: dict[_Subscription, list[tuple[Transaction, bool]]] = {}
        marks: dict[_Subscription, Position | None] = {}  # a whole end passed over after its share
        last_cut: dict[_Subscription, int] = {}  # per pipeline, the last of `txs` it cut
        if subs is not self._routed:
            self._routed, self._routes = subs, {}
        routes = self._routes
        for i, tx in enumerate(txs):
            groups = _groups(tx)
            takers: tuple[_Subscription, ...] | list[_Subscription]
            if groups is None:  # a DDL: every pipeline's Extract judges it against its rules
                takers, plain = subs, False
            else:  # only the pipelines reading one of its tables cut it
                plain = tx.complete
                if len(groups) == 1:
                    name = next(iter(groups))
                    takers = routes.get(name) or ()
                    if name not in routes:
                        takers = routes[name] = tuple(sub for sub in subs if sub.keeps(name))
                else:
                    reading: set[_Subscription] = set()
                    for name in groups:
                        route = routes.get(name)
                        if route is None:
                            route = routes[name] = tuple(sub for sub in subs if sub.keeps(name))
                        reading.update(route)
                    takers = [sub for sub in subs if sub in reading]
            for sub in takers:
                last_cut[sub] = i
                cut = sub.cut(tx, groups)
                if cut is not None:
                    shares.setdefault(sub, []).append((cut, plain))
                    marks[sub] = None
        # The others pass over the transactions after the last one they cut, once for the bulk: the
        # last whole one's end (their position mark), then the end of the pieces after it, if any.
        last = len(txs) - 1
        whole = last
        while whole >= 0 and not txs[whole].complete:
            whole -= 1
        for sub in subs:
            first = last_cut.get(sub, -1) + 1
            if first > last:
                continue
            queued = sub in shares  # its mark waits for its share, queued below
            if whole >= first:
                passed = sub.pass_over(txs[whole].end, True, note=not queued)
                if queued and passed is not None:
                    marks[sub] = passed
            if whole != last:
                sub.pass_over(txs[last].end, False)
        if not shares:
            return
        weights = {sub: sum(_weight(cut) for cut, _ in share) for sub, share in shares.items()}
        since = time.monotonic()
        while not self._stop.is_set():
            full = [sub for sub, weight in weights.items() if sub.full_for(weight)]
            if not full:
                break
            if stop is not None and stop.is_set():
                raise Stopped()
            now = time.monotonic()
            stalled = [sub for sub in full if sub.stalled(now)]
            # Waiting on stalled pipelines past STUCK_SECONDS drops them even if nobody starves: what
            # they wait for (the node's cap on batches in flight) may itself wait for this stream.
            if stalled and (now - since >= STUCK_SECONDS or any(sub.starving() for sub in subs if sub not in full)):
                for sub in stalled:
                    sub.drop()
                continue
            time.sleep(0.005)
        for sub, share in shares.items():
            if not sub.detached:
                sub.put_all(share, marks.get(sub))

    def _end(self, error: SetlError) -> None:
        with self._lock:
            self.ended = True
            subs = list(self._subs)
        for sub in subs:
            sub.fail(error)


class _Readers:
    """The node's shared readers, one per source key (a process runs one node)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[Hashable, SharedReader] = {}
        #: per key, the sources built and not opened yet (a node starts its pipelines one by one)
        self._unopened: dict[Hashable, weakref.WeakSet[SharedBinlogSource]] = {}
        self._last_news: dict[Hashable, float] = {}  # per key, when a source was last built or opened

    def built(self, key: Hashable, source: SharedBinlogSource) -> None:
        """`source` was built: a reader of `key` starting now waits for it to open (`SIBLINGS_SECONDS`)."""
        with self._lock:
            self._unopened.setdefault(key, weakref.WeakSet()).add(source)
            self._last_news[key] = time.monotonic()

    def opening(self, key: Hashable, source: SharedBinlogSource) -> None:
        with self._lock:
            self._unopened.get(key, weakref.WeakSet()).discard(source)
            self._last_news[key] = time.monotonic()

    def siblings_until(self, key: Hashable) -> float:
        """Until when a reader of `key` waits: while sources of it built and not opened yet remain,
        until `SIBLINGS_SECONDS` after the last one was built or opened."""
        with self._lock:
            if not self._unopened.get(key):
                return 0.0
            return self._last_news.get(key, 0.0) + SIBLINGS_SECONDS

    def attach(self, key: Hashable, make: Callable[[Callable[[str, str], bool]], MysqlBinlogSource],
               pipeline: str, at: Position, limit: int, keep: Callable[[str, str], bool] | None,
               ready: Callable[[], None] | None = None) -> tuple[SharedReader, _Subscription] | None:
        """A subscription to the key's reader (started at `at` when there is none), or None. None too
        while another reader of the same server (`_server`), for pipelines of other reader settings (a
        channel's loop guard, batch.max_rows), runs: a second stream with the same server_id would
        make the server disconnect the first, and each reconnect the other."""
        with self._lock:
            known = self._readers.get(key)
            fresh = known is None or known.ended
            if fresh and any(_server(other) == _server(key) and not reader.ended
                             for other, reader in self._readers.items() if other != key):
                return None
            if known is None or known.ended:
                holder: list[SharedReader] = []
                reader = SharedReader(key, make(lambda schema, table: holder[0].selects(schema, table)), at,
                                      lambda: self.siblings_until(key))
                holder.append(reader)
            else:
                reader = known
            sub = reader.attach(pipeline, at, limit, keep, ready)
            if sub is None:
                return None
            if fresh:
                reader.start()
                self._readers[key] = reader
            return reader, sub

    def detach(self, reader: SharedReader, sub: _Subscription) -> None:
        """Drop `sub`; the reader stops when it was its last."""
        with self._lock:
            last = reader.detach(sub)
            if last and self._readers.get(reader.key) is reader:
                del self._readers[reader.key]
        if last:
            reader.stop()

    def count(self) -> int:
        """How many shared readers run now."""
        with self._lock:
            return len(self._readers)

    def reading(self) -> int:
        """How many shared readers have opened their stream (no longer wait for their siblings)."""
        with self._lock:
            return sum(1 for reader in self._readers.values() if reader.opened)


def _server(key: Hashable) -> Hashable:
    """The server of a shared reader's key (`SharedBinlogSource._key`: host and port first)."""
    return key[:2] if isinstance(key, tuple) else key


READERS = _Readers()


class SharedBinlogSource(MysqlBinlogSource):
    """A pipeline's binlog Select that reads through the node's `SharedReader` of its server.

    Same contract as `MysqlBinlogSource` (positions, pieces of split transactions, refusals); only
    how the rows arrive differs. `open` at a position joins the shared stream when it is close;
    `open` without one (the configured start) reads alone until the first position, then joins.
    A pipeline that falls `max_rows_in_memory` rows behind the stream is dropped from it and reads
    alone from its own position, joining again once close: it never holds the others back.
    The shared stream reads with `shared_server_id`; reading alone uses the pipeline's own."""

    def __init__(self, *, shared_server_id: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shared_server_id = shared_server_id
        self._kwargs = kwargs
        self._shared_reader: SharedReader | None = None  # the node's shared stream, while joined
        self._sub: _Subscription | None = None
        self._after: Position | None = None
        self._next_merge = 0.0
        self._ready: Callable[[], None] | None = None  # `listen`'s: the scheduler's wake of its Select task
        self.joins = 0  # times it joined a shared stream
        self.drops = 0  # times the shared stream dropped it (a full buffer)
        READERS.built(self._key(), self)

    @classmethod
    def from_config(cls, cfg: Any, *, pipeline: str, **kwargs: Any) -> "SharedBinlogSource":
        # A two-way channel's loop guard, as `MysqlBinlogSource.from_config` sets it: the shared stream
        # of these pipelines drops the other direction's writes (`_key` keeps other guards apart).
        kwargs.setdefault("ignore_server_ids", cfg.ignore_server_ids)
        kwargs.setdefault("ignore_marks", cfg.ignore_marks)
        return cls(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                   server_id=cfg.server_id, flavor=cfg.flavor, start=cfg.start, pipeline=pipeline,
                   ssl=cfg.ssl, snapshot=cfg.snapshot, heartbeat=cfg.heartbeat_ms / 1000.0, **kwargs)

    @property
    def shared(self) -> bool:
        """Whether it reads through the shared stream now."""
        return self._sub is not None

    def _key(self) -> Hashable:
        k = self._kwargs
        return (self.host, self.port, self.user, k.get("password", ""), k.get("ssl"), self.flavor, self.sequences,
                self.max_rows_in_memory, self.heartbeat, self.table_map_cache, self.fast_decoder,
                self.shared_server_id, self.ignore_server_ids, self.ignore_marks, self.statement_markers)

    def _make_shared(self, selects: Callable[[str, str], bool]) -> MysqlBinlogSource:
        kwargs = dict(self._kwargs, server_id=self.shared_server_id, pipeline="", selects=selects, reads=selects,
                      start="earliest")
        return _SharedStream(**kwargs)

    def _join(self, at: Position) -> bool:
        limit = BUFFER_BATCHES * self.max_rows_in_memory
        got = READERS.attach(self._key(), self._make_shared, self.pipeline, at, limit, self.reads, self._ready)
        if got is None:
            return False
        self._shared_reader, self._sub = got
        self._after = at
        self.detected_flavor = self._shared_reader.source.detected_flavor
        self.figures.arrivals = self._shared_reader.source.arrivals  # the shared stream's (lag figures)
        self.joins += 1
        log.info("pipeline=%s stage=select reads the shared binlog stream of %s:%s from %s", self.pipeline,
                 self.host, self.port, at)
        return True

    def _leave(self) -> None:
        reader, sub = self._shared_reader, self._sub
        self._shared_reader = self._sub = None
        if reader is not None:  # its own reader from now on: a copy, not the shared stream's figures
            self.figures.arrivals = collections.deque(self.figures.arrivals, maxlen=self.figures.arrivals.maxlen)
        if reader is not None and sub is not None:
            READERS.detach(reader, sub)

    def open(self, start: Position | None) -> None:
        self.close()
        READERS.opening(self._key(), self)
        if start is None and isinstance(self.start, Position):
            start = self.start  # a configured start by file and position joins at once
        if start is not None:
            self.check()  # what the pipeline's own open refuses (settings, cascades of its tables)
            if self._join(start):
                return
        super().open(start)
        self._after = super().tell()
        self._next_merge = time.monotonic() + MERGE_EVERY

    def poll(self, timeout: float) -> Transaction | None:
        if self._sub is not None:
            return self._poll_shared(timeout)
        tx = super().poll(timeout)
        if tx is not None:
            self._after = tx.end
        now = time.monotonic()
        if self._after is not None and now >= self._next_merge:
            self._next_merge = now + MERGE_EVERY
            after = self._after
            if self._join(after):
                MysqlBinlogSource.close(self)  # its own stream only: the shared one continues after `after`
        return tx

    def _poll_shared(self, timeout: float) -> Transaction | None:
        assert self._sub is not None and self._shared_reader is not None
        item = self._sub.take(timeout)
        if item is _DETACHED:
            self.drops += 1
            log.warning("pipeline=%s stage=select position=%s asked for no rows for %.0fs with %d rows queued: "
                        "dropped from the shared binlog stream of %s:%s, reading alone until it is close again",
                        self.pipeline, self._after, HOLD_SECONDS, BUFFER_BATCHES * self.max_rows_in_memory,
                        self.host, self.port)
            self._leave()
            super().open(self._after)
            self._next_merge = time.monotonic() + MERGE_EVERY
            return None
        if isinstance(item, _Failed):
            self._leave()
            try:
                error = copy.copy(item.error)  # each pipeline raises its own: with_context fills it in
                error.context = dict(item.error.context)
            except (TypeError, AttributeError):  # a subclass that cannot be copied: the same words, plainly
                error = SourceError(item.error.message, **item.error.context)
            raise error.with_context(pipeline=self.pipeline or None, stage="select") from item.error
        if item is not None:
            assert isinstance(item, Transaction)
            self._after = item.end
        heard, after = self._shared_reader.source.heard, self._after
        # `heard[0] <= after` without attrs' generated comparison (asked at every poll)
        if heard is not None and after is not None and \
                (heard[0].log, heard[0].offset, heard[0].row) <= (after.log, after.offset, after.row):
            self.figures.hear(*heard)  # the stream stood where this pipeline stands now, then (lag figures)
        return item

    def tell(self) -> Position | None:
        return self._after if self._sub is not None else super().tell()

    def listen(self, ready: Callable[[], None]) -> None:
        """While joined, the shared stream calls `ready` whenever it queues rows (or a DDL, a
        failure, a drop) for this pipeline: its Select waits for that instead of polling."""
        self._ready = ready
        sub = self._sub
        if sub is not None:
            sub.ready = ready

    def notifies(self) -> bool:
        """Whether it reads the shared stream now (reading alone, it does not announce rows)."""
        return self._sub is not None and self._ready is not None

    def behind(self) -> bool:
        """Whether the stream it reads (the shared one while joined) reads a backlog now."""
        reader = self._shared_reader
        if reader is not None:
            return reader.source.behind()
        return super().behind()

    def passed(self) -> tuple[Position, Position] | None:
        """Where the shared stream read past the loop guard's echoes while joined (its own reader's
        otherwise): a fact of the binlog under this pipeline's guard (`_key` shares a stream only
        among equal guards), and each end the stream hands on reaches every subscription, as rows
        or as a position mark, so the ack Termin compares with `after` is this pipeline's own."""
        reader = self._shared_reader
        if reader is not None:
            return reader.source.passed()
        return super().passed()

    def close(self, timeout: float = 5.0) -> None:
        self._leave()
        super().close(timeout)
