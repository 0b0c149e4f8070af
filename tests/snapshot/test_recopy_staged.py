"""A re-copy (`setl snapshot --table`) of a target table that holds rows keeps its old rows visible
until the copy is done, then switches in one target transaction: a reader counting the table every
~20 ms never sees fewer rows than it had (less the rows the source deleted meanwhile), under a
writer, a kill -9 in the middle and an ALTER TABLE of the copied table; the staging table is gone
at the end and the target equals the source."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from setl.sinks.sql_staging import staging_prefix
from tests.e2e.setl_process import mysql_target, postgres_target, spawned
from tests.helpers.wait import wait_until
from tests.snapshot import tables as t
from tests.snapshot.test_snapshot_e2e import make_setl, run_until_caught_up
from tests.snapshot.test_snapshot_resume import progress

pytestmark = pytest.mark.timeout(300)

ROWS = 20_000
KEYLESS = 2_000
TABLES = {"ints": t.TABLES["ints"][0], "nokey": t.TABLES["nokey"][0]}


def fill(server: Any, db: str) -> None:
    """ROWS rows in ints, KEYLESS in nokey, kept out of the binlog (only a copy brings them)."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.executemany("INSERT INTO ints VALUES (%s, %s, %s)", [(i * 2, i % 97, f"c{i}") for i in range(ROWS)])
            cur.executemany("INSERT INTO nokey VALUES (%s, %s)", [(i, f"y{i % 13}") for i in range(KEYLESS)])
    finally:
        conn.close()


class Writer:
    """Inserts, updates and deletes on both tables in small transactions; `deleted` counts the rows
    each table lost, raised *before* each COMMIT (so it never lags what a reader could see)."""

    def __init__(self, server: Any, db: str) -> None:
        self.server, self.db = server, db
        self.deleted = {"ints": 0, "nokey": 0}
        self.transactions = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="recopy-writer", daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the writer did not stop"
        if self.error is not None and exc[0] is None:
            raise AssertionError(f"writer failed: {self.error!r}")

    def _run(self) -> None:
        conn = self.server.connect(database=self.db, autocommit=False)
        n = 0
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    n += 1
                    cur.execute("INSERT INTO ints (id, k, c) VALUES (%s, 1, 'new')", (10 * ROWS + 2 * n + 1,))
                    cur.execute("UPDATE ints SET k = k + 1, c = CONCAT('u', c) WHERE id = %s", ((n * 7919) % ROWS * 2,))
                    if n % 3 == 0:
                        gone = (n * 104729) % ROWS * 2
                        self.deleted["ints"] += cur.execute("DELETE FROM ints WHERE id = %s", (gone,))
                        cur.execute("INSERT INTO nokey VALUES (%s, 'w')", (KEYLESS + n,))
                        self.deleted["nokey"] += cur.execute("DELETE FROM nokey WHERE x = %s LIMIT 1", (n % KEYLESS,))
                    conn.commit()
                    self.transactions += 1
                    time.sleep(0.005)
        except BaseException as exc:  # reported by __exit__
            self.error = exc
        finally:
            conn.close()


class Counter:
    """Counts each table of the target every ~20 ms on its own autocommit connection; `low` is the
    lowest (count - floor) seen per table, the floor being the rows the table had when counting
    began less the rows the source deleted up to the count."""

    def __init__(self, count: Callable[[str], int], tables: dict[str, int], writer: Writer) -> None:
        self.count, self.tables, self.writer = count, tables, writer
        self.low: dict[str, int] = {}
        self.samples = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="recopy-counter", daemon=True)

    def __enter__(self) -> Counter:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the counter did not stop"

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                for table, baseline in self.tables.items():
                    found = self.count(table)
                    margin = found - (baseline - self.writer.deleted[table])
                    self.low[table] = min(margin, self.low.get(table, margin))
                self.samples += 1
                self.stop.wait(0.02)
        except BaseException as exc:  # checked by the test
            self.error = exc


def mariadb_count(server: Any, db: str) -> Callable[[str], int]:
    conn = server.connect(database=db)  # autocommit: each count sees the last commit

    def count(table: str) -> int:
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM `{table}`")
            return int(cur.fetchone()[0])

    return count


def postgres_count(server: Any, database: str, schema: str) -> Callable[[str], int]:
    conn = server.connect(dbname=database)

    def count(table: str) -> int:
        return int(conn.execute(f'SELECT COUNT(*) FROM "{schema}"."{table}"').fetchone()[0])

    return count


def copied(setl: Any, proc: Any, tables: list[str], after: float = 0.0) -> dict[str, float]:
    """Wait for the copies of `tables` begun after `after` to be done; when each began."""
    def done() -> bool:
        assert proc.poll() is None, setl.logs()[-3000:]
        found = progress(setl, full=True)
        return all(n in found and found[n].status.value == "done" and found[n].started > after for n in tables)

    wait_until(done, timeout=120, interval=0.1, message=lambda: f"copies of {tables} done: {progress(setl)}")
    return {n: progress(setl, full=True)[n].started for n in tables}


def recopy(setl: Any, source_db: str, tables: list[str]) -> None:
    args = [a for n in tables for a in ("--table", f"{source_db}.{n}")]
    result = setl.run("snapshot", "--pipeline", setl.name, *args)
    assert result.returncode == 0, result.stdout + result.stderr


def mariadb_staging_left(server: Any, pipeline: str) -> list[tuple]:
    prefix = staging_prefix(pipeline)
    return server.query("SELECT table_schema, table_name FROM information_schema.tables"
                        " WHERE LEFT(table_name, %s) = %s", (len(prefix), prefix))


def prepare_mariadb(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, server_id: int,
                    **pipeline: Any) -> Any:
    t.create(mariadb_source, source_db, TABLES)
    t.create(mariadb_target, mysql_db, TABLES)
    fill(mariadb_source, source_db)
    return make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=server_id, **pipeline)


@pytest.mark.parametrize("mode", ["ordered", "per_table"])
def test_a_recopy_into_mariadb_keeps_the_old_rows_visible(tmp_path, mariadb_source, mariadb_target, source_db,
                                                          mysql_db, mode):
    """A running pipeline (batches loaded whole, or per table) re-copies a keyed table of 20k rows and a
    keyless one while the source is written: the target's counts never drop below their rows (less the
    source's deletes), the log tells the copy went to a staging table and switched, the staging tables
    are gone, and CHECKSUM TABLE agrees."""
    setl = prepare_mariadb(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db,
                           2131 if mode == "ordered" else 2135, load={"mode": mode})
    names = list(TABLES)
    with spawned(setl) as proc:
        first = copied(setl, proc, names)
        wait_until(lambda: t.checksums(mariadb_target, mysql_db, names) == t.checksums(
            mariadb_source, source_db, names), timeout=60, message="the first copy in the target")
        baseline = {n: int(mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.`{n}`")[0][0]) for n in names}
        assert baseline == {"ints": ROWS, "nokey": KEYLESS}
        with Writer(mariadb_source, source_db) as writer, \
                Counter(mariadb_count(mariadb_target, mysql_db), baseline, writer) as counter:
            recopy(setl, source_db, names)
            copied(setl, proc, names, after=max(first.values()))
            wait_until(lambda: writer.transactions > 50, timeout=60, message="the writer wrote")
        assert counter.error is None, counter.error
        assert counter.samples > 10 and set(counter.low) == set(names)
        assert min(counter.low.values()) >= 0, (counter.low, baseline, writer.deleted)
        assert writer.deleted["ints"] > 0 and writer.deleted["nokey"] > 0
        assert setl.stop(proc) == 0
    logs = setl.logs()
    for name in names:
        assert re.search(rf"table={re.escape(mysql_db)}\.{name} position=[^\n]* copying into", logs), logs[-3000:]
        assert re.search(rf"table={re.escape(mysql_db)}\.{name} position=[^\n]* copy done: the table switches", logs)
    run_until_caught_up(setl)
    assert t.checksums(mariadb_source, source_db, names) == t.checksums(mariadb_target, mysql_db, names)
    assert mariadb_staging_left(mariadb_target, setl.name) == []
    assert mariadb_target.query("SELECT COUNT(*) FROM `setl`.`setl_position_copy`") == [(0,)]


def test_a_recopy_into_postgresql_keeps_the_old_rows_visible(tmp_path, mariadb_source, postgres_server, source_db,
                                                             postgres_db):
    """The same re-copy into PostgreSQL: the counts never drop, the staging tables are gone, and the
    tables equal the source row by row."""
    t.create(mariadb_source, source_db, TABLES)
    fill(mariadb_source, source_db)
    postgres_server.query(f'CREATE SCHEMA IF NOT EXISTS "{source_db}"', dbname=postgres_db)
    for name in TABLES:
        postgres_server.query(f'CREATE TABLE "{source_db}"."{name}" {t.PG_TYPES[name]}', dbname=postgres_db)
    setl = make_setl(tmp_path, mariadb_source, source_db, postgres_target(postgres_server, postgres_db),
                     f"{source_db}.{{table}}", server_id=2132)
    names = list(TABLES)
    count = postgres_count(postgres_server, postgres_db, source_db)
    with spawned(setl) as proc:
        first = copied(setl, proc, names)
        wait_until(lambda: {n: count(n) for n in names} == {"ints": ROWS, "nokey": KEYLESS}, timeout=60,
                   message="the first copy in the target")
        baseline = {n: count(n) for n in names}
        with Writer(mariadb_source, source_db) as writer, \
                Counter(postgres_count(postgres_server, postgres_db, source_db), baseline, writer) as counter:
            recopy(setl, source_db, names)
            copied(setl, proc, names, after=max(first.values()))
            wait_until(lambda: writer.transactions > 50, timeout=60, message="the writer wrote")
        assert counter.error is None, counter.error
        assert counter.samples > 10 and min(counter.low.values()) >= 0, (counter.low, baseline, writer.deleted)
        assert setl.stop(proc) == 0
    assert "copy done: the table switches" in setl.logs()
    run_until_caught_up(setl)
    for name in names:
        assert t.mariadb_rows(mariadb_source, source_db, name) == t.postgres_rows(
            postgres_server, postgres_db, source_db, name), name
    prefix = staging_prefix(setl.name)
    assert postgres_server.query("SELECT table_name FROM information_schema.tables WHERE left(table_name, %s) = %s",
                                 (len(prefix), prefix), dbname=postgres_db) == []
    assert postgres_server.query("SELECT COUNT(*) FROM setl.setl_position_copy", dbname=postgres_db) == [(0,)]


def test_a_recopy_survives_kill_9(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """kill -9 of the node in the middle of a re-copy (its chunk reads slowed by a failpoint): the
    target still holds the old rows and the staging table; the restart finishes the copy, the
    table equals the source and the staging table is gone. `setl verify` skips the table while its
    copy is requested."""
    setl = prepare_mariadb(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, 2133)
    run_until_caught_up(setl)  # the first copy
    assert int(mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.ints")[0][0]) == ROWS
    recopy(setl, source_db, ["ints"])
    # setl verify leaves a table whose copy is not done out (its target table is stale until then)
    checked = setl.run("verify", "--pipeline", setl.name, "--wait-timeout", "30", timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{source_db}.ints: skipped, its copy is requested" in checked.stdout, checked.stdout
    assert f"{source_db}.nokey -> {mysql_db}.nokey: equal" in checked.stdout, checked.stdout
    assert checked.stdout.rstrip().endswith("s") and ", 1 skipped in " in checked.stdout, checked.stdout
    setl.faults = f'[{{"stage": "snapshot_read", "action": "slow", "seconds": 0.3, "times": null, ' \
                  f'"task": "{source_db}.ints"}}]'
    with Writer(mariadb_source, source_db) as writer:
        baseline = {"ints": ROWS, "nokey": KEYLESS}
        with Counter(mariadb_count(mariadb_target, mysql_db), baseline, writer) as counter:
            with spawned(setl) as proc:
                def halfway() -> bool:
                    assert proc.poll() is None, setl.logs()[-3000:]
                    ints = progress(setl).get("ints")
                    return ints is not None and ints[0] == "copying" and ints[2] >= 3

                wait_until(halfway, timeout=120, interval=0.05, message=lambda: f"progress {progress(setl)}")
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            assert mariadb_staging_left(mariadb_target, setl.name), "the staging table of the copy under way"
            setl.faults = None
            with spawned(setl) as proc:
                copied(setl, proc, ["ints"])
                assert setl.stop(proc) == 0
        assert counter.error is None, counter.error
        assert counter.samples > 10 and min(counter.low.values()) >= 0, (counter.low, writer.deleted)
    run_until_caught_up(setl)
    assert "snapshot resumes after chunk" in setl.logs()
    assert t.checksums(mariadb_source, source_db, list(TABLES)) == t.checksums(mariadb_target, mysql_db, list(TABLES))
    assert mariadb_staging_left(mariadb_target, setl.name) == []
    assert mariadb_target.query("SELECT COUNT(*) FROM `setl`.`setl_position_copy`") == [(0,)]


def test_an_alter_table_during_a_recopy(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """An ALTER TABLE of the table being re-copied: the target table is altered, the copy starts
    again into a staging table made from the altered table, the counts never drop, and the table
    ends equal with the staging table gone."""
    setl = prepare_mariadb(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, 2134)
    run_until_caught_up(setl)  # the first copy
    first = progress(setl, full=True)["ints"].started
    setl.faults = f'[{{"stage": "snapshot_read", "action": "slow", "seconds": 0.4, "times": null, ' \
                  f'"task": "{source_db}.ints"}}]'
    baseline = {"ints": ROWS, "nokey": KEYLESS}
    with Writer(mariadb_source, source_db) as writer, \
            Counter(mariadb_count(mariadb_target, mysql_db), baseline, writer) as counter:
        with spawned(setl) as proc:
            wait_until(lambda: "reading the mariadb binlog" in setl.logs(), timeout=60, message="the start")
            recopy(setl, source_db, ["ints"])

            def under_way() -> bool:
                assert proc.poll() is None, setl.logs()[-3000:]
                ints = progress(setl).get("ints")
                return ints is not None and ints[0] == "copying" and ints[2] >= 2

            wait_until(under_way, timeout=120, interval=0.05, message=lambda: f"progress {progress(setl)}")
            with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
                cur.execute("ALTER TABLE ints ADD COLUMN extra INT NOT NULL DEFAULT 7")
            wait_until(lambda: "altered while being copied" in setl.logs(), timeout=60, message="the ALTER seen")
            copied(setl, proc, ["ints"], after=first)
            wait_until(lambda: not mariadb_staging_left(mariadb_target, setl.name), timeout=60,
                       message="the staging table dropped")
            assert setl.stop(proc) == 0
    assert counter.error is None, counter.error
    assert counter.samples > 10 and min(counter.low.values()) >= 0, (counter.low, writer.deleted)
    run_until_caught_up(setl)
    columns = mariadb_target.query(f"SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                   f"'{mysql_db}' AND table_name = 'ints' ORDER BY ordinal_position")
    assert [c[0] for c in columns] == ["id", "k", "c", "extra"]
    logs = setl.logs()
    assert "its re-copy is dropped by a DDL" in logs, logs[-3000:]
    assert len(re.findall(r"table=\S+\.ints position=[^\n]* copying into", logs)) >= 2, logs[-3000:]
    assert t.checksums(mariadb_source, source_db, list(TABLES)) == t.checksums(mariadb_target, mysql_db, list(TABLES))
    assert mariadb_staging_left(mariadb_target, setl.name) == []
    assert mariadb_target.query("SELECT COUNT(*) FROM `setl`.`setl_position_copy`") == [(0,)]


def test_a_wiped_meta_store_during_a_recopy_asked_of_a_running_node_is_refused(
        tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """A re-copy asked of a running node is killed -9 halfway and the meta store is deleted: the
    target says the copy is under way (its staging record names the table), so the start refuses
    (exit 2, naming the table) instead of adopting the position and leaving the table stale behind
    its staging table; `--start` then copies it and ends equal."""
    setl = prepare_mariadb(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db, 2137)
    run_until_caught_up(setl)  # the first copy; the target's identity says no copy is under way
    setl.faults = f'[{{"stage": "snapshot_read", "action": "slow", "seconds": 0.3, "times": null, ' \
                  f'"task": "{source_db}.ints"}}]'
    with spawned(setl) as proc:
        recopy(setl, source_db, ["ints"])

        def halfway() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            ints = progress(setl).get("ints")
            return ints is not None and ints[0] == "copying" and ints[2] >= 3

        wait_until(halfway, timeout=120, interval=0.05, message=lambda: f"progress {progress(setl)}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert mariadb_staging_left(mariadb_target, setl.name), "the staging table of the copy under way"
    setl.faults = None
    setl.meta_path.unlink()  # rm -rf var/
    refused = setl.start_until_caught_up(timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("setl: error")]
    assert f"a table copy was under way: {mysql_db}.ints" in line and "--start" in line, line
    assert setl.run("position", "reset", "--pipeline", setl.name, "--start").returncode == 0
    run_until_caught_up(setl)
    assert t.checksums(mariadb_source, source_db, list(TABLES)) == t.checksums(mariadb_target, mysql_db, list(TABLES))
    assert mariadb_staging_left(mariadb_target, setl.name) == []
