"""A MySQL or MariaDB database as the target, through PyMySQL.

Each batch is one transaction: ``DELETE ... WHERE (key) IN (...)`` for the merged deletes, then
multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` of the full after-images (snapshot reads among
them, a batch of reads only into an InnoDB table tried first by ``LOAD DATA LOCAL``,
`setl.sinks.mysql_load_data`; into a keyless table, runs of inserts and reads as multi-row
``INSERT``), then the batch's end
position, batch id and epoch in ```setl`.`setl_position``` (see `SqlLoad` for the guarantees).
Target tables must exist, named by the batch's schema and table, or be made by replicated DDL:
under ``pipeline.ddl: apply`` each table DDL runs as Extract rewrote it (names mapped and
qualified), with a replay mark kept in ```setl`.`setl_position_ddl``` because MySQL commits
around DDL (see `setl.sinks.mysql_ddl`); a CREATE TABLE first creates its database if missing.
Sequences (MariaDB) replicate: their DDL runs as table DDL does (names mapped and qualified), and a
sequence's state rows (`RowChange.sequence`, handed on by the source because this target declares
`LoadCapabilities.sequences`) are written as one INSERT of the batch's last state per sequence,
which replaces the sequence's whole state (MariaDB writes it outside the batch transaction, as it
does on the source; a replay writes the same state again). A sequence the target lacks is created
first from the source's definition. DEFAULTs drawing on a sequence are still left out of replicated
DDL: the rows carry the values the source drew.
Tables without a primary key are matched on every column with ``<=>`` (one row per change).
Columns the target computes (generated VIRTUAL/STORED columns, the ROW START/ROW END columns of a
system-versioned table; learnt from information_schema per table, again after each DDL) are not
written: the target computes them itself.
The session runs with strict
SQL mode (a bad value fails the batch instead of being truncated), ``NO_AUTO_VALUE_ON_ZERO`` (an
id of 0 stays 0), ``ALLOW_INVALID_DATES`` without ``NO_ZERO_DATE`` (zero and partial dates, the
source's `InvalidDate` values, are stored exactly), ``time_zone='+00:00'`` (naive datetimes for
TIMESTAMP columns are UTC),
``foreign_key_checks=0`` (the merged order of a batch is not the order of its parents and
children) and READ COMMITTED.

Known limit: a table with a UNIQUE key besides its primary key can see an upsert land on the
wrong row when two rows swap unique values inside one batch (ON DUPLICATE KEY UPDATE matches any
unique key).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Literal

import attrs
import pymysql
import pymysql.err
from pymysql.constants import CLIENT

from setl.config import SslConfig
from setl.dial import mysql_connection
from setl.errors import LoadError, RefusedLoadError, TableRefused, TransientLoadError
from setl.model import Batch
from setl.sinks import mysql_load_data
from setl.sinks.mysql_ddl import MysqlDdlApplier
from setl.sinks.mysql_loop_guard import MarkedConnection, start_marking
from setl.sinks.mysql_positions import MysqlPositionStore
from setl.sinks.mysql_rows import CHUNK_ROWS, MAX_STATEMENT, MysqlRows
from setl.sinks.mysql_sequences import MysqlSequences
from setl.sinks.mysql_sql import SQL_MODE, quote, to_db
from setl.sinks.mysql_staging import MysqlStaging
from setl.sinks.postgresql_ddl import without_sequence_ddl
from setl.sinks.sql_common import SqlLoad
from setl.sinks.sql_failures import CurrentTable, TargetTableMissing, load_context
from setl.sinks.sql_load_path import load_batch
from setl.sinks.sql_segments import DdlStep
from setl.stages.load import LoadCapabilities
from setl.tls import mysql_context, require_encrypted

Connection = pymysql.connections.Connection


@attrs.frozen
class MysqlTargetConfig:
    type: Literal["mysql"]
    host: str = "127.0.0.1"  # the MySQL or MariaDB server written
    port: int = 3306  # its TCP port
    user: str = "root"  # needs the grants in docs/grants.md
    password: str = attrs.field(default="", repr=False)  # may be "${ENV_VAR}"; never logged
    database: str | None = None  # the connection's default database; tables are named SCHEMA.TABLE anyway
    ssl: SslConfig | None = None  # TLS for every connection to the target (docs/tls.md)
    #: the server_id every write of setl's sessions carries into the target's binlog (a two-way
    #: channel's mark, which the other direction's reader drops: docs/bidirectional.md); needs SUPER,
    #: or BINLOG REPLAY and BINLOG ADMIN (MariaDB 10.11)
    session_server_id: int | None = None
    #: the gtid_domain_id of setl's sessions (MariaDB): its writes in a GTID domain of their own
    session_gtid_domain_id: int | None = None
    #: how a channel's writes are marked: `server_id` (the session's, above), `marker` (a row of
    #: setl.setl_channel_mark first in every transaction, a comment on every DDL: `loop_mark`), or
    #: `auto`: server_id where the user may set it, else marker (docs/bidirectional.md)
    loop_guard: Literal["auto", "server_id", "marker"] = "server_id"
    #: the mark of this direction's writes (`setl.loop_marks.mark_name`), for the marker guard
    loop_mark: str | None = None


_ER_SPECIFIC_ACCESS_DENIED = 1227


def mark_session(conn: Connection, config: MysqlTargetConfig, pipeline: str) -> tuple[str | None, str]:
    """Mark the session's writes as the config's loop guard says: set the session's `server_id` and
    `gtid_domain_id` to the config's (when given), so that every event setl writes, DDL included,
    carries them; or, under `marker` (and `auto` when the user may not set them), mark each
    transaction with a row of the mark table (`conn` is then a `MarkedConnection`). A user without
    the privilege for `server_id` is refused with the GRANT to run. Answers (the guard in use or
    None, why), for the log line and `setl check --channel`."""
    if config.loop_guard == "marker":
        return _marker(conn, config, pipeline), "loop_guard: marker"
    settings = [(name, value) for name, value in (("server_id", config.session_server_id),
                                                  ("gtid_domain_id", config.session_gtid_domain_id),
                                                  ("sql_log_bin", 1 if config.session_server_id else None))
                if value is not None]
    if not settings:
        return None, "no loop guard"
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION " + ", ".join(f"{name} = %s" for name, _ in settings),
                        tuple(value for _, value in settings))
        return "server_id", f"user {config.user!r} may set its session's server_id"
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] == _ER_SPECIFIC_ACCESS_DENIED and config.loop_guard == "auto" \
                and config.loop_mark:
            return _marker(conn, config, pipeline), f"user {config.user!r} may not set its session's server_id"
        if exc.args and exc.args[0] == _ER_SPECIFIC_ACCESS_DENIED:
            raise RefusedLoadError(
                f"user {config.user!r} may not set its session's {', '.join(n for n, _ in settings)} on the "
                f"target {config.host}:{config.port} ({exc.args[1]}), so the other direction could not tell "
                f"setl's writes from the users': GRANT BINLOG REPLAY, BINLOG ADMIN ON *.* TO '{config.user}'@'%' "
                "(MariaDB 10.11; SUPER elsewhere), see docs/bidirectional.md", pipeline=pipeline,
                stage="load") from exc
        raise


def _marker(conn: Connection, config: MysqlTargetConfig, pipeline: str) -> str:
    """Start the marker guard on `conn` (`mysql_loop_guard.start_marking`): it needs row-based
    logging, or the mark row and the rows around it would be logged as statements."""
    if config.loop_mark is None or not isinstance(conn, MarkedConnection):
        raise RefusedLoadError(f"target {config.host}:{config.port}: loop_guard marker needs the channel's mark "
                               "(target.loop_mark), which a channel's pipelines are given", pipeline=pipeline,
                               stage="load")
    with conn.cursor() as cur:
        cur.execute("SELECT @@session.binlog_format", ())
        found = cur.fetchone()
    if not found or str(found[0]).upper() != "ROW":
        raise RefusedLoadError(f"target {config.host}:{config.port} logs with binlog_format "
                               f"{found[0] if found else '?'}: the marker loop guard needs ROW (its mark rows and "
                               "the rows they mark must be row events). Fix: SET GLOBAL binlog_format = ROW (and in "
                               "my.cnf), or grant the user BINLOG REPLAY, BINLOG ADMIN for loop_guard server_id",
                               pipeline=pipeline, stage="load")
    start_marking(conn, config.loop_mark)
    return "marker"


# Server errors worth a reconnect and replay: lock wait timeout, deadlock, connection killed or
# refused, server shutting down or restarting, and the client-side lost-connection family.
TRANSIENT_ERRORS = frozenset({
    1040,  # too many connections
    1053,  # server shutdown in progress
    1205,  # lock wait timeout exceeded
    1213,  # deadlock found when trying to get lock
    1927,  # connection was killed (MariaDB)
    2003,  # can't connect
    2006,  # server has gone away
    2013,  # lost connection during query
    2014,  # commands out of sync (a connection left broken)
    2055,  # lost connection at a system call
    1077, 1078, 1079, 1080,  # normal shutdown, got signal, shutdown complete, forcing close
    1152, 1184,  # aborted connection, aborted new connection
    1158, 1159, 1160, 1161,  # network read/write errors and timeouts
    1969,  # query interrupted by max_statement_time
    4031,  # disconnected by the server for inactivity (MySQL 8)
})
MISSING_TABLE_ERRORS = frozenset({1146, 1049})  # no such table, unknown database
# Errors about one table's rows that no retry changes: a value or a shape the target refuses, a missing
# privilege on the table (`setl.errors.TableRefused`: quarantine or pause, docs/quarantine.md). Not a
# deadlock, a lock wait or a lost connection (TRANSIENT_ERRORS), nor a foreign key, which names
# another table's state.
TABLE_REFUSED_ERRORS = frozenset({
    1048,  # column cannot be null
    1054,  # unknown column (the target table lacks it)
    1142, 1143,  # command denied for the table, column
    1264, 1690,  # value out of range
    1265, 1292, 1366, 1367,  # data truncated, incorrect value
    1406,  # data too long for the column
    3819, 4025,  # CHECK constraint violated (MySQL, MariaDB)
    3140,  # invalid JSON text (MySQL)
})
# A DDL's failure that says nothing of its table: the server short of resources, or the statement
# interrupted. Not quarantined (`MysqlDialect.refuses`): it pauses, or is retried, as before.
NOT_A_TABLES_REFUSAL = frozenset({
    1021, 1114, 1030,  # disk full, table full, the storage engine's own error
    1037, 1038, 1041,  # out of memory
    1317, 3024,  # query interrupted, max_execution_time (MySQL)
})
log = logging.getLogger(__name__)


class MysqlDialect:
    """The MySQL/MariaDB `SqlDialect` (`setl.sinks.sql_dialect`): PyMySQL sessions set as the module
    docstring says, `MysqlRows` for rows, `MysqlDdlApplier` for DDL (which commits: the load path
    takes the fence again after it), error codes by `TRANSIENT_ERRORS` and `MISSING_TABLE_ERRORS`."""

    name = "mysql"
    transactional_ddl = False

    def __init__(self, config: MysqlTargetConfig, *, pipeline: str, chunk_rows: int, connect_timeout: float,
                 read_timeout: float | None) -> None:
        self.config = config
        self.pipeline = pipeline
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        ssl = getattr(config, "ssl", None)
        self._ssl = mysql_context(ssl, where="target.ssl", pipeline=pipeline) if ssl else None
        self.rows = MysqlRows(pipeline, chunk_rows=chunk_rows, sequences=MysqlSequences(pipeline, self.connect),
                              load_data=mysql_load_data.LoadData(pipeline, self.describe))
        self.ddl_applier: MysqlDdlApplier | None = None  # made with the position store, whose table it marks
        self.loop_guard: tuple[str | None, str] = (None, "")  # the loop guard in use, and why (`mark_session`)

    def position_store(self, *, pipeline: str, schema: str, table: str, token: str, lock_timeout: float,
                       writing: CurrentTable) -> MysqlPositionStore:
        """The position store, and the DDL applier marking its DDL in the store's ``_ddl`` table."""
        store = MysqlPositionStore(pipeline=pipeline, schema=schema, table=table, token=token,
                                   lock_timeout=lock_timeout, describe=self.describe, writing=writing)
        self.ddl_applier = MysqlDdlApplier(pipeline, store.ddl_marks, context=functools.partial(load_context, pipeline),
                                           describe=self.describe, forget=self.rows.forget_tables,
                                           refuses=self.refuses)
        return store

    def staging(self) -> MysqlStaging:
        return MysqlStaging(self.rows.columns.forget_table)

    def narrow(self, batch: Batch) -> Batch:
        """DEFAULTs drawing on a sequence are left out of DDL (logged at INFO); sequence DDL is applied."""
        return without_sequence_ddl(batch, self.pipeline, keep_sequences=True)

    def apply_ddl(self, conn: Connection, batch: Batch, step: DdlStep) -> None:
        """`MysqlDdlApplier.apply`: MySQL commits around every DDL (the load path fences again)."""
        if self.ddl_applier is None:
            raise RuntimeError("no DDL applier: the sink makes its position store first")
        self.ddl_applier.apply(conn, batch, step)

    def connect(self) -> Connection:
        conn = mysql_connection(
            host=self.config.host,
            port=self.config.port,
            user=self.config.user,
            password=self.config.password,
            database=self.config.database,
            charset="utf8mb4",
            autocommit=False,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            write_timeout=self.read_timeout,
            ssl=self._ssl,
            # `MysqlPositionStore.record_and_commit` sends several statements at once; snapshot
            # reads may go by LOAD DATA LOCAL, whose input only `mysql_load_data` sends (PyMySQL's
            # own `local_infile`, which opens any file the server names, stays off).
            client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.LOCAL_FILES,
            cls=MarkedConnection,
        )
        if self._ssl is not None:
            require_encrypted(conn, self.config.host, self.config.port)
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = %s, time_zone = '+00:00', foreign_key_checks = 0",
                        (SQL_MODE,))
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", ())
            guard, why = mark_session(conn, self.config, self.pipeline)
            if guard is not None and (guard, why) != self.loop_guard:
                log.info("pipeline=%s stage=load: loop guard %s on target %s:%s (%s)", self.pipeline, guard,
                         self.config.host, self.config.port, why)
                self.loop_guard = guard, why
            cur.execute("SELECT @@max_allowed_packet", ())
            found = cur.fetchone()
        conn.commit()
        if found and found[0]:
            self.rows.statement_bytes = max(16_384, min(MAX_STATEMENT, int(found[0]) // 2))
        return conn

    def disconnect(self, conn: Connection) -> None:
        conn.close()

    def commit(self, conn: Connection) -> None:
        conn.commit()

    def rollback(self, conn: Connection) -> None:
        conn.rollback()

    def classify(self, exc: BaseException) -> type[LoadError] | type[TargetTableMissing] | None:
        if isinstance(exc, pymysql.err.InterfaceError):  # the connection is closed
            return TransientLoadError
        if isinstance(exc, pymysql.err.MySQLError):
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if code in TRANSIENT_ERRORS:
                return TransientLoadError
            if code in MISSING_TABLE_ERRORS:
                return TargetTableMissing
            if code in TABLE_REFUSED_ERRORS:
                return TableRefused
            return LoadError
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return TransientLoadError
        return LoadError

    def refuses(self, exc: BaseException) -> bool:
        """Whether the server's answer to a DDL is one no retry changes: not transient, not a missing
        table (`MysqlDdlApplier` raises it as the table's refusal, `ddl_refused`)."""
        code = exc.args[0] if isinstance(exc, pymysql.err.MySQLError) and exc.args else None
        return code not in NOT_A_TABLES_REFUSAL and self.classify(exc) in (LoadError, TableRefused, RefusedLoadError)

    def describe(self, exc: BaseException) -> str:
        if isinstance(exc, pymysql.err.MySQLError) and len(exc.args) >= 2:
            return f"{exc.args[1]} (MySQL error {exc.args[0]})"
        return f"{type(exc).__name__}: {exc}"



class MysqlLoad(SqlLoad[Connection]):
    """Loads batches into MySQL or MariaDB (see the module docstring and `SqlLoad`)."""

    dialect = "mysql"
    capabilities = LoadCapabilities(per_table=True, stores_position=True, sequences=True, copy_end=True,
                                    quarantine=True)
    config: MysqlTargetConfig
    sql: MysqlDialect
    positions: MysqlPositionStore

    def __init__(self, config: MysqlTargetConfig, *, connect_timeout: float = 10.0,
                 read_timeout: float | None = 300.0, **options: Any) -> None:
        """`options` are `SqlLoad`'s (pipeline, ddl, position table, chunking, retries)."""
        options.setdefault("chunk_rows", CHUNK_ROWS)
        sql = MysqlDialect(config, pipeline=options["pipeline"], chunk_rows=options["chunk_rows"],
                           connect_timeout=connect_timeout, read_timeout=read_timeout)
        super().__init__(config, sql, **options)

    def __repr__(self) -> str:
        return f"<MysqlLoad {self.pipeline} -> {self.config.host}:{self.config.port}>"

    def load(self, batch: Batch) -> None:
        """As `SqlLoad.load`; but on a marked target (a two-way channel's, `session_server_id`) the
        position of a batch without changes is recorded outside the binlog (``sql_log_bin = 0``):
        logged, it would come back to the other direction as a position mark, whose position would
        be recorded on the first site, and so on for ever."""
        if batch.changes or self.config.session_server_id is None:
            super().load(batch)
            return
        try:
            self._retrying(lambda: self._with_connection(lambda conn: self._unlogged(conn, batch), batch), batch)
        finally:
            self.sql.rows.prepared.drop(batch)

    def _unlogged(self, conn: Connection, batch: Batch) -> None:
        """`batch` (no changes: its position) in a transaction kept out of the binlog. A connection
        that fails meanwhile is not reused: its session may still have the binlog off."""
        if getattr(conn, "loop_mark", None) is not None:  # the marker guard: its mark row drops it
            load_batch(self.path, conn, batch, self.segments(batch))
            return
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_log_bin = 0")
            load_batch(self.path, conn, batch, self.segments(batch))
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_log_bin = 1")
        except BaseException:
            self.pool.mark_broken()
            raise


__all__ = ["MysqlDialect", "MysqlLoad", "TRANSIENT_ERRORS", "quote", "to_db"]
