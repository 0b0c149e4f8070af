"""Chunk hashing as Spark tasks (`setl verify --engine spark`).

The driver still cuts a table into chunks (the snapshot's chunker), waits for the pipeline's acked
position and drills differing chunks down to rows; only the chunk aggregates run as Spark jobs on
``spark.master``: a window of chunks is split among the tasks of one job per end, and each task
opens its own connection to that end and runs, chunk by chunk, the same server-side hash query as
the local engine (`setl.verify.ends.End.summary`, each source chunk in its own consistent snapshot,
whose binlog position comes back with the aggregate). The tasks use the Python drivers (PyMySQL,
psycopg), so no JDBC jar is needed, and setl's code is shipped with the jobs as for the snapshot's
Spark engine (`setl.snapshot.spark_engine`). Passwords travel inside the tasks (never logged); TLS
to either end cannot travel and is refused.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import attrs

from setl.config import SparkConfig
from setl.dial import mysql_connection
from setl.errors import SetlError
from setl.model import Position
from setl.verify import mariadb, postgresql
from setl.verify.ends import End
from setl.verify.plan import TableCheck

Range = tuple[Any, Any]

log = logging.getLogger("setl.verify")


class SparkEngineError(SetlError):
    """The Spark engine cannot run (exit 2)."""

    exit_code = 2


@attrs.frozen
class EndSpec:
    """What a task needs to read one end: its side, its SQL dialect and the driver's connect() arguments."""

    side: str  # "source" or "target"
    dialect: str  # "mysql" or "postgresql"
    connect: dict[str, Any] = attrs.field(repr=False)


def target_connect(target: Any, dialect: str) -> dict[str, Any] | None:
    """The driver's connect() arguments for a task's connection to the pipeline's target (its config,
    `target`); None with TLS, whose context cannot travel."""
    if getattr(target, "ssl", None) is not None:
        return None
    common = {"host": target.host, "port": target.port, "user": target.user, "connect_timeout": 10}
    if dialect == "mysql":
        return {**common, "password": target.password or "", "database": target.database, "charset": "utf8mb4",
                "autocommit": True}
    return {**common, "password": target.password or None, "dbname": target.database, "autocommit": False,
            "application_name": "setl verify", "options": "-c TimeZone=UTC",
            "client_encoding": "UTF8"}


def hash_chunks(spec: EndSpec, check: TableCheck, chunks: Sequence[tuple[int, Any, Any]]
                ) -> list[tuple[int, int, int, str | None, int | None]]:
    """Runs on an executor: (index, rows, hash sum, snapshot log, offset) of each chunk at `spec`'s end,
    each in a transaction of its own (on the source a consistent snapshot, with its binlog position)."""
    if spec.dialect == "mysql":

        conn: Any = mysql_connection(**spec.connect)
        engine: Any = mariadb
    else:
        import psycopg

        conn = psycopg.connect(**spec.connect)
        engine = postgresql
    try:
        engine.prepare(conn)
        end = End(conn, engine, check, spec.side)
        out = []
        for index, lower, upper in chunks:
            with end.snapshot() as position:
                rows, total = end.summary(lower, upper)
            out.append((index, rows, total, position.log if position else None,
                        position.offset if position else None))
        return out
    finally:
        conn.close()


def _task_error(exc: BaseException) -> str:
    """The Python error that failed a Spark task (the last line of its traceback), else Spark's own."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    python = [line for line in lines if "Error:" in line and not line.startswith(("at ", "py4j", "org.apache"))]
    return (python[-1] if python else lines[0] if lines else type(exc).__name__)[:500]


@attrs.define
class SparkChunks:
    """Hashes windows of chunks as Spark jobs (`Verifier.chunks`) on the node's one SparkSession."""

    pipeline: str
    spark: SparkConfig
    source: EndSpec
    target: EndSpec

    def _run(self, spec: EndSpec, check: TableCheck, ranges: Sequence[Range]
             ) -> list[tuple[int, int, Position | None]]:
        from setl.snapshot.spark_engine import SparkReads
        from setl.spark import get_session

        context = get_session(self.spark).sparkContext
        SparkReads.ship(context)
        # the routing plan's filter and transforms are not needed to hash (sql mode has neither
        # filter nor compared transform columns) and may not pickle
        shipped = attrs.evolve(check, route=attrs.evolve(check.route, filter=None, steps=()))
        chunks = [(i, low, high) for i, (low, high) in enumerate(ranges)]
        tasks = max(1, min(len(chunks), int(context.defaultParallelism)))
        groups = [chunks[i::tasks] for i in range(tasks)]
        context.setJobDescription(f"setl verify {self.pipeline} {check.source.name} ({spec.side})")
        try:
            found = context.parallelize(groups, tasks).flatMap(functools.partial(hash_chunks, spec, shipped)) \
                .collect()
        except Exception as exc:  # a task's error comes back wrapped by Py4J, with the JVM's stack
            raise SparkEngineError(f"a Spark task hashing the {spec.side}'s chunks failed: {_task_error(exc)}",
                                   pipeline=self.pipeline, stage="verify", table=str(check.source.name)) from exc
        log.info("pipeline=%s stage=verify table=%s %d chunk(s) hashed on the %s by %d Spark task(s)", self.pipeline,
                 check.source.name, len(chunks), spec.side, tasks)
        by_index = {index: (rows, total, None if log is None or offset is None else Position(log, offset))
                    for index, rows, total, log, offset in found}
        return [by_index[i] for i in range(len(chunks))]

    def source_summaries(self, check: TableCheck, ranges: Sequence[Range]
                         ) -> list[tuple[tuple[int, int], Position | None]]:
        """Each range's (rows, hash sum) on the source, with the binlog position of its snapshot."""
        return [((rows, total), position) for rows, total, position in self._run(self.source, check, ranges)]

    def target_summaries(self, check: TableCheck, ranges: Sequence[Range]) -> list[tuple[int, int]]:
        """Each range's (rows, hash sum) on the target."""
        return [(rows, total) for rows, total, _ in self._run(self.target, check, ranges)]
