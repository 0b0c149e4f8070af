"""A whole `setl verify` run: connect to the pipeline's source and target as the pipeline does,
plan each selected table along the routing plan, compare them (`Verifier`), and report."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from setl import connectors
from setl.config import NodeSettings, PipelineConfig
from setl.errors import SetlError
from setl.meta.base import MetaStore, PipelineState, Status
from setl.model import SCHEMA_REFUSED, Position, TableName
from setl.routing import Route, build_plan
from setl.snapshot.reader import ChunkReader
from setl.stages.snapshot import SnapshotCapable
from setl.status import lag_seconds
from setl.verify import mariadb, postgresql
from setl.verify.compare import Verifier
from setl.verify.ends import End
from setl.verify.pace import VerifyError
from setl.verify.plan import plan_table
from setl.verify.report import Report
from setl.verify.spark_engine import EndSpec, SparkChunks
from setl.verify.spark_engine import target_connect as spark_target

_SYSTEM = ("mysql", "information_schema", "performance_schema", "sys")


def selected_tables(conn: Any, selects: Any) -> list[TableName]:
    """Every base table of the source that the pipeline's rules replicate."""
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
                    f"AND TABLE_SCHEMA NOT IN ({', '.join(['%s'] * len(_SYSTEM))}) ORDER BY 1, 2", _SYSTEM)
        return [TableName(str(s), str(t)) for s, t in cur.fetchall() if selects(str(s), str(t))]


def schema_refusal(state: PipelineState, route: Route) -> str | None:
    """Why `route`'s table is not compared when the pipeline stopped at a DDL of it that its
    ``schema_changes`` policy refuses (`setl.model.DdlChange.refusal`); None otherwise. Its target
    table is as it was before that DDL: a difference by decision, reported as such, never equal."""
    error = state.error or ""
    named = any(f"table={route.target}{end}" in error for end in (" ", ":"))
    if state.status is not Status.PAUSED or SCHEMA_REFUSED not in error or not named:
        return None
    return (f"the pipeline stopped at a schema change its schema_changes policy ({route.schema_changes}) refuses, "
            f"and the target table is as it was before it: {error}")


def verify_pipeline(settings: NodeSettings, config: PipelineConfig, meta: MetaStore, tables: Sequence[TableName],
                    *, attempts: int = 3, max_rows_per_second: float = 0.0, chunk_rows: int = 10_000,
                    wait_timeout: float = 60.0, progress: Callable[[str, int, int, bool], None] | None = None,
                    sleep: Callable[[float], None] = time.sleep, max_lag: float = 0.0, lag_timeout: float = 600.0,
                    paused: Callable[[str, float | None], None] | None = None, engine: str = "local") -> Report:
    """Compare `tables` (all that the rules select when empty) of `config`'s pipeline; `progress`
    and `paused` as `Verifier`'s; `sleep` every wait's (a scheduled check's raises when the node
    stops); `max_lag` (0: off) and `lag_timeout` pause the check while the pipeline's lag (as
    `setl status` shows it) is above the bound. `engine` ``spark`` hashes the chunks of keyed tables as
    Spark tasks on the node's ``spark.master`` (`setl.verify.spark_engine`), ``local`` here."""
    name = config.name
    started = time.monotonic()
    plan = build_plan(settings, config)
    select = connectors.build_select(config, settings, selects=plan.selects)
    if not isinstance(select, SnapshotCapable):
        raise VerifyError(f"source type {config.source.type} cannot be read in consistent snapshots; "
                          "setl verify needs a MySQL/MariaDB source", pipeline=name, stage="verify")
    dialect = {"mysql": "mysql", "postgresql": "postgresql"}.get(config.target.type)
    if dialect is None:
        raise VerifyError(f"target type {config.target.type} cannot be verified (MariaDB/MySQL and PostgreSQL "
                          "targets can)", pipeline=name, stage="verify")
    chunks = None
    if engine == "spark":
        source_connect, target_connect = select.snapshot_access().task_connect, spark_target(config.target, dialect)
        if source_connect is None or target_connect is None:
            raise VerifyError("--engine spark does not support TLS to the source or the target (source.ssl, "
                              "target.ssl: the Spark tasks connect without it); use --engine local", pipeline=name,
                              stage="verify")
        chunks = SparkChunks(name, settings.spark, EndSpec("source", "mysql", dict(source_connect)),
                             EndSpec("target", dialect, target_connect))
    elif engine != "local":
        raise VerifyError(f"unknown engine {engine!r} (local or spark)", pipeline=name, stage="verify")
    sql = mariadb if dialect == "mysql" else postgresql
    schema = connectors.build_schema(config, settings)
    assert schema is not None  # both SQL targets create tables
    source_conn: Any = None
    report = Report(name)

    def acked() -> Position | None:
        ack = meta.position(name)
        return ack.position if ack is not None else None

    verifier = Verifier(name, acked, attempts=attempts, max_rows_per_second=max_rows_per_second,
                        wait_timeout=wait_timeout, progress=progress, sleep=sleep,
                        lag=lambda: lag_seconds(meta, name), max_lag=max_lag, lag_timeout=lag_timeout,
                        paused=paused, chunks=chunks)
    current = ""
    try:
        source_conn = select.snapshot_access().connect()
        mariadb.prepare(source_conn)
        target_conn = schema.conn
        sql.prepare(target_conn)
        reader = ChunkReader(lambda: source_conn, name)
        reader.check(source_conn, select.snapshot_access().where)
        copying = meta.copies_not_done(name)  # their target tables are stale until done: not drift
        for table in tables or selected_tables(source_conn, plan.selects):
            current = str(table)
            route = plan.route(table.schema, table.table)
            if route is None:
                raise VerifyError("no table rule of the pipeline selects it", pipeline=name, stage="verify",
                                  table=current)
            if table in copying:
                report.skipped[current] = (f"its copy is {copying[table]} (the target table holds its old rows "
                                           "until the copy is done): verify it again once setl status says done")
                continue
            refused = schema_refusal(meta.state(name), route)
            if refused is not None:
                report.stopped[current] = refused
                continue
            found = reader.plan(source_conn, table)
            if found is None:
                raise VerifyError("no such source table", pipeline=name, stage="verify", table=current)
            json = mariadb.json_columns(source_conn, table.schema, table.table) & set(found.columns)
            if json:
                found = attrs.evolve(found, types={**found.types, **{c: "json" for c in json}})
            check = plan_table(found, route, sql.columns(target_conn, route.target.schema, route.target.table),
                               dialect, pipeline=name)
            source_end = End(source_conn, mariadb, check, "source")
            target_end = End(target_conn, sql, check, "target")

            def boundary(after: tuple[Any, ...] | None, plan_: Any = found) -> tuple[Any, ...] | None:
                return reader.boundary(source_conn, plan_, after, chunk_rows)

            report.tables.append(verifier.table(check, source_end, target_end, boundary))
    except SetlError as exc:
        exc.with_context(pipeline=name, stage="verify", table=current or None)
        exc.exit_code = 2
        raise
    except Exception as exc:  # a driver's error: a server away, a refused statement
        cause = " ".join(str(exc).split())  # psycopg's messages span lines: one line, as every error
        raise VerifyError(f"{type(exc).__name__}: {cause}", pipeline=name, stage="verify",
                          table=current or None) from exc
    finally:
        if source_conn is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                source_conn.close()
        schema.close()
    report.seconds = time.monotonic() - started
    return report
