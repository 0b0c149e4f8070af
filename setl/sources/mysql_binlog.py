"""A MySQL or MariaDB binary log as a Select: whole transactions of full-image row changes and DDL.

This is the only module that imports pymysqlreplication; nothing it returns holds a library object.
A background thread reads the binlog with a blocking stream and hands assembled transactions to
`poll` through a bounded queue, so `poll` honours its timeout and `close` interrupts the read.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import queue
import re
import socket
import threading
from collections.abc import Mapping
from typing import Any

import attrs
import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE, NONE_SOURCE
from pymysqlreplication.event import MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from setl.config import MysqlSourceConfig
from setl.errors import ConfigError, PositionPurged, SourceError
from setl.model import Change, DdlChange, Op, Position, RowChange, Transaction
from setl.stages.select import Select

log = logging.getLogger("setl.sources.mysql_binlog")


def _drop_reconnect_notice(record: logging.LogRecord) -> bool:
    # The library logs this on every lost stream, ours included when close() cuts it; a real
    # loss surfaces as a SourceError from poll() instead.
    return "Re-request the connection" not in record.getMessage()


logging.getLogger("pymysqlreplication").addFilter(_drop_reconnect_notice)

# What a server must run with, and why: column names and primary keys come from the table map.
REQUIRED_SETTINGS: Mapping[str, str] = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}

_EVENTS = [RotateEvent, MariadbGtidEvent, QueryEvent, XidEvent, TableMapEvent,
           WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent]
_GTID_STANDALONE = 0x01  # MariaDB GTID flag: one statement, no BEGIN/COMMIT follows
_IGNORED_IN_TX = re.compile(r"^\s*(SAVEPOINT|ROLLBACK\s+TO|RELEASE\s+SAVEPOINT|XA\s)", re.I)

_NAME = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_QUALIFIED = rf"(?P<name>{_NAME}(?:\s*\.\s*{_NAME})?)"
_DDL_PATTERNS = [
    re.compile(rf"^(?:(?:CREATE|ALTER|DROP|RENAME|OPTIMIZE|REPAIR|ANALYZE)\s+"
               rf"(?:OR\s+REPLACE\s+|TEMPORARY\s+|ONLINE\s+|IGNORE\s+|NO_WRITE_TO_BINLOG\s+|LOCAL\s+)*TABLE"
               rf"|TRUNCATE(?:\s+TABLE)?)\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?{_QUALIFIED}", re.I),
    re.compile(rf"^(?:CREATE|DROP)\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?"
               rf"INDEX\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?{_NAME}\s+(?:\w+\s+\w+\s+)?ON\s+{_QUALIFIED}", re.I),
]
_DDL_DATABASE = re.compile(rf"^(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:DATABASE|SCHEMA)\s+"
                           rf"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?P<name>{_NAME})", re.I)
_LEADING_COMMENTS = re.compile(r"^\s*(?:/\*(?!!).*?\*/\s*|#[^\n]*\n\s*|--\s[^\n]*\n\s*)*", re.S)


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def ddl_target(statement: str, default_schema: str) -> tuple[str, str | None]:
    """Best-effort ``(schema, table or None)`` a DDL statement acts on."""
    text = _LEADING_COMMENTS.sub("", statement, count=1)
    match = _DDL_DATABASE.match(text)
    if match:
        return _unquote(match["name"]), None
    for pattern in _DDL_PATTERNS:
        match = pattern.match(text)
        if match:
            parts = re.split(rf"\s*\.\s*(?={_NAME}$)", match["name"], maxsplit=1)
            if len(parts) == 2:
                return _unquote(parts[0]), _unquote(parts[1])
            return default_schema, _unquote(parts[0])
    return default_schema, None


def _read_time2(self: RowsEvent, column: Any) -> datetime.timedelta:
    """TIME(fsp) as MySQL packs it (``my_time_packed_from_binary``).

    The library decodes the whole and the fractional part of a negative TIME separately and gets
    the fraction wrong (-00:00:01.5 comes back as -00:00:01.000005).
    """
    nfrac = (column.fsp + 1) // 2
    data = self.packet.read(3 + nfrac)
    if nfrac == 3:
        packed = int.from_bytes(data, "big") - (0x800000 << 24)
    else:
        intpart = int.from_bytes(data[:3], "big") - 0x800000
        frac = int.from_bytes(data[3:], "big")
        if intpart < 0 and frac:
            intpart, frac = intpart + 1, frac - (1 << (8 * nfrac))
        packed = (intpart << 24) + frac * (10_000 if nfrac == 1 else 100)
    sign, packed = (-1 if packed < 0 else 1), abs(packed)
    hms, micros = packed >> 24, packed % (1 << 24)
    return sign * datetime.timedelta(hours=(hms >> 12) % 1024, minutes=(hms >> 6) % 64, seconds=hms % 64,
                                     microseconds=micros)


RowsEvent._RowsEvent__read_time2 = _read_time2  # type: ignore[attr-defined]  # only this module reads rows


@attrs.frozen
class _TableInfo:
    """What a rows event needs from its table map: names, key, and per-column value fixes."""

    schema: str
    table: str
    primary_key: tuple[str, ...]
    sets: frozenset[str]
    bits: frozenset[str]
    years: frozenset[str]
    binaries: frozenset[str]
    binary_widths: Mapping[str, int]

    @classmethod
    def from_table_map(cls, event: TableMapEvent) -> "_TableInfo":
        columns = event.columns
        meta = event.optional_metadata
        indexes = list(meta.simple_primary_key_list) or list(meta.primary_keys_with_prefix)
        if indexes:
            key = tuple(columns[i].name for i in indexes)
        else:
            pk = event.get_table().primary_key
            key = tuple(pk) if isinstance(pk, tuple) else ((pk,) if pk else ())
        return cls(
            event.schema, event.table, key,
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.SET),
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.BIT),
            frozenset(c.name for c in columns if c.type == FIELD_TYPE.YEAR),
            frozenset(c.name for c in columns if c.character_set_name == "binary"),
            # BINARY(n) arrives with its trailing zero bytes stripped
            {c.name: c.max_length for c in columns
             if c.type == FIELD_TYPE.STRING and c.character_set_name == "binary"},
        )

    def image(self, values: dict[str, Any], none_sources: Mapping[str, str]) -> dict[str, Any]:
        """The row as setl hands it on: the library's values, with its lossy spots undone."""
        for name in self.sets:
            if values.get(name) is None and none_sources.get(name) == NONE_SOURCE.EMPTY_SET:
                values[name] = set()
        for name in self.bits:
            if values.get(name) is not None:
                values[name] = int(values[name], 2)
        for name in self.years:
            if values.get(name) == 1900:  # YEAR 0000 decodes as 1900, which YEAR cannot hold
                values[name] = 0
        for name in self.binaries:
            if values.get(name) == "":  # an empty value skips the (failing) decode and stays str
                values[name] = b""
        for name, width in self.binary_widths.items():
            value = values.get(name)
            if isinstance(value, bytes) and len(value) < width:
                values[name] = value.ljust(width, b"\0")
        return values


class _Assembler:
    """Turns a stream of binlog events into transactions (runs on the reader thread)."""

    def __init__(self, log_file: str, max_rows: int) -> None:
        self.log_file = log_file
        self.max_rows = max_rows
        self.tables: dict[int, _TableInfo] = {}
        self.rows: list[tuple[Op, _TableInfo, dict | None, dict | None]] = []
        self.nbytes = 0
        self.in_tx = False
        self.standalone = False

    def feed(self, event: Any) -> list[Transaction]:
        size = event.packet.event_size
        if isinstance(event, RotateEvent):
            self.log_file = event.next_binlog
            if event.timestamp:  # a real rotation: table ids may be reused in the next file
                self.tables.clear()
            return []
        end = Position(self.log_file, event.packet.log_pos)
        self.nbytes += size
        if isinstance(event, MariadbGtidEvent):
            self.standalone = bool(event.flags & _GTID_STANDALONE)
            self.in_tx = not self.standalone
            return []
        if isinstance(event, TableMapEvent):
            self.tables[event.table_id] = _TableInfo.from_table_map(event)
            return []
        if isinstance(event, RowsEvent):
            self._add_rows(event)
            if len(self.rows) >= self.max_rows:
                return self._pieces(end)
            return []
        if isinstance(event, XidEvent):
            return [self._commit(end, event.timestamp)]
        if isinstance(event, QueryEvent):
            return self._query(event, end)
        return []

    def _add_rows(self, event: RowsEvent) -> None:
        info = self.tables.get(event.table_id)
        if info is None:
            raise SourceError(f"rows event for table id {event.table_id} ({event.schema}.{event.table}) "
                              "without its table map")
        for row in event.rows:
            if isinstance(event, WriteRowsEvent):
                self.rows.append((Op.INSERT, info, None, info.image(row["values"], row["none_sources"])))
            elif isinstance(event, DeleteRowsEvent):
                self.rows.append((Op.DELETE, info, info.image(row["values"], row["none_sources"]), None))
            else:
                self.rows.append((Op.UPDATE, info,
                                  info.image(row["before_values"], row["before_none_sources"]),
                                  info.image(row["after_values"], row["after_none_sources"])))

    def _changes(self, rows: list, position: Position, commit_time: float | None) -> tuple[Change, ...]:
        return tuple(
            DdlChange(*after, before, position) if op is None  # type: ignore[misc]
            else RowChange(op, info.schema, info.table, info.primary_key, before, after, position, commit_time)
            for op, info, before, after in rows
        )

    def _pieces(self, cursor: Position) -> list[Transaction]:
        """Cut full pieces off a transaction too large to hold; their `end` is only a cursor."""
        pieces = []
        while len(self.rows) >= self.max_rows:
            chunk, self.rows = self.rows[: self.max_rows], self.rows[self.max_rows:]
            pieces.append(Transaction(self._changes(chunk, cursor, None), cursor, complete=False,
                                      nbytes=self.nbytes))
            self.nbytes = 0
        return pieces

    def _commit(self, end: Position, timestamp: float | None) -> Transaction:
        tx = Transaction(self._changes(self.rows, end, float(timestamp) if timestamp else None), end,
                         nbytes=self.nbytes)
        self.rows, self.nbytes, self.in_tx, self.standalone = [], 0, False, False
        return tx

    def _query(self, event: QueryEvent, end: Position) -> list[Transaction]:
        statement = event.query.strip()
        verb = statement.rstrip(";").strip().upper()
        if verb == "BEGIN":
            self.in_tx = True
            return []
        if verb == "COMMIT":  # non-transactional tables, or a server that sends BEGIN/COMMIT
            return [self._commit(end, event.timestamp)]
        if verb == "ROLLBACK":
            if self.rows:
                # Only a mix with non-transactional tables is logged this way; their rows stay.
                log.warning("transaction ending at %s was rolled back; passing on its %d row "
                            "changes to non-transactional tables", end, len(self.rows))
            return [self._commit(end, event.timestamp)]
        if self.in_tx and not self.standalone and _IGNORED_IN_TX.match(statement):
            return []
        schema = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) else event.schema
        ddl_schema, table = ddl_target(statement, schema or "")
        if self.in_tx and self.rows:
            # A statement logged inside a transaction: keep it ordered with the rows around it.
            self.rows.append((None, None, statement, (ddl_schema, table)))  # type: ignore[arg-type]
            return []
        tx = Transaction((DdlChange(ddl_schema, table, statement, end),), end, nbytes=self.nbytes)
        self.nbytes, self.in_tx, self.standalone = 0, False, False
        return [tx]


class _Stopped(Exception):
    """The reader was closed; its thread ends quietly."""


class _Lost(Exception):
    """The stream connection dropped; the library would reconnect mid-transaction, so we refuse."""


class _Connector:
    """The `pymysql_wrapper` handed to the library: one stream connection, and a way to cut it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: list[pymysql.connections.Connection] = []
        self._stream_opened = False
        self.closed = False

    def __call__(self, **kwargs: Any) -> pymysql.connections.Connection:
        if "db" in kwargs:  # the library still uses PyMySQL's deprecated names
            kwargs["database"] = kwargs.pop("db")
        if "passwd" in kwargs:
            kwargs["password"] = kwargs.pop("passwd")
        control = kwargs.get("database") == "information_schema"
        with self._lock:
            if self.closed:
                raise _Stopped()
            if not control:
                if self._stream_opened:
                    raise _Lost()
                self._stream_opened = True
        conn = pymysql.connect(**kwargs)
        with self._lock:
            self._connections.append(conn)
            if self.closed:
                self._cut(conn)
                raise _Stopped()
        return conn

    @staticmethod
    def _cut(conn: pymysql.connections.Connection) -> None:
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def shutdown(self) -> None:
        """Wake a blocked read: shut the sockets down (the reader thread closes them)."""
        with self._lock:
            self.closed = True
            connections = list(self._connections)
        for conn in connections:
            self._cut(conn)


@attrs.frozen
class _Failure:
    error: BaseException
    position: Position


class MysqlBinlogSource(Select):
    """Reads a MySQL or MariaDB binlog from a file and position (see the module docstring).

    * Positions are ``Position(binlog file, offset after the commit event)``. A position from
      `open` or `seek` wins over the configured `start` ("earliest", "latest", or a mapping
      ``{file: ..., pos: ...}``).
    * `open` refuses a server whose binlog settings lose data (`REQUIRED_SETTINGS`) and a
      position whose file was purged (`PositionPurged`).
    * `poll` blocks at most `timeout` seconds. A lost connection raises `SourceError`; the next
      `seek` or `open` reconnects. Transactions of more than `max_rows_in_memory` rows come in
      pieces with ``complete=False``.
    * Values are pymysqlreplication's, except: an empty SET is ``set()``, BIT is an int, BINARY(n)
      keeps its trailing zero bytes, YEAR 0 is 0. MariaDB's JSON is text and stays a str.
    * `server_id` must be unique among the server's replicas and readers.
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
        queue_size: int = 16,
        connect_timeout: float = 5.0,
        heartbeat: float = 5.0,
    ) -> None:
        if flavor not in ("auto", "mariadb", "mysql"):
            raise ConfigError(f"source.flavor {flavor!r} is not auto, mariadb or mysql", pipeline=pipeline)
        if max_rows_in_memory < 1:
            raise ConfigError("max_rows_in_memory must be at least 1", pipeline=pipeline)
        self.host, self.port, self.user = host, port, user
        self._password = password
        self.server_id = server_id
        self.flavor = flavor
        self.start = self._parse_start(start, pipeline)
        self.pipeline = pipeline
        self.max_rows_in_memory = max_rows_in_memory
        self.queue_size = queue_size
        self.connect_timeout = connect_timeout
        self.heartbeat = heartbeat
        self._queue: queue.Queue[Transaction | _Failure] | None = None
        self._thread: threading.Thread | None = None
        self._connector: _Connector | None = None
        self._reader: BinLogStreamReader | None = None
        self._stop = threading.Event()
        self._cursor: Position | None = None
        self.detected_flavor: str | None = None

    @classmethod
    def from_config(cls, cfg: MysqlSourceConfig, *, pipeline: str, **kwargs: Any) -> "MysqlBinlogSource":
        return cls(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password,
                   server_id=cfg.server_id, flavor=cfg.flavor, start=cfg.start, pipeline=pipeline,
                   **kwargs)

    def __repr__(self) -> str:
        return f"<MysqlBinlogSource {self.host}:{self.port} server_id={self.server_id} at {self._cursor}>"

    @staticmethod
    def _parse_start(start: Any, pipeline: str) -> str | Position:
        if start is None or start in ("earliest", "latest"):
            return start or "earliest"
        if isinstance(start, Position):
            return start
        if isinstance(start, Mapping):
            file = start.get("file", start.get("log"))
            pos = start.get("pos", start.get("offset", 4))
            if isinstance(file, str) and isinstance(pos, int) and not isinstance(pos, bool) and pos >= 4:
                return Position(file, pos)
        if isinstance(start, str):
            with contextlib.suppress(ValueError):
                return Position.parse(start)
        raise ConfigError(f"source.start {start!r} is not earliest, latest or {{file: NAME, pos: OFFSET}} "
                          "(OFFSET at least 4)", pipeline=pipeline)

    # --- control connection ------------------------------------------------------------------

    def _error(self, message: str, position: Position | None = None, cls: type[SourceError] = SourceError
               ) -> SourceError:
        return cls(message, pipeline=self.pipeline, stage="select", position=position)

    def _connect(self) -> pymysql.connections.Connection:
        try:
            return pymysql.connect(host=self.host, port=self.port, user=self.user, password=self._password,
                                   connect_timeout=self.connect_timeout, autocommit=True, charset="utf8mb4")
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot connect to {self.host}:{self.port} as {self.user}: {exc}") from exc

    def _query(self, conn: pymysql.connections.Connection, sql: str) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    def _status(self, conn: pymysql.connections.Connection) -> Position | None:
        try:
            rows = self._query(conn, "SHOW MASTER STATUS")
        except pymysql.err.ProgrammingError:  # MySQL 8.4 renamed it
            rows = self._query(conn, "SHOW BINARY LOG STATUS")
        return Position(rows[0][0], int(rows[0][1])) if rows else None

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
            fix = (f"start the server with log_bin (log-bin=mysql-bin in [mysqld])" if name == "log_bin"
                   else f"set {name}={wanted} in the server's [mysqld] config (or SET GLOBAL {name}={wanted}) "
                        "and restart the pipeline")
            raise self._error(f"server {self.host}:{self.port} ({version}) has {name}={shown}; setl needs "
                              f"{name}={wanted} to read full row images: {fix}")
        return flavor

    def _resolve(self, conn: pymysql.connections.Connection, start: Position | None) -> Position:
        logs = [(row[0], int(row[1])) for row in self._query(conn, "SHOW BINARY LOGS")]
        if not logs:
            raise self._error(f"server {self.host}:{self.port} lists no binary logs")
        target = start if start is not None else self.start
        if target == "earliest":
            return Position(logs[0][0], 4)
        if target == "latest":
            status = self._status(conn)
            if status is None:
                raise self._error(f"server {self.host}:{self.port} shows no binlog status")
            return status
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
        return Position(target.log, max(4, target.offset))

    # --- Select ------------------------------------------------------------------------------

    def open(self, start: Position | None) -> None:
        self.close()
        conn = self._connect()
        try:
            self.detected_flavor = self._check_settings(conn)
            position = self._resolve(conn, start)
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the binlog settings of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        self._cursor = position
        self._stop = threading.Event()
        self._queue = queue.Queue(self.queue_size)
        self._connector = _Connector()
        settings = {"host": self.host, "port": self.port, "user": self.user, "password": self._password,
                    "connect_timeout": self.connect_timeout, "read_timeout": max(30.0, 4 * self.heartbeat)}
        # is_mariadb=False on purpose: the library's MariaDB handshake ignores log_file/log_pos
        # unless given a GTID, while the classic COM_BINLOG_DUMP serves both flavors by file+pos.
        self._reader = BinLogStreamReader(
            connection_settings=settings, server_id=self.server_id, resume_stream=True, blocking=True,
            log_file=position.log, log_pos=position.offset, only_events=_EVENTS, is_mariadb=False,
            slave_heartbeat=self.heartbeat, pymysql_wrapper=self._connector, enable_logging=False,
        )
        self._thread = threading.Thread(target=self._read, args=(self._reader, self._queue, self._stop, position),
                                        name=f"setl-{self.pipeline or 'mysql'}-binlog", daemon=True)
        self._thread.start()
        log.info("pipeline=%s reading the %s binlog of %s:%s from %s (server_id %d)", self.pipeline,
                 self.detected_flavor, self.host, self.port, position, self.server_id)

    def _read(self, reader: BinLogStreamReader, out: queue.Queue, stop: threading.Event,
              start: Position) -> None:
        assembler = _Assembler(start.log, self.max_rows_in_memory)
        last = start

        def put(item: Transaction | _Failure) -> None:
            while not stop.is_set():
                with contextlib.suppress(queue.Full):
                    out.put(item, timeout=0.1)
                    return
            raise _Stopped()

        try:
            while not stop.is_set():
                event = reader.fetchone()
                if event is None:
                    raise _Lost()
                for tx in assembler.feed(event):
                    if tx.complete:
                        last = tx.end
                    put(tx)
        except _Stopped:
            pass
        except BaseException as exc:  # every failure reaches poll(); none kills the thread silently
            if not stop.is_set():
                with contextlib.suppress(_Stopped):
                    put(_Failure(exc, last))

    def poll(self, timeout: float) -> Transaction | None:
        if self._queue is None:
            raise RuntimeError("poll() before open()")
        try:
            item = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if isinstance(item, _Failure):
            self._queue = None  # this stream is dead; seek or open starts a new one
            raise self._failure(item) from item.error
        self._cursor = item.end
        return item

    def _failure(self, failure: _Failure) -> SourceError:
        exc = failure.error
        if isinstance(exc, _Lost):
            return self._error(f"lost the binlog connection to {self.host}:{self.port} after {failure.position}",
                               failure.position)
        if isinstance(exc, SourceError):
            return exc.with_context(pipeline=self.pipeline or None, stage="select",
                                    position=failure.position)  # type: ignore[return-value]
        if isinstance(exc, pymysql.MySQLError):
            return self._error(f"binlog read from {self.host}:{self.port} failed after {failure.position}: "
                               f"{exc}", failure.position)
        return self._error(f"cannot decode the binlog of {self.host}:{self.port} after {failure.position}: "
                           f"{type(exc).__name__}: {exc}", failure.position)

    def tell(self) -> Position | None:
        return self._cursor

    def head(self) -> Position | None:
        conn = self._connect()
        try:
            return self._status(conn)
        except pymysql.MySQLError as exc:
            raise self._error(f"cannot read the binlog status of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._connector is not None:
            self._connector.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("pipeline=%s binlog reader thread did not stop within %.0fs", self.pipeline, timeout)
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()
        self._thread = self._reader = self._connector = self._queue = None


def _log_number(name: str) -> int:
    suffix = name.rpartition(".")[2]
    return int(suffix) if suffix.isdigit() else -1
