"""Faults at a real SQL sink inside a running pipeline: its connection killed by the server in the
middle of a batch, and a batch for a table the target lacks."""

from __future__ import annotations

import contextlib
import threading

import pytest

from setl.errors import LoadError
from setl.scheduler import Outcome
from setl.sinks.mysql import MysqlLoad
from setl.testing.servers import wait_until

from .replicate import binlog_head, replicate, table_rule

pytestmark = pytest.mark.timeout(120)


def test_sink_connection_killed_mid_batch_is_retried_in_place(mariadb_source, source_db, mariadb_target,
                                                              mysql_db, tmp_path, caplog):
    """KILL CONNECTION of the sink's session while it waits inside a batch transaction: the sink
    reconnects and replays the batch itself (no rollback through Termin), and the target ends equal."""
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(16))")
        for k in range(20):
            cur.execute("INSERT INTO t VALUES " + ", ".join(f"({k * 10 + i}, 'v{i}')" for i in range(10)))
        cur.execute("UPDATE t SET v = 'changed' WHERE id % 7 = 0")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="kill", position_schema=mysql_db,
                     initial_backoff=0.01)
    # The target table exists already (the replicated CREATE TABLE finds the same shape), and an
    # open transaction holds key 5, so the sink's first row batch waits inside its transaction.
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY, v VARCHAR(16))")
    blocker = mariadb_target.connect()
    blocker.autocommit(False)
    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(replicate(
        mariadb_source, start, [table_rule(rf"{source_db}\.t", f"{mysql_db}.t")], load, tmp_path, name="kill")))
    waiting = ("SELECT id FROM information_schema.processlist WHERE info LIKE %s AND id <> %s",
               (f"INSERT INTO `{mysql_db}`.`t`%", blocker.thread_id()))
    try:
        with blocker.cursor() as cur:
            cur.execute(f"INSERT INTO `{mysql_db}`.t VALUES (5, 'blocker')")
            runner.start()
            wait_until(lambda: mariadb_target.query(*waiting), message="the sink to wait for key 5")
            victim = mariadb_target.query(*waiting)[0][0]
            mariadb_target.query(f"KILL CONNECTION {victim}")
        blocker.rollback()
        runner.join(60)
    finally:
        blocker.close()
    assert not runner.is_alive() and outcome, "the pipeline did not catch up"
    assert any("reconnecting and replaying" in r.getMessage() for r in caplog.records)
    assert not any("rolled back" in r.getMessage() for r in caplog.records)
    assert mariadb_target.query(f"SELECT * FROM `{mysql_db}`.t ORDER BY id") == \
        mariadb_source.query(f"SELECT * FROM `{source_db}`.t ORDER BY id")


def test_missing_target_table_pauses_and_applies_nothing(mariadb_source, source_db, mariadb_target, mysql_db,
                                                         tmp_path):
    """A transaction touching a table the target lacks pauses the pipeline with an error naming
    pipeline, stage, table and position; its rows for the table that exists are not applied."""
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE present (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE absent (id INT PRIMARY KEY)")
        conn.autocommit(False)
        cur.execute("INSERT INTO present VALUES (1)")
        cur.execute("INSERT INTO absent VALUES (1)")
        conn.commit()
    mariadb_target.query(f"CREATE TABLE `{mysql_db}`.present (id INT PRIMARY KEY)")
    load = MysqlLoad(mariadb_target.target_config(), pipeline="missing", position_schema=mysql_db, ddl="skip")
    scheduler = replicate(mariadb_source, start, [table_rule(rf"{source_db}\..*", f"{mysql_db}.{{table}}")],
                          load, tmp_path, name="missing", outcome=Outcome.PAUSED)
    error = scheduler.error
    assert isinstance(error, LoadError)
    assert error.context["pipeline"] == "missing" and error.context["stage"] == "load"
    assert error.context["table"] == f"{mysql_db}.absent" and "does not exist" in error.message
    assert error.context["position"].log == start.log and error.context["position"] > start
    assert mariadb_target.query(f"SELECT * FROM `{mysql_db}`.present") == []
