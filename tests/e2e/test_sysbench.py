"""sysbench ``oltp_write_only`` on a real MariaDB source while `setl start` replicates it: the
target ends equal to the source, also through SIGKILLs of setl and an outage of the target.

The first test replicates ``sysbench prepare`` itself (CREATE TABLE, rows, CREATE INDEX) into an
empty database. The others keep the DDL out of the binlog and create the target tables
themselves, so they test rows alone; their pipelines start at the binlog position taken just
before the tables are filled, so the initial rows travel through setl as well.
"""

from __future__ import annotations

import re
import signal
import time

from setl.model import Position
from setl.testing.servers import free_port, wait_until
from tests.e2e.setl_process import (
    SetlProcess,
    binlog_head,
    mysql_source,
    mysql_target,
    postgres_target,
    spawned,
)
from tools import sysbench

TABLES = 3
TABLE_SIZE = 500
THREADS = 3
RATE = 250  # transactions/s over all threads, about 1,000 row changes/s
SECONDS = 6
NAMES = [f"sbtest{n}" for n in range(1, TABLES + 1)]


def prepare_source(server, database: str, ddl_in_binlog: bool = False) -> Position:
    """Fill the sysbench tables on `server`; return the binlog position from before them."""
    start = binlog_head(server)
    sysbench.prepare(sysbench.Conn.from_server(server, database), tables=TABLES, table_size=TABLE_SIZE,
                     ddl_in_binlog=ddl_in_binlog)
    return start


def make_setl(tmp_path, source, database: str, start: Position, target: dict, target_name: str,
              **pipeline) -> SetlProcess:
    settings = {"parallelism": 3, "batch": {"max_rows": 2000, "max_wait_ms": 50},
                "retry": {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 500}}
    settings.update(pipeline)
    return SetlProcess(tmp_path, source=mysql_source(source, start={"file": start.log, "pos": start.offset}),
                       target=target, tables=[{"source": rf"{re.escape(database)}\..*", "target": target_name}],
                       pipeline=settings)


def load(server, database: str, seconds: float = SECONDS) -> sysbench.Running:
    return sysbench.start(sysbench.Conn.from_server(server, database), seconds=seconds, threads=THREADS,
                          rate=RATE, tables=TABLES, table_size=TABLE_SIZE)


def wait_caught_up(setl: SetlProcess, source, proc, timeout: float = 90) -> None:
    """Wait until the running `proc` has acked the source's current binlog end."""
    head = binlog_head(source)

    def caught_up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"setl exited with {proc.returncode}:\n{setl.logs()[-3000:]}")
        ack = setl.acked()
        return ack is not None and ack.position >= head

    wait_until(caught_up, timeout=timeout, interval=0.1, message=lambda: f"an ack at {head} (at {setl.acked()})")


def wait_acked_past(setl: SetlProcess, proc, batch_id: int, timeout: float = 60) -> None:
    def moved() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"setl exited with {proc.returncode}:\n{setl.logs()[-3000:]}")
        ack = setl.acked()
        return ack is not None and ack.batch_id > batch_id

    wait_until(moved, timeout=timeout, interval=0.05, message=f"an ack after batch {batch_id}")


def assert_mariadb_equal(source, source_db: str, target, target_db: str) -> None:
    mine = sysbench.checksums(sysbench.Conn.from_server(source, source_db))
    theirs = sysbench.checksums(sysbench.Conn.from_server(target, target_db))
    assert sorted(mine) == NAMES
    assert all(mine.values()), "a source table is empty: the test proves nothing"
    assert theirs == mine


def create_target_tables(server, database: str) -> None:
    sysbench.create_tables(sysbench.Conn.from_server(server, database), tables=TABLES)


def stoppable_target(mariadb_factory, server_id: int):
    """A target of its own (the test stops it), on a fixed port, with the sysbench tables in `sb`."""
    target = mariadb_factory(port=free_port(), server_id=server_id)
    target.query("CREATE DATABASE sb")
    create_target_tables(target, "sb")
    return target


def test_sysbench_prepare_and_load_replicate_to_mariadb(tmp_path, mariadb_source, source_db, mariadb_target,
                                                       mysql_db):
    """sysbench prepare (DDL and rows) then oltp_write_only from several threads, replicated by a running
    `setl start` into an empty target database, end with every table's CHECKSUM equal."""
    start = prepare_source(mariadb_source, source_db, ddl_in_binlog=True)
    setl = make_setl(tmp_path, mariadb_source, source_db, start, mysql_target(mariadb_target),
                     f"{mysql_db}.{{table}}")
    with spawned(setl) as proc:
        result = load(mariadb_source, source_db).wait()
        wait_caught_up(setl, mariadb_source, proc)
        assert setl.stop(proc) == 0, setl.logs()[-3000:]
    assert result.transactions > SECONDS * RATE / 2
    assert_mariadb_equal(mariadb_source, source_db, mariadb_target, mysql_db)
    assert setl.status()["error"] is None


def test_sigkill_during_load_then_restart_ends_equal(tmp_path, mariadb_source, source_db, mariadb_target, mysql_db):
    """`setl start` SIGKILL-ed three times during the load and restarted each time ends with every table equal."""
    start = prepare_source(mariadb_source, source_db)
    create_target_tables(mariadb_target, mysql_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, start, mysql_target(mariadb_target),
                     f"{mysql_db}.{{table}}")
    prepared = sysbench.checksums(sysbench.Conn.from_server(mariadb_source, source_db))
    # Long enough for three kill cycles on a loaded machine; cut short once they are done.
    running = load(mariadb_source, source_db, seconds=60)
    try:
        last = 0
        for _ in range(3):
            with spawned(setl) as proc:
                wait_acked_past(setl, proc, last)
                proc.send_signal(signal.SIGKILL)
                assert proc.wait(10) == -signal.SIGKILL
            assert not running.done, "the load ended before the kill: nothing was tested under load"
            last = setl.acked().batch_id
    finally:
        running.stop()  # a client killed mid-transaction: the server rolls it back
    assert sysbench.checksums(sysbench.Conn.from_server(mariadb_source, source_db)) != prepared
    final = setl.start_until_caught_up()
    assert final.returncode == 0, final.stderr[-3000:]
    assert setl.acked().position >= binlog_head(mariadb_source)
    assert_mariadb_equal(mariadb_source, source_db, mariadb_target, mysql_db)


def test_target_outage_during_load_is_ridden_out(tmp_path, mariadb_source, source_db, mariadb_factory):
    """The target stopped for 3 s during the load: setl retries, never pauses, and ends with every table equal."""
    target = stoppable_target(mariadb_factory, server_id=3)
    start = prepare_source(mariadb_source, source_db)
    # Enough attempts for the outage: 30 rollbacks with backoff capped at 0.5 s, on top of the
    # sink's own in-place retries of each lost connection.
    setl = make_setl(tmp_path, mariadb_source, source_db, start, mysql_target(target), "sb.{table}",
                     retry={"max_attempts": 30, "initial_backoff_ms": 100, "max_backoff_ms": 500})
    with spawned(setl) as proc:
        wait_acked_past(setl, proc, 0)  # the prepared rows are in
        running = load(mariadb_source, source_db, seconds=8)
        try:
            wait_acked_past(setl, proc, setl.acked().batch_id)  # and the load flows
            target.stop()
            stopped_at = setl.acked()
            time.sleep(3)  # the outage itself (a fault held for a fixed time, not a wait)
            assert not running.done, "the load ended during the outage: the test proves too little"
            assert proc.poll() is None, setl.logs()[-3000:]
            target.start()
            result = running.wait()
        finally:
            running.stop()
        wait_caught_up(setl, mariadb_source, proc)
        assert setl.acked().batch_id > stopped_at.batch_id
        status = setl.status()
        assert status["status"] == "running" and status["error"] is None
        assert setl.stop(proc) == 0, setl.logs()[-3000:]
    assert result.transactions > 8 * RATE / 2
    assert_mariadb_equal(mariadb_source, source_db, target, "sb")
    logs = setl.logs()
    assert "Traceback" not in logs
    assert re.search(rf"pipeline={setl.name} stage=load .*(Can't connect|Lost connection|gone away)", logs), \
        logs[-3000:]


PG_TABLE = """CREATE TABLE public.{name} (
    id INTEGER PRIMARY KEY, k INTEGER NOT NULL DEFAULT 0,
    c CHAR(120) NOT NULL DEFAULT '', pad CHAR(60) NOT NULL DEFAULT '')"""


def test_sysbench_load_replicates_to_postgresql(tmp_path, mariadb_source, source_db, postgres_server, postgres_db):
    """Under oltp_write_only load, `setl start` into PostgreSQL ends with every table equal row by row."""
    for name in NAMES:
        postgres_server.query(PG_TABLE.format(name=name), dbname=postgres_db)
    start = prepare_source(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, start, postgres_target(postgres_server, postgres_db),
                     "public.{table}")
    with spawned(setl) as proc:
        result = load(mariadb_source, source_db).wait()
        wait_caught_up(setl, mariadb_source, proc)
        assert setl.stop(proc) == 0, setl.logs()[-3000:]
    assert result.transactions > SECONDS * RATE / 2
    for name in NAMES:
        mine = mariadb_source.query(f"SELECT id, k, c, pad FROM `{source_db}`.`{name}` ORDER BY id")
        # bpchar::text drops the trailing blanks CHAR(n) pads with, as MariaDB does on read
        theirs = postgres_server.query(f"SELECT id, k, c::text, pad::text FROM public.{name} ORDER BY id",
                                       dbname=postgres_db)
        assert len(mine) > TABLE_SIZE / 2
        assert [tuple(r) for r in theirs] == [tuple(r) for r in mine], name


def test_target_outage_past_the_retries_pauses_until_resume(tmp_path, mariadb_source, source_db, mariadb_factory):
    """An outage longer than the retry budget pauses the pipeline with the error in `setl status`; after the target
    is back it stays paused until `setl resume`, then ends with every table equal."""
    target = stoppable_target(mariadb_factory, server_id=4)
    start = prepare_source(mariadb_source, source_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, start, mysql_target(target), "sb.{table}",
                     retry={"max_attempts": 2, "initial_backoff_ms": 50, "max_backoff_ms": 100,
                                "max_elapsed_ms": 3000})  # a target outage is transient: retried this long
    with spawned(setl) as proc:
        wait_acked_past(setl, proc, 0)
        running = load(mariadb_source, source_db)
        try:
            wait_acked_past(setl, proc, setl.acked().batch_id)
            target.stop()
            paused = wait_until(lambda: (s := setl.status())["status"] == "paused" and s, timeout=60,
                                interval=0.2, message="the pipeline to pause")
            assert f"pipeline={setl.name} stage=load" in paused["error"] and "Can't connect" in paused["error"]
            target.start()
            assert setl.status()["status"] == "paused"  # nothing restarts silently
            assert proc.poll() is None, setl.logs()[-3000:]
            resumed = setl.run("resume", "--pipeline", setl.name)
            assert resumed.returncode == 0 and "resumed" in resumed.stdout
            running.wait()
        finally:
            running.stop()
        wait_caught_up(setl, mariadb_source, proc)
        assert setl.stop(proc) == 0, setl.logs()[-3000:]
    assert_mariadb_equal(mariadb_source, source_db, target, "sb")
