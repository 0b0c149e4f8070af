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
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
)
from pymysqlreplication.row_event import RowsEvent, TableMapEvent

from setl.config import SslConfig
from setl.errors import ConfigError, PositionPurged, SourceError
from setl.model import ColumnSchema, Position, TableName, TableSchema, Transaction
from setl.retry import Backoff
from setl.sources.mysql_binlog import fast
from setl.sources.mysql_binlog.assembler import (
    _EVENTS,
    _POSITION_EVENTS,
    KnownTables,
    _Assembler,
    _GtidState,
    gtid_flavor,
    read_events,
)
from setl.sources.mysql_binlog.connector import _Connector, _disconnected, _Lost, _Stopped
from setl.sources.mysql_binlog.decoding import (
    XaKey,
    _Item,
    _row_items,
    _TableInfo,
)
from setl.sources.mysql_binlog.lookups import TableLookups, _Lookups
from setl.sources.mysql_binlog.patches import _TableMapCache, install
from setl.sources.mysql_binlog.statements import _XA_END
from setl.stages.select import Select
from setl.stages.snapshot import SnapshotAccess
from setl.tablecopy import SnapshotSettings
from setl.tls import mysql_context, require_encrypted, tls_failure


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


log = logging.getLogger("setl.sources.mysql_binlog")


#: Arrival times kept for the lag figures (a reader that nobody asks drops the oldest).
ARRIVALS = 10_000

# What a server must run with, and why: column names and primary keys come from the table map.
REQUIRED_SETTINGS: Mapping[str, str] = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}


@attrs.frozen
class _Failure:
    error: BaseException
    position: Position | None


@attrs.frozen
class _GtidStart:
    """A configured start by GTID set: the server positions the stream (auto_position)."""

    gtid: str
    flavor: str


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
    * `open` refuses a server whose binlog settings lose data (`REQUIRED_SETTINGS`) and a
      position whose file was purged (`PositionPurged`).
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
    ) -> None:
        if flavor not in ("auto", "mariadb", "mysql"):
            raise ConfigError(f"source.flavor {flavor!r} is not auto, mariadb or mysql", pipeline=pipeline)
        if max_rows_in_memory < 1:
            raise ConfigError("max_rows_in_memory must be at least 1", pipeline=pipeline)
        install()
        #: rows events decoded by the compiled decoder (`fast`), where it is built and knows the table
        self.fast_decoder = fast_decoder and fast.available()
        # One context for every connection: the binlog stream's, its control connections', ours.
        self._ssl = mysql_context(ssl, where="source.ssl", pipeline=pipeline or None) if ssl else None
        self.host, self.port, self.user = host, port, user
        self._password = password
        self.server_id = server_id
        self.flavor = flavor
        self.start = self._parse_start(start, pipeline)
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
        self.table_maps: _TableMapCache | None = None
        #: (position, time.time()): where the reader last stood between transactions, and when.
        #: A heartbeat from an idle server renews the time: the log ended there then (lag figures).
        self.heard: tuple[Position, float] | None = None
        #: (end, time.time()) of transactions read within the second of their commit timestamp, oldest
        #: first: the binlog's timestamps have whole seconds, the time read refines them (lag figures).
        self.arrivals: collections.deque[tuple[Position, float]] = collections.deque(maxlen=ARRIVALS)
        self._lookups = _Lookups(self._connect)
        self._tables = TableLookups(self._lookups, pipeline=pipeline, sequences=sequences)

    @classmethod
    def from_config(cls, cfg: MysqlSourceConfig, *, pipeline: str, **kwargs: Any) -> "MysqlBinlogSource":
        return cls(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                   server_id=cfg.server_id, flavor=cfg.flavor, start=cfg.start, pipeline=pipeline,
                   ssl=cfg.ssl, snapshot=cfg.snapshot, heartbeat=cfg.heartbeat_ms / 1000.0, **kwargs)

    def __repr__(self) -> str:
        return f"<MysqlBinlogSource {self.host}:{self.port} server_id={self.server_id} at {self._cursor}>"

    @staticmethod
    def _parse_start(start: Any, pipeline: str) -> str | Position | _GtidStart:
        if start is None or start in ("earliest", "latest", "snapshot"):
            return start or "earliest"
        if isinstance(start, Position):
            return start
        if isinstance(start, Mapping) and set(start) == {"gtid"} and isinstance(start["gtid"], str):
            flavor = gtid_flavor(start["gtid"])
            if flavor is not None:
                return _GtidStart(start["gtid"].strip(), flavor)
            raise ConfigError(f"source.start.gtid {start['gtid']!r} is neither a MariaDB GTID list "
                              "(DOMAIN-SERVER-SEQ[,...]) nor a MySQL GTID set (UUID:N[-M][,...])",
                              pipeline=pipeline)
        if isinstance(start, Mapping) and set(start) <= {"file", "log", "pos", "offset"}:
            file = start.get("file", start.get("log"))
            pos = start.get("pos", start.get("offset", 4))
            if isinstance(file, str) and isinstance(pos, int) and not isinstance(pos, bool) and pos >= 4:
                return Position(file, pos)
        if isinstance(start, str):
            with contextlib.suppress(ValueError):
                return Position.parse(start)
        raise ConfigError(f"source.start {start!r} is not earliest, latest, snapshot, {{file: NAME, pos: OFFSET}} "
                          "(OFFSET at least 4) or {gtid: GTID_SET}", pipeline=pipeline)

    # --- control connection ------------------------------------------------------------------

    def _error(self, message: str, position: Position | None = None, cls: type[SourceError] = SourceError
               ) -> SourceError:
        return cls(message, pipeline=self.pipeline, stage="select", position=position)

    def _connect(self) -> pymysql.connections.Connection:
        try:
            conn = pymysql.connect(host=self.host, port=self.port, user=self.user, password=self._password,
                                   connect_timeout=self.connect_timeout, autocommit=True, charset="utf8mb4",
                                   ssl=self._ssl)
            if self._ssl is not None:
                require_encrypted(conn, self.host, self.port)
            return conn
        except (pymysql.MySQLError, ConnectionError) as exc:
            cause = tls_failure(exc)
            if cause is not None:
                raise self._error(f"cannot connect to {self.host}:{self.port} as {self.user} over TLS: {cause} "
                                  "(see source.ssl)") from exc
            raise self._error(f"cannot connect to {self.host}:{self.port} as {self.user}: {exc}") from exc

    def snapshot_access(self) -> SnapshotAccess:
        """What `setl.snapshot` needs to copy this server's tables (`SnapshotCapable`): this
        source's own connections (credentials, TLS, timeouts), its start and table selection.
        Connects to nothing."""
        task_connect = None if self._ssl is not None else {
            "host": self.host, "port": self.port, "user": self.user, "password": self._password,
            "connect_timeout": self.connect_timeout, "charset": "utf8mb4", "autocommit": True}
        return SnapshotAccess(self._connect, f"{self.host}:{self.port}", task_connect,
                              start_mode=self.start == "snapshot", selects=self.selects,
                              settings=self.snapshot_settings, batch_rows=self.max_rows_in_memory)

    def _settings(self) -> dict[str, Any]:
        """The library's connection settings for a binlog stream (and its control connections)."""
        settings = {"host": self.host, "port": self.port, "user": self.user, "password": self._password,
                    "connect_timeout": self.connect_timeout, "read_timeout": max(30.0, 4 * self.heartbeat)}
        if self._ssl is not None:
            settings["ssl"] = self._ssl
        return settings

    def _query(self, conn: pymysql.connections.Connection, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def _status(self, conn: pymysql.connections.Connection) -> tuple[Position, str | None] | None:
        """The binlog head, and (MySQL) the GTID set executed up to it."""
        try:
            rows = self._query(conn, "SHOW MASTER STATUS")
        except pymysql.err.ProgrammingError:  # MySQL 8.4 renamed it
            rows = self._query(conn, "SHOW BINARY LOG STATUS")
        if not rows:
            return None
        executed = rows[0][4] if len(rows[0]) > 4 else None
        return Position(rows[0][0], int(rows[0][1])), (executed or None)

    def _check_settings(self, conn: pymysql.connections.Connection) -> str:
        """Refuse a server that cannot give full row images with names; return its flavor."""
        version = self._query(conn, "SELECT VERSION()")[0][0]
        flavor = self.flavor if self.flavor != "auto" else ("mariadb" if "mariadb" in version.lower() else "mysql")
        names = ", ".join(f"'{name}'" for name in REQUIRED_SETTINGS)
        values = {name.lower(): str(value) for name, value in
                  self._query(conn, f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")}
        for name, wanted in REQUIRED_SETTINGS.items():
            value = values.get(name)
            if value is not None and value.upper() == wanted:
                continue
            shown = "missing (server too old: needs MariaDB 10.5+ or MySQL 8.0.14+)" if value is None else value
            fix = ("start the server with log_bin (log-bin=mysql-bin in [mysqld])" if name == "log_bin"
                   else f"set {name}={wanted} in the server's [mysqld] config (or SET GLOBAL {name}={wanted}) "
                        "and restart the pipeline")
            raise self._error(f"server {self.host}:{self.port} ({version}) has {name}={shown}; setl needs "
                              f"{name}={wanted} to read full row images: {fix}")
        compressed = self._query(conn, "SHOW GLOBAL VARIABLES LIKE 'binlog_transaction_compression'")
        if compressed and str(compressed[0][1]).upper() == "ON":  # MySQL 8.0.20+: payload events we cannot read
            raise self._error(f"server {self.host}:{self.port} ({version}) has binlog_transaction_compression=ON; "
                              "setl cannot read compressed transactions: set it OFF and restart the pipeline")
        return flavor

    def _refuse_cascades(self, conn: pymysql.connections.Connection) -> None:
        """Refuse a selected table whose rows a foreign key changes: InnoDB applies ON DELETE/UPDATE
        CASCADE, SET NULL and SET DEFAULT inside the engine, and the binlog never shows them."""
        found = self._query(conn, "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, REFERENCED_TABLE_NAME, "
                                  "DELETE_RULE, UPDATE_RULE FROM information_schema.REFERENTIAL_CONSTRAINTS "
                                  "WHERE DELETE_RULE <> 'RESTRICT' AND DELETE_RULE <> 'NO ACTION' "
                                  "OR UPDATE_RULE <> 'RESTRICT' AND UPDATE_RULE <> 'NO ACTION' "
                                  "ORDER BY CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME")
        for schema, table, constraint, parent, on_delete, on_update in found:
            if self.selects is not None and not self.selects(schema, table):
                continue
            rules = " ".join(f"ON {what} {rule}" for what, rule in (("DELETE", on_delete), ("UPDATE", on_update))
                             if rule not in ("RESTRICT", "NO ACTION"))
            raise self._error(f"table {schema}.{table} has foreign key {constraint} ({rules} from {parent}): the "
                              "server changes its rows without logging them, so its copy would differ; exclude "
                              "the table or drop the cascade (see docs/mysql-source.md)")

    def _gtids_at(self, conn: pymysql.connections.Connection, position: Position,
                  executed: str | None = None) -> _GtidState | None:
        """The GTID set executed up to `position`, when the server can tell."""
        if self.detected_flavor == "mariadb":
            rows = self._query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", (position.log, position.offset))
            text = rows[0][0] if rows else None
            return _GtidState("mariadb", text) if text is not None else None
        return _GtidState("mysql", executed) if executed else None

    def _resolve(self, conn: pymysql.connections.Connection, start: Position | None
                 ) -> tuple[Position | None, _GtidState | None]:
        """Where to read from: a checked file+pos (or None for a GTID start), and the GTIDs there."""
        logs = [(row[0], int(row[1])) for row in self._query(conn, "SHOW BINARY LOGS")]
        if not logs:
            raise self._error(f"server {self.host}:{self.port} lists no binary logs")
        target = start if start is not None else self.start
        if target == "earliest":
            target = Position(logs[0][0], 4)
        elif target in ("latest", "snapshot") or isinstance(target, _GtidStart):  # a snapshot starts at the head
            status = self._status(conn)
            if status is None:
                raise self._error(f"server {self.host}:{self.port} shows no binlog status")
            head, executed = status
            if not isinstance(target, _GtidStart):  # "latest" or "snapshot"
                gtids = self._gtids_at(conn, head, executed)
                return attrs.evolve(head, gtid=gtids.text or None if gtids else None), gtids
            return self._resolve_gtid(conn, target, head, executed)
        assert isinstance(target, Position)
        sizes = dict(logs)
        if target.log not in sizes:
            oldest = Position(logs[0][0], 4)
            if _log_number(target.log) > _log_number(logs[-1][0]):
                raise self._error(f"position {target} is ahead of the server's last binlog {logs[-1][0]} "
                                  "(was the server reset?)", target)
            raise self._error(f"position {target} was purged from the server; the oldest available is "
                              f"{oldest}: reset the pipeline's position and reload its tables",
                              target, cls=PositionPurged)
        if target.offset > sizes[target.log]:
            raise self._error(f"position {target} is past the end of {target.log} "
                              f"({sizes[target.log]} bytes)", target)
        position = Position(target.log, max(4, target.offset))
        gtids = self._gtids_at(conn, position)
        saved = target.gtid
        flavor = gtid_flavor(saved) if saved else None
        if gtids is None and saved and flavor is not None and flavor == self.detected_flavor:
            gtids = _GtidState(flavor, saved)
        # A checkpoint inside a split transaction (row > 0) reads it again from its start.
        return attrs.evolve(position, gtid=gtids.text or None if gtids else None, row=target.row), gtids

    def _resolve_gtid(self, conn: pymysql.connections.Connection, target: _GtidStart, head: Position,
                      executed: str | None) -> tuple[Position | None, _GtidState]:
        if target.flavor != self.detected_flavor:
            raise self._error(f"source.start.gtid {target.gtid!r} is a {target.flavor} GTID but "
                              f"{self.host}:{self.port} is {self.detected_flavor}")
        wanted = _GtidState(target.flavor, target.gtid)
        if target.flavor == "mariadb":
            executed = self._query(conn, "SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
        if executed is not None and wanted.covers(_GtidState(target.flavor, executed)):
            # Nothing after it yet: start at the head by position, so caught-up is known at once.
            return attrs.evolve(head, gtid=wanted.text), wanted
        return None, wanted

    # --- Select ------------------------------------------------------------------------------

    def check(self) -> str:
        """What `open` checks before reading, without reading: the connection (and TLS), the binlog
        settings and grants a reader needs, and no selected table with a cascading foreign key.
        Returns what was found (``mariadb 10.11.19 at HOST:PORT``); raises `SourceError` naming the
        first problem (`setl check`)."""
        conn = self._connect()
        try:
            flavor = self._check_settings(conn)
            self._refuse_cascades(conn)
            version = str(self._query(conn, "SELECT VERSION()")[0][0])
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the binlog settings of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        return f"{flavor} {version} at {self.host}:{self.port}"

    def open(self, start: Position | None) -> None:
        self.close()
        conn = self._connect()
        try:
            self.detected_flavor = self._check_settings(conn)
            self._refuse_cascades(conn)
            position, gtids = self._resolve(conn, start)
            tables = [(str(schema), str(table)) for schema, table in self._query(
                conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE <> 'VIEW' "
                      "AND TABLE_SCHEMA NOT IN ('information_schema', 'performance_schema', 'sys', 'mysql')")]
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the binlog settings of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        self._cursor = position
        self._mark = None
        self._stop = threading.Event()
        self._queue = queue.Queue()  # bounded by rows: see _read's put
        self._queued_rows = 0
        self.table_maps = _TableMapCache() if self.table_map_cache else None
        self.row_decoders = fast.RowDecoders() if self.fast_decoder else None
        self._connector = _Connector(self.table_maps, tls=self._ssl is not None)
        self._tables = TableLookups(self._lookups, pipeline=self.pipeline, sequences=self.sequences)
        assembler = _Assembler(position or Position("", 0), self.max_rows_in_memory, gtids, self._prepared_rows,
                               self._tables.transactional, self.selects, KnownTables(tables))
        assembler.kind_of = self._tables.table_kind
        assembler.sequences = self.sequences
        assembler.mode_names = self._tables.mode_names
        gtid_start = gtids.text if position is None and gtids is not None else None
        self._thread = threading.Thread(
            target=self._read, args=(self._connector, assembler, self._queue, self._stop, position, gtid_start),
            name=f"setl-{self.pipeline or 'mysql'}-binlog", daemon=True)
        self._thread.start()
        log.info("pipeline=%s reading the %s binlog of %s:%s from %s (server_id %d)", self.pipeline,
                 self.detected_flavor, self.host, self.port, position or f"after GTID {gtid_start}",
                 self.server_id)


    def _prepared_rows(self, key: XaKey, start: Position | None, commit: Position) -> list[_Item]:
        """The row changes of prepared XA transaction `key`, read again from the binlog (runs on the
        reader thread when its XA COMMIT group, starting at `commit`, arrives).

        From `start` when this reader saw its XA PREPARE; else (a restart between XA PREPARE and
        XA COMMIT) from the last XA PREPARE of `key` before `commit`, searching the binlogs newest
        first. A prepared transaction no binlog holds any more stops the pipeline.
        """
        xid = f"X'{key[1].hex()}',X'{key[2].hex()}',{key[0]}"
        if start is not None:
            found = self._scan_for_prepare(key, start, commit, first_only=True)
        else:
            conn = self._connect()
            try:
                logs = [str(row[0]) for row in self._query(conn, "SHOW BINARY LOGS")]
            finally:
                conn.close()
            found = None
            for name in reversed(logs[: logs.index(commit.log) + 1] if commit.log in logs else []):
                found = self._scan_for_prepare(key, Position(name, 4), commit)
                if found is not None:
                    log.info("pipeline=%s found the XA PREPARE of %s (committed at %s) in %s", self.pipeline,
                             xid, commit, name)
                    break
        if found is None:
            raise SourceError(f"XA COMMIT {xid} at {commit}: its XA PREPARE is no longer in the binlogs of "
                              f"{self.host}:{self.port} (purged?), so its rows cannot be applied; reload the "
                              "tables it touched and reset the pipeline's position past it", position=commit)
        return found

    def _scan_for_prepare(self, key: XaKey, start: Position, stop: Position, first_only: bool = False
                          ) -> list[_Item] | None:
        """The rows of the last XA PREPARE group of `key` in ``[start, stop)`` of one binlog file."""
        connector = _Connector(None, tls=self._ssl is not None)
        settings = self._settings()
        # server_id 0 with a non-blocking dump, as mariadb-binlog reads: it does not displace the
        # pipeline's own stream (a second reader with its server_id would).
        reader = BinLogStreamReader(connection_settings=settings, server_id=0, blocking=False, resume_stream=True,
                                    log_file=start.log, log_pos=start.offset, is_mariadb=False,
                                    only_events=_EVENTS, pymysql_wrapper=connector, enable_logging=False)
        tables: dict[int, _TableInfo] = {}
        group: list[_Item] = []
        found: list[_Item] | None = None
        try:
            while True:
                event = reader.fetchone()
                if event is None:
                    return found
                if isinstance(event, RotateEvent):
                    if event.next_binlog != start.log:
                        return found
                    continue
                if not isinstance(event, _POSITION_EVENTS) and (start.log, event.packet.log_pos) > (
                        stop.log, stop.offset):
                    return found
                if isinstance(event, (MariadbGtidEvent, GtidEvent)):
                    group = []
                elif isinstance(event, TableMapEvent):
                    info = _TableInfo.from_table_map(event)
                    tables[event.table_id] = info.with_kind(self._tables.table_kind(info.schema, info.table))
                elif isinstance(event, RowsEvent) and event.table_id in tables:
                    if not tables[event.table_id].sequence:
                        group.extend(_row_items(event, tables[event.table_id]))
                elif isinstance(event, XAPrepareEvent) and not event.one_phase and (
                        event.xid_format_id, bytes(event.xid_gtrid), bytes(event.xid_bqual)) == key:
                    found = group
                    if first_only:
                        return found
                elif isinstance(event, QueryEvent):
                    match = _XA_END.match(event.query)
                    if match and (int(match["format"]), bytes.fromhex(match["gtrid"]),
                                  bytes.fromhex(match["bqual"])) == key:
                        found = None  # finished before: a later XA PREPARE reuses the XID
                    elif event.query.strip().upper().startswith("XA START"):
                        group = []
        except pymysql.MySQLError as exc:
            raise SourceError(f"cannot read {start.log} of {self.host}:{self.port} again for the XA PREPARE of "
                              f"the XA COMMIT at {stop}: {exc}", position=stop) from exc
        finally:
            with contextlib.suppress(Exception):
                reader.close()
            connector.shutdown()

    def _stream(self, connector: _Connector, at: Position | None, gtid: str | None) -> BinLogStreamReader:
        settings = self._settings()
        common: dict[str, Any] = dict(
            connection_settings=settings, server_id=self.server_id, blocking=True, only_events=_EVENTS,
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
                        if txs or held > last_held:  # only then can the peak have grown
                            with self._buffer_lock:
                                buffered = self._queued_rows + held
                            self.peak_buffered_rows = max(self.peak_buffered_rows, buffered)
                        last_held = len(assembler.rows)
                except _Stopped:
                    raise
                except BaseException as exc:
                    if stop.is_set() or not _disconnected(exc):
                        raise
                    now = time.monotonic()
                    down_since = down_since if down_since is not None else now
                    if now - down_since >= self.reconnect_timeout:
                        raise self._error(f"the binlog server {self.host}:{self.port} stayed unreachable for "
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
            return self._error(f"cannot read the binlog of {self.host}:{self.port} over TLS: {cause} "
                               "(see source.ssl)", where)
        if isinstance(exc, pymysql.MySQLError):
            if exc.args and exc.args[0] == _ER_MASTER_FATAL_READING_BINLOG:
                return self._error(f"the server {self.host}:{self.port} cannot send its binlog after {after} "
                                   f"(purged, or a GTID it does not have?): {exc.args[-1]}", where,
                                   cls=PositionPurged)
            return self._error(f"binlog read from {self.host}:{self.port} failed after {after}: {exc}", where)
        return self._error(f"cannot decode the binlog of {self.host}:{self.port} after {after}: "
                           f"{type(exc).__name__}: {exc}", where)

    def tell(self) -> Position | None:
        return self._cursor

    def head(self) -> Position | None:
        conn = self._connect()
        try:
            status = self._status(conn)
            return status[0] if status else None
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the binlog status of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()

    def identity(self) -> dict[str, Any]:
        """Which server this is (`setl.pipeline.identity`): its ``server_uuid`` (MySQL), ``server_id``
        and ``gtid_domain_id`` (MariaDB), as the server reports them; a variable it lacks is left out."""
        conn = self._connect()
        try:
            rows = self._query(conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                                     "('server_uuid', 'server_id', 'gtid_domain_id')")
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the server identity of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        found = {str(name): str(value) for name, value in rows}
        return {name: (int(value) if name != "server_uuid" else value) for name, value in sorted(found.items())}

    def bytes_behind(self, position: Position) -> tuple[Position, int] | None:
        """The log's end and the bytes of binlog after `position` up to it (None: `position`'s file is gone)."""
        try:
            [rows] = self._lookups.query(("SHOW BINARY LOGS", None))
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot list the binary logs of {self.host}:{self.port}: {exc}") from exc
        logs = [(str(row[0]), int(row[1])) for row in rows]
        names = [name for name, _ in logs]
        if not logs or position.log not in names:
            return None
        after = logs[names.index(position.log):]
        behind = sum(size for _, size in after) - min(position.offset, after[0][1])
        return Position(*logs[-1]), behind

    def describe(self) -> tuple[TableSchema, ...]:
        """The selected base tables' columns from information_schema, on a connection of its own."""
        conn = self._connect()
        try:
            tables = self._query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, CREATE_OPTIONS FROM information_schema.TABLES "
                                       "WHERE TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') AND TABLE_SCHEMA "
                                       "NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')")
            wanted = {(str(schema), str(table)) for schema, table, _options in tables
                      if self.selects is None or self.selects(str(schema), str(table))}
            partitioned = {(str(schema), str(table)) for schema, table, options in tables
                           if "partitioned" in str(options or "").lower()}
            if not wanted:
                return ()
            schemas = sorted({schema for schema, _ in wanted})
            marks = ", ".join(["%s"] * len(schemas))
            columns = self._query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, "
                                        "COLUMN_DEFAULT, CHARACTER_SET_NAME, COLLATION_NAME, GENERATION_EXPRESSION, "
                                        "DATA_TYPE, EXTRA "
                                        f"FROM information_schema.COLUMNS WHERE TABLE_SCHEMA IN ({marks}) "
                                        "ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION", schemas)
            json_checked = _json_checked(self._query, conn, marks, schemas)
            mariadb = "mariadb" in str(self._query(conn, "SELECT VERSION()")[0][0]).lower()
            keys = self._query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM "
                                     f"information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA IN ({marks}) "
                                     "AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY TABLE_SCHEMA, TABLE_NAME, "
                                     "ORDINAL_POSITION", schemas)
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the selected tables' columns: {exc}") from exc
        finally:
            conn.close()
        found: dict[tuple[str, str], list[ColumnSchema]] = {}
        for schema, table, name, type_, nullable, default, charset, collation, expression, data_type, extra \
                in columns:
            key = (str(schema), str(table))
            if key in wanted:
                found.setdefault(key, []).append(_column_schema(
                    str(name), str(type_), nullable == "YES", default, charset, collation, expression,
                    str(data_type), str(extra or ""), (*key, str(name)) in json_checked, mariadb))
        primary: dict[tuple[str, str], list[str]] = {}
        for schema, table, name in keys:
            # A system-versioned table's key holds its row end, which COLUMNS lists only when the
            # period columns are declared: the rows setl hands on carry neither (current rows only).
            if any(column.name == str(name) for column in found.get((str(schema), str(table)), ())):
                primary.setdefault((str(schema), str(table)), []).append(str(name))
        return tuple(TableSchema(TableName(*key), tuple(cols), tuple(primary.get(key, ())), key in partitioned)
                     for key, cols in sorted(found.items()))

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
        self._lookups.close()


def _json_checked(query: Callable[..., Any], conn: Any, marks: str, schemas: Sequence[str]) -> set[tuple[str, ...]]:
    """(schema, table, column) of MariaDB's JSON columns: LONGTEXT with a ``json_valid(`col`)`` CHECK."""
    try:
        rows = query(conn, "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CHECK_CLAUSE FROM information_schema."
                           f"CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA IN ({marks})", schemas)
    except pymysql.MySQLError:  # a server without CHECK_CONSTRAINTS (MySQL 5.7): JSON is its own type there
        return set()
    found: set[tuple[str, ...]] = set()
    for schema, table, clause in rows:
        match = re.fullmatch(r"json_valid\(`((?:[^`]|``)+)`\)", str(clause).strip())
        if match:
            found.add((str(schema), str(table), match[1].replace("``", "`")))
    return found


def _column_schema(name: str, column_type: str, nullable: bool, default: Any, charset: Any, collation: Any,
                   expression: Any, data_type: str, extra: str, json: bool, mariadb: bool = True) -> ColumnSchema:
    """A column from its information_schema.COLUMNS row (MariaDB's and MySQL's spellings)."""
    # Lower case outside quotes: ENUM and SET members keep their case.
    lowered = "".join(part if i % 2 else part.lower() for i, part in enumerate(re.split(r"('(?:[^']|'')*')",
                                                                                      column_type)))
    generated = str(expression) if expression else None  # MariaDB: NULL, MySQL: '' for a stored column
    text = None if default is None or generated else str(default)
    if text is not None and text.upper() == "NULL":
        text = None  # MariaDB writes a nullable column's absent default as NULL
    elif text is not None and _NEXT_VALUE.search(text):
        text = None  # a sequence's next value: the rows carry the values, the target has no such sequence
    elif text is not None and "DEFAULT_GENERATED" in extra.upper():
        text = f"({text})" if not text.lower().startswith("current_timestamp") else text
    elif text is not None and mariadb:
        # MariaDB quotes every literal and lists an expression as written: `concat('a','b')`
        if not _LITERAL.fullmatch(text) and not text.lower().startswith("current_timestamp"):
            text = f"({text})"
    elif (text is not None and not text.startswith("'") and data_type.lower() in _MYSQL_QUOTED_DEFAULTS
          and not text.lower().startswith("current_timestamp")):
        text = "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"  # MySQL 8 gives literals unquoted
    return ColumnSchema(name, lowered, nullable, text, str(charset) if charset else None,
                        str(collation) if collation else None, generated, json or data_type.lower() == "json",
                        "INVISIBLE" in extra.upper())


#: A default information_schema lists as a literal: a quoted string, a number, b'..' or x'..'.
_LITERAL = re.compile(r"'(?:[^'\\]|''|\\.)*'|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[bBxX]'[0-9a-fA-F]*'")
#: A default drawing a sequence's value (MariaDB: ``nextval(`s`.`seq`)``, ``NEXT VALUE FOR seq``).
_NEXT_VALUE = re.compile(r"\b(?:nextval|lastval|setval)\s*\(|\bNEXT\s+VALUE\s+FOR\b|\bPREVIOUS\s+VALUE\s+FOR\b", re.I)


#: Types whose literal default MySQL 8 lists unquoted (MariaDB quotes every string literal).
_MYSQL_QUOTED_DEFAULTS = frozenset({"char", "varchar", "binary", "varbinary", "enum", "set", "date", "datetime",
                                    "timestamp", "time", "year", "tinytext", "text", "mediumtext", "longtext"})


def _weight(item: Transaction | _Failure) -> int:
    """What an item counts for in the reader's queue: its rows, at least one."""
    return max(1, len(item.changes)) if isinstance(item, Transaction) else 1


def _log_number(name: str) -> int:
    suffix = name.rpartition(".")[2]
    return int(suffix) if suffix.isdigit() else -1
