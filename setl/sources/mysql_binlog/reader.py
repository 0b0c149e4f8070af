"""The binlog reader thread of one open: the stream from a position or a GTID start, events fed to
the assembler, its transactions handed to `poll` (`handoff.Handoff`), a lost connection re-made with
backoff from the last transaction end handed on, and every other end turned into one `SourceError`
for `poll` to raise (`failure_error`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import pymysql

from setl.adapters.replication import TableMapCache
from setl.binlog_events import Heartbeat
from setl.errors import PositionPurged, SourceError
from setl.model import Position
from setl.retry import Backoff
from setl.sources.mysql_binlog import fast
from setl.sources.mysql_binlog.assembler import _EVENTS, _Assembler, read_events
from setl.sources.mysql_binlog.connector import _Connector, _disconnected, _Lost
from setl.sources.mysql_binlog.ddl_events import KnownTables
from setl.sources.mysql_binlog.handoff import LATE_SECONDS, Failure, Handoff, ReaderFigures, Stopped
from setl.sources.mysql_binlog.lookups import TableLookups
from setl.sources.mysql_binlog.opening import Opening
from setl.sources.mysql_binlog.server import Selects, SourceServer
from setl.sources.mysql_binlog.skipping import RowCounter
from setl.sources.mysql_binlog.stream import BinlogStream
from setl.sources.mysql_binlog.xa import PreparedXa
from setl.tls import tls_failure

log = logging.getLogger("setl.sources.mysql_binlog")

_ER_MASTER_FATAL_READING_BINLOG = 1236


@attrs.frozen
class ReaderSettings:
    """What an open's reader is built from besides its server, its start and its table rules: plain
    values, so that a reader process (`setl.sources.reader_process`) is given them whole."""

    server_id: int
    pipeline: str
    max_rows_in_memory: int
    reconnect_timeout: float
    table_map_cache: bool
    fast_decoder: bool  # where the compiled module is built (`fast.available()`)
    sequences: bool
    ignore_server_ids: frozenset[int]
    #: a row change logged as a statement on one read table is handed on as a marker (`_Assembler.statement_markers`)
    statement_markers: bool = False
    ignore_marks: frozenset[str] = frozenset()  # a channel's marks (`setl.loop_marks`) whose transactions are dropped
    #: table row changes handed on as plain tuples (`_Assembler.plain_rows`): a reader process's only
    plain_rows: bool = False


def start_reader(server: SourceServer, opening: Opening, settings: ReaderSettings, handoff: Handoff,
                 figures: ReaderFigures, backoff: Backoff, selects: Selects,
                 reads: Callable[[str, str], bool] | None = None) -> "BinlogReader":
    """An open's reader thread, started from `opening` with fresh caches, handing on to `handoff`.
    Rows events of tables `reads` refuses are counted, not decoded (`skipping`; None: all are read)."""
    position, gtids = opening.position, opening.gtids
    pipeline = settings.pipeline
    lookups = TableLookups(server.lookups, pipeline=pipeline, sequences=settings.sequences)  # fresh caches
    assembler = _Assembler(position or Position("", 0), settings.max_rows_in_memory, gtids,
                           PreparedXa(server, lookups.table_kind, pipeline, lookups.temporal_precisions).rows,
                           lookups.transactional, selects, KnownTables(opening.tables))
    assembler.kind_of = lookups.table_kind
    assembler.reads = reads
    assembler.sequences = settings.sequences
    assembler.ignore_server_ids = settings.ignore_server_ids
    assembler.judge.markers = settings.statement_markers
    assembler.judge.writes_elsewhere = lookups.writes_elsewhere
    assembler.marks.ignore = settings.ignore_marks
    assembler.plain_rows = settings.plain_rows
    assembler.ddl_events.mode_names = lookups.mode_names
    gtid_start = gtids.text if position is None and gtids is not None else None
    reader = BinlogReader(server, handoff, figures, server_id=settings.server_id, flavor=opening.flavor,
                          reconnect_timeout=settings.reconnect_timeout, backoff=backoff, pipeline=pipeline,
                          table_maps=TableMapCache() if settings.table_map_cache else None,
                          row_decoders=fast.RowDecoders(settings.fast_decoder, lookups.temporal_precisions),
                          row_counter=RowCounter(settings.fast_decoder))
    reader.unselected = assembler.unselected
    reader.start(assembler, position, gtid_start)
    return reader


class BinlogReader:
    """One open's reader thread and its stream connections; `start` once, `stop` once.

    Owns the thread, its stop event and its stream connections (`_Connector`, one
    `stream.BinlogStream` at a time); what it reads goes to
    `handoff`, what it did to `figures`. `table_maps` and `row_decoders` are the decoded-table-map
    cache and the compiled decoders of this open (None: not used).
    """

    def __init__(self, server: SourceServer, handoff: Handoff, figures: ReaderFigures, *, server_id: int,
                 flavor: str, reconnect_timeout: float, backoff: Backoff, pipeline: str,
                 table_maps: TableMapCache | None, row_decoders: fast.RowDecoders | None,
                 row_counter: RowCounter | None = None) -> None:
        self.server = server
        self.handoff = handoff
        self.figures = figures
        self.server_id = server_id
        self.flavor = flavor  # the server's, detected: how a GTID start is sent
        self.reconnect_timeout = reconnect_timeout
        self.backoff = backoff
        self.pipeline = pipeline
        self.table_maps = table_maps
        self.row_decoders = row_decoders
        self.row_counter = row_counter  # counts the rows events of tables not read (`skipping`)
        self.unselected: set[int] = set()  # its assembler's table ids of tables not read (`skipping`)
        self.connector = _Connector(tls=server.ssl is not None)
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, assembler: _Assembler, position: Position | None, gtid_start: str | None) -> None:
        """Read from `position` (None: from GTID `gtid_start`) in a thread of its own."""
        self.thread = threading.Thread(target=self._read, args=(assembler, position, gtid_start),
                                       name=f"setl-{self.pipeline or 'mysql'}-binlog", daemon=True)
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """End the thread: cut its connections (a blocked read wakes) and join it for up to `timeout`."""
        self._stop.set()
        self.connector.shutdown()
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("pipeline=%s binlog reader thread did not stop within %.0fs", self.pipeline, timeout)

    def _stream(self, at: Position | None, gtid: str | None) -> BinlogStream:
        return BinlogStream(self.connector, self.server.stream_settings(), server_id=self.server_id, at=at, gtid=gtid,
                            flavor=self.flavor, events=_EVENTS, table_maps=self.table_maps,
                            heartbeat=self.server.heartbeat)

    def _put(self, item: Any) -> None:
        self.handoff.put(item, self._stop)

    def _read(self, assembler: _Assembler, start: Position | None, gtid_start: str | None) -> None:
        """The thread: events → transactions → the hand-off, reconnecting from the last end handed on."""
        stop, figures, handoff = self._stop, self.figures, self.handoff
        handed = start  # end of the last complete transaction handed on (None: still the GTID start)
        down_since: float | None = None
        attempt = 0
        try:
            while not stop.is_set():
                stream = self._stream(handed, gtid_start)
                events = fast.FastStream(stream, self.row_decoders, assembler.unselected, self.row_counter)
                # Where a stream starts (a rollback's rewind, a reconnect) says nothing of where the
                # log ends: the reader is heard there only once it has read past it, or once an
                # idle server's heartbeat says the log ends there. Else an ack at the rewind point
                # would look caught up for a moment and reset the lag of a pipeline far behind.
                started_at, news = assembler.mark, False
                last_held = 0
                try:
                    stream.connect()
                    while not stop.is_set():
                        event, txs, held = read_events(assembler, events)
                        if event is None:
                            raise _Lost()
                        if not news:
                            news = isinstance(event, Heartbeat) or assembler.mark > started_at
                        if held > last_held:  # the rows held peaked inside the read, before any hand-on
                            figures.buffered(handoff.queued_with(held))
                        if txs:
                            stamp: int = event.header.timestamp or 0  # the commit's whole second
                            if stamp:
                                now = time.time()
                                if stamp <= now < stamp + 1:
                                    figures.arrived(txs[-1].end, now)
                                elif now >= stamp + LATE_SECONDS:  # read from a backlog (`behind`)
                                    figures.late = now
                            for tx in txs:
                                self._put(tx)
                                down_since, attempt = None, 0  # progress: the retry budget starts afresh
                                handed = tx.end
                        if news and not assembler.in_tx and assembler.positioned:
                            figures.hear(assembler.mark, time.time())
                        if assembler.marks.hold:  # read past echoes, which hand on no position
                            figures.passing(assembler.passed())
                        last_held = len(assembler.rows)
                        if txs:  # handed on: the queue grew by what the assembler let go of
                            figures.buffered(handoff.queued_with(last_held))
                except Stopped:
                    raise
                except BaseException as exc:
                    if stop.is_set() or not _disconnected(exc):
                        raise
                    now = time.monotonic()
                    down_since = down_since if down_since is not None else now
                    if now - down_since >= self.reconnect_timeout:
                        raise self.server.error(
                            f"the binlog server {self.server.host}:{self.server.port} stayed unreachable for "
                            f"{now - down_since:.0f}s (reconnect_timeout); last error: {exc}", handed) from exc
                    attempt += 1
                    delay = self.backoff.delay(attempt)
                    log.warning("pipeline=%s lost the binlog stream of %s:%s (%s); reconnecting from %s in "
                                "%.1fs", self.pipeline, self.server.host, self.server.port, exc,
                                handed or f"GTID {gtid_start}", delay)
                    if stop.wait(delay):
                        raise Stopped() from None
                    figures.reconnected()
                    self.connector.reset()
                    if handed is not None:
                        assembler.restart(handed)  # a piece's end restarts at its transaction's start
                    else:
                        assembler.restart(Position(assembler.log_file, 0))
                finally:
                    with contextlib.suppress(Exception):
                        stream.close()
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - every failure reaches poll(); none kills the thread silently
            if not stop.is_set():
                with contextlib.suppress(Stopped):
                    self._put(Failure(exc, handed))


def failure_error(failure: Failure, server: SourceServer, pipeline: str) -> SourceError:
    """The one-line error `poll` raises for the reader thread's end by `failure`."""
    exc, where = failure.error, failure.position
    after = where or "the configured start"
    at = f"{server.host}:{server.port}"
    if isinstance(exc, SourceError):
        return exc.with_context(pipeline=pipeline or None, stage="select", position=where)  # type: ignore[return-value]
    cause = tls_failure(exc)
    if cause is not None:
        return server.error(f"cannot read the binlog of {at} over TLS: {cause} (see source.ssl)", where)
    if isinstance(exc, pymysql.MySQLError):
        if exc.args and exc.args[0] == _ER_MASTER_FATAL_READING_BINLOG:
            return server.error(f"the server {at} cannot send its binlog after {after} "
                                f"(purged, or a GTID it does not have?): {exc.args[-1]}", where, cls=PositionPurged)
        return server.error(f"binlog read from {at} failed after {after}: {exc}", where)
    return server.error(f"cannot decode the binlog of {at} after {after}: {type(exc).__name__}: {exc}", where)
