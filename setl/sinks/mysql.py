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
around DDL (see `MysqlLoad._apply_ddl`); a CREATE TABLE first creates its database if missing.
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

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import pymysql
import pymysql.converters
import pymysql.err
from pymysql.constants import CLIENT, SERVER_STATUS

from setl.config import SslConfig
from setl.dial import mysql_connection
from setl.errors import LoadError, TransientLoadError
from setl.model import Batch
from setl.sinks import mysql_load_data
from setl.sinks.merge import TableChanges
from setl.sinks.mysql_ddl import MysqlDdlApplier
from setl.sinks.mysql_lenient import execute_one_row, holds_error_value, split_error_values
from setl.sinks.mysql_positions import MysqlPositionStore
from setl.sinks.mysql_sequences import MysqlSequences
from setl.sinks.mysql_sql import SQL_MODE, plain_quote, quote, table_name, to_db, value_lists
from setl.sinks.mysql_staging import MysqlStaging
from setl.sinks.postgresql_ddl import without_sequence_ddl
from setl.sinks.prepared import PreparedBatches
from setl.sinks.sql_common import (
    PROCESS_TOKEN,
    DdlStep,
    Segment,
    SqlLoad,
    TargetTableMissing,
    chunks,
    group_by_columns,
    insert_runs,
    reads_only,
)
from setl.stages.load import LoadCapabilities
from setl.tls import mysql_context, require_encrypted


@attrs.frozen
class MysqlTargetConfig:
    type: Literal["mysql"]
    host: str = "127.0.0.1"  # the MySQL or MariaDB server written
    port: int = 3306  # its TCP port
    user: str = "root"  # needs the grants in docs/grants.md
    password: str = attrs.field(default="", repr=False)  # may be "${ENV_VAR}"; never logged
    database: str | None = None  # the connection's default database; tables are named SCHEMA.TABLE anyway
    ssl: SslConfig | None = None  # TLS for every connection to the target (docs/tls.md)


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
log = logging.getLogger(__name__)

#: About the most bytes of VALUES one multi-row statement carries: a snapshot chunk or a large batch goes
#: in a few round trips (each costs a wait for the GIL besides the trip). Capped at half the server's
#: ``max_allowed_packet`` (16 MB by default in MariaDB), read when a connection opens.
MAX_STATEMENT = 8_000_000
#: Rows per multi-row statement unless ``chunk_rows`` is given. A larger set goes in several
#: statements, each built by a helper thread while the server runs the one before (`BuiltAhead`).
CHUNK_ROWS = 2_000


class BuiltAhead:
    """The items of `produce` (statement texts), made by a helper thread one item ahead of the
    reader: the next statement is built (Python, holding the GIL) while the server runs the current
    one (a socket wait, not holding it), so the target is not idle while setl formats rows. A
    context manager: leaving it stops and joins the helper, whatever happened."""

    _END = object()

    def __init__(self, produce: Iterator[str], name: str) -> None:
        self._produce = produce
        self._items: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Iterator[str]:
        self._thread.start()
        return self._take()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30.0)

    def _put(self, item: Any, error: BaseException | None = None) -> bool:
        while not self._stop.is_set():
            try:
                self._items.put((item, error), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._produce:
                if not self._put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            self._put(self._END, exc)
            return
        self._put(self._END)

    def _take(self) -> Iterator[str]:
        while True:
            try:
                item, error = self._items.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("statement builder stopped without a result") from None
                continue
            if error is not None:
                raise error
            if item is self._END:
                return
            yield item


def _quotes_doubled(text: str) -> str:
    return text.replace("'", "''")


@attrs.frozen(eq=False)
class _Prepared:
    """What `MysqlLoad.prepare` worked out for one batch object, and what it assumed."""

    segments: list[Segment]
    #: id(TableChanges) -> (that TableChanges, [(statement head, [rest of each statement])])
    statements: dict[int, tuple[TableChanges, list[tuple[str, list[str]]]]]
    #: id(TableChanges) -> (that TableChanges, [(LOAD DATA statement, its input, its rows)]): a
    #: batch of snapshot reads only, into an InnoDB table (`setl.sinks.mysql_load_data`)
    loads: dict[int, tuple[TableChanges, list[mysql_load_data.Input]]]
    generation: int
    statement_bytes: int
    backslashes: bool


class MysqlLoad(SqlLoad[pymysql.connections.Connection]):
    """Loads batches into MySQL or MariaDB (see the module docstring and `SqlLoad`)."""

    dialect = "mysql"
    capabilities = LoadCapabilities(per_table=True, stores_position=True, sequences=True, copy_end=True)
    config: MysqlTargetConfig
    positions: MysqlPositionStore
    _prepared: PreparedBatches[_Prepared]  # what `prepare` built (the base makes it and drops after load)

    def __init__(self, config: MysqlTargetConfig, *, connect_timeout: float = 10.0,
                 read_timeout: float | None = 300.0, **options: Any) -> None:
        """`options` are `SqlLoad`'s (pipeline, ddl, position table, chunking, retries)."""
        options.setdefault("chunk_rows", CHUNK_ROWS)
        super().__init__(config, **options)
        self._statement_bytes = MAX_STATEMENT
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        ssl = getattr(config, "ssl", None)
        self._ssl = mysql_context(ssl, where="target.ssl", pipeline=self.pipeline) if ssl else None
        # per target table: the columns the server computes (generated, system-versioning period)
        self._unwritable: dict[tuple[str, str], frozenset[str]] = {}
        # per target table: its ENUM columns, lower-cased (rows holding ENUM's error value '' are
        # written on their own, `setl.sinks.mysql_lenient`); known and forgotten with `_unwritable`
        self._enums: dict[tuple[str, str], frozenset[str]] = {}
        #: snapshot reads by LOAD DATA; its tables' engines known and forgotten with `_unwritable`
        self.load_data = mysql_load_data.LoadData(self.pipeline, self._describe)
        self._unwritable_generation = 0  # counts the times `_unwritable` was forgotten (after DDL)
        #: the target's sequences: their state rows, and creating the ones it lacks
        self.sequences = MysqlSequences(self.pipeline, self._connect)
        #: how a connection of this sink writes a literal, once one has written rows: (its
        #: ``escape``, whether backslashes escape) — the same for all, whose session settings are
        #: set alike (`_connect`); what `prepare` builds statements with
        self._escaper: tuple[Callable[[Any], str], bool] | None = None
        self.ddl_applier = MysqlDdlApplier(self.pipeline, self.positions.ddl_marks, context=self._context,
                                           describe=self._describe, forget=self._forget_tables)

    def __repr__(self) -> str:
        return f"<MysqlLoad {self.pipeline} -> {self.config.host}:{self.config.port}>"

    def _segments(self, batch: Batch) -> list[Segment]:
        """DEFAULTs drawing on a sequence are left out of DDL (logged at INFO); sequence DDL is
        applied. A prepared batch's segments are those `prepare` worked out."""
        prepared = self._prepared.get(batch)
        if prepared is not None:
            return prepared.segments
        return super()._segments(without_sequence_ddl(batch, self.pipeline, keep_sequences=True))

    def prepare(self, batch: Batch) -> None:
        """Merge `batch` and build the multi-row upsert statements of its keyed tables now (on the
        calling worker), so that `load` only sends them. Tables whose computed columns are not
        known yet, and everything after a DDL of the batch, are left to `load`; so is the whole
        batch when no connection has written rows yet. `load` uses the statements only if the
        computed columns were not forgotten since (a DDL), the statement size limit and the
        connection's escaping are as they were."""
        escaper = self._escaper
        if escaper is None:
            return
        generation, limit = self._unwritable_generation, self._statement_bytes
        segments = super()._segments(without_sequence_ddl(batch, self.pipeline, keep_sequences=True))
        statements: dict[int, tuple[TableChanges, list[tuple[str, list[str]]]]] = {}
        loads: dict[int, tuple[TableChanges, list[mysql_load_data.Input]]] = {}
        chunk = escaper[1] and reads_only(batch)
        for segment in segments:
            if not isinstance(segment, list):
                break  # a DDL may change the tables after it
            for table in segment:
                computed = self._unwritable.get((table.schema, table.table))
                if not table.primary_key or not table.upserts or computed is None:
                    continue
                if chunk and self.load_data.may((table.schema, table.table)):
                    found = mysql_load_data.inputs(table.schema, table.table, group_by_columns(
                        self._all_writable(table.upserts, computed)).items())
                    if found is not None:
                        loads[id(table)] = (table, found)
                        continue
                statements[id(table)] = (table, list(self._upsert_statements(table, computed, *escaper, limit)))
        self._prepared.put(batch, _Prepared(segments, statements, loads, generation, limit, escaper[1]))

    def _prepared_statements(self, conn: pymysql.connections.Connection,
                             table: TableChanges) -> list[tuple[str, list[str]]] | None:
        """The upsert statements `prepare` built for `table` (of a segment it worked out), if they
        still hold for `conn`."""
        backslashes = not getattr(conn, "server_status", 0) & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
        for prepared in self._prepared.values():
            found = prepared.statements.get(id(table))
            if found is not None and found[0] is table:
                valid = (prepared.generation == self._unwritable_generation
                         and prepared.statement_bytes == self._statement_bytes
                         and prepared.backslashes == backslashes)
                return found[1] if valid else None
        return None

    def _prepared_loads(self, table: TableChanges) -> list[mysql_load_data.Input] | None:
        """The ``LOAD DATA`` inputs `prepare` made for `table`, if its columns were not forgotten
        since (a DDL) and the table may still go by ``LOAD DATA``."""
        for prepared in self._prepared.values():
            found = prepared.loads.get(id(table))
            if found is not None and found[0] is table:
                valid = (prepared.generation == self._unwritable_generation
                         and self.load_data.may((table.schema, table.table)))
                return found[1] if valid else None
        return None

    # -- connection

    def _make_positions(self) -> MysqlPositionStore:
        return MysqlPositionStore(pipeline=self.pipeline, schema=self.position_schema, table=self.position_table,
                                  token=PROCESS_TOKEN, lock_timeout=self.fence_lock_timeout,
                                  describe=self._describe, on_table=self._name_table)

    def _make_staging(self) -> MysqlStaging:
        return MysqlStaging(self._forget_table)

    def _forget_table(self, schema: str, table: str) -> None:
        """A staging table made or dropped: learn its computed and ENUM columns again at next use."""
        self._unwritable.pop((schema, table), None)
        self._enums.pop((schema, table), None)
        self.load_data.forget((schema, table))

    def _connect(self) -> pymysql.connections.Connection:
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
        )
        if self._ssl is not None:
            require_encrypted(conn, self.config.host, self.config.port)
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = %s, time_zone = '+00:00', foreign_key_checks = 0",
                        (SQL_MODE,))
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", ())
            cur.execute("SELECT @@max_allowed_packet", ())
            found = cur.fetchone()
        conn.commit()
        if found and found[0]:
            self._statement_bytes = max(16_384, min(MAX_STATEMENT, int(found[0]) // 2))
        return conn

    def _disconnect(self, conn: pymysql.connections.Connection) -> None:
        conn.close()

    def _commit(self, conn: pymysql.connections.Connection) -> None:
        conn.commit()

    def _rollback(self, conn: pymysql.connections.Connection) -> None:
        conn.rollback()

    # -- rows

    def _computed(self, cur: Any, schema: str, table: str) -> frozenset[str]:
        """The lower-cased columns of a target table that the server computes and refuses values
        for: generated columns (VIRTUAL, STORED/PERSISTENT) and the ROW START/ROW END columns of a
        system-versioned table. Read from information_schema once per table; forgotten after DDL."""
        ident = (schema, table)
        known = self._unwritable.get(ident)
        if known is None:
            cur.execute("SELECT column_name, extra LIKE %s OR extra IN ('ROW START', 'ROW END'), data_type = 'enum'"
                        " FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                        ("%GENERATED%", schema, table))
            rows = cur.fetchall()
            known = frozenset(row[0].lower() for row in rows if row[1])
            if rows:  # a missing table is asked again next time
                cur.execute("SELECT engine FROM information_schema.tables WHERE table_schema = %s"
                            " AND table_name = %s", (schema, table))
                engine = cur.fetchone()
                self.load_data.transactional[ident] = bool(engine and str(engine[0]).lower() == "innodb")
                self._unwritable[ident] = known
                self._enums[ident] = frozenset(row[0].lower() for row in rows if row[2])
        return known

    @staticmethod
    def _writable(image: Mapping[str, Any], computed: frozenset[str]) -> Mapping[str, Any]:
        return {c: v for c, v in image.items() if c.lower() not in computed} if computed else image

    @classmethod
    def _all_writable(cls, images: Sequence[Mapping[str, Any]], computed: frozenset[str]
                      ) -> Sequence[Mapping[str, Any]]:
        """`_writable` of each image (the images themselves, without a call per row, when the
        table has no computed column)."""
        return [cls._writable(i, computed) for i in images] if computed else images

    def _apply_keyed(self, conn: pymysql.connections.Connection, table: TableChanges) -> None:
        if table.patches:  # keys none of the deletes and upserts touch: any order
            self._apply_patches(conn, table)
        name = table_name(table.schema, table.table)
        key = table.primary_key
        with conn.cursor() as cur:
            computed = self._computed(cur, table.schema, table.table)
            for part in chunks(table.deletes, self.chunk_rows):
                if len(key) == 1:
                    marks = ", ".join(["%s"] * len(part))
                    args = [to_db(image[key[0]]) for image in part]
                    cur.execute(f"DELETE FROM {name} WHERE {quote(key[0])} IN ({marks})", args)
                else:
                    row = "(" + ", ".join(["%s"] * len(key)) + ")"
                    key_columns = ", ".join(map(quote, key))
                    args = [to_db(image[c]) for image in part for c in key]
                    cur.execute(f"DELETE FROM {name} WHERE ({key_columns}) IN ({', '.join([row] * len(part))})",
                                args)
            if self._escaper is None:
                self._escaper = (conn.escape, not getattr(conn, "server_status", 0)
                                 & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES)
            upserts, lenient = split_error_values(table.upserts, self._enums.get((table.schema, table.table), ()))
            if not lenient and not table.deletes:
                loads = self._prepared_loads(table)
                if loads is not None and self.load_data.send(
                        conn, cur, (table.schema, table.table), loads,
                        min(mysql_load_data.PACKET_BYTES, self._statement_bytes)):
                    return
            prepared = self._prepared_statements(conn, table) if not lenient else None
            if prepared is not None:
                for head, texts in prepared:
                    for text in texts:
                        cur.execute(head + text)
                return
            plain = f"{plain_quote(table.schema)}.{plain_quote(table.table)}"
            for columns, images in group_by_columns(self._all_writable(upserts, computed)).items():
                head = f"INSERT INTO {plain} ({', '.join(map(plain_quote, columns))}) VALUES "
                tail = self._upsert_tail(columns)
                with self._statements(conn, images) as statements:
                    for values in statements:
                        cur.execute(head + values + tail)
            for image in lenient:
                self._insert(cur, name, self._writable(image, computed), self._upsert_tail(
                    list(self._writable(image, computed))).replace("%", "%%"), (table.schema, table.table))

    def _apply_patches(self, conn: pymysql.connections.Connection, table: TableChanges) -> None:
        """`table.patches` (rows updated only in part: `setl.sinks.merge`) as ``UPDATE ... SET <the
        patch's other columns> WHERE <key>``, never an insert: single-row statements, sent many to a
        round trip (the connection takes several statements at once)."""
        plain, key, literal = f"{plain_quote(table.schema)}.{plain_quote(table.table)}", table.primary_key, conn.escape
        with conn.cursor() as cur:
            computed = self._computed(cur, table.schema, table.table)
            texts: list[str] = []
            size = 0
            for image in self._all_writable(table.patches, computed):
                sets = ", ".join(f"{plain_quote(c)} = {literal(to_db(v))}" for c, v in image.items() if c not in key)
                if sets:  # else only the key: nothing to set
                    texts.append(f"UPDATE {plain} SET {sets} WHERE "
                                 + " AND ".join(f"{plain_quote(c)} = {literal(to_db(image[c]))}" for c in key))
                    size += 4 * len(texts[-1])  # at most 4 bytes a character in utf8mb4
                if size >= self._statement_bytes or len(texts) >= 1000:
                    self._execute_all(cur, texts)
                    texts, size = [], 0
            self._execute_all(cur, texts)

    @staticmethod
    def _execute_all(cur: Any, texts: list[str]) -> None:
        """Run `texts` (statements without parameters) in one round trip, reading every result."""
        if texts:
            cur.execute(";".join(texts))  # no parameters: the text is sent as it is
            while cur.nextset():  # each statement's result, and its error if it failed
                pass

    @staticmethod
    def _upsert_tail(columns: Sequence[str]) -> str:
        updates = ", ".join(f"{plain_quote(c)} = VALUES({plain_quote(c)})" for c in columns)
        return f" ON DUPLICATE KEY UPDATE {updates}"

    def _upsert_statements(self, table: TableChanges, computed: frozenset[str], literal: Callable[[Any], str],
                           backslashes: bool, limit: int) -> Iterator[tuple[str, list[str]]]:
        """`_apply_keyed`'s upserts of `table`, as (head, [VALUES list + tail, ...]) per column list."""
        escape_string = pymysql.converters.escape_string if backslashes else _quotes_doubled
        plain = f"{plain_quote(table.schema)}.{plain_quote(table.table)}"
        for columns, images in group_by_columns(self._all_writable(table.upserts, computed)).items():
            head = f"INSERT INTO {plain} ({', '.join(map(plain_quote, columns))}) VALUES "
            tail = self._upsert_tail(columns)
            yield head, [values + tail for values in self._texts(images, literal, escape_string, limit)]

    def _apply_sequence(self, conn: pymysql.connections.Connection, table: TableChanges) -> None:
        """A keyless table's changes one by one, in order; a sequence's state rows as its last state."""
        if table.sequence and table.sequence[-1].sequence is not None:
            self.sequences.apply_state(conn, table)
            return
        name = table_name(table.schema, table.table)
        with conn.cursor() as cur:
            computed = self._computed(cur, table.schema, table.table)
            for change, added in insert_runs(table.sequence):
                if change is None:  # a run of inserts and reads: multi-row INSERTs
                    plain = f"{plain_quote(table.schema)}.{plain_quote(table.table)}"
                    usual, lenient = split_error_values(added, self._enums.get((table.schema, table.table), ()))
                    for columns, images in group_by_columns(self._all_writable(usual, computed)).items():
                        head = f"INSERT INTO {plain} ({', '.join(map(plain_quote, columns))}) VALUES "
                        with self._statements(conn, images) as statements:
                            for values in statements:
                                cur.execute(head + values)
                    for image in lenient:
                        self._insert(cur, name, self._writable(image, computed), "", (table.schema, table.table))
                    continue
                if change.before is not None:
                    where = " AND ".join(f"{quote(c)} <=> %s" for c in change.before)
                    cur.execute(f"DELETE FROM {name} WHERE {where} LIMIT 1",
                                [to_db(v) for v in change.before.values()])
                if change.after is not None:
                    self._insert(cur, name, self._writable(change.after, computed), "", (table.schema, table.table))

    def _statements(self, conn: pymysql.connections.Connection,
                    images: Sequence[Mapping[str, Any]]) -> contextlib.AbstractContextManager[Iterator[str]]:
        """The VALUES lists for `images` (`_values`), built ahead by a helper thread when they make
        more than one statement."""
        if len(images) <= self.chunk_rows:
            return contextlib.nullcontext(self._values(conn, images))
        return BuiltAhead(self._values(conn, images), f"setl-{self.pipeline}-load-build")

    def _values(self, conn: pymysql.connections.Connection, images: Sequence[Mapping[str, Any]]) -> Iterator[str]:
        """The VALUES lists of multi-row statements for `images` (which share one column order), at
        most `chunk_rows` rows and about `MAX_STATEMENT` bytes (at most half the server's
        ``max_allowed_packet``) each. Values are escaped as PyMySQL escapes parameters (its own
        escaping for all but plain str, int and None), without its per-row formatting of a
        parameterised statement (`pymysql.connections.Connection.escape`)."""
        escape_string: Callable[[str], str] = pymysql.converters.escape_string
        if getattr(conn, "server_status", 0) & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
            escape_string = _quotes_doubled  # as PyMySQL's own escape does then
        return self._texts(images, conn.escape, escape_string, self._statement_bytes)

    def _texts(self, images: Sequence[Mapping[str, Any]], literal: Callable[[Any], str],
               escape_string: Callable[[str], str], limit: int) -> Iterator[str]:
        """`_values` with a connection's `literal` (its ``escape``) and `escape_string`, statements of
        about `limit` bytes at most (`setl.sinks.mysql_sql.value_lists`)."""
        return value_lists(images, literal, escape_string, limit, self.chunk_rows)

    def _insert(self, cur: Any, name: str, image: Mapping[str, Any], tail: str, table: tuple[str, str]) -> None:
        """One row's INSERT (+ `tail`, %-escaped); a row holding ENUM's error value goes non-strict
        with its warnings checked (`setl.sinks.mysql_lenient`)."""
        sql = f"INSERT INTO {name} ({', '.join(map(quote, image))}) VALUES ({', '.join(['%s'] * len(image))}){tail}"
        args = [to_db(v) for v in image.values()]
        enums = self._enums.get(table, frozenset())
        if enums and holds_error_value(image, enums):
            execute_one_row(cur, sql, args, image, enums, SQL_MODE)
        else:
            cur.execute(sql, args)

    # -- DDL

    def _apply_ddl(self, conn: pymysql.connections.Connection, batch: Batch, step: DdlStep) -> None:
        """`MysqlDdlApplier.apply`, then the fence held again: MySQL commits around every DDL."""
        self.ddl_applier.apply(conn, batch, step)
        self.fence.check(conn, batch)

    def _forget_tables(self) -> None:
        """A DDL may add, drop or change computed, ENUM and sequence columns: learn them again."""
        self._unwritable_generation += 1  # statements prepared before this DDL are not used
        self._unwritable.clear()
        self._enums.clear()
        self.load_data.forget()
        self.sequences.forget()

    # -- errors

    def _classify(self, exc: BaseException) -> type[LoadError] | type[TargetTableMissing] | None:
        if isinstance(exc, pymysql.err.InterfaceError):  # the connection is closed
            return TransientLoadError
        if isinstance(exc, pymysql.err.MySQLError):
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if code in TRANSIENT_ERRORS:
                return TransientLoadError
            if code in MISSING_TABLE_ERRORS:
                return TargetTableMissing
            return LoadError
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return TransientLoadError
        return LoadError

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, pymysql.err.MySQLError) and len(exc.args) >= 2:
            return f"{exc.args[1]} (MySQL error {exc.args[0]})"
        return super()._describe(exc)


__all__ = ["MysqlLoad", "TRANSIENT_ERRORS", "quote", "to_db"]
