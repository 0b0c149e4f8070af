"""A MySQL or MariaDB binary log as a Select: whole transactions of full-image row changes and DDL.

This package is the only importer of pymysqlreplication; nothing it returns holds a library object.
A background thread reads the binlog with a blocking stream, reconnects when the server goes away,
and hands assembled transactions to `poll` through a bounded queue, so `poll` honours its timeout
and `close` interrupts the read.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs
import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import HeartbeatLogEvent

from setl.adapters.replication import TableMapCache
from setl.config import SslConfig
from setl.errors import ConfigError, PositionPurged, SourceError
from setl.model import Position, TableSchema, Transaction
from setl.retry import Backoff
from setl.sources.mysql_binlog import fast
from setl.sources.mysql_binlog.assembler import _EVENTS, _Assembler, read_events
from setl.sources.mysql_binlog.connector import _Connector, _disconnected, _Lost, _Stopped
from setl.sources.mysql_binlog.ddl_events import KnownTables
from setl.sources.mysql_binlog.lookups import TableLookups
from setl.sources.mysql_binlog.patches import install
from setl.sources.mysql_binlog.server import SourceServer
from setl.sources.mysql_binlog.settings import SettingsReport
from setl.sources.mysql_binlog.start import parse_start, resolve
from setl.sources.mysql_binlog.xa import PreparedXa
from setl.stages.select import Select
from setl.stages.snapshot import SnapshotAccess
from setl.tablecopy import SnapshotSettings
from setl.tls import mysql_context, tls_failure


@attrs.frozen
class MysqlSourceConfig:
    """A MySQL or MariaDB server's binary log."""

    type: Literal["mysql"]
    host: str = "127.0.0.1"  # the server setl reads the binlog of
    port: int = 3306  # its TCP port
    user: str = "root"  # needs the grants in docs/grants.md
    password: str = attrs.field(default="", repr=False)  # may be "${ENV_VAR}"; never logged
    server_id: int = 1001  # unique among the server's replicas and binlog readers
    flavor: Literal["auto", "mariadb", "mysql"] = "auto"  # auto: from the server's VERSION()
    #: where a pipeline without a position starts: earliest, latest, snapshot (copy the selected tables, then
    #: follow the binlog from there; see docs/snapshot.md), {file: NAME, pos: OFFSET} or {gtid: GTID_SET}
    start: Any = "earliest"
    ssl: SslConfig | None = None  # TLS for the binlog stream and every query setl runs on the server
    snapshot: SnapshotSettings = attrs.Factory(SnapshotSettings)  # how `start: snapshot` and `setl snapshot` copy
    #: how often an idle server sends a heartbeat event: the longest an idle source goes unheard (lag figures)
    heartbeat_ms: int = attrs.field(default=1000, validator=attrs.validators.ge(100))
    #: transactions written by sessions with these server_ids are dropped whole, DDL included (a
    #: two-way channel's other direction: docs/bidirectional.md)
    ignore_server_ids: tuple[int, ...] = ()


log = logging.getLogger("setl.sources.mysql_binlog")


#: Arrival times kept for the lag figures (a reader that nobody asks drops the oldest).
ARRIVALS = 10_000


@attrs.frozen
class _Failure:
    """The reader thread's end by an error, queued for `poll` to raise; `position`: the last end handed on."""

    error: BaseException
    position: Position | None


_ER_MASTER_FATAL_READING_BINLOG = 1236


class MysqlBinlogSource(Select):
    """Reads a MySQL or MariaDB binlog from a file and position, or from a GTID set.

    * Positions are ``Position(binlog file, offset after the commit event, gtid)``; `gtid` is the
      GTID set executed up to there when the server logs GTIDs (MariaDB ``domain-server-seq``
      list, MySQL ``uuid:intervals`` set) and the state at the start is known.
    * A position from `open` or `seek` wins over the configured `start`: "earliest", "latest",
      ``{file: ..., pos: ...}`` or ``{gtid: ...}``. A GTID start is handed to the server
      (MariaDB ``slave_connect_state``, MySQL ``COM_BINLOG_DUMP_GTID``); `tell` is None until
      the first transaction after it arrives, and every later open or seek is by file and
      position. A GTID set the server has fully executed starts at the head.
    * `open` refuses a server whose binlog settings lose data or cannot be applied exactly
      (`settings.SETTINGS`: every refused one in one line) and a position whose file was purged
      (`PositionPurged`); `judge_settings` gives every verdict without refusing.
    * `poll` blocks at most `timeout` seconds. When the binlog ends in events that are not
      transactions (rotation, checkpoints, heartbeats), `poll` returns a position mark: a
      Transaction with no changes whose `end` has moved past them, so an ack can reach the head.
    * A lost connection is re-established with backoff from the end of the last complete
      transaction handed on (dropping the part of a split transaction already handed on), for
      up to `reconnect_timeout` seconds; after that `poll` raises `SourceError`.
    * Transactions of more than `max_rows_in_memory` rows come in pieces with ``complete=False``;
      a piece's end is the transaction's start with `row` = row changes handed on so far, and
      `open`/`seek` there re-reads the transaction and skips them (see `_Assembler`).
      The reader runs ahead of `poll` by up to `max_rows_in_memory` rows (a transaction with no
      rows counts as one; a bigger piece waits for an empty queue), so it is never held back by
      many small transactions and never holds more than about twice that (`peak_buffered_rows`).
    * With `table_map_cache` (the default) a table-map event whose bytes were seen before reuses
      the decoded table instead of decoding its column metadata again (`table_maps` counts hits).
    * With `fast_decoder` (the default, where the compiled `_rows` module is built) the reader
      frames the stream's packets itself and rows events of tables whose column types it knows are
      decoded in C into the same rows (`fast.FastStream`; `row_decoders` counts events each way).
    * Values are pymysqlreplication's, except: an empty SET is ``set()``, BIT is an int, BINARY(n)
      keeps its trailing zero bytes, YEAR 0 is 0. MariaDB's JSON is text and stays a str.
    * Two-phase XA: an XA PREPARE group hands nothing on (its end may be acknowledged); its rows
      are read again from the binlog and handed on at its XA COMMIT, in commit order (XA ROLLBACK:
      never). After a restart between the two, the XA PREPARE is searched for in the binlogs,
      newest first; if it was purged the pipeline stops naming the XA COMMIT's position.
    * `server_id` must be unique among the server's replicas and readers.
    * A transaction whose events carry a server_id in `ignore_server_ids` is dropped whole (its
      rows, its DDL, every piece of it), only its end is handed on as a position mark.
    * It is `SnapshotCapable`: `snapshot_access` gives `setl.snapshot` its connections, so that
      tables can be copied into its stream (docs/snapshot.md).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 3306,
        user: str = "root",
        password: str = "",
        server_id: int = 1001,
        flavor: str = "auto",
        start: Any = "earliest",
        pipeline: str = "",
        max_rows_in_memory: int = 50_000,
        connect_timeout: float = 5.0,
        heartbeat: float = 1.0,
        reconnect_timeout: float = 60.0,
        table_map_cache: bool = True,
        fast_decoder: bool = True,
        selects: Callable[[str, str], bool] | None = None,
        ssl: SslConfig | None = None,
        snapshot: SnapshotSettings | None = None,
        sequences: bool = False,
        ignore_server_ids: Sequence[int] = (),
    ) -> None:
        if flavor not in ("auto", "mariadb", "mysql"):
            raise ConfigError(f"source.flavor {flavor!r} is not auto, mariadb or mysql", pipeline=pipeline)
        if max_rows_in_memory < 1:
            raise ConfigError("max_rows_in_memory must be at least 1", pipeline=pipeline)
        install()
        #: rows events decoded by the compiled decoder (`fast`), where it is built and knows the table
        self.fast_decoder = fast_decoder and fast.available()
        # One context for every connection: the binlog stream's, its control connections', ours.
        context = mysql_context(ssl, where="source.ssl", pipeline=pipeline or None) if ssl else None
        #: how to reach the server and the plain questions asked of it; host, port, user, flavor,
        #: connect_timeout and heartbeat below are copies of its settings
        self.server = SourceServer(host, port, user, password=password, ssl=context, connect_timeout=connect_timeout,
                                   heartbeat=heartbeat, flavor=flavor, pipeline=pipeline)
        self.host, self.port, self.user = host, port, user
        self.server_id = server_id
        self.flavor = flavor
        self.start = parse_start(start, pipeline)
        self.pipeline = pipeline
        self.max_rows_in_memory = max_rows_in_memory
        self.connect_timeout = connect_timeout
        self.heartbeat = heartbeat
        self.reconnect_timeout = reconnect_timeout
        self.table_map_cache = table_map_cache
        self.snapshot_settings = snapshot or SnapshotSettings()  # given to setl.snapshot by snapshot_access()
        self.selects = selects  # whether the pipeline's table rules take (schema, table); None: every table
        #: hand on a sequence's state rows (`setl.model.RowChange.sequence`): set when the pipeline's
        #: target applies them (`setl.stages.load.LoadCapabilities.sequences`); dropped otherwise
        self.sequences = sequences
        self.ignore_server_ids = frozenset(ignore_server_ids)
        self.backoff = Backoff(initial=0.1, maximum=2.0, max_attempts=0)
        self._queue: queue.Queue[Transaction | _Failure] | None = None
        self._thread: threading.Thread | None = None
        self._connector: _Connector | None = None
        self._stop = threading.Event()
        self._cursor: Position | None = None
        self._mark: Transaction | None = None
        self._buffer_lock = threading.Lock()
        self._room = threading.Condition(self._buffer_lock)  # the reader waits here for the queue to drain
        self._queued_rows = 0  # rows in the queue, a transaction without rows counting as one
        self.peak_buffered_rows = 0
        self.reconnects = 0
        self.detected_flavor: str | None = None
        self.table_maps: TableMapCache | None = None
        #: (position, time.time()): where the reader last stood between transactions, and when.
        #: A heartbeat from an idle server renews the time: the log ended there then (lag figures).
        self.heard: tuple[Position, float] | None = None
        #: (end, time.time()) of transactions read within the second of their commit timestamp, oldest
        #: first: the binlog's timestamps have whole seconds, the time read refines them (lag figures).
        self.arrivals: collections.deque[tuple[Position, float]] = collections.deque(maxlen=ARRIVALS)

    @classmethod
    def from_config(cls, cfg: MysqlSourceConfig, *, pipeline: str, **kwargs: Any) -> "MysqlBinlogSource":
        kwargs.setdefault("ignore_server_ids", cfg.ignore_server_ids)
        return cls(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                   server_id=cfg.server_id, flavor=cfg.flavor, start=cfg.start, pipeline=pipeline,
                   ssl=cfg.ssl, snapshot=cfg.snapshot, heartbeat=cfg.heartbeat_ms / 1000.0, **kwargs)

    def __repr__(self) -> str:
        return f"<MysqlBinlogSource {self.host}:{self.port} server_id={self.server_id} at {self._cursor}>"

    # --- connections -------------------------------------------------------------------------

    def _connect(self) -> pymysql.connections.Connection:
        """A new connection to the server (`SourceServer.connect`)."""
        return self.server.connect()

    def snapshot_access(self) -> SnapshotAccess:
        """What `setl.snapshot` needs to copy this server's tables (`SnapshotCapable`): this
        source's own connections (credentials, TLS, timeouts), its start and table selection.
        Connects to nothing."""
        return SnapshotAccess(self.server.connect, f"{self.host}:{self.port}", self.server.task_connect(),
                              start_mode=self.start == "snapshot", selects=self.selects,
                              settings=self.snapshot_settings, batch_rows=self.max_rows_in_memory)

    # --- Select ------------------------------------------------------------------------------

    def check(self) -> str:
        """What `open` checks before reading, without reading: the connection (and TLS), the binlog
        settings and grants a reader needs, and no selected table with a cascading foreign key.
        Returns what was found (``mariadb 10.11.19 at HOST:PORT``); raises `SourceError` naming the
        first problem (`setl check`)."""
        conn = self.server.connect()
        try:
            flavor = self.server.check_settings(conn, self.selects)
            self.server.refuse_cascades(conn, self.selects)
            version = str(self.server.query(conn, "SELECT VERSION()")[0][0])
        except pymysql.MySQLError as exc:
            raise self.server.error(f"cannot read the binlog settings of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        return f"{flavor} {version} at {self.host}:{self.port}"

    def judge_settings(self, position: Position | None = None, also: Sequence[str] = ()) -> SettingsReport:
        """setl's verdict on each server setting that changes what the binlog holds
        (`settings.SETTINGS`), on the binlog filters against the selected schemas, and on whether
        the binlog of `position` (else of a configured start by file) is still on the server; every
        verdict, refused or not (`setl check`, and `setl start` before the first row). `also`:
        schemas the pipeline reads besides its selected tables' (a signal table's). Raises
        `SourceError` only when the server cannot be asked."""
        at = position if position is not None else self.start if isinstance(self.start, Position) else None
        gtid_start = position is None and not isinstance(self.start, (str, Position))
        conn = self.server.connect()
        try:
            return self.server.judge_settings(conn, self.selects, at, gtid_start, also)[1]
        except pymysql.MySQLError as exc:
            raise self.server.error(f"cannot read the binlog settings of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()

    def open(self, start: Position | None) -> None:
        self.close()
        conn = self.server.connect()
        try:
            self.detected_flavor = self.server.check_settings(conn, self.selects)
            self.server.refuse_cascades(conn, self.selects)
            position, gtids = resolve(self.server, conn, start if start is not None else self.start,
                                      self.detected_flavor)
            tables = [(str(schema), str(table)) for schema, table in self.server.query(
                conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE <> 'VIEW' "
                      "AND TABLE_SCHEMA NOT IN ('information_schema', 'performance_schema', 'sys', 'mysql')")]
        except pymysql.MySQLError as exc:
            raise self.server.error(f"cannot read the binlog settings of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        self._cursor = position
        self._mark = None
        self._stop = threading.Event()
        self._queue = queue.Queue()  # bounded by rows: see _read's put
        self._queued_rows = 0
        self.table_maps = TableMapCache() if self.table_map_cache else None
        self.row_decoders = fast.RowDecoders() if self.fast_decoder else None
        self._connector = _Connector(self.table_maps, tls=self.server.ssl is not None)
        lookups = TableLookups(self.server.lookups, pipeline=self.pipeline, sequences=self.sequences)  # fresh caches
        assembler = _Assembler(position or Position("", 0), self.max_rows_in_memory, gtids,
                               PreparedXa(self.server, lookups.table_kind, self.pipeline).rows,
                               lookups.transactional, self.selects, KnownTables(tables))
        assembler.kind_of = lookups.table_kind
        assembler.sequences = self.sequences
        assembler.ignore_server_ids = self.ignore_server_ids
        assembler.ddl_events.mode_names = lookups.mode_names
        gtid_start = gtids.text if position is None and gtids is not None else None
        self._thread = threading.Thread(
            target=self._read, args=(self._connector, assembler, self._queue, self._stop, position, gtid_start),
            name=f"setl-{self.pipeline or 'mysql'}-binlog", daemon=True)
        self._thread.start()
        log.info("pipeline=%s reading the %s binlog of %s:%s from %s (server_id %d)", self.pipeline,
                 self.detected_flavor, self.host, self.port, position or f"after GTID {gtid_start}",
                 self.server_id)

    def _stream(self, connector: _Connector, at: Position | None, gtid: str | None) -> BinLogStreamReader:
        settings = self.server.stream_settings()
        common: dict[str, Any] = dict(
            connection_settings=settings, server_id=self.server_id, blocking=True, only_events=_EVENTS,
            filter_non_implemented_events=False,
            slave_heartbeat=self.heartbeat, pymysql_wrapper=connector, enable_logging=False)
        if at is not None:
            # is_mariadb=False on purpose: with is_mariadb=True the library sends an empty file
            # name (the server's first binlog) unless given a GTID; the classic COM_BINLOG_DUMP
            # serves both flavors by file+pos, and resume_stream=True makes it send log_pos.
            return BinLogStreamReader(resume_stream=True, log_file=at.log, log_pos=at.offset, is_mariadb=False,
                                      **common)
        return BinLogStreamReader(auto_position=gtid, is_mariadb=self.detected_flavor == "mariadb", **common)

    def _read(self, connector: _Connector, assembler: _Assembler, out: queue.Queue, stop: threading.Event,
              start: Position | None, gtid_start: str | None) -> None:
        """The reader thread: events → transactions → `out`, reconnecting from the last end handed on."""
        handed = start  # end of the last complete transaction handed on (None: still the GTID start)
        down_since: float | None = None
        attempt = 0

        def put(item: Transaction | _Failure) -> None:
            weight = _weight(item)
            with self._room:
                while self._queued_rows and self._queued_rows + weight > self.max_rows_in_memory:
                    if stop.is_set():
                        raise _Stopped()
                    self._room.wait(0.1)
                self._queued_rows += weight
            out.put(item)

        try:
            while not stop.is_set():
                reader = self._stream(connector, handed, gtid_start)
                events = reader if self.row_decoders is None else fast.FastStream(reader, self.row_decoders)
                # Where a stream starts (a rollback's rewind, a reconnect) says nothing of where the
                # log ends: the reader is heard there only once it has read past it, or once an
                # idle server's heartbeat says the log ends there. Else an ack at the rewind point
                # would look caught up for a moment and reset the lag of a pipeline far behind.
                started_at, news = assembler.mark, False
                last_held = 0
                try:
                    while not stop.is_set():
                        event, txs, held = read_events(assembler, events)
                        if event is None:
                            raise _Lost()
                        if not news:
                            news = isinstance(event, HeartbeatLogEvent) or assembler.mark > started_at
                        if held > last_held:  # the rows held peaked inside the read, before any hand-on
                            with self._buffer_lock:
                                buffered = self._queued_rows + held
                            self.peak_buffered_rows = max(self.peak_buffered_rows, buffered)
                        if txs:
                            stamp: int = getattr(event, "timestamp", 0) or 0
                            if stamp:
                                now = time.time()
                                if stamp <= now < stamp + 1:
                                    self.arrivals.append((txs[-1].end, now))
                            for tx in txs:
                                put(tx)
                                down_since, attempt = None, 0  # progress: the retry budget starts afresh
                                handed = tx.end
                        if news and not assembler.in_tx and assembler.positioned:
                            self.heard = (assembler.mark, time.time())
                        last_held = len(assembler.rows)
                        if txs:  # handed on: the queue grew by what the assembler let go of
                            with self._buffer_lock:
                                buffered = self._queued_rows + last_held
                            self.peak_buffered_rows = max(self.peak_buffered_rows, buffered)
                except _Stopped:
                    raise
                except BaseException as exc:
                    if stop.is_set() or not _disconnected(exc):
                        raise
                    now = time.monotonic()
                    down_since = down_since if down_since is not None else now
                    if now - down_since >= self.reconnect_timeout:
                        raise self.server.error(f"the binlog server {self.host}:{self.port} stayed unreachable for "
                                                f"{now - down_since:.0f}s (reconnect_timeout); last error: {exc}",
                                                handed) from exc
                    attempt += 1
                    delay = self.backoff.delay(attempt)
                    log.warning("pipeline=%s lost the binlog stream of %s:%s (%s); reconnecting from %s in "
                                "%.1fs", self.pipeline, self.host, self.port, exc,
                                handed or f"GTID {gtid_start}", delay)
                    if stop.wait(delay):
                        raise _Stopped() from None
                    self.reconnects += 1
                    connector.reset()
                    if handed is not None:
                        assembler.restart(handed)  # a piece's end restarts at its transaction's start
                    else:
                        assembler.restart(Position(assembler.log_file, 0))
                finally:
                    with contextlib.suppress(Exception):
                        reader.close()
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - every failure reaches poll(); none kills the thread silently
            if not stop.is_set():
                with contextlib.suppress(_Stopped):
                    put(_Failure(exc, handed))

    def poll(self, timeout: float) -> Transaction | None:
        """The next transaction; a position mark only when nothing else is ready (see the class)."""
        if self._queue is None:
            raise RuntimeError("poll() before open()")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                if self._mark is not None:
                    item = self._queue.get_nowait()
                else:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                mark, self._mark = self._mark, None
                if mark is not None:
                    self._cursor = mark.end
                return mark
            with self._room:
                self._queued_rows -= _weight(item)
                self._room.notify()
            if isinstance(item, _Failure):
                self._queue = None  # this stream is dead; seek or open starts a new one
                raise self._failure(item) from item.error
            if not item.changes and item.complete:
                self._mark = item  # a later mark or transaction supersedes it
                continue
            self._mark = None
            self._cursor = item.end
            return item

    def _failure(self, failure: _Failure) -> SourceError:
        exc, where = failure.error, failure.position
        after = where or "the configured start"
        if isinstance(exc, SourceError):
            return exc.with_context(pipeline=self.pipeline or None, stage="select",
                                    position=where)  # type: ignore[return-value]
        cause = tls_failure(exc)
        if cause is not None:
            return self.server.error(f"cannot read the binlog of {self.host}:{self.port} over TLS: {cause} "
                                     "(see source.ssl)", where)
        if isinstance(exc, pymysql.MySQLError):
            if exc.args and exc.args[0] == _ER_MASTER_FATAL_READING_BINLOG:
                return self.server.error(f"the server {self.host}:{self.port} cannot send its binlog after {after} "
                                         f"(purged, or a GTID it does not have?): {exc.args[-1]}", where,
                                         cls=PositionPurged)
            return self.server.error(f"binlog read from {self.host}:{self.port} failed after {after}: {exc}", where)
        return self.server.error(f"cannot decode the binlog of {self.host}:{self.port} after {after}: "
                                 f"{type(exc).__name__}: {exc}", where)

    def tell(self) -> Position | None:
        return self._cursor

    def head(self) -> Position | None:
        """The binlog's end now, on a connection of its own (`SourceServer.head`)."""
        return self.server.head()

    def identity(self) -> dict[str, Any]:
        """Which server this is (`setl.pipeline.identity`): see `SourceServer.identity`."""
        return self.server.identity()

    def bytes_behind(self, position: Position) -> tuple[Position, int] | None:
        """The log's end and the bytes of binlog after `position` up to it (None: `position`'s file is gone)."""
        return self.server.bytes_behind(position)

    def describe(self) -> tuple[TableSchema, ...]:
        """The selected base tables' columns from information_schema, on a connection of its own."""
        return self.server.describe(self.selects)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._connector is not None:
            self._connector.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("pipeline=%s binlog reader thread did not stop within %.0fs", self.pipeline, timeout)
        self._thread = self._connector = self._queue = None
        self._mark = None
        self.server.close()


def _weight(item: Transaction | _Failure) -> int:
    """What an item counts for in the reader's queue: its rows, at least one."""
    return max(1, len(item.changes)) if isinstance(item, Transaction) else 1
