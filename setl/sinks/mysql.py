"""A MySQL or MariaDB database as the target, through PyMySQL.

Each batch is one transaction: ``DELETE ... WHERE (key) IN (...)`` for the merged deletes, then
multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` of the full after-images, then the batch's end
position, batch id and epoch in ```setl`.`setl_position``` (see `SqlLoad` for the guarantees).
Target tables must exist, named by the batch's schema and table. The session runs with strict
SQL mode (a bad value fails the batch instead of being truncated), ``NO_AUTO_VALUE_ON_ZERO`` (an
id of 0 stays 0), ``time_zone='+00:00'`` (naive datetimes for TIMESTAMP columns are UTC),
``foreign_key_checks=0`` (the merged order of a batch is not the order of its parents and
children) and READ COMMITTED.

Known limit: a table with a UNIQUE key besides its primary key can see an upsert land on the
wrong row when two rows swap unique values inside one batch (ON DUPLICATE KEY UPDATE matches any
unique key).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pymysql
import pymysql.err

from setl.config import MysqlTargetConfig
from setl.errors import LoadError, TransientLoadError
from setl.model import Batch
from setl.sinks.merge import TableChanges
from setl.sinks.sql_common import SqlLoad, TargetTableMissing, chunks, group_by_columns

# Server errors worth a reconnect and replay: lock wait timeout, deadlock, connection killed,
# server shutting down, and the client-side lost-connection family.
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
    4031,  # disconnected by the server for inactivity (MySQL 8)
})
MISSING_TABLE_ERRORS = frozenset({1146, 1049})  # no such table, unknown database

SQL_MODE = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO,ERROR_FOR_DIVISION_BY_ZERO"


def quote(name: str) -> str:
    """A backtick-quoted identifier, safe inside a PyMySQL %-format query string."""
    return "`" + name.replace("`", "``").replace("%", "%%") + "`"


def table_name(schema: str, table: str) -> str:
    return f"{quote(schema)}.{quote(table)}"


def to_db(value: Any) -> Any:
    """A row value as PyMySQL can send it: JSON documents dumped, SET members joined."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, (set, frozenset)):
        return ",".join(sorted(map(str, value)))
    return value


class MySQLLoad(SqlLoad[pymysql.connections.Connection]):
    """Loads batches into MySQL or MariaDB (see the module docstring and `SqlLoad`)."""

    dialect = "mysql"

    def __init__(
        self,
        config: MysqlTargetConfig,
        *,
        pipeline: str,
        position_schema: str = "setl",
        position_table: str = "setl_position",
        chunk_rows: int = 500,
        max_attempts: int = 5,
        initial_backoff: float = 0.1,
        max_backoff: float = 5.0,
        connect_timeout: float = 10.0,
        read_timeout: float | None = 300.0,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        extra = {"sleep": sleep} if sleep is not None else {}
        super().__init__(pipeline=pipeline, position_schema=position_schema,
                         position_table=position_table, chunk_rows=chunk_rows,
                         max_attempts=max_attempts, initial_backoff=initial_backoff,
                         max_backoff=max_backoff, **extra)
        self.config = config
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._position = table_name(position_schema, position_table)

    @classmethod
    def from_config(cls, config: MysqlTargetConfig, *, pipeline: str, **options: Any) -> "MySQLLoad":
        return cls(config, pipeline=pipeline, **options)

    def __repr__(self) -> str:
        return f"<MySQLLoad {self.pipeline} -> {self.config.host}:{self.config.port}>"

    # -- connection

    def _connect(self) -> pymysql.connections.Connection:
        conn = pymysql.connect(
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
        )
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = %s, time_zone = '+00:00', foreign_key_checks = 0",
                        (SQL_MODE,))
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", ())
        conn.commit()
        return conn

    def _disconnect(self, conn: pymysql.connections.Connection) -> None:
        conn.close()

    def _commit(self, conn: pymysql.connections.Connection) -> None:
        conn.commit()

    def _rollback(self, conn: pymysql.connections.Connection) -> None:
        conn.rollback()

    # -- position and epoch

    def _create_position_table(self, conn: pymysql.connections.Connection) -> None:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(self.position_schema)}", ())
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self._position} ("
                " `pipeline` VARCHAR(191) NOT NULL PRIMARY KEY,"
                " `log` VARCHAR(512) NOT NULL,"
                " `offset` BIGINT NOT NULL,"
                " `gtid` TEXT NULL,"
                " `batch_id` BIGINT NOT NULL,"
                " `epoch` BIGINT NOT NULL,"
                " `updated_at` TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
                "   ON UPDATE CURRENT_TIMESTAMP(6)"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
        conn.commit()

    def _locked_epoch(self, conn: pymysql.connections.Connection) -> int | None:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `epoch` FROM {self._position} WHERE `pipeline` = %s FOR UPDATE",
                        (self.pipeline,))
            row = cur.fetchone()
        return int(row[0]) if row else None

    def _read_position(self, conn: pymysql.connections.Connection) -> tuple[str, int, str | None] | None:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `log`, `offset`, `gtid` FROM {self._position} WHERE `pipeline` = %s",
                        (self.pipeline,))
            row = cur.fetchone()
        conn.commit()  # end the read's snapshot, so the next read sees newer commits
        return (row[0], int(row[1]), row[2]) if row else None

    def _write_position(self, conn: pymysql.connections.Connection, batch: Batch) -> None:
        end = batch.end
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self._position} (`pipeline`, `log`, `offset`, `gtid`, `batch_id`, `epoch`)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE `log` = VALUES(`log`),"
                " `offset` = VALUES(`offset`), `gtid` = VALUES(`gtid`),"
                " `batch_id` = VALUES(`batch_id`), `epoch` = VALUES(`epoch`),"
                " `updated_at` = CURRENT_TIMESTAMP(6)",
                (self.pipeline, end.log, end.offset, end.gtid, batch.id, batch.epoch),
            )

    # -- rows

    def _apply_keyed(self, conn: pymysql.connections.Connection, table: TableChanges) -> None:
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
                    columns = ", ".join(map(quote, key))
                    args = [to_db(image[c]) for image in part for c in key]
                    cur.execute(f"DELETE FROM {name} WHERE ({columns}) IN ({', '.join([row] * len(part))})",
                                args)
            for columns, images in group_by_columns(table.upserts).items():
                updates = ", ".join(f"{quote(c)} = VALUES({quote(c)})" for c in columns)
                sql = (f"INSERT INTO {name} ({', '.join(map(quote, columns))})"
                       f" VALUES ({', '.join(['%s'] * len(columns))})"
                       f" ON DUPLICATE KEY UPDATE {updates}")
                for part in chunks(images, self.chunk_rows):
                    # PyMySQL turns this into one multi-row INSERT per ~1 MB of statement
                    cur.executemany(sql, [[to_db(image[c]) for c in columns] for image in part])

    def _apply_sequence(self, conn: pymysql.connections.Connection, table: TableChanges) -> None:
        name = table_name(table.schema, table.table)
        with conn.cursor() as cur:
            for change in table.sequence:
                if change.before is not None:
                    where = " AND ".join(f"{quote(c)} <=> %s" for c in change.before)
                    cur.execute(f"DELETE FROM {name} WHERE {where} LIMIT 1",
                                [to_db(v) for v in change.before.values()])
                if change.after is not None:
                    self._insert(cur, name, change.after)

    @staticmethod
    def _insert(cur: Any, name: str, image: Mapping[str, Any]) -> None:
        cur.execute(f"INSERT INTO {name} ({', '.join(map(quote, image))})"
                    f" VALUES ({', '.join(['%s'] * len(image))})",
                    [to_db(v) for v in image.values()])

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


__all__ = ["MySQLLoad", "TRANSIENT_ERRORS", "quote", "to_db"]
