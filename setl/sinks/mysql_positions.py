"""Where the MySQL target keeps a pipeline's position, per-table positions, fence, sessions,
identity and DDL marks: InnoDB tables in the position schema (`MysqlPositionStore`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pymysql
import pymysql.err
from pymysql.connections import Connection

from setl.errors import LoadError
from setl.model import Batch, Position
from setl.sinks.mysql_sql import quote, table_name
from setl.sinks.sql_positions import FenceBusy, PositionStore, end_values, stored_position

_DUPLICATE_COLUMN = 1060  # ER_DUP_FIELDNAME
#: The columns of a recorded position (the pipeline's, and each target table's).
_POSITION_COLUMNS = (" `log` VARCHAR(512) NOT NULL, `offset` BIGINT NOT NULL, `row` BIGINT NOT NULL DEFAULT 0,"
                     " `gtid` TEXT NULL, `batch_id` BIGINT NOT NULL, `epoch` BIGINT NOT NULL,")


class MysqlPositionStore(PositionStore[Connection]):
    """`PositionStore` for MySQL and MariaDB. Sessions are told apart by ``CONNECTION_ID()`` and
    the server's boot time (ids are unique within one boot); a deposed writer's session is ended
    with ``KILL CONNECTION``. The pipeline's and its tables' positions are written with the COMMIT
    in one multi-statement round trip. It also names ``<position_table>_ddl``, where the DDL
    applier marks the DDL it ran (`ddl_marks`).
    """

    def __init__(self, **options: Any) -> None:
        """`options` are `PositionStore`'s."""
        super().__init__(**options)
        self.position = table_name(self.schema, self.table)
        self.ddl_marks = table_name(self.schema, self.table + "_ddl")
        self.table_position = table_name(self.schema, self.table + "_table")
        self.fence_table = table_name(self.schema, self.table + "_fence")
        self.sessions = table_name(self.schema, self.table + "_session")
        self.identity = table_name(self.schema, self.table + "_identity")
        self.copies = table_name(self.schema, self.table + "_copy")

    def commit(self, conn: Connection) -> None:
        conn.commit()

    def create_tables(self, conn: Connection) -> None:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote(self.schema)}", ())
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.position} ("
                " `pipeline` VARCHAR(191) NOT NULL PRIMARY KEY," + _POSITION_COLUMNS +
                " `updated_at` TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
                "   ON UPDATE CURRENT_TIMESTAMP(6)"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
            # Tables made before positions had a row: add it (only when missing, since an ALTER
            # waits for every open transaction on the table).
            cur.execute("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s"
                        " AND TABLE_NAME = %s AND COLUMN_NAME = 'row'",
                        (self.schema, self.table))
            found = cur.fetchone()
            if found is None or not found[0]:
                try:
                    cur.execute(f"ALTER TABLE {self.position} ADD COLUMN `row` BIGINT NOT NULL"
                                " DEFAULT 0 AFTER `offset`", ())
                except pymysql.err.OperationalError as exc:
                    # Another process opening the same target added it between the look and the
                    # ALTER (ER_DUP_FIELDNAME): then it is there, as wanted.
                    if not exc.args or exc.args[0] != _DUPLICATE_COLUMN:
                        raise
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table_position} ("
                " `pipeline` VARCHAR(191) NOT NULL,"
                " `target_table` VARCHAR(400) NOT NULL," + _POSITION_COLUMNS +
                " PRIMARY KEY (`pipeline`, `target_table`)"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.fence_table} ("
                " `pipeline` VARCHAR(191) NOT NULL PRIMARY KEY,"
                " `epoch` BIGINT NOT NULL"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.sessions} ("
                " `pipeline` VARCHAR(191) NOT NULL,"
                " `session` BIGINT NOT NULL,"
                " `token` VARCHAR(255) NOT NULL,"
                " `boot` BIGINT NOT NULL,"
                " `epoch` BIGINT NOT NULL,"
                " `registered_at` TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
                " PRIMARY KEY (`pipeline`, `session`)"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.identity} ("
                " `pipeline` VARCHAR(191) NOT NULL PRIMARY KEY,"
                " `identity` TEXT NOT NULL,"
                " `updated_at` TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
                "   ON UPDATE CURRENT_TIMESTAMP(6)"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.copies} ("
                " `pipeline` VARCHAR(191) NOT NULL,"
                " `target_schema` VARCHAR(191) NOT NULL,"
                " `target_table` VARCHAR(191) NOT NULL,"
                " `staging` VARCHAR(64) NOT NULL,"
                " `created_at` TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
                " PRIMARY KEY (`pipeline`, `target_schema`, `target_table`)"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {self.ddl_marks} ("
                " `pipeline` VARCHAR(191) NOT NULL PRIMARY KEY,"
                " `mark` VARCHAR(700) NOT NULL"
                ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                (),
            )
        conn.commit()

    @staticmethod
    def _boot(cur: Any) -> int:
        """When the server started (Unix seconds): session ids are unique within one boot."""
        cur.execute("SELECT UNIX_TIMESTAMP() - VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                    " WHERE VARIABLE_NAME = 'UPTIME'", ())
        return int(cur.fetchone()[0])

    def register(self, conn: Connection, epoch: int) -> None:
        with conn.cursor() as cur:
            boot = self._boot(cur)
            cur.execute(f"INSERT INTO {self.sessions} (`pipeline`, `session`, `token`, `boot`, `epoch`)"
                        " VALUES (%s, CONNECTION_ID(), %s, %s, %s) ON DUPLICATE KEY UPDATE"
                        " `token` = VALUES(`token`), `boot` = VALUES(`boot`), `epoch` = VALUES(`epoch`),"
                        " `registered_at` = CURRENT_TIMESTAMP(6)",
                        (self.pipeline, self.token, boot, epoch))
        conn.commit()

    def kill_others(self, conn: Connection) -> int:
        killed = 0
        with conn.cursor() as cur:
            boot = self._boot(cur)
            cur.execute(f"SELECT `session`, `boot` FROM {self.sessions} WHERE `pipeline` = %s AND `token` <> %s",
                        (self.pipeline, self.token))
            for session, registered_boot in cur.fetchall():
                # The uptime is read in whole seconds: a registration of this boot may differ by one.
                alive = abs(int(registered_boot) - boot) <= 2
                if alive:
                    try:
                        cur.execute(f"KILL CONNECTION {int(session)}", ())
                        killed += 1
                    except pymysql.err.MySQLError as exc:
                        code = exc.args[0] if exc.args else None
                        if code in (1095, 1227):  # not owner of the thread / access denied
                            raise LoadError(
                                f"cannot kill session {session} of a deposed writer to fence the target "
                                f"({self._describe(exc)}): grant the target account CONNECTION ADMIN "
                                f"(or SUPER), or use the same account on every node", pipeline=self.pipeline,
                                stage="load") from exc
                        if code != 1094:  # unknown thread: it is gone
                            raise
                        alive = False
                if not alive:
                    cur.execute(f"DELETE FROM {self.sessions} WHERE `pipeline` = %s AND `session` = %s",
                                (self.pipeline, session))
        conn.commit()
        return killed

    def raise_fence(self, conn: Connection, epoch: int | None) -> int:
        wait = max(1, round(self.lock_timeout))
        try:
            with conn.cursor() as cur:
                # SET SESSION (not MariaDB's SET STATEMENT) so that MySQL targets take it too.
                cur.execute(f"SET SESSION innodb_lock_wait_timeout = {wait}", ())
                cur.execute(f"SELECT `epoch` FROM {self.fence_table} WHERE `pipeline` = %s FOR UPDATE",
                            (self.pipeline,))
                row = cur.fetchone()
                cur.execute(f"SELECT `epoch` FROM {self.position} WHERE `pipeline` = %s", (self.pipeline,))
                position = cur.fetchone()
                stored = max([int(r[0]) for r in (row, position) if r] or [0])
                if epoch is None:
                    epoch = stored + 1
                if stored <= epoch:
                    stored = epoch
                    cur.execute(f"INSERT INTO {self.fence_table} (`pipeline`, `epoch`) VALUES (%s, %s)"
                                " ON DUPLICATE KEY UPDATE `epoch` = VALUES(`epoch`)", (self.pipeline, epoch))
            conn.commit()
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in (1205, 1213):  # lock wait timeout, deadlock
                raise FenceBusy() from exc
            raise
        finally:
            # A dead connection is dropped anyway; the error that killed it is the one to raise.
            with contextlib.suppress(pymysql.err.MySQLError), conn.cursor() as cur:
                cur.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT", ())
        return stored

    def shared_epoch(self, conn: Connection) -> int | None:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `epoch` FROM {self.fence_table} WHERE `pipeline` = %s LOCK IN SHARE MODE",
                        (self.pipeline,))
            row = cur.fetchone()
        return int(row[0]) if row else None

    def read_position(self, conn: Connection) -> tuple[Position | None, int | None]:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `log`, `offset`, `row`, `gtid`, `epoch` FROM {self.position}"
                        " WHERE `pipeline` = %s", (self.pipeline,))
            row = cur.fetchone()
            cur.execute(f"SELECT `epoch` FROM {self.fence_table} WHERE `pipeline` = %s", (self.pipeline,))
            fence = cur.fetchone()
        conn.commit()  # end the read's snapshot, so the next read sees newer commits
        position = Position(row[0], int(row[1]), row[3], row=int(row[2])) if row else None
        epochs = [int(r[-1]) for r in (row, fence) if r]
        return position, max(epochs) if epochs else None

    def has_tables(self, conn: Connection) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN"
                        " (%s, %s)", (self.schema, self.table, self.table + "_fence"))
            row = cur.fetchone()
        conn.commit()
        return bool(row and int(row[0]) == 2)

    def read_identity(self, conn: Connection) -> str | None:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `identity` FROM {self.identity} WHERE `pipeline` = %s", (self.pipeline,))
            row = cur.fetchone()
        conn.commit()
        return str(row[0]) if row else None

    def read_server(self, conn: Connection) -> dict[str, Any]:
        """MySQL's ``server_uuid``; MariaDB has none: its ``hostname``, ``datadir`` and ``server_id``
        (where its data lives, not the port it listens on: a server moved to another port is the same)."""
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('server_uuid', 'hostname', 'datadir', "
                        "'server_id')")
            found = {str(name): str(value) for name, value in cur.fetchall()}
        conn.commit()
        if found.get("server_uuid"):
            return {"server_uuid": found["server_uuid"]}
        return {"hostname": found.get("hostname"), "datadir": found.get("datadir"),
                "server_id": int(found.get("server_id") or 0)}

    def write_identity(self, conn: Connection, text: str) -> None:
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {self.identity} (`pipeline`, `identity`) VALUES (%s, %s)"
                        " ON DUPLICATE KEY UPDATE `identity` = VALUES(`identity`)", (self.pipeline, text))
        conn.commit()

    def read_copies(self, conn: Connection) -> dict[tuple[str, str], str]:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `target_schema`, `target_table`, `staging` FROM {self.copies}"
                        " WHERE `pipeline` = %s", (self.pipeline,))
            return {(str(s), str(t)): str(staging) for s, t, staging in cur.fetchall()}

    def record_copy(self, conn: Connection, schema: str, table: str, staging: str) -> None:
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {self.copies} (`pipeline`, `target_schema`, `target_table`, `staging`)"
                        " VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE `staging` = VALUES(`staging`),"
                        " `created_at` = CURRENT_TIMESTAMP(6)", (self.pipeline, schema, table, staging))

    def forget_copy(self, conn: Connection, schema: str, table: str) -> None:
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {self.copies} WHERE `pipeline` = %s AND `target_schema` = %s"
                        " AND `target_table` = %s", (self.pipeline, schema, table))

    @property
    def _write_position_sql(self) -> str:
        return (f"INSERT INTO {self.position} (`pipeline`, `log`, `offset`, `row`, `gtid`, `batch_id`, `epoch`)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE `log` = VALUES(`log`),"
                " `offset` = VALUES(`offset`), `row` = VALUES(`row`), `gtid` = VALUES(`gtid`),"
                " `batch_id` = VALUES(`batch_id`), `epoch` = VALUES(`epoch`),"
                " `updated_at` = CURRENT_TIMESTAMP(6)")

    def write_position(self, conn: Connection, batch: Batch) -> None:
        with conn.cursor() as cur:
            cur.execute(self._write_position_sql, (self.pipeline, *end_values(batch)))

    def pipeline_position(self, conn: Connection) -> Position | None:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `log`, `offset`, `row` FROM {self.position} WHERE `pipeline` = %s",
                        (self.pipeline,))
            r = cur.fetchone()
        return stored_position(r)

    def fence_and_table_position(self, conn: Connection,
                                  table: str) -> tuple[int | None, Position | None]:
        """Both locking reads in one statement (one round trip): the fence row shared (its own
        locking clause) and the table's position row for update, each locked to COMMIT; either
        may be missing."""
        with conn.cursor() as cur:
            cur.execute(f"SELECT (SELECT `epoch` FROM {self.fence_table} WHERE `pipeline` = %s LOCK IN SHARE MODE),"
                        f" t.`log`, t.`offset`, t.`row` FROM (SELECT 1) AS one LEFT JOIN {self.table_position} AS t"
                        " ON t.`pipeline` = %s AND t.`target_table` = %s FOR UPDATE",
                        (self.pipeline, self.pipeline, table))
            row = cur.fetchone()
        assert row is not None  # the outer (SELECT 1) gives one row
        epoch = int(row[0]) if row[0] is not None else None
        return epoch, stored_position(row[1:]) if row[1] is not None else None

    @staticmethod
    def _results(cur: Any, count: int) -> list[tuple[Any, ...]]:
        """The rows of each of the `count` results of a multi-statement `cur` executed, in order;
        raises the error of the first statement that failed (the server ran none after it), so
        no result is left on the connection."""
        results = [cur.fetchall()]
        while cur.nextset():
            results.append(cur.fetchall())
        if len(results) != count:
            raise pymysql.err.InternalError(f"expected {count} results of a multi-statement, got {len(results)}")
        return results

    def record_and_commit(self, conn: Connection, batch: Batch, tables: Sequence[str],
                           pipeline: bool) -> None:
        """The position writes and the COMMIT in one multi-statement round trip: the server stops
        at a write that fails, so nothing after it (the COMMIT included) runs, and its error is raised."""
        end = end_values(batch)
        statements: list[str] = []
        args: list[Any] = []
        for table in tables:
            statements.append(self._write_table_position_sql)
            args += (self.pipeline, table, *end)
        if pipeline:
            statements.append(self._write_position_sql)
            args += (self.pipeline, *end)
        statements.append("COMMIT")
        self._writing.table = ", ".join(tables) or None
        with conn.cursor() as cur:
            cur.execute(";\n".join(statements), args)
            self._results(cur, len(statements))
        self._writing.table = None

    def table_position_locked(self, conn: Connection, table: str) -> Position | None:
        with conn.cursor() as cur:
            cur.execute(f"SELECT `log`, `offset`, `row` FROM {self.table_position}"
                        " WHERE `pipeline` = %s AND `target_table` = %s FOR UPDATE", (self.pipeline, table))
            r = cur.fetchone()
        return stored_position(r)

    @property
    def _write_table_position_sql(self) -> str:
        return (f"INSERT INTO {self.table_position} (`pipeline`, `target_table`, `log`, `offset`, `row`,"
                " `gtid`, `batch_id`, `epoch`) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE"
                " `log` = VALUES(`log`), `offset` = VALUES(`offset`), `row` = VALUES(`row`),"
                " `gtid` = VALUES(`gtid`), `batch_id` = VALUES(`batch_id`), `epoch` = VALUES(`epoch`)")

    def write_table_position(self, conn: Connection, table: str, batch: Batch) -> None:
        with conn.cursor() as cur:
            cur.execute(self._write_table_position_sql, (self.pipeline, table, *end_values(batch)))
