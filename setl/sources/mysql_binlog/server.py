"""The source server as setl talks to it outside the binlog stream: how to connect (credentials,
TLS, timeouts; the library's stream settings) and the plain questions and checks asked on a
connection (binlog status and settings, cascading foreign keys, GTIDs at a position, identity,
the selected tables' columns)."""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import pymysql

from setl.dial import mysql_connection
from setl.errors import SourceError
from setl.model import ColumnSchema, Position, TableName, TableSchema
from setl.sources.mysql_binlog.assembler import _GtidState
from setl.sources.mysql_binlog.lookups import _Lookups
from setl.sources.mysql_binlog.settings import ServerFacts, SettingsReport, evaluate
from setl.tls import require_encrypted, tls_failure

#: Whether the pipeline's table rules take (schema, table); None: every table.
Selects = Callable[[str, str], bool] | None

# What a server must run with, and why: column names and primary keys come from the table map
# (every other setting that changes the binlog: `settings.SETTINGS`).
REQUIRED_SETTINGS: Mapping[str, str] = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}


@attrs.define
class SourceServer:
    """One MySQL or MariaDB server: how to reach it, and the plain questions setl asks it.

    * `connect` opens a new autocommit connection (TLS with `ssl`, refused if the server did not
      encrypt it); `stream_settings` are the same settings as the library takes them for a binlog
      stream. `lookups` is the one connection kept open for frequent short questions.
    * The questions that take a connection run on it and leave it open; the others open their own
      and close it. All block; none keeps state beyond `lookups`.
    * Every failure is a `SourceError` made by `error`, naming the pipeline and the select stage.
    """

    host: str
    port: int
    user: str
    _password: str = attrs.field(repr=False, alias="password")
    ssl: ssl.SSLContext | None = attrs.field(default=None, repr=False)  # one context for every connection
    connect_timeout: float = 5.0
    heartbeat: float = 1.0  # how often an idle server sends a heartbeat on the stream (seconds)
    flavor: str = "auto"  # as configured; `check_settings` tells the server's
    pipeline: str = ""
    lookups: _Lookups = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.lookups = _Lookups(self.connect)

    def error(self, message: str, position: Position | None = None, cls: type[SourceError] = SourceError
              ) -> SourceError:
        """A `SourceError` (or `cls`) naming the pipeline, the select stage and `position`."""
        return cls(message, pipeline=self.pipeline, stage="select", position=position)

    def connect(self) -> pymysql.connections.Connection:
        """A new autocommit connection; raises `SourceError` naming the server (and TLS as the cause)."""
        try:
            conn = mysql_connection(host=self.host, port=self.port, user=self.user, password=self._password,
                                   connect_timeout=self.connect_timeout, autocommit=True, charset="utf8mb4",
                                   ssl=self.ssl)
            if self.ssl is not None:
                require_encrypted(conn, self.host, self.port)
            return conn
        except (pymysql.MySQLError, ConnectionError) as exc:
            cause = tls_failure(exc)
            if cause is not None:
                raise self.error(f"cannot connect to {self.host}:{self.port} as {self.user} over TLS: {cause} "
                                 "(see source.ssl)") from exc
            raise self.error(f"cannot connect to {self.host}:{self.port} as {self.user}: {exc}") from exc

    def stream_settings(self) -> dict[str, Any]:
        """The library's connection settings for a binlog stream (and its control connections)."""
        settings = {"host": self.host, "port": self.port, "user": self.user, "password": self._password,
                    "connect_timeout": self.connect_timeout, "read_timeout": max(30.0, 4 * self.heartbeat)}
        if self.ssl is not None:
            settings["ssl"] = self.ssl
        return settings

    @staticmethod
    def query(conn: pymysql.connections.Connection, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def status(self, conn: pymysql.connections.Connection) -> tuple[Position, str | None] | None:
        """The binlog head, and (MySQL) the GTID set executed up to it."""
        try:
            rows = self.query(conn, "SHOW MASTER STATUS")
        except pymysql.err.ProgrammingError:  # MySQL 8.4 renamed it
            rows = self.query(conn, "SHOW BINARY LOG STATUS")
        if not rows:
            return None
        executed = rows[0][4] if len(rows[0]) > 4 else None
        return Position(rows[0][0], int(rows[0][1])), (executed or None)

    def check_settings(self, conn: pymysql.connections.Connection, selects: Selects = None,
                       position: Position | None = None, gtid_start: bool = False) -> str:
        """Refuse a server whose settings lose data or change the binlog in ways setl cannot apply
        exactly (`settings.SETTINGS`), naming every refused setting with its fix in one line;
        return its flavor."""
        facts, report = self.judge_settings(conn, selects, position, gtid_start)
        refused = report.refusal()
        if refused is not None:
            raise self.error(refused, position)
        return facts.flavor

    def judge_settings(self, conn: pymysql.connections.Connection, selects: Selects = None,
                       position: Position | None = None, gtid_start: bool = False, also: Sequence[str] = ()
                       ) -> tuple[ServerFacts, SettingsReport]:
        """The server's facts, read once, and setl's verdict on each setting (`settings.evaluate`);
        `also`: schemas the pipeline reads besides its selected tables'."""
        facts = ServerFacts.read(conn, self.flavor, schemas=[*self.selected_schemas(conn, selects), *also],
                                 position=position, gtid_start=gtid_start, pipeline=self.pipeline)
        return facts, SettingsReport(f"{self.host}:{self.port}", facts.version, tuple(evaluate(facts)))

    def selected_schemas(self, conn: pymysql.connections.Connection, selects: Selects) -> list[str]:
        """The schemas holding a table the pipeline's rules select (every schema with a table if all)."""
        rows = self.query(conn, "SELECT DISTINCT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                                "WHERE TABLE_TYPE <> 'VIEW' AND TABLE_SCHEMA NOT IN "
                                "('mysql', 'information_schema', 'performance_schema', 'sys')")
        return sorted({str(schema) for schema, table in rows if selects is None or selects(str(schema), str(table))})

    def refuse_cascades(self, conn: pymysql.connections.Connection, selects: Selects) -> None:
        """Refuse a selected table whose rows a foreign key changes: InnoDB applies ON DELETE/UPDATE
        CASCADE, SET NULL and SET DEFAULT inside the engine, and the binlog never shows them."""
        found = self.query(conn, "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, REFERENCED_TABLE_NAME, "
                                 "DELETE_RULE, UPDATE_RULE FROM information_schema.REFERENTIAL_CONSTRAINTS "
                                 "WHERE DELETE_RULE <> 'RESTRICT' AND DELETE_RULE <> 'NO ACTION' "
                                 "OR UPDATE_RULE <> 'RESTRICT' AND UPDATE_RULE <> 'NO ACTION' "
                                 "ORDER BY CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME")
        for schema, table, constraint, parent, on_delete, on_update in found:
            if selects is not None and not selects(schema, table):
                continue
            rules = " ".join(f"ON {what} {rule}" for what, rule in (("DELETE", on_delete), ("UPDATE", on_update))
                             if rule not in ("RESTRICT", "NO ACTION"))
            raise self.error(f"table {schema}.{table} has foreign key {constraint} ({rules} from {parent}): the "
                             "server changes its rows without logging them, so its copy would differ; exclude "
                             "the table or drop the cascade (see docs/mysql-source.md)")

    def gtids_at(self, conn: pymysql.connections.Connection, position: Position, flavor: str | None,
                 executed: str | None = None) -> _GtidState | None:
        """The GTID set executed up to `position` on a server of `flavor`, when the server can tell."""
        if flavor == "mariadb":
            rows = self.query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", (position.log, position.offset))
            text = rows[0][0] if rows else None
            return _GtidState("mariadb", text) if text is not None else None
        return _GtidState("mysql", executed) if executed else None

    def head(self) -> Position | None:
        conn = self.connect()
        try:
            status = self.status(conn)
            return status[0] if status else None
        except pymysql.MySQLError as exc:
            raise self.error(f"cannot read the binlog status of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()

    def identity(self) -> dict[str, Any]:
        """Which server this is (`setl.pipeline.identity`): its ``server_uuid`` (MySQL), ``server_id``
        and ``gtid_domain_id`` (MariaDB), as the server reports them; a variable it lacks is left out."""
        conn = self.connect()
        try:
            rows = self.query(conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                                    "('server_uuid', 'server_id', 'gtid_domain_id')")
        except pymysql.MySQLError as exc:
            raise self.error(f"cannot read the server identity of {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        found = {str(name): str(value) for name, value in rows}
        return {name: (int(value) if name != "server_uuid" else value) for name, value in sorted(found.items())}

    def bytes_behind(self, position: Position) -> tuple[Position, int] | None:
        """The log's end and the bytes of binlog after `position` up to it (None: `position`'s file is gone)."""
        try:
            [rows] = self.lookups.query(("SHOW BINARY LOGS", None))
        except pymysql.MySQLError as exc:
            raise self.error(f"cannot list the binary logs of {self.host}:{self.port}: {exc}") from exc
        logs = [(str(row[0]), int(row[1])) for row in rows]
        names = [name for name, _ in logs]
        if not logs or position.log not in names:
            return None
        after = logs[names.index(position.log):]
        behind = sum(size for _, size in after) - min(position.offset, after[0][1])
        return Position(*logs[-1]), behind

    def describe(self, selects: Selects) -> tuple[TableSchema, ...]:
        """The selected base tables' columns from information_schema, on a connection of its own."""
        conn = self.connect()
        try:
            tables = self.query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, CREATE_OPTIONS FROM information_schema.TABLES "
                                      "WHERE TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') AND TABLE_SCHEMA "
                                      "NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')")
            wanted = {(str(schema), str(table)) for schema, table, _options in tables
                      if selects is None or selects(str(schema), str(table))}
            partitioned = {(str(schema), str(table)) for schema, table, options in tables
                           if "partitioned" in str(options or "").lower()}
            if not wanted:
                return ()
            schemas = sorted({schema for schema, _ in wanted})
            marks = ", ".join(["%s"] * len(schemas))
            columns = self.query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, "
                                       "COLUMN_DEFAULT, CHARACTER_SET_NAME, COLLATION_NAME, GENERATION_EXPRESSION, "
                                       "DATA_TYPE, EXTRA "
                                       f"FROM information_schema.COLUMNS WHERE TABLE_SCHEMA IN ({marks}) "
                                       "ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION", schemas)
            json_checked = _json_checked(self.query, conn, marks, schemas)
            mariadb = "mariadb" in str(self.query(conn, "SELECT VERSION()")[0][0]).lower()
            keys = self.query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM "
                                    f"information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA IN ({marks}) "
                                    "AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY TABLE_SCHEMA, TABLE_NAME, "
                                    "ORDINAL_POSITION", schemas)
        except pymysql.MySQLError as exc:
            raise self.error(f"cannot read the selected tables' columns: {exc}") from exc
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

    def task_connect(self) -> dict[str, Any] | None:
        """PyMySQL's arguments for a connection opened elsewhere (a Spark task); None with TLS, whose
        context cannot travel."""
        return None if self.ssl is not None else {
            "host": self.host, "port": self.port, "user": self.user, "password": self._password,
            "connect_timeout": self.connect_timeout, "charset": "utf8mb4", "autocommit": True}

    def close(self) -> None:
        """Close the kept connection (a later question opens a new one)."""
        self.lookups.close()


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


