"""Quarantine under a running `setl start`, on MariaDB and PostgreSQL: one table quarantined while
three others under concurrent writes stay equal and its replay runs beside the live pipeline, and
kill -9 during quarantine and during replay on PostgreSQL (docs/quarantine.md)."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
from typing import Any

import attrs
import pymysql
import pytest

from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, postgres_target, spawned
from tests.helpers.wait import wait_until

from .test_quarantine import assert_equal, make_source, positions_of_kept, write

pytestmark = pytest.mark.timeout(240)

LIVE_TABLES = ("a", "b", "c", "bad")
LONG_ID = 100_000  # the one row whose value the bad table's target refuses; never written again


@attrs.frozen
class Target:
    """One SQL target of a `setl start`: its config mapping, the schema of its tables, a query, and
    how a column is widened there."""

    kind: str
    config: dict[str, Any]
    schema: str
    query: Any

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        return self.query(f"SELECT id, v FROM {self.schema}.{table} ORDER BY id")

    def kept(self, table: str) -> list[tuple[Any, ...]]:
        """The positions kept for quarantined `table` (pipelines with the default position table), in order."""
        q = "`" if self.kind == "mariadb" else '"'
        return positions_of_kept(self.query(f"SELECT {q}change{q} FROM setl.setl_position_kept"
                                            f" WHERE target_table = %s ORDER BY seq", (f"{self.schema}.{table}",)))

    def widen(self, table: str) -> None:
        if self.kind == "mariadb":
            self.query(f"ALTER TABLE {self.schema}.{table} MODIFY v VARCHAR(20)")
        else:
            self.query(f"ALTER TABLE {self.schema}.{table} ALTER COLUMN v TYPE varchar(20)")


def make_target(request: pytest.FixtureRequest, kind: str, tables: tuple[str, ...]) -> Target:
    """`tables` on the target, each (id, v varchar(20)) but bad's v, varchar(5)."""
    if kind == "mariadb":
        server, db = request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db")
        made = Target(kind, mysql_target(server), db, lambda sql, args=None: server.query(sql, args))
    else:
        server, pgdb = request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db")
        made = Target(kind, postgres_target(server, pgdb), "dw",
                      lambda sql, args=None: server.query(sql, args, dbname=pgdb))
        made.query("CREATE SCHEMA dw")
    for table in tables:
        width = 5 if table == "bad" else 20
        made.query(f"CREATE TABLE {made.schema}.{table} (id INT PRIMARY KEY, v VARCHAR({width}))")
    return made


@pytest.fixture(params=["mariadb", "postgresql"])
def live_target(request: pytest.FixtureRequest) -> Target:
    return make_target(request, request.param, LIVE_TABLES)


def setl_for(tmp_path: Any, source: Any, start: Any, source_db: str, target: Target, **pipeline: Any) -> SetlProcess:
    return SetlProcess(tmp_path, source=mysql_source(source, start={"file": start.log, "pos": start.offset}),
                       target=target.config,
                       tables=[{"source": rf"{source_db}\..*", "target": f"{target.schema}.{{table}}"}],
                       pipeline={"on_table_error": "quarantine", "create_tables": False,
                                 "batch": {"max_rows": 50, "max_wait_ms": 20}, **pipeline})


class Writer(threading.Thread):
    """Transactions upserting and deleting random rows of every table for `seconds` (one session); at
    `long_after` seconds, one transaction also inserts the bad table's row `LONG_ID` with a value of
    12 characters (the target's column takes 5)."""

    def __init__(self, server: Any, database: str, seconds: float, *, seed: int, long_after: float | None) -> None:
        super().__init__(name=f"writer-{seed}", daemon=True)
        self.server, self.database, self.seconds, self.long_after = server, database, seconds, long_after
        self.rng = random.Random(seed)
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._write()
        except BaseException as exc:  # reported by `finish`
            self.error = exc

    def _write(self) -> None:
        rng, db = self.rng, self.database
        started = time.monotonic()
        long_due = self.long_after is not None
        with contextlib.closing(pymysql.connect(**self.server.connect_args(autocommit=False))) as conn, \
                conn.cursor() as cur:
            while time.monotonic() - started < self.seconds:
                for table in LIVE_TABLES:
                    for _ in range(3):
                        cur.execute(f"INSERT INTO `{db}`.`{table}` (id, v) VALUES (%s, %s) ON DUPLICATE KEY UPDATE"
                                    " v = VALUES(v)", (rng.randrange(1, 400), str(rng.randrange(1000))))
                    cur.execute(f"DELETE FROM `{db}`.`{table}` WHERE id = %s", (rng.randrange(1, 400),))
                if long_due and time.monotonic() - started >= (self.long_after or 0):
                    cur.execute(f"INSERT INTO `{db}`.bad (id, v) VALUES (%s, %s)", (LONG_ID, "x" * 12))
                    long_due = False
                conn.commit()
                self.transactions += 1

    def finish(self) -> int:
        """Join it; the transactions it committed (its error raised)."""
        self.join(60)
        assert not self.is_alive(), "the writer did not end"
        if self.error is not None:
            raise self.error
        return self.transactions


def make_live_source(server: Any, database: str) -> None:
    with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        for table in LIVE_TABLES:
            cur.execute(f"CREATE TABLE `{database}`.`{table}` (id INT PRIMARY KEY, v VARCHAR(20))")


def caught_up(setl: SetlProcess, proc: Any, source: Any) -> None:
    head = binlog_head(source)

    def acked() -> bool:
        assert proc.poll() is None, setl.logs()[-3000:]
        ack = setl.acked()
        return ack is not None and ack.position >= head

    wait_until(acked, timeout=90, interval=0.2, message=lambda: setl.logs()[-3000:])


def source_rows(server: Any, database: str, table: str) -> list[tuple[Any, ...]]:
    return server.query(f"SELECT id, v FROM `{database}`.`{table}` ORDER BY id")


def test_one_table_quarantined_while_three_others_under_concurrent_writes_stay_equal(
        mariadb_source, source_db, live_target, tmp_path):
    """A running pipeline under a concurrent writer (3 s): the table whose value the target refuses is
    quarantined and the 3 others catch up equal; then, with the writer running again, the column is
    widened and `setl resume --table` replays beside the live pipeline: every table ends equal, with
    nothing left kept."""
    make_live_source(mariadb_source, source_db)
    start = binlog_head(mariadb_source)
    setl = setl_for(tmp_path, mariadb_source, start, source_db, live_target)
    others = ("a", "b", "c")
    with spawned(setl) as proc:
        first = Writer(mariadb_source, source_db, 3.0, seed=1, long_after=1.0)
        first.start()
        written = first.finish()
        caught_up(setl, proc, mariadb_source)
        for table in others:
            assert live_target.rows(table) == source_rows(mariadb_source, source_db, table), table
        kept = live_target.kept("bad")
        assert kept and kept == sorted(kept), kept
        assert (LONG_ID, "x" * 12) in source_rows(mariadb_source, source_db, "bad")
        assert all(i != LONG_ID for i, _ in live_target.rows("bad"))

        second = Writer(mariadb_source, source_db, 3.0, seed=2, long_after=None)
        second.start()
        live_target.widen("bad")
        resumed = setl.run("resume", "--pipeline", setl.name, "--table", f"{live_target.schema}.bad",
                           "--chunk-rows", "40")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
        assert f"{live_target.schema}.bad replayed" in resumed.stdout, resumed.stdout
        written += second.finish()
        caught_up(setl, proc, mariadb_source)
        for table in LIVE_TABLES:
            assert live_target.rows(table) == source_rows(mariadb_source, source_db, table), table
        assert live_target.kept("bad") == []
        assert live_target.query("SELECT COUNT(*) FROM setl.setl_position_quarantine WHERE target_table = %s",
                                 (f"{live_target.schema}.bad",))[0][0] == 0
        assert SetlProcess.stop(proc) == 0, setl.logs()[-3000:]
    assert written > 20, written  # the writers really ran beside the pipeline


@pytest.fixture
def pg_target(request: pytest.FixtureRequest) -> Target:
    return make_target(request, "postgresql", ("a", "b", "bad"))


def test_postgresql_kill_9_during_quarantine_and_during_replay_ends_exact(mariadb_source, source_db, pg_target,
                                                                          tmp_path):
    """On PostgreSQL: `setl start` killed -9 while it keeps a quarantined table's changes (before
    COMMIT), then right after the batch that quarantined it (before its ack), then `setl resume
    --table` killed -9 inside its second replay transaction: the other tables end equal, nothing is
    kept twice or out of order, and the replay run again ends every table equal."""
    make_source(mariadb_source, source_db)
    start = binlog_head(mariadb_source)
    write(mariadb_source, source_db, 1)
    write(mariadb_source, source_db, 100, long_at=115)
    write(mariadb_source, source_db, 200)
    setl = setl_for(tmp_path, mariadb_source, start, source_db, pg_target,
                    retry={"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 20})
    setl.config["pipeline"]["batch"] = {"max_rows": 20, "max_wait_ms": 20}
    setl.write_config()
    setl.faults = json.dumps([{"stage": "quarantine_kept", "action": "crash"}])
    crashed = setl.start_until_caught_up()
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert pg_target.kept("bad") == []  # the quarantining transaction never committed
    setl.faults = json.dumps([{"stage": "termin", "action": "crash"}])
    crashed = setl.start_until_caught_up()
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert pg_target.kept("bad"), "the batch that quarantined the table committed"
    setl.faults = None
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    assert_equal(mariadb_source, source_db, pg_target.rows, ("a", "b"))
    kept = pg_target.kept("bad")
    assert kept == sorted(kept) and len(kept) > 10 and len(set(kept)) == len(kept), kept
    assert all(i < 115 for i, _ in pg_target.rows("bad")), pg_target.rows("bad")

    pg_target.widen("bad")
    setl.faults = json.dumps([{"stage": "quarantine_replay", "action": "crash", "batch": 1}])
    crashed = setl.run("resume", "--pipeline", setl.name, "--table", "dw.bad", "--chunk-rows", "5")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    assert pg_target.kept("bad") == kept[5:]  # the first transaction only
    setl.faults = None
    resumed = setl.run("resume", "--pipeline", setl.name, "--table", "dw.bad", "--chunk-rows", "5")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    assert f"dw.bad replayed ({len(kept) - 5} changes applied)" in resumed.stdout, resumed.stdout
    assert_equal(mariadb_source, source_db, pg_target.rows)
    write(mariadb_source, source_db, 300)
    done = setl.start_until_caught_up()
    assert done.returncode == 0, done.stderr[-3000:]
    assert_equal(mariadb_source, source_db, pg_target.rows)
    assert pg_target.kept("bad") == []
