"""How the MySQL target writes a table's merged changes (`MysqlRows`, its `RowWriter`): multi-row
``DELETE`` and ``INSERT ... ON DUPLICATE KEY UPDATE``, ``LOAD DATA LOCAL`` for a chunk of snapshot
reads into an InnoDB table (`setl.sinks.mysql_load_data`), patches as ``UPDATE``, a keyless table's
changes one by one; and what it must know of each target table to do so (`MysqlColumns`)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import pymysql
import pymysql.converters
from pymysql.constants import SERVER_STATUS

from setl.model import Batch
from setl.sinks import mysql_load_data
from setl.sinks.merge import TableChanges
from setl.sinks.mysql_lenient import execute_one_row, holds_error_value, split_error_values
from setl.sinks.mysql_sequences import MysqlSequences
from setl.sinks.mysql_sql import SQL_MODE, plain_quote, quote, table_name, to_db, value_lists
from setl.sinks.prepared import PreparedBatches
from setl.sinks.sql_rows import chunks, group_by_columns, insert_runs, reads_only
from setl.sinks.sql_segments import Segment

Connection = pymysql.connections.Connection

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
    """What `MysqlRows.prepare` worked out for one batch object, and what it assumed."""

    segments: list[Segment]
    #: id(TableChanges) -> (that TableChanges, [(statement head, [rest of each statement])])
    statements: dict[int, tuple[TableChanges, list[tuple[str, list[str]]]]]
    #: id(TableChanges) -> (that TableChanges, [(LOAD DATA statement, its input, its rows)]): a
    #: batch of snapshot reads only, into an InnoDB table (`setl.sinks.mysql_load_data`)
    loads: dict[int, tuple[TableChanges, list[mysql_load_data.Input]]]
    generation: int
    statement_bytes: int
    backslashes: bool


def _backslashes(conn: Connection) -> bool:
    """Whether backslashes escape in string literals on `conn` (not under NO_BACKSLASH_ESCAPES)."""
    return not getattr(conn, "server_status", 0) & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES


class MysqlColumns:
    """What the MySQL target's tables are, learnt from information_schema once per table: the
    columns the server computes (generated VIRTUAL/STORED columns, the ROW START/ROW END columns of
    a system-versioned table), the ENUM columns (rows holding ENUM's error value '' are written on
    their own, `setl.sinks.mysql_lenient`) and the engine (whether ``LOAD DATA`` may carry snapshot
    reads, `load_data`). Forgotten after DDL (`forget`): `generation` counts those times, so that
    statements built before are not used. Safe for the sink's threads."""

    def __init__(self, load_data: mysql_load_data.LoadData) -> None:
        self.load_data = load_data
        self.generation = 0
        self._computed: dict[tuple[str, str], frozenset[str]] = {}
        self._enums: dict[tuple[str, str], frozenset[str]] = {}

    def known_computed(self, ident: tuple[str, str]) -> frozenset[str] | None:
        """The computed columns of a table learnt already (None: not yet)."""
        return self._computed.get(ident)

    def enums(self, ident: tuple[str, str]) -> frozenset[str]:
        """The lower-cased ENUM columns of a table learnt already (`computed`)."""
        return self._enums.get(ident, frozenset())

    def computed(self, cur: Any, schema: str, table: str) -> frozenset[str]:
        """The lower-cased columns of a target table that the server computes and refuses values
        for, read once per table (with its ENUM columns and engine); a missing table is asked again."""
        ident = (schema, table)
        known = self._computed.get(ident)
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
                self._computed[ident] = known
                self._enums[ident] = frozenset(row[0].lower() for row in rows if row[2])
        return known

    def forget(self) -> None:
        """A DDL may add, drop or change computed and ENUM columns, or the engine: learn them again."""
        self.generation += 1  # statements prepared before this DDL are not used
        self._computed.clear()
        self._enums.clear()
        self.load_data.forget()

    def forget_table(self, schema: str, table: str) -> None:
        """A staging table made or dropped: learn its columns again at next use."""
        self._computed.pop((schema, table), None)
        self._enums.pop((schema, table), None)
        self.load_data.forget((schema, table))


def writable(image: Mapping[str, Any], computed: frozenset[str]) -> Mapping[str, Any]:
    """`image` without the columns the server computes."""
    return {c: v for c, v in image.items() if c.lower() not in computed} if computed else image


def all_writable(images: Sequence[Mapping[str, Any]], computed: frozenset[str]) -> Sequence[Mapping[str, Any]]:
    """`writable` of each image (the images themselves, without a call per row, when the table has
    no computed column)."""
    return [writable(i, computed) for i in images] if computed else images


def upsert_tail(columns: Sequence[str]) -> str:
    updates = ", ".join(f"{plain_quote(c)} = VALUES({plain_quote(c)})" for c in columns)
    return f" ON DUPLICATE KEY UPDATE {updates}"


def execute_all(cur: Any, texts: list[str]) -> None:
    """Run `texts` (statements without parameters) in one round trip, reading every result."""
    if texts:
        cur.execute(";".join(texts))  # no parameters: the text is sent as it is
        while cur.nextset():  # each statement's result, and its error if it failed
            pass


class MysqlRows:
    """The MySQL target's `RowWriter` (see `setl.sinks.sql_dialect`). Statements carry at most
    `chunk_rows` rows and about `statement_bytes` bytes (half the server's ``max_allowed_packet``,
    set when a connection opens); a larger set is built by a helper thread while the server runs
    the statement before (`BuiltAhead`). `prepare` builds a batch's upserts ahead, used only while
    the columns were not forgotten since (a DDL), the size limit and the connection's escaping are
    as they were. Safe for the sink's threads."""

    def __init__(self, pipeline: str, *, chunk_rows: int, sequences: MysqlSequences,
                 load_data: mysql_load_data.LoadData) -> None:
        self.pipeline = pipeline
        self.chunk_rows = chunk_rows
        self.statement_bytes = MAX_STATEMENT
        self.sequences = sequences
        self.load_data = load_data
        self.columns = MysqlColumns(load_data)
        self.prepared: PreparedBatches[_Prepared] = PreparedBatches()
        #: how a connection of this sink writes a literal, once one has written rows: (its
        #: ``escape``, whether backslashes escape) — the same for all, whose session settings are
        #: set alike (`MysqlDialect.connect`); what `prepare` builds statements with
        self._escaper: tuple[Callable[[Any], str], bool] | None = None

    def forget_tables(self) -> None:
        """After a DDL: learn the tables' columns and the sequences again (`MysqlColumns.forget`)."""
        self.columns.forget()
        self.sequences.forget()

    # -- ahead of the transaction

    def prepare(self, batch: Batch, plan: Callable[[Batch], list[Segment]]) -> None:
        """Merge `batch` (`plan`) and build the multi-row upsert statements of its keyed tables now
        (on the calling worker), so that `upsert` only sends them. Tables whose computed columns are
        not known yet, and everything after a DDL of the batch, are left to `upsert`; so is the whole
        batch when no connection has written rows yet."""
        escaper = self._escaper
        if escaper is None:
            return
        generation, limit = self.columns.generation, self.statement_bytes
        segments = plan(batch)
        statements: dict[int, tuple[TableChanges, list[tuple[str, list[str]]]]] = {}
        loads: dict[int, tuple[TableChanges, list[mysql_load_data.Input]]] = {}
        chunk = escaper[1] and reads_only(batch)
        for segment in segments:
            if not isinstance(segment, list):
                break  # a DDL may change the tables after it
            for table in segment:
                computed = self.columns.known_computed((table.schema, table.table))
                if not table.primary_key or not table.upserts or computed is None:
                    continue
                if chunk and self.load_data.may((table.schema, table.table)):
                    found = mysql_load_data.inputs(table.schema, table.table, group_by_columns(
                        all_writable(table.upserts, computed)).items())
                    if found is not None:
                        loads[id(table)] = (table, found)
                        continue
                statements[id(table)] = (table, list(self._upsert_statements(table, computed, *escaper, limit)))
        self.prepared.put(batch, _Prepared(segments, statements, loads, generation, limit, escaper[1]))

    def _prepared_statements(self, conn: Connection, table: TableChanges) -> list[tuple[str, list[str]]] | None:
        """The upsert statements `prepare` built for `table` (of a segment it worked out), if they
        still hold for `conn`."""
        backslashes = _backslashes(conn)
        for prepared in self.prepared.values():
            found = prepared.statements.get(id(table))
            if found is not None and found[0] is table:
                valid = (prepared.generation == self.columns.generation
                         and prepared.statement_bytes == self.statement_bytes
                         and prepared.backslashes == backslashes)
                return found[1] if valid else None
        return None

    def _prepared_loads(self, table: TableChanges) -> list[mysql_load_data.Input] | None:
        """The ``LOAD DATA`` inputs `prepare` made for `table`, if its columns were not forgotten
        since (a DDL) and the table may still go by ``LOAD DATA``."""
        for prepared in self.prepared.values():
            found = prepared.loads.get(id(table))
            if found is not None and found[0] is table:
                valid = (prepared.generation == self.columns.generation
                         and self.load_data.may((table.schema, table.table)))
                return found[1] if valid else None
        return None

    # -- a keyed table: patches, deletes, upserts

    def patch(self, conn: Connection, table: TableChanges) -> None:
        """`table.patches` (rows updated only in part: `setl.sinks.merge`) as ``UPDATE ... SET <the
        patch's other columns> WHERE <key>``, never an insert: single-row statements, sent many to a
        round trip (the connection takes several statements at once)."""
        plain, key, literal = f"{plain_quote(table.schema)}.{plain_quote(table.table)}", table.primary_key, conn.escape
        with conn.cursor() as cur:
            computed = self.columns.computed(cur, table.schema, table.table)
            texts: list[str] = []
            size = 0
            for image in all_writable(table.patches, computed):
                sets = ", ".join(f"{plain_quote(c)} = {literal(to_db(v))}" for c, v in image.items() if c not in key)
                if sets:  # else only the key: nothing to set
                    texts.append(f"UPDATE {plain} SET {sets} WHERE "
                                 + " AND ".join(f"{plain_quote(c)} = {literal(to_db(image[c]))}" for c in key))
                    size += 4 * len(texts[-1])  # at most 4 bytes a character in utf8mb4
                if size >= self.statement_bytes or len(texts) >= 1000:
                    execute_all(cur, texts)
                    texts, size = [], 0
            execute_all(cur, texts)

    def delete(self, conn: Connection, table: TableChanges) -> None:
        """``DELETE ... WHERE (key) IN (...)``, `chunk_rows` keys a statement."""
        name = table_name(table.schema, table.table)
        key = table.primary_key
        with conn.cursor() as cur:
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

    def upsert(self, conn: Connection, table: TableChanges) -> None:
        """Multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` (as `prepare` built them, if they still
        hold), or ``LOAD DATA`` for snapshot reads into an InnoDB table with no delete in the batch;
        a row holding ENUM's error value alone (`setl.sinks.mysql_lenient`)."""
        ident = (table.schema, table.table)
        with conn.cursor() as cur:
            computed = self.columns.computed(cur, table.schema, table.table)
            if self._escaper is None:
                self._escaper = (conn.escape, _backslashes(conn))
            upserts, lenient = split_error_values(table.upserts, self.columns.enums(ident))
            if not lenient and not table.deletes:
                loads = self._prepared_loads(table)
                if loads is not None and self.load_data.send(
                        conn, cur, ident, loads, min(mysql_load_data.PACKET_BYTES, self.statement_bytes)):
                    return
            prepared = self._prepared_statements(conn, table) if not lenient else None
            if prepared is not None:
                for head, texts in prepared:
                    for text in texts:
                        cur.execute(head + text)
                return
            plain = f"{plain_quote(table.schema)}.{plain_quote(table.table)}"
            for columns, images in group_by_columns(all_writable(upserts, computed)).items():
                head = f"INSERT INTO {plain} ({', '.join(map(plain_quote, columns))}) VALUES "
                tail = upsert_tail(columns)
                with self._statements(conn, images) as statements:
                    for values in statements:
                        cur.execute(head + values + tail)
            name = table_name(table.schema, table.table)
            for image in lenient:
                self._insert(cur, name, writable(image, computed), upsert_tail(
                    list(writable(image, computed))).replace("%", "%%"), ident)

    def _upsert_statements(self, table: TableChanges, computed: frozenset[str], literal: Callable[[Any], str],
                           backslashes: bool, limit: int) -> Iterator[tuple[str, list[str]]]:
        """`upsert`'s statements for `table`, as (head, [VALUES list + tail, ...]) per column list."""
        escape_string = pymysql.converters.escape_string if backslashes else _quotes_doubled
        plain = f"{plain_quote(table.schema)}.{plain_quote(table.table)}"
        for columns, images in group_by_columns(all_writable(table.upserts, computed)).items():
            head = f"INSERT INTO {plain} ({', '.join(map(plain_quote, columns))}) VALUES "
            tail = upsert_tail(columns)
            yield head, [values + tail for values in self._texts(images, literal, escape_string, limit)]

    # -- a keyless table

    def in_order(self, conn: Connection, table: TableChanges) -> None:
        """A keyless table's changes one by one, in order (an update or delete removes one row equal
        to the before-image, ``<=>``); runs of inserts and reads as multi-row INSERTs; a sequence's
        state rows as its last state (`MysqlSequences`)."""
        if table.sequence and table.sequence[-1].sequence is not None:
            self.sequences.apply_state(conn, table)
            return
        ident = (table.schema, table.table)
        name = table_name(table.schema, table.table)
        with conn.cursor() as cur:
            computed = self.columns.computed(cur, table.schema, table.table)
            for change, added in insert_runs(table.sequence):
                if change is None:  # a run of inserts and reads: multi-row INSERTs
                    plain = f"{plain_quote(table.schema)}.{plain_quote(table.table)}"
                    usual, lenient = split_error_values(added, self.columns.enums(ident))
                    for columns, images in group_by_columns(all_writable(usual, computed)).items():
                        head = f"INSERT INTO {plain} ({', '.join(map(plain_quote, columns))}) VALUES "
                        with self._statements(conn, images) as statements:
                            for values in statements:
                                cur.execute(head + values)
                    for image in lenient:
                        self._insert(cur, name, writable(image, computed), "", ident)
                    continue
                if change.before is not None:
                    where = " AND ".join(f"{quote(c)} <=> %s" for c in change.before)
                    cur.execute(f"DELETE FROM {name} WHERE {where} LIMIT 1",
                                [to_db(v) for v in change.before.values()])
                if change.after is not None:
                    self._insert(cur, name, writable(change.after, computed), "", ident)

    # -- statement texts

    def _statements(self, conn: Connection,
                    images: Sequence[Mapping[str, Any]]) -> contextlib.AbstractContextManager[Iterator[str]]:
        """The VALUES lists for `images` (`_values`), built ahead by a helper thread when they make
        more than one statement."""
        if len(images) <= self.chunk_rows:
            return contextlib.nullcontext(self._values(conn, images))
        return BuiltAhead(self._values(conn, images), f"setl-{self.pipeline}-load-build")

    def _values(self, conn: Connection, images: Sequence[Mapping[str, Any]]) -> Iterator[str]:
        """The VALUES lists of multi-row statements for `images` (which share one column order), at
        most `chunk_rows` rows and about `statement_bytes` bytes each. Values are escaped as PyMySQL
        escapes parameters (its own escaping for all but plain str, int and None), without its
        per-row formatting of a parameterised statement (`pymysql.connections.Connection.escape`)."""
        escape_string: Callable[[str], str] = pymysql.converters.escape_string
        if not _backslashes(conn):
            escape_string = _quotes_doubled  # as PyMySQL's own escape does then
        return self._texts(images, conn.escape, escape_string, self.statement_bytes)

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
        enums = self.columns.enums(table)
        if enums and holds_error_value(image, enums):
            execute_one_row(cur, sql, args, image, enums, SQL_MODE)
        else:
            cur.execute(sql, args)


__all__ = ["BuiltAhead", "MysqlColumns", "MysqlRows"]
