"""Run a real pipeline in-process for end-to-end tests: the MariaDB binlog source, the table
rules' Extract and a SQL sink under the scheduler, from a given binlog position until caught up."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import Any

import attrs

from setl.config import BatchSettings, LoadSettings, PipelineSettings, RetrySettings, TableRule
from setl.meta.sqlite import SqliteMetaStore
from setl.model import Position
from setl.scheduler import Outcome, Scheduler
from setl.sources.mysql_binlog import MysqlBinlogSource
from setl.stages import TableExtract, Transform
from setl.stages.load import Load
from setl.testing.servers import MariaDBServer

_server_ids = itertools.count(7000 + os.getpid() % 1000 * 10)

SETTINGS = PipelineSettings(
    parallelism=2,
    batch=BatchSettings(max_rows=50, max_wait_ms=20),
    retry=RetrySettings(max_attempts=3, initial_backoff_ms=10, max_backoff_ms=50),
    drain_timeout_ms=10000,
)


def binlog_head(server: MariaDBServer) -> Position:
    """Where the server's binlog ends now."""
    log, offset = server.query("SHOW MASTER STATUS")[0][:2]
    return Position(log, int(offset))


def table_rule(source: str, target: str, **options: Any) -> TableRule:
    return TableRule(source=source, target=target, **options)


def replicate(source: MariaDBServer, start: Position, rules: list[TableRule], load: Load, meta_dir: Path,
              name: str = "e2e", settings: PipelineSettings = SETTINGS,
              outcome: Outcome = Outcome.CAUGHT_UP, **source_options: Any) -> Scheduler:
    """Run the pipeline from `start` until it has acked the binlog's end as it stands now; return the
    scheduler (its `acked_batches`, `error`). Fails the test if it ends other than `outcome`. The
    source hands on sequence state rows when `load` declares it applies them, as pipeline assembly
    has it do; `source_options` are more of `MysqlBinlogSource`'s settings."""
    select = MysqlBinlogSource(host=source.host, port=source.port, user=source.user, password=source.password,
                               server_id=next(_server_ids), flavor="mariadb", start=start, pipeline=name,
                               sequences=load.capabilities.sequences, **source_options)
    meta = SqliteMetaStore(meta_dir / f"{name}.db")
    scheduler = Scheduler(name, settings, select, TableExtract(rules, pipeline=name), Transform(), load, meta)
    try:
        ended = scheduler.run(until_caught_up=True)
    finally:
        load.close()
        meta.close()
    assert ended is outcome, f"pipeline ended {ended}: {scheduler.error}"
    return scheduler


def write_source(source: MariaDBServer, source_db: str) -> Position:
    """A keyed and a keyless source table; 30 transactions each touching both; the binlog start before them."""
    with contextlib.closing(source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE k (id INT PRIMARY KEY, v INT NOT NULL)")
        cur.execute("CREATE TABLE loose (v INT NOT NULL)")
    start = binlog_head(source)
    with contextlib.closing(source.connect(database=source_db, autocommit=False)) as conn, conn.cursor() as cur:
        for n in range(30):
            cur.execute("INSERT INTO loose VALUES (%s), (%s)", (n % 4, n % 4))
            cur.execute("INSERT INTO k VALUES (%s, %s)", (n, n))
            if n % 3 == 0:
                cur.execute("DELETE FROM loose WHERE v = %s LIMIT 1", (n % 4,))
            conn.commit()
    return start


PER_TABLE = attrs.evolve(SETTINGS, load=LoadSettings(mode="per_table"),
                         retry=RetrySettings(max_attempts=6, initial_backoff_ms=10, max_backoff_ms=50))
