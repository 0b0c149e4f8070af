"""A node rides out outages of its source and target (retry.max_elapsed_ms) instead of pausing,
at startup too, and pauses at once on failures retrying cannot fix: real servers, `setl` as a process."""

from __future__ import annotations

import contextlib
import threading
import time

import pymysql
import pytest

from setl.testing.servers import wait_until
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target, spawned

pytestmark = pytest.mark.timeout(300)

#: Few attempts for other failures (so the old behaviour would pause), a generous budget for transient ones.
RETRY = {"max_attempts": 2, "initial_backoff_ms": 100, "max_backoff_ms": 1000, "max_elapsed_ms": 120_000}


def make_tables(source, target, database: str) -> None:
    for server in (source, target):
        with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
            cur.execute(f"CREATE TABLE IF NOT EXISTS `{database}`.items (id INT PRIMARY KEY, v INT)")


def pipeline(tmp_path, source, target, database: str, *, start=None, retry=RETRY) -> SetlProcess:
    """A pipeline copying `database`.items, from `start` (default: the source's binlog head now)."""
    if start is None:
        head = binlog_head(source)
        start = {"file": head.log, "pos": head.offset}
    return SetlProcess(tmp_path, source=mysql_source(source, start=start), target=mysql_target(target),
                       tables=[{"source": rf"{database}\.items", "target": f"{database}.items"}],
                       pipeline={"parallelism": 2, "batch": {"max_rows": 200, "max_wait_ms": 50}, "retry": retry})


class Writer:
    """Writes to the source's `items` on a thread (one insert and one update a transaction) until stopped.

    Tolerates the source being away (the writes it could not make are simply not made).
    """

    def __init__(self, server, database: str) -> None:
        self.server, self.database = server, database
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer")

    def __enter__(self) -> "Writer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        key = 0
        while not self._stop.is_set():
            try:
                with contextlib.closing(pymysql.connect(**self.server.connect_args(autocommit=True))) as conn, \
                        conn.cursor() as cur:
                    while not self._stop.is_set():
                        key += 1
                        cur.execute(f"INSERT INTO `{self.database}`.items VALUES (%s, 0)", (key,))
                        cur.execute(f"UPDATE `{self.database}`.items SET v = v + 1 WHERE id = %s", (key // 2,))
                        self.written += 1
                        time.sleep(0.005)
            except pymysql.MySQLError:
                self._stop.wait(0.5)


def rows(server, database: str) -> list[tuple]:
    return server.query(f"SELECT id, v FROM `{database}`.items ORDER BY id")


def wait_caught_up(setl: SetlProcess, source, timeout: float = 120) -> None:
    head = binlog_head(source)
    wait_until(lambda: (ack := setl.acked()) is not None and ack.position >= head, timeout=timeout,
               message=lambda: f"the ack to reach {head}; logs:\n{setl.logs()[-4000:]}")


def test_target_stopped_15s_under_load_is_ridden_out(tmp_path, mariadb_factory, mariadb_source):
    """The target down for 15 s under load: status says `retrying`, the pipeline never pauses, the target ends equal."""
    target = mariadb_factory(server_id=41)
    make_tables(mariadb_source, target, "outage_t")
    setl = pipeline(tmp_path, mariadb_source, target, "outage_t")
    with spawned(setl) as proc:
        with Writer(mariadb_source, "outage_t") as writer:
            wait_until(lambda: setl.acked() is not None and writer.written > 50, timeout=60,
                       message="the first acks")
            target.stop()
            try:
                wait_until(lambda: setl.status()["retrying"] is not None, timeout=30,
                           message="status to say retrying")
                row = setl.status()
                assert row["status"] == "retrying" and row["retrying_since"] <= time.time()
                shown = setl.run("status")
                assert "retrying since " in shown.stdout and " retrying " in shown.stdout.splitlines()[1]
                time.sleep(15)
            finally:
                target.start()
            written = writer.written
            wait_until(lambda: writer.written > written + 50, timeout=30, message="more writes after the outage")
        wait_caught_up(setl, mariadb_source)
        assert proc.poll() is None, setl.logs()[-3000:]
        row = setl.status()
        assert row["status"] == "running" and row["retrying"] is None and row["error"] is None
        assert SetlProcess.stop(proc) == 0
    assert rows(target, "outage_t") == rows(mariadb_source, "outage_t")


def test_source_stopped_20s_under_load_is_ridden_out(tmp_path, mariadb_factory, mariadb_target):
    """The source down for about 20 s under load: no pause, and the target ends equal to the source."""
    source = mariadb_factory(server_id=42)
    make_tables(source, mariadb_target, "outage_s")
    setl = pipeline(tmp_path, source, mariadb_target, "outage_s")
    with spawned(setl) as proc:
        with Writer(source, "outage_s") as writer:
            wait_until(lambda: setl.acked() is not None and writer.written > 50, timeout=60,
                       message="the first acks")
            source.stop()
            time.sleep(20)
            source.start()
            written = writer.written
            wait_until(lambda: writer.written > written + 50, timeout=60, message="more writes after the outage")
        wait_caught_up(setl, source)
        assert proc.poll() is None, setl.logs()[-3000:]
        assert setl.status()["status"] == "running"
        assert SetlProcess.stop(proc) == 0
    assert rows(mariadb_target, "outage_s") == rows(source, "outage_s")
    assert "paused" not in setl.logs()


def test_start_while_the_target_is_down_catches_up_once_it_is_back(tmp_path, mariadb_factory, mariadb_source):
    """`setl start --until-caught-up` with the target down waits (status: retrying), catches up once it is back."""
    target = mariadb_factory(server_id=43)
    make_tables(mariadb_source, target, "outage_start")
    start = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO outage_start.items VALUES (%s, %s)", [(i, i) for i in range(300)])
    setl = pipeline(tmp_path, mariadb_source, target, "outage_start", start={"file": start.log, "pos": start.offset})
    target.stop()
    with spawned(setl, "start", "--pipeline", setl.name, "--until-caught-up") as proc:
        try:
            wait_until(lambda: setl.meta_path.exists() and setl.status()["retrying"] is not None, timeout=30,
                       message="status to say retrying")
            time.sleep(10)
            assert proc.poll() is None, setl.logs()[-3000:]
        finally:
            target.start()
        assert proc.wait(120) == 0, setl.logs()[-3000:]
    assert rows(target, "outage_start") == rows(mariadb_source, "outage_start")


def test_start_while_the_source_is_down_catches_up_once_it_is_back(tmp_path, mariadb_factory, mariadb_target):
    """`setl start --until-caught-up` with the source down retries opening it and catches up when it is back."""
    source = mariadb_factory(server_id=44)
    make_tables(source, mariadb_target, "outage_src_start")
    setl = pipeline(tmp_path, source, mariadb_target, "outage_src_start")
    with contextlib.closing(source.connect()) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO outage_src_start.items VALUES (%s, %s)", [(i, i) for i in range(100)])
    source.stop()
    with spawned(setl, "start", "--pipeline", setl.name, "--until-caught-up") as proc:
        try:
            wait_until(lambda: setl.meta_path.exists() and setl.status()["retrying"] is not None, timeout=30,
                       message="status to say retrying")
            time.sleep(5)
            assert proc.poll() is None, setl.logs()[-3000:]
        finally:
            source.start()
        assert proc.wait(120) == 0, setl.logs()[-3000:]
    assert rows(mariadb_target, "outage_src_start") == rows(source, "outage_src_start")


@pytest.mark.parametrize("side", ["source", "target"])
def test_bad_credentials_stop_at_once_with_one_line_and_status_keeps_the_error(
        tmp_path, side, mariadb_source, mariadb_target):
    """A wrong source or target password exits 1 in seconds, not after the 10-minute budget; `setl status` shows why."""
    make_tables(mariadb_source, mariadb_target, "outage_cred")
    setl = pipeline(tmp_path, mariadb_source, mariadb_target, "outage_cred",
                    retry={"max_attempts": 5, "initial_backoff_ms": 200})  # the default max_elapsed_ms
    setl.config[side]["password"] = "not-the-password"
    setl.write_config()
    began = time.monotonic()
    result = setl.run("start", "--pipeline", setl.name)
    assert result.returncode == 1, result.stderr[-3000:]
    assert time.monotonic() - began < 30
    lines = [line for line in result.stderr.splitlines() if line.startswith("setl: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "denied" in lines[0].lower()
    row = setl.status()
    assert row["status"] != "running" and "denied" in (row["error"] or "").lower()
