"""A MySQL or MariaDB binary log as a Select: whole transactions of full-image row changes and DDL.

`MysqlBinlogSource` is the Select stage's face and the wiring of its parts, each the one owner of
its state: `opening.SourceChecks` (settings judgment and where an open starts), `reader.BinlogReader`
(the reading thread of one open and its failures), `handoff.Handoff` (the queue bounded by rows
between that thread and `poll`) and `handoff.ReaderFigures` (what the reader has done, for the lag
figures), and `server.SourceServer` (connections and the position, identity and head questions).
`poll` owns only the cursor and the pending position mark.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs
import pymysql

from setl.adapters.replication import TableMapCache
from setl.config import SslConfig
from setl.errors import ConfigError
from setl.model import Position, TableSchema, Transaction
from setl.retry import Backoff
from setl.sources.mysql_binlog import fast
from setl.sources.mysql_binlog.handoff import Failure, Handoff, ReaderFigures
from setl.sources.mysql_binlog.opening import SourceChecks
from setl.sources.mysql_binlog.process import ReaderProcess, ServerSpec, Spare
from setl.sources.mysql_binlog.reader import BinlogReader, ReaderSettings, failure_error, start_reader
from setl.sources.mysql_binlog.server import SourceServer
from setl.sources.mysql_binlog.settings import SettingsReport
from setl.sources.mysql_binlog.skipping import RowCounter
from setl.sources.mysql_binlog.start import parse_start
from setl.stages.select import Select
from setl.stages.snapshot import SnapshotAccess
from setl.tablecopy import SnapshotSettings
from setl.tls import mysql_context


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
    #: transactions holding a row of setl's mark table with one of these marks, and DDL carrying one in
    #: its comment, are dropped whole (a two-way channel's marker-row loop guard: docs/bidirectional.md)
    ignore_marks: tuple[str, ...] = ()


log = logging.getLogger("setl.sources.mysql_binlog")


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
    * setl opens the binlog stream itself (`stream.BinlogStream`: the dump by file and position or
      by GTID, packets framed by the compiled `_rows.Framer` where it is built), and decodes every
      rows event itself (`fast.FastStream`): in C with `fast_decoder` (the default, where the
      compiled `_rows` module is built), else in Python (`rowcodec`), into the same rows
      (`row_decoders` counts events each way). The library parses the other event bodies.
    * Rows events of tables `reads` refuses (default: those `selects` refuses) are passed over by
      length: counted, never decoded (`skipping`), so a split transaction's resume point is the same.
    * Values are pymysqlreplication's, except: an empty SET is ``set()``, BIT is an int, BINARY(n)
      keeps its trailing zero bytes, YEAR 0 is 0. MariaDB's JSON is text and stays a str.
    * Two-phase XA: an XA PREPARE group hands nothing on (its end may be acknowledged); its rows
      are read again from the binlog and handed on at its XA COMMIT, in commit order (XA ROLLBACK:
      never). After a restart between the two, the XA PREPARE is searched for in the binlogs,
      newest first; if it was purged the pipeline stops naming the XA COMMIT's position.
    * `server_id` must be unique among the server's replicas and readers.
    * A transaction whose events carry a server_id in `ignore_server_ids` is dropped whole (its
      rows, its DDL, every piece of it), only its end is handed on as a position mark; so is one
      marked with a mark in `ignore_marks` (`setl.loop_marks`).
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
        reads: Callable[[str, str], bool] | None = None,
        ssl: SslConfig | None = None,
        snapshot: SnapshotSettings | None = None,
        sequences: bool = False,
        ignore_server_ids: Sequence[int] = (),
        ignore_marks: Sequence[str] = (),
        reader_process: bool = False,
        statement_markers: bool = False,
    ) -> None:
        if flavor not in ("auto", "mariadb", "mysql"):
            raise ConfigError(f"source.flavor {flavor!r} is not auto, mariadb or mysql", pipeline=pipeline)
        if max_rows_in_memory < 1:
            raise ConfigError("max_rows_in_memory must be at least 1", pipeline=pipeline)
        #: rows events decoded by the compiled decoder (`fast`) where it is built; else by its Python twin
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
        #: whether the reader hands on rows of (schema, table) at all (default `selects`; a signal table
        #: too): the rows events of the others are counted by length, never decoded (`skipping`)
        self.reads = reads if reads is not None else selects
        #: hand on a sequence's state rows (`setl.model.RowChange.sequence`): set when the pipeline's
        #: target applies them (`setl.stages.load.LoadCapabilities.sequences`); dropped otherwise
        self.sequences = sequences
        self.ignore_server_ids = frozenset(ignore_server_ids)
        #: a row change logged as a statement that writes one selected table alone is handed on as a
        #: marker in its place (`setl.model.DdlChange.logged_rows`), which quarantines that table at
        #: the target, rather than stopping the reader (set under ``on_table_error: quarantine`` with a
        #: target that keeps a quarantine; docs/quarantine.md)
        self.statement_markers = statement_markers
        self.ignore_marks = frozenset(ignore_marks)
        #: read in a process of its own (`process.ReaderProcess`): the reader's CPU on the other core
        self.reader_process = reader_process
        self._spec = ServerSpec(host, port, user, password, ssl, connect_timeout, heartbeat, flavor, pipeline)
        #: the reader process of the first open, started now: its start-up overlaps the node's
        self._spare = Spare(pipeline)
        if reader_process:
            self._spare.start()
        self.backoff = Backoff(initial=0.1, maximum=2.0, max_attempts=0)
        self.checks = SourceChecks(self.server, selects, self.start)  # settings judgment, where an open starts
        self.figures = ReaderFigures()  # what the reader threads did, across opens (lag figures, tests)
        self.detected_flavor: str | None = None
        self.table_maps: TableMapCache | None = None  # the open reader's decoded-table-map cache
        self.row_decoders: fast.RowDecoders | None = None  # the open reader's compiled decoders
        self.row_counter: RowCounter | None = None  # the open reader's counts of tables not read
        self._unread: set[int] = set()  # the open reader's table ids of tables not read (its assembler's)
        self._reader: BinlogReader | ReaderProcess | None = None  # the open reader thread (or process)
        self._handoff: Handoff | None = None  # its queue to poll (None: closed, or its failure raised)
        self._cursor: Position | None = None  # after the last transaction or mark poll returned
        self._mark: Transaction | None = None  # a position mark poll holds back while more may come

    @classmethod
    def from_config(cls, cfg: MysqlSourceConfig, *, pipeline: str, **kwargs: Any) -> "MysqlBinlogSource":
        kwargs.setdefault("ignore_server_ids", cfg.ignore_server_ids)
        kwargs.setdefault("ignore_marks", cfg.ignore_marks)
        return cls(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                   server_id=cfg.server_id, flavor=cfg.flavor, start=cfg.start, pipeline=pipeline,
                   ssl=cfg.ssl, snapshot=cfg.snapshot, heartbeat=cfg.heartbeat_ms / 1000.0, **kwargs)

    def __repr__(self) -> str:
        return f"<MysqlBinlogSource {self.host}:{self.port} server_id={self.server_id} at {self._cursor}>"

    # --- what the reader did (ReaderFigures) ----------------------------------------------------

    @property
    def peak_buffered_rows(self) -> int:
        """The most rows queued for `poll` and held by the assembler at once (see the class)."""
        return self.figures.peak_buffered_rows

    @property
    def reconnects(self) -> int:
        """Streams re-established after a lost connection."""
        return self.figures.reconnects

    @property
    def heard(self) -> tuple[Position, float] | None:
        """(position, time.time()) where the reader last stood between transactions, and when."""
        return self.figures.heard

    @property
    def arrivals(self) -> collections.deque[tuple[Position, float]]:
        """(end, time.time()) of transactions read within their commit's second, oldest first."""
        return self.figures.arrivals

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
        return self.checks.check()

    def judge_settings(self, position: Position | None = None, also: Sequence[str] = ()) -> SettingsReport:
        """setl's verdict on each server setting that changes what the binlog holds
        (`settings.SETTINGS`), on the binlog filters against the selected schemas, and on whether
        the binlog of `position` (else of a configured start by file) is still on the server; every
        verdict, refused or not (`setl check`, and `setl start` before the first row). `also`:
        schemas the pipeline reads besides its selected tables' (a signal table's). Raises
        `SourceError` only when the server cannot be asked."""
        return self.checks.judge(position, also)

    def open(self, start: Position | None) -> None:
        self._close_reader()
        opening = self.checks.opening(start)
        self.detected_flavor, position, gtids = opening.flavor, opening.position, opening.gtids
        self._cursor = position
        self._mark = None
        self._handoff = self._new_handoff()
        settings = ReaderSettings(self.server_id, self.pipeline, self.max_rows_in_memory, self.reconnect_timeout,
                                  self.table_map_cache, self.fast_decoder, self.sequences, self.ignore_server_ids,
                                  self.statement_markers, self.ignore_marks)
        if self.reader_process:  # socket, framing, decoding and assembly on the other core
            process = ReaderProcess(self._spec, opening, settings, self._handoff, self.figures,
                                    self.selects, self.reads)
            self._reader = process
            process.start(self._spare.take())
            self.table_maps = self.row_decoders = None  # the child's
            self.row_counter, self._unread = None, set()  # the child's (it passes over what `reads` refuses)
        else:
            reader = start_reader(self.server, opening, settings, self._handoff, self.figures, self.backoff,
                                  self.selects, self.reads)
            self._reader = reader
            self.table_maps, self.row_decoders = reader.table_maps, reader.row_decoders
            self.row_counter, self._unread = reader.row_counter, reader.unselected
        gtid_start = gtids.text if position is None and gtids is not None else None
        log.info("pipeline=%s reading the %s binlog of %s:%s from %s (server_id %d)", self.pipeline,
                 self.detected_flavor, self.host, self.port, position or f"after GTID {gtid_start}",
                 self.server_id)

    def _new_handoff(self) -> Handoff:
        """The queue an open's reader hands on to (`shared_binlog` hands on through its own)."""
        return Handoff(self.max_rows_in_memory)

    def poll(self, timeout: float) -> Transaction | None:
        """The next transaction; a position mark only when nothing else is ready (see the class)."""
        if self._handoff is None:
            raise RuntimeError("poll() before open()")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            item = self._handoff.take(None if self._mark is not None else deadline - time.monotonic())
            if item is None:
                mark, self._mark = self._mark, None
                if mark is not None:
                    self._cursor = mark.end
                return mark
            if isinstance(item, Failure):
                self._handoff = None  # this stream is dead; seek or open starts a new one
                raise failure_error(item, self.server, self.pipeline) from item.error
            if not item.changes and item.complete:
                self._mark = item  # a later mark or transaction supersedes it
                continue
            self._mark = None
            self._cursor = item.end
            return item

    def seek(self, position: Position | None) -> None:
        """Read again after `position` (a rollback): `open` there, which ends the open reader first; unlike
        `close` then `open`, a reader process's spare is kept for it (`process.Spare`)."""
        self.open(position)

    def tell(self) -> Position | None:
        return self._cursor

    def passes_over(self) -> bool:
        """Whether this open's reader passed over rows events of tables it does not read, or has
        table maps of such tables at hand (`skipping`): a wider `reads` must then read again."""
        if isinstance(self._reader, ReaderProcess):
            return True  # its child's counts are not known here
        counter = self.row_counter
        return bool(self._unread) or (counter is not None and counter.skipped > 0)

    # --- the server's position, identity and tables (SourceServer) --------------------------------

    def head(self) -> Position | None:
        """The binlog's end now, on a connection of its own (`SourceServer.head`)."""
        return self.server.head()

    def passed(self) -> tuple[Position, Position] | None:
        """Where the reader read past a marker loop guard's echoes (`ReaderFigures.passed`)."""
        return self.figures.passed

    def behind(self) -> bool:
        """Whether the reader reads a backlog now (`ReaderFigures.behind`; a reader process's frames say
        which transactions its reader read late, and its receiver hands them on as the thread does)."""
        return self.figures.behind(time.time())

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
        self._spare.close(timeout)  # no open took it
        self._close_reader(timeout)

    def _close_reader(self, timeout: float = 5.0) -> None:
        if self._reader is not None:
            self._reader.stop(timeout)
        counter, self.row_counter = self.row_counter, None
        if counter is not None and counter.skipped:
            log.info("pipeline=%s binlog reader of %s:%s passed over %d rows events of tables it does not read "
                     "(counted, not decoded; %d left to the decoders)", self.pipeline, self.host, self.port,
                     counter.skipped, counter.decoded)
        self._reader = self._handoff = None
        self._mark = None
        self.server.close()
