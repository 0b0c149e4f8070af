"""Pre-write actions: what a batch DDL task does to its target slice before its data is loaded.

Every action must be safe to run again: a process killed after the action and before its
record runs it again on restart (the task's data is only loaded after the record, so a redo
only repeats the clearing).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql
import pymysql.err
from pymysql.converters import escape_string

from setl.ddltask.signal import split_where
from setl.dial import mysql_connection
from setl.errors import LoadError, TransientLoadError
from setl.meta.base import DdlTask
from setl.retry import call_with_retries
from setl.sinks.mysql import TRANSIENT_ERRORS, MysqlTargetConfig, quote
from setl.tls import mysql_context, require_encrypted

log = logging.getLogger("setl.ddltask")


class Actions:
    """Runs tasks' pre-write actions on one target.

    `run` may block and is called from many load threads, never twice at once for one table.
    It returns once the action is durable in the target; it raises `LoadError` (or its subclass
    `TransientLoadError`, which callers may retry) when the action failed.
    """

    system = "none"

    def run(self, task: DdlTask) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections. Idempotent."""


# Errors a redo of an action may meet, if the partition is (drop) or is not (add) already gone.
_DROP_REFUSED = {1507, 1508}  # wrong partition list; "cannot remove all partitions" (MariaDB)
_SAME_NAME_PARTITION = 1517


class MysqlActions(Actions):
    """Actions on a MySQL or MariaDB target, on a connection of their own (autocommit).

    * truncate_table: ``TRUNCATE TABLE t``
    * drop_partition / truncate_partition: ``ALTER TABLE t DROP|TRUNCATE PARTITION p``
    * add_range_partition ``NAME:BOUND``: ``ALTER TABLE t ADD PARTITION (PARTITION NAME VALUES
      LESS THAN (BOUND))``; an integer BOUND is sent as a number, anything else as a string
    * delete_where ``COLUMN=VALUE``: ``DELETE FROM t WHERE COLUMN = 'VALUE'``
    * none: nothing

    Dropping a partition that is gone, or adding one whose name exists, counts as done (a redo).
    Transient errors (lost connection, lock wait timeout) are retried in place.
    """

    system = "mysql"

    def __init__(self, config: MysqlTargetConfig, *, pipeline: str, lock_wait_timeout: int = 60,
                 attempts: int = 5, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.pipeline = pipeline
        self.lock_wait_timeout = lock_wait_timeout
        self.attempts = attempts
        self._sleep = sleep
        self._lock = threading.Lock()
        self._conn: pymysql.connections.Connection | None = None

    def statement(self, task: DdlTask) -> tuple[str, tuple[Any, ...]] | None:
        """The SQL and arguments of `task`'s action, or None for op none."""
        name = f"{quote(task.op_db)}.{quote(task.op_table)}"
        if task.op_type == "truncate_table":
            return f"TRUNCATE TABLE {name}", ()
        if task.op_type in ("drop_partition", "truncate_partition"):
            verb = "DROP" if task.op_type == "drop_partition" else "TRUNCATE"
            return f"ALTER TABLE {name} {verb} PARTITION {quote(task.op_partition)}", ()
        if task.op_type == "add_range_partition":
            partition, _, bound = task.op_partition.partition(":")
            bound = bound.strip()
            value = bound if re.fullmatch(r"-?\d+", bound) else f"'{escape_string(bound)}'"
            return (f"ALTER TABLE {name} ADD PARTITION (PARTITION {quote(partition.strip())}"
                    f" VALUES LESS THAN ({value.replace('%', '%%')}))", ())
        if task.op_type == "delete_where":
            column, value = split_where(task.op_partition)
            return f"DELETE FROM {name} WHERE {quote(column)} = %s", (value,)
        if task.op_type == "none":
            return None
        raise LoadError(f"{task.describe()}: unknown op_type", pipeline=self.pipeline, stage="load",
                        table=task.target)

    def run(self, task: DdlTask) -> None:
        statement = self.statement(task)
        if statement is None:
            return
        with self._lock:
            call_with_retries(lambda: self._execute(task, *statement), attempts=self.attempts,
                              retry_on=(TransientLoadError,), sleep=self._sleep,
                              before_retry=lambda exc: self._drop())

    def _execute(self, task: DdlTask, sql: str, args: tuple[Any, ...]) -> None:
        try:
            conn = self._connection()
            with conn.cursor() as cur:
                cur.execute(sql, args)
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if self._already_done(task, code):
                log.info("pipeline=%s stage=load %s was already done in the target (%s)",
                         self.pipeline, task.describe(), exc.args[1] if len(exc.args) > 1 else exc)
                return
            transient = code in TRANSIENT_ERRORS or isinstance(exc, pymysql.err.InterfaceError)
            if transient:
                self._drop()
            kind = TransientLoadError if transient else LoadError
            message = f"{exc.args[1]} (MySQL error {code})" if len(exc.args) > 1 else str(exc)
            raise kind(message, pipeline=self.pipeline, stage="load", table=task.target) from exc

    def _already_done(self, task: DdlTask, code: int | None) -> bool:
        """Whether an error only says an earlier run already did what `task` asks."""
        if task.op_type == "add_range_partition":
            return code == _SAME_NAME_PARTITION
        if task.op_type != "drop_partition" or code not in _DROP_REFUSED:
            return False
        with self._connection().cursor() as cur:
            cur.execute("SELECT 1 FROM information_schema.partitions WHERE table_schema = %s"
                        " AND table_name = %s AND partition_name = %s",
                        (task.op_db, task.op_table, task.op_partition))
            return cur.fetchone() is None

    def _connection(self) -> pymysql.connections.Connection:
        if self._conn is None:
            tls = getattr(self.config, "ssl", None)
            self._conn = mysql_connection(host=self.config.host, port=self.config.port,
                                         user=self.config.user, password=self.config.password,
                                         database=self.config.database, charset="utf8mb4",
                                         autocommit=True, connect_timeout=10,
                                         ssl=mysql_context(tls, where="target.ssl") if tls else None)
            if tls is not None:
                require_encrypted(self._conn, self.config.host, self.config.port)
            with self._conn.cursor() as cur:
                cur.execute("SET SESSION lock_wait_timeout = %s", (self.lock_wait_timeout,))
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()


__all__ = ["Actions", "MysqlActions"]
