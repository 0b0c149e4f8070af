"""A PostgreSQL database as the target, through psycopg 3.

Each batch is one transaction: ``DELETE ... WHERE (key) IN (...)`` for the merged deletes, then
multi-row ``INSERT ... ON CONFLICT (key) DO UPDATE`` of the full after-images (from `copy_rows`
rows of one shape on, as a snapshot chunk of reads is: ``COPY`` into a temporary table, then one
``INSERT ... SELECT ... ON CONFLICT``; runs of inserts and reads into a keyless table: ``COPY``
into it), then the batch's
end position, batch id and epoch in ``setl.setl_position`` (see `SqlLoad` for the guarantees).
Target tables must exist, or be made by replicated DDL: a change's ``schema`` is the PostgreSQL
schema, its ``table`` the table (in the configured database). Under ``pipeline.ddl: apply`` MySQL
table DDL is translated (`setl.sinks.postgresql_ddl` lists what is and what is refused with a
`LoadError`) and runs inside the batch's transaction. Tables without a primary key are matched on
every column with ``IS NOT DISTINCT FROM`` (one row per change, by ctid). Values go through
psycopg's adapters (bytes as bytea, Decimal as numeric, timedelta as interval); dicts and lists
are sent as jsonb. The session time zone is UTC. Zero and partial dates (`InvalidDate`) follow the
target's ``invalid_dates`` policy (`setl.sinks.invalid_dates`): refused by default, or NULL.
Spatial values (`setl.values.Geometry`) go as PostGIS geometry, WKB bytea or WKT text by the
target's ``spatial`` option (`setl.sinks.postgresql_spatial`).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import attrs
import psycopg
import psycopg.errors
from psycopg import sql

from setl.config import SslConfig
from setl.ddl import with_table
from setl.errors import LoadError, RefusedLoadError, TableRefused, TransientLoadError
from setl.model import Batch
from setl.sinks import postgresql_spatial as spatial
from setl.sinks.invalid_dates import InvalidDatePolicy
from setl.sinks.nul_text import HINT as NUL_HINT
from setl.sinks.nul_text import NulTextPolicy
from setl.sinks.postgresql_ddl import Translator, UnsupportedDdl, without_sequence_ddl
from setl.sinks.postgresql_positions import PostgresPositionStore
from setl.sinks.postgresql_rows import CHUNK_ROWS, PostgresqlRows, StatementCache, identifier, native, to_db
from setl.sinks.postgresql_staging import PostgresStaging
from setl.sinks.sql_common import SqlLoad
from setl.sinks.sql_failures import CurrentTable, TargetTableMissing, ddl_refused, load_context
from setl.sinks.sql_segments import DdlStep
from setl.tls import libpq_params


@attrs.frozen
class PostgresqlTargetConfig:
    type: Literal["postgresql"]
    host: str = "127.0.0.1"  # the PostgreSQL server written
    port: int = 5432  # its TCP port
    user: str = "postgres"  # needs the grants in docs/grants.md
    password: str = attrs.field(default="", repr=False)  # may be "${ENV_VAR}"; never logged
    database: str = "postgres"  # the database written; a change's schema is the PostgreSQL schema
    #: what to write for a zero or partial date (`setl.sinks.invalid_dates`): refuse or null
    invalid_dates: Literal["refuse", "null"] = "refuse"
    #: what to do with text holding NUL (0x00), which PostgreSQL cannot store (`setl.sinks.nul_text`)
    nul_in_text: Literal["refuse", "strip", "escape"] = "refuse"
    #: spatial columns (`setl.sinks.postgresql_spatial`): PostGIS geometry, WKB bytea or WKT text;
    #: auto: postgis when the extension is in the target database, else wkb
    spatial: Literal["auto", "postgis", "wkb", "wkt"] = "auto"
    #: a partitioned source table: plain (a plain table holding the same rows) or refuse (stop:
    #: `setl.sinks.postgresql_ddl`, `setl.schema.postgresql`)
    partitions: Literal["plain", "refuse"] = "plain"
    ssl: SslConfig | None = None  # TLS: sslmode verify-full (require with verify false); none: libpq's prefer


log = logging.getLogger(__name__)

# SQLSTATE classes and codes worth a reconnect and replay.
TRANSIENT_STATES = ("08", "40", "57P01", "57P02", "57P03", "53300", "55P03")
MISSING_TABLE_STATES = ("42P01", "3F000")  # undefined table, invalid schema name
# One table's rows that no retry changes (`setl.errors.TableRefused`, docs/quarantine.md): a data
# exception (class 22: too long, out of range, invalid text), a NOT NULL or CHECK violation, a
# missing privilege, an undefined column. Not a serialization failure, a deadlock or a lost
# connection (TRANSIENT_STATES), nor a foreign key (another table's state).
TABLE_REFUSED_STATES = ("22", "23502", "23514", "42501", "42703")
# A DDL's failure that says nothing of its table: insufficient resources, an operator's or a
# timeout's cancel, a system or internal error. Not quarantined: it pauses, or is retried, as before.
NOT_A_TABLES_REFUSAL = ("53", "57", "58", "XX")


class PostgresqlDialect:
    """The PostgreSQL `SqlDialect` (`setl.sinks.sql_dialect`): psycopg sessions in UTC with spatial
    values registered, `PostgresqlRows` for rows, MySQL DDL translated and run in the batch's
    transaction (PostgreSQL DDL is transactional), errors by SQLSTATE."""

    name = "postgresql"
    transactional_ddl = True

    def __init__(self, config: PostgresqlTargetConfig, *, pipeline: str, chunk_rows: int, copy_rows: int,
                 connect_timeout: int) -> None:
        self.config = config
        self.pipeline = pipeline
        self.connect_timeout = connect_timeout
        self.statements = StatementCache()
        self.rows = PostgresqlRows(chunk_rows=chunk_rows, copy_rows=copy_rows, statements=self.statements)
        self.invalid_dates = InvalidDatePolicy(getattr(config, "invalid_dates", "refuse"),
                                                pipeline=pipeline, target="PostgreSQL")
        self.nul_text = NulTextPolicy(getattr(config, "nul_in_text", "refuse"), pipeline=pipeline,
                                       target="PostgreSQL")
        #: the form of spatial values the last connection opened resolved `config.spatial` to
        self._spatial: spatial.SpatialForm = "wkb"

    def position_store(self, *, pipeline: str, schema: str, table: str, token: str, lock_timeout: float,
                       writing: CurrentTable) -> PostgresPositionStore:
        return PostgresPositionStore(pipeline=pipeline, schema=schema, table=table, token=token,
                                     lock_timeout=lock_timeout, describe=self.describe, writing=writing,
                                     text=self.statements.text)

    def staging(self) -> PostgresStaging:
        return PostgresStaging(self.pipeline)

    def narrow(self, batch: Batch) -> Batch:
        """Sequence DDL left out, zero and partial dates handled by the ``invalid_dates`` policy and
        text holding NUL by ``nul_in_text``."""
        return self.nul_text.apply(self.invalid_dates.apply(without_sequence_ddl(batch, self.pipeline)))

    def connect(self) -> psycopg.Connection:
        conn = self._open()
        try:
            form = spatial.resolve(conn, getattr(self.config, "spatial", "auto"))
            spatial.register(conn, form)
        except BaseException:
            conn.close()
            raise
        self._spatial = form
        return conn

    def _open(self) -> psycopg.Connection:
        return psycopg.connect(
            host=self.config.host,
            port=self.config.port,
            user=self.config.user,
            password=self.config.password or None,
            dbname=self.config.database,
            connect_timeout=self.connect_timeout,
            autocommit=False,
            application_name=f"setl:{self.pipeline}"[:63],
            options="-c TimeZone=UTC",
            client_encoding="UTF8",  # an SQL_ASCII database would hand names and text back as bytes
            **libpq_params(getattr(self.config, "ssl", None)),
        )

    def disconnect(self, conn: psycopg.Connection) -> None:
        conn.close()

    def commit(self, conn: psycopg.Connection) -> None:
        conn.commit()

    def rollback(self, conn: psycopg.Connection) -> None:
        if not conn.closed:
            conn.rollback()

    def apply_ddl(self, conn: psycopg.Connection, batch: Batch, step: DdlStep) -> None:
        """Translate the MySQL DDL (see `setl.sinks.postgresql_ddl`) and run it in the batch's
        transaction: PostgreSQL DDL is transactional, so a replay finds it undone or committed
        with the batch's position. A statement it cannot translate fails the batch."""
        change = step.change
        context = load_context(self.pipeline, batch, change.qualified_table)
        translator = Translator(change.schema, spatial=self._spatial,
                                partitions=getattr(self.config, "partitions", "plain"))
        try:
            statements = translator.translate(step.statement)
        except (UnsupportedDdl, ValueError) as exc:
            raise ddl_refused(f"cannot translate this DDL for PostgreSQL: {exc}", change, step.statement,
                              context) from exc
        if not statements:
            log.warning("pipeline=%s stage=load table=%s position=%s: index DDL is not applied to "
                        "PostgreSQL: %s", self.pipeline, change.qualified_table, change.position or batch.end,
                        change.statement)
        if step.statement.kind == "create_table":
            ref = step.statement.tables[0]
            schema = ref.schema or change.schema
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(identifier(schema)))
            name = identifier(schema, ref.table).as_string(conn)
            plain = not {"REPLACE", "EXISTS"} & {t.upper for t in step.statement.tokens[:ref.start]}
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
            if plain and exists and exists[0]:
                if not self._same_shape(conn, step, name):
                    raise ddl_refused(f"table {schema}.{ref.table} already exists with another shape", change,
                                      step.statement, context)
                log.info("pipeline=%s stage=load table=%s: table exists with the same shape; CREATE "
                         "TABLE counts as applied", self.pipeline, change.qualified_table)
                return
        for table, why in translator.needs_empty:
            row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()
            if row and row[0]:
                raise ddl_refused(f"it cannot apply exactly on PostgreSQL: {table} has rows and {why}", change,
                                  step.statement, context)
        for statement in statements:
            try:
                conn.execute(statement)
            except psycopg.Error as exc:
                if self.refuses(exc):
                    raise ddl_refused(self.describe(exc), change, step.statement, context) from exc
                raise  # transient, or a missing table: as any statement's

    def _same_shape(self, conn: psycopg.Connection, step: DdlStep, name: str) -> bool:
        """Whether table `name` has the columns (names, types, NOT NULL, primary key) the CREATE
        TABLE gives, checked against a scratch temporary table inside a savepoint."""
        scratch = with_table(step.statement, "pg_temp", "setl_shape_check")
        shape = ("SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, i.indrelid IS NOT NULL"
                 " FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary"
                 " AND a.attnum = ANY(i.indkey)"
                 " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum")
        conn.execute("SAVEPOINT setl_shape_check")
        try:
            for statement in Translator(step.change.schema, spatial=self._spatial).translate(scratch):
                conn.execute(statement)
            return (conn.execute(shape, (name,)).fetchall()
                    == conn.execute(shape, ("pg_temp.setl_shape_check",)).fetchall())
        finally:
            conn.execute("ROLLBACK TO SAVEPOINT setl_shape_check")

    def classify(self, exc: BaseException) -> type[LoadError] | type[TargetTableMissing] | None:
        if _nul_refused(exc):
            return RefusedLoadError  # the same rows fail the same way: pause at once
        if isinstance(exc, psycopg.Error):
            state = exc.sqlstate or ""
            if state in MISSING_TABLE_STATES:
                return TargetTableMissing
            if state and state.startswith(TRANSIENT_STATES):
                return TransientLoadError
            if state and state.startswith(TABLE_REFUSED_STATES):
                return TableRefused
            if not state and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                return TransientLoadError  # the connection broke before the server answered
            return LoadError
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return TransientLoadError
        return LoadError

    def refuses(self, exc: BaseException) -> bool:
        """Whether the server's answer to a DDL statement is one no retry changes and that is its
        table's (`ddl_refused`): not transient, not a missing table, not `NOT_A_TABLES_REFUSAL`."""
        state = getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None
        return bool(state) and not str(state).startswith(NOT_A_TABLES_REFUSAL) and self.classify(exc) in (
            LoadError, TableRefused, RefusedLoadError)

    def describe(self, exc: BaseException) -> str:
        if _nul_refused(exc):
            return NUL_HINT
        if isinstance(exc, spatial.NoPostgis):
            return str(exc)
        if isinstance(exc, psycopg.Error):
            text = " ".join(str(exc).split())
            return f"{text} (SQLSTATE {exc.sqlstate})" if exc.sqlstate else text
        return f"{type(exc).__name__}: {exc}"


def _nul_refused(exc: BaseException) -> bool:
    """Whether `exc` is psycopg refusing text that holds NUL (it checks before sending)."""
    return isinstance(exc, psycopg.DataError) and "NUL (0x00)" in str(exc)



class PostgresqlLoad(SqlLoad[psycopg.Connection]):
    """Loads batches into PostgreSQL (see the module docstring and `SqlLoad`)."""

    dialect = "postgresql"
    config: PostgresqlTargetConfig
    sql: PostgresqlDialect

    def __init__(self, config: PostgresqlTargetConfig, *, connect_timeout: int = 10, copy_rows: int = 1000,
                 **options: Any) -> None:
        """`copy_rows`: from how many rows of one shape (a table's upserts, or a keyless table's run
        of inserts and reads) a batch sends them with ``COPY`` rather than multi-row INSERTs.
        `options` are `SqlLoad`'s (pipeline, ddl, position table, chunking, retries)."""
        options.setdefault("chunk_rows", CHUNK_ROWS)
        sql = PostgresqlDialect(config, pipeline=options["pipeline"], chunk_rows=options["chunk_rows"],
                                copy_rows=copy_rows, connect_timeout=connect_timeout)
        super().__init__(config, sql, **options)

    def __repr__(self) -> str:
        return f"<PostgresqlLoad {self.pipeline} -> {self.config.host}:{self.config.port}/{self.config.database}>"


__all__ = ["PostgresqlDialect", "PostgresqlLoad", "native", "to_db"]
