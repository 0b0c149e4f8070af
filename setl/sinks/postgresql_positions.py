"""Where the PostgreSQL target keeps a pipeline's position, per-table positions, fence, sessions
and identity: tables in the position schema (`PostgresPositionStore`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql

from setl.errors import LoadError
from setl.model import Batch, Position
from setl.sinks.sql_positions import FenceBusy, PositionStore, end_values, stored_position
from setl.values import as_text


class PostgresPositionStore(PositionStore[psycopg.Connection]):
    """`PositionStore` for PostgreSQL. Sessions are told apart by backend pid and start time; a
    deposed writer's session is ended with ``pg_terminate_backend``. The statements on the hot
    path are rendered once through the sink's statement cache (`text`).
    """

    def __init__(self, *, text: Callable[..., str], **options: Any) -> None:
        """`text(conn, key, build)`: a statement rendered once per key (`postgresql_rows.StatementCache`);
        `options` are `PositionStore`'s."""
        super().__init__(**options)
        self._text = text
        self.position = sql.Identifier(self.schema, self.table)
        self.table_position = sql.Identifier(self.schema, self.table + "_table")
        self.fence_table = sql.Identifier(self.schema, self.table + "_fence")
        self.identity = sql.Identifier(self.schema, self.table + "_identity")
        self.sessions = sql.Identifier(self.schema, self.table + "_session")
        self.copies = sql.Identifier(self.schema, self.table + "_copy")

    def commit(self, conn: psycopg.Connection) -> None:
        conn.commit()

    def create_tables(self, conn: psycopg.Connection) -> None:
        schema = sql.Identifier(self.schema)
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                              (self.position.as_string(conn),)).fetchone()
        if not (exists and exists[0]):
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                " pipeline text PRIMARY KEY,"
                " log text NOT NULL,"
                " \"offset\" bigint NOT NULL,"
                " \"row\" bigint NOT NULL DEFAULT 0,"
                " gtid text,"
                " batch_id bigint NOT NULL,"
                " epoch bigint NOT NULL,"
                " updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(self.position))
        # Tables made before positions had a row: add it (only when missing, since an ALTER
        # waits for every open transaction on the table).
        has_row = conn.execute("SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'row'"
                               " AND NOT attisdropped", (self.position.as_string(conn),)).fetchone()
        if not has_row:
            conn.execute(sql.SQL('ALTER TABLE {} ADD COLUMN IF NOT EXISTS "row" bigint NOT NULL DEFAULT 0')
                         .format(self.position))
        for name, columns in (
            (self.table_position, ' pipeline text NOT NULL, target_table text NOT NULL, log text NOT NULL,'
                                   ' "offset" bigint NOT NULL, "row" bigint NOT NULL DEFAULT 0, gtid text,'
                                   ' batch_id bigint NOT NULL, epoch bigint NOT NULL,'
                                   ' PRIMARY KEY (pipeline, target_table)'),
            (self.fence_table, " pipeline text PRIMARY KEY, epoch bigint NOT NULL"),
            (self.identity, " pipeline text PRIMARY KEY, identity text NOT NULL,"
                             " updated_at timestamptz NOT NULL DEFAULT now()"),
            (self.sessions, " pipeline text NOT NULL, session integer NOT NULL, token text NOT NULL,"
                             " started timestamptz, epoch bigint NOT NULL,"
                             " registered_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pipeline, session)"),
            (self.copies, " pipeline text NOT NULL, target_schema text NOT NULL, target_table text NOT NULL,"
                           " staging text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),"
                           " PRIMARY KEY (pipeline, target_schema, target_table)"),
        ):
            present = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name.as_string(conn),)).fetchone()
            if not (present and present[0]):
                conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (" + columns + ")").format(name))
        conn.commit()

    def register(self, conn: psycopg.Connection, epoch: int) -> None:
        conn.execute(sql.SQL(
            "INSERT INTO {} (pipeline, session, token, started, epoch)"
            " SELECT %s, pid, %s, backend_start, %s FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            " ON CONFLICT (pipeline, session) DO UPDATE SET token = EXCLUDED.token,"
            " started = EXCLUDED.started, epoch = EXCLUDED.epoch, registered_at = now()"
        ).format(self.sessions), (self.pipeline, self.token, epoch))
        conn.commit()

    def kill_others(self, conn: psycopg.Connection) -> int:
        # backend_start is NULL for another role's sessions without pg_read_all_stats: then the
        # pid alone identifies the session.
        same = ("a.pid = s.session AND (a.backend_start IS NULL OR s.started IS NULL"
                " OR a.backend_start = s.started)")
        try:
            killed = conn.execute(sql.SQL(
                "SELECT s.session, pg_terminate_backend(s.session) FROM {} s JOIN pg_stat_activity a ON "
                + same + " WHERE s.pipeline = %s AND s.token <> %s AND s.session <> pg_backend_pid()"
            ).format(self.sessions), (self.pipeline, self.token)).fetchall()
        except psycopg.errors.InsufficientPrivilege as exc:
            conn.rollback()
            raise LoadError(
                f"cannot terminate the sessions of a deposed writer to fence the target "
                f"({self._describe(exc)}): use the same role on every node, or grant the target "
                f"account pg_signal_backend", pipeline=self.pipeline, stage="load") from exc
        conn.execute(sql.SQL(
            "DELETE FROM {} s WHERE s.pipeline = %s AND s.token <> %s"
            " AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE " + same + ")"
        ).format(self.sessions), (self.pipeline, self.token))
        conn.commit()
        return sum(1 for _, done in killed if done)

    def read_copies(self, conn: psycopg.Connection) -> dict[tuple[str, str], str]:
        rows = conn.execute(sql.SQL("SELECT target_schema, target_table, staging FROM {} WHERE pipeline = %s")
                            .format(self.copies), (self.pipeline,)).fetchall()
        return {(as_text(s), as_text(t)): as_text(staging) for s, t, staging in rows}

    def record_copy(self, conn: psycopg.Connection, schema: str, table: str, staging: str) -> None:
        conn.execute(sql.SQL("INSERT INTO {} (pipeline, target_schema, target_table, staging) VALUES (%s, %s, %s, %s)"
                             " ON CONFLICT (pipeline, target_schema, target_table) DO UPDATE SET"
                             " staging = EXCLUDED.staging, created_at = now()").format(self.copies),
                     (self.pipeline, schema, table, staging))

    def forget_copy(self, conn: psycopg.Connection, schema: str, table: str) -> None:
        conn.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s AND target_schema = %s AND target_table = %s")
                     .format(self.copies), (self.pipeline, schema, table))

    def raise_fence(self, conn: psycopg.Connection, epoch: int | None) -> int:
        try:
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                sql.Literal(f"{int(self.lock_timeout * 1000)}ms")))
            conn.execute(sql.SQL("INSERT INTO {} (pipeline, epoch) VALUES (%s, 0) ON CONFLICT DO NOTHING")
                         .format(self.fence_table), (self.pipeline,))
            row = conn.execute(sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s FOR UPDATE")
                               .format(self.fence_table), (self.pipeline,)).fetchone()
            position = conn.execute(sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s").format(self.position),
                                    (self.pipeline,)).fetchone()
            stored = max([int(r[0]) for r in (row, position) if r] or [0])
            if epoch is None:
                epoch = stored + 1
            if stored <= epoch:
                stored = epoch
                conn.execute(sql.SQL("UPDATE {} SET epoch = %s WHERE pipeline = %s").format(self.fence_table),
                             (epoch, self.pipeline))
            conn.commit()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            raise FenceBusy() from exc
        return stored

    def shared_epoch(self, conn: psycopg.Connection) -> int | None:
        text = self._text(conn, ("shared-epoch",), lambda: sql.SQL(
            "SELECT epoch FROM {} WHERE pipeline = %s FOR SHARE").format(self.fence_table))
        row = conn.execute(text, (self.pipeline,)).fetchone()
        return int(row[0]) if row else None

    def fence_and_table_position(self, conn: psycopg.Connection, table: str) -> tuple[int | None, Position | None]:
        """Both locking reads in one statement (one round trip): the fence row shared and the
        table's position row for update, each locked to COMMIT; either may be missing."""
        text = self._text(conn, ("fence-and-table-position",), lambda: sql.SQL(
            'SELECT f.epoch, t.log, t."offset", t."row" FROM (SELECT) AS one'
            " LEFT JOIN (SELECT epoch FROM {} WHERE pipeline = %s FOR SHARE) AS f ON true"
            ' LEFT JOIN (SELECT log, "offset", "row" FROM {} WHERE pipeline = %s AND target_table = %s'
            " FOR UPDATE) AS t ON true").format(self.fence_table, self.table_position))
        row = conn.execute(text, (self.pipeline, self.pipeline, table)).fetchone()
        assert row is not None  # the outer (SELECT) gives one row
        epoch = int(row[0]) if row[0] is not None else None
        return epoch, stored_position(row[1:]) if row[1] is not None else None

    def read_position(self, conn: psycopg.Connection) -> tuple[Position | None, int | None]:
        row = conn.execute(
            sql.SQL('SELECT log, "offset", "row", gtid, epoch FROM {} WHERE pipeline = %s').format(self.position),
            (self.pipeline,),
        ).fetchone()
        fence = conn.execute(sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s").format(self.fence_table),
                             (self.pipeline,)).fetchone()
        conn.commit()
        position = Position(row[0], int(row[1]), row[3], row=int(row[2])) if row else None
        epochs = [int(r[-1]) for r in (row, fence) if r]
        return position, max(epochs) if epochs else None

    def has_tables(self, conn: psycopg.Connection) -> bool:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                           (self.position.as_string(conn), self.fence_table.as_string(conn))).fetchone()
        conn.rollback()
        return bool(row and row[0])

    def read_identity(self, conn: psycopg.Connection) -> str | None:
        row = conn.execute(sql.SQL("SELECT identity FROM {} WHERE pipeline = %s").format(self.identity),
                           (self.pipeline,)).fetchone()
        conn.commit()
        return as_text(row[0]) if row else None

    def read_server(self, conn: psycopg.Connection) -> dict[str, Any]:
        """The cluster's ``system_identifier`` (kept by its physical replicas, new at each initdb);
        without the right to read it (pg_control_system() is the superuser's and pg_monitor's),
        the server's address and port."""
        try:
            row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
            conn.commit()
            return {"system_identifier": as_text(row[0]) if row else None}
        except psycopg.errors.InsufficientPrivilege:
            conn.rollback()
        row = conn.execute("SELECT host(inet_server_addr()), inet_server_port()").fetchone()
        conn.commit()
        return {"address": row[0] if row else None, "port": row[1] if row else None}

    def write_identity(self, conn: psycopg.Connection, text: str) -> None:
        conn.execute(sql.SQL("INSERT INTO {} (pipeline, identity) VALUES (%s, %s) ON CONFLICT (pipeline)"
                             " DO UPDATE SET identity = EXCLUDED.identity, updated_at = now()").format(self.identity),
                     (self.pipeline, text))
        conn.commit()

    def write_position(self, conn: psycopg.Connection, batch: Batch) -> None:
        text = self._text(conn, ("write-position",), lambda: sql.SQL(
            'INSERT INTO {} (pipeline, log, "offset", "row", gtid, batch_id, epoch)'
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (pipeline) DO UPDATE SET"
            ' log = EXCLUDED.log, "offset" = EXCLUDED."offset", "row" = EXCLUDED."row", gtid = EXCLUDED.gtid,'
            " batch_id = EXCLUDED.batch_id, epoch = EXCLUDED.epoch, updated_at = now()"
        ).format(self.position))
        conn.execute(text, (self.pipeline, *end_values(batch)))

    def pipeline_position(self, conn: psycopg.Connection) -> Position | None:
        text = self._text(conn, ("pipeline-position",), lambda: sql.SQL(
            'SELECT log, "offset", "row" FROM {} WHERE pipeline = %s').format(self.position))
        row = conn.execute(text, (self.pipeline,)).fetchone()
        return stored_position(row)

    def table_position_locked(self, conn: psycopg.Connection, table: str) -> Position | None:
        text = self._text(conn, ("table-position",), lambda: sql.SQL(
            'SELECT log, "offset", "row" FROM {} WHERE pipeline = %s AND target_table = %s FOR UPDATE'
        ).format(self.table_position))
        row = conn.execute(text, (self.pipeline, table)).fetchone()
        return stored_position(row)

    def write_table_position(self, conn: psycopg.Connection, table: str, batch: Batch) -> None:
        text = self._text(conn, ("write-table-position",), lambda: sql.SQL(
            'INSERT INTO {} (pipeline, target_table, log, "offset", "row", gtid, batch_id, epoch)'
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (pipeline, target_table) DO UPDATE SET"
            ' log = EXCLUDED.log, "offset" = EXCLUDED."offset", "row" = EXCLUDED."row",'
            " gtid = EXCLUDED.gtid, batch_id = EXCLUDED.batch_id, epoch = EXCLUDED.epoch"
        ).format(self.table_position))
        conn.execute(text, (self.pipeline, table, *end_values(batch)))
