"""Chunk reads as Spark tasks (``source.snapshot.engine: spark``).

The driver still finds every chunk's boundaries on the server and places each chunk in the stream;
only the read itself (a consistent-snapshot transaction, its binlog position and its rows) runs as a
task, on ``local[*]`` or on whatever cluster ``spark.master`` names, so a large table is read by
many machines. The tasks use the Python driver (PyMySQL), so no JDBC jar is needed: the executors'
Python needs setl's dependencies (PyMySQL, attrs), and setl's own code is shipped with the jobs
(`SparkContext.addPyFile`, once per session), so an executor runs the driver's version of it. The
source's password travels to the executors inside the task (never logged). TLS to the source
(`source.ssl`) is not supported with this engine.
"""

from __future__ import annotations

import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

import attrs

from setl.dial import mysql_connection
from setl.model import Position
from setl.snapshot.reader import ChunkReader, TablePlan


@attrs.frozen
class ChunkTask:
    """One chunk read, as shipped to an executor."""

    connect: dict[str, Any] = attrs.field(repr=False)  # PyMySQL connect() arguments, password included
    plan: TablePlan
    lower: tuple[Any, ...] | None
    upper: tuple[Any, ...] | None


def read_task(task: ChunkTask) -> tuple[str, int, list[dict[str, Any]]]:
    """Runs on an executor: the chunk's rows and its snapshot's binlog position (file, offset)."""

    conn = mysql_connection(**task.connect)
    try:
        ChunkReader.prepare(conn)
        rows, position = ChunkReader(lambda: conn, "").read(conn, task.plan, task.lower, task.upper,
                                                            lambda _: None)
    finally:
        conn.close()
    return position.log, position.offset, rows


class SparkReads:
    """Reads chunks as Spark jobs of one task each, on the node's one SparkSession (`setl.spark`)."""

    _shipped: set[int] = set()  # the SparkContexts setl's code was added to
    _lock = threading.Lock()

    def __init__(self, connect: dict[str, Any], spark: Any) -> None:
        self.connect = connect
        self.spark = spark  # the node's SparkConfig

    @classmethod
    def ship(cls, context: Any) -> None:
        """Add a zip of the running setl package to the context's Python files, once."""
        with cls._lock:
            if id(context) in cls._shipped:
                return
            root = Path(__file__).resolve().parents[1]  # the setl package this module belongs to
            path = Path(tempfile.mkdtemp(prefix="setl-pyfiles-")) / "setl.zip"
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
                for source in sorted(root.rglob("*.py")):
                    archive.write(source, source.relative_to(root.parent).as_posix())
            context.addPyFile(str(path))
            cls._shipped.add(id(context))

    def read(self, plan: TablePlan, lower: tuple[Any, ...] | None,
             upper: tuple[Any, ...] | None) -> tuple[list[dict[str, Any]], Position]:
        from setl.spark import get_session

        context = get_session(self.spark).sparkContext
        self.ship(context)
        task = ChunkTask(self.connect, plan, lower, upper)
        context.setJobDescription(f"setl snapshot {plan.name}")
        ((log, offset, rows),) = context.parallelize([task], 1).map(read_task).collect()
        return rows, Position(log, offset)
