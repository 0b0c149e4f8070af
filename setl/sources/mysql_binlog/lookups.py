"""The short questions the binlog reader asks the server while it reads: `_Lookups`, the one
connection kept open for them, and `TableLookups`, what a table is (kind, sequence definition,
engine) and what a query's sql_mode is called, each answer cached for the stream."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import pymysql

from setl import ddl
from setl import values as canonical
from setl.errors import SourceError
from setl.sources.mysql_binlog.decoding import _PERIOD, TableKind
from setl.sources.mysql_binlog.statements import _unquote

log = logging.getLogger("setl.sources.mysql_binlog")

_TRANSACTIONAL_ENGINES = frozenset({"innodb", "rocksdb", "tokudb", "xtradb"})


class _Lookups:
    """One connection to the source kept open for the short metadata questions the reader and the
    node's sampler ask while a pipeline runs (a table's kind or engine, how far the log ends),
    one question at a time across threads.

    A connection per question cost more than the question: PyMySQL (1.2 on) builds a TLS context
    from the system's CA store for every connection it opens, 15-25 ms of CPU here. A question that
    finds the kept connection broken (the server restarted, the session was killed or timed out)
    is asked once more on a new one.
    """

    def __init__(self, connect: Callable[[], pymysql.connections.Connection]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._conn: pymysql.connections.Connection | None = None

    def query(self, *statements: tuple[str, Any]) -> list[list[tuple[Any, ...]]]:
        """The rows of each ``(sql, args)`` in turn, on the kept connection."""
        with self._lock:
            for attempt in (1, 2):
                fresh = self._conn is None
                if self._conn is None:
                    self._conn = self._connect()
                try:
                    results = []
                    with self._conn.cursor() as cur:
                        for sql, args in statements:
                            cur.execute(sql, args)
                            results.append(list(cur.fetchall()))
                    return results
                except (pymysql.err.OperationalError, pymysql.err.InterfaceError, ConnectionError):
                    self._drop()
                    if fresh or attempt == 2:
                        raise
            raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class TableLookups:
    """What the reader asks the server about the tables and statements it decodes, on the kept
    connection (`_Lookups`): a table's kind (`table_kind`), its old temporal columns' precision
    (`temporal_precisions`), a sequence's definition, a sql_mode's names and whether a table's
    engine is transactional.

    Engines and mode names are asked once and cached for the life of this object (one stream:
    the source builds a new one at every `open`); table kinds are asked once per table map decoded.
    Methods block on the server; any thread may call them (the kept connection serialises them).
    """

    def __init__(self, lookups: _Lookups, *, pipeline: str = "", sequences: bool = False) -> None:
        self._lookups = lookups
        self.pipeline = pipeline
        self.sequences = sequences  # whether a sequence's state rows are handed on (its definition asked)
        self._engines: dict[tuple[str, str], str] = {}  # storage engine by table, asked at a ROLLBACK TO
        self._modes: dict[int, str | None] = {}

    def table_kind(self, schema: str, table: str) -> TableKind:
        """Whether a table is a SEQUENCE or system-versioned (and its period columns), and its columns
        whose bytes are handed on as text (UUID, INET6, INET4: the table map shows them as binary
        strings), asked once per table map the reader decodes."""
        found, typed = self._lookups.query(
            ("SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
             (schema, table)),
            ("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
             "AND TABLE_NAME = %s AND DATA_TYPE IN %s", (schema, table, tuple(sorted(canonical.TEXT_TYPES)))))
        texts = {str(name): str(of).lower() for name, of in typed}
        kind = str(found[0][0]).upper() if found else ""
        if kind == "SEQUENCE":
            return TableKind(sequence=True, definition=self.sequence_definition(schema, table), texts=texts)
        if not found:  # dropped since: the table map tells a sequence by its columns
            return TableKind(found=False, texts=texts)
        if kind != "SYSTEM VERSIONED":
            return TableKind(texts=texts)
        [shown] = self._lookups.query((f"SHOW CREATE TABLE {ddl.quote(schema)}.{ddl.quote(table)}", None))
        create = str(shown[0][1])
        match = _PERIOD.search(create)
        return TableKind(period=(_unquote(match[1]), _unquote(match[2])) if match else ("row_start", "row_end"),
                         texts=texts)

    def temporal_precisions(self, schema: str, table: str
                            ) -> tuple[dict[str, tuple[str, int | None]], int | None, str]:
        """Each TIME, DATETIME and TIMESTAMP column's (DATA_TYPE, DATETIME_PRECISION) as the server holds
        the table now, when its definition was last written (``CREATE_TIME``, a Unix time; None when the
        server has no such table or cannot tell) and its engine: asked once per table map with MariaDB's
        pre-10.1 temporal columns, whose precision the table map does not give."""
        typed, made = self._lookups.query(
            ("SELECT COLUMN_NAME, DATA_TYPE, DATETIME_PRECISION FROM information_schema.COLUMNS "
             "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND DATA_TYPE IN ('time', 'datetime', 'timestamp')",
             (schema, table)),
            ("SELECT UNIX_TIMESTAMP(CREATE_TIME), ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
             "AND TABLE_NAME = %s", (schema, table)))
        columns = {str(name): (str(of).lower(), None if digits is None else int(digits)) for name, of, digits in typed}
        return (columns, int(made[0][0]) if made and made[0][0] is not None else None,
                str(made[0][1] or "") if made else "")

    def sequence_definition(self, schema: str, table: str) -> str | None:
        """``SHOW CREATE SEQUENCE`` of a sequence whose state rows are handed on (None when they are
        not, or when the source has no such sequence now: dropped later in the binlog). It is the
        definition as the source holds it now; the state rows carry the state as the binlog had it."""
        if not self.sequences:
            return None
        try:
            [shown] = self._lookups.query((f"SHOW CREATE SEQUENCE {ddl.quote(schema)}.{ddl.quote(table)}", None))
        except pymysql.MySQLError as exc:
            if not (exc.args and exc.args[0] in (1049, 1146, 4090, 4091)):  # no such database or sequence
                raise
            log.info("pipeline=%s sequence %s.%s cannot be shown (%s): a target that lacks it creates it "
                     "from its state row", self.pipeline, schema, table, exc)
            return None
        return str(shown[0][1]) if shown else None

    def mode_names(self, bits: int) -> str | None:
        """The names of the sql_mode whose bits a query event carries, as the source spells them
        (asked once per distinct mode; None when the source cannot tell)."""
        known = self._modes.get(bits)
        if known is None and bits not in self._modes:
            try:
                results = self._lookups.query(("SET @setl_sql_mode = @@SESSION.sql_mode", None),
                                              ("SET SESSION sql_mode = %s", (bits,)),
                                              ("SELECT @@SESSION.sql_mode", None),
                                              ("SET SESSION sql_mode = @setl_sql_mode", None))
                known = str(results[2][0][0])
            except pymysql.MySQLError as exc:
                log.warning("pipeline=%s cannot name sql_mode %d of a DDL (%s): it runs under the target's own",
                            self.pipeline, bits, exc)
            self._modes[bits] = known
        return known

    def writes_elsewhere(self, schema: str, table: str, called: frozenset[str]) -> str | None:
        """Why a row change to `schema`.`table` logged as a statement that calls the functions named
        `called` may write other tables too (a trigger on the table, a stored function of one of
        those names, as the server holds them now), or None. Asked at each such statement: they are
        rare, and a trigger may come or go between two."""
        statements: list[tuple[str, Any]] = [
            ("SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = %s "
             "AND EVENT_OBJECT_TABLE = %s", (schema, table))]
        if called:
            statements.append(("SELECT CONCAT(ROUTINE_SCHEMA, '.', ROUTINE_NAME) FROM information_schema.ROUTINES "
                               "WHERE ROUTINE_TYPE = 'FUNCTION' AND LOWER(ROUTINE_NAME) IN %s",
                               (tuple(sorted(called)),)))
        found = self._lookups.query(*statements)
        if found[0]:
            return f"the table has trigger(s) {', '.join(str(row[0]) for row in found[0])}"
        if len(found) > 1 and found[1]:
            return f"it calls stored function(s) {', '.join(sorted(str(row[0]) for row in found[1]))}"
        return None

    def transactional(self, schema: str, table: str) -> bool:
        """Whether a ROLLBACK TO undoes the table's changes (its engine is transactional)."""
        engine = self._engines.get((schema, table))
        if engine is None:
            [found] = self._lookups.query(("SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                                           "AND TABLE_NAME = %s", (schema, table)))
            if not found or not found[0][0]:
                raise SourceError(f"a ROLLBACK TO SAVEPOINT undid changes to {schema}.{table}, which no longer "
                                  "exists on the server, so setl cannot tell whether they were undone", table=
                                  f"{schema}.{table}")
            engine = self._engines[(schema, table)] = str(found[0][0]).lower()
        return engine in _TRANSACTIONAL_ENGINES
