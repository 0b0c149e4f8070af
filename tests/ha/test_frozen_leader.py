"""A leader frozen inside its target transaction (SIGSTOP after its load took the fence, before
COMMIT) is fenced: two `setl start` nodes on one ZooKeeper, a MariaDB source, and a MariaDB or a
PostgreSQL target. The standby takes over without waiting for the freeze to end, the frozen
leader's transaction never commits, and a table without a primary key ends equal to the source."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from setl.ha import Coordinator
from setl.meta.zookeeper import ZooKeeperMetaStore
from setl.model import Ack
from setl.testing.servers import wait_until
from tests.e2e.setl_process import (
    binlog_head,
    mysql_source,
    mysql_target,
    postgres_target,
)
from tests.ha.zk import unique_root
from tests.helpers.locks import mariadb_lock_waits, postgres_lock_waits

pytestmark = pytest.mark.timeout(240)

SESSION_TIMEOUT_MS = 2000
STANDBY_DELAY_MS = 500


class Target:
    """The target side of the rig: where the tables live and how the test reads and locks them."""

    config: dict[str, Any]
    template: str  # the pipeline's target name template

    def execute(self, statement: str) -> None:
        raise NotImplementedError

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def lock(self, table: str, key: int) -> Any:
        """A connection whose open transaction holds row `key` of `table` (call .rollback())."""
        raise NotImplementedError

    def lock_waits(self, holder: Any) -> int:
        """Sessions waiting for a lock `holder` (a `lock` connection) holds (`tests.helpers.locks`)."""
        raise NotImplementedError

    def diagnose(self) -> str:
        """The server's sessions and lock waits, for a failure message."""
        raise NotImplementedError


class MariaDBTarget(Target):
    def __init__(self, server: Any, database: str) -> None:
        self.server, self.database = server, database
        self.config = mysql_target(server)
        self.template = f"{database}.{{table}}"

    def execute(self, statement: str) -> None:
        self.server.query(statement.replace("{schema}", f"`{self.database}`"))

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        return sorted(self.server.query(f"SELECT * FROM `{self.database}`.`{table}`"))

    def lock(self, table: str, key: int) -> Any:
        conn = self.server.connect(autocommit=False)
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM `{self.database}`.`{table}` WHERE id = %s FOR UPDATE", (key,))
        return conn

    def lock_waits(self, holder: Any) -> int:
        return mariadb_lock_waits(self.server, holder)

    def diagnose(self) -> str:
        trx = self.server.query("SELECT trx_mysql_thread_id, trx_state, trx_started, trx_query"
                                " FROM information_schema.INNODB_TRX")
        sessions = self.server.query("SELECT id, user, db, command, time, state, info"
                                     " FROM information_schema.PROCESSLIST")
        return "INNODB_TRX:\n" + "\n".join(map(repr, trx)) + "\nPROCESSLIST:\n" + "\n".join(map(repr, sessions))


class PostgresTarget(Target):
    def __init__(self, server: Any, database: str) -> None:
        self.server, self.database = server, database
        self.config = postgres_target(server, database)
        self.template = "app.{table}"
        self.server.query("CREATE SCHEMA app", dbname=database)

    def execute(self, statement: str) -> None:
        self.server.query(statement.replace("{schema}", "app"), dbname=self.database)

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        return sorted(self.server.query(f"SELECT * FROM app.{table}", dbname=self.database))

    def lock(self, table: str, key: int) -> Any:
        conn = self.server.connect(dbname=self.database, autocommit=False)
        conn.execute(f"SELECT * FROM app.{table} WHERE id = %s FOR UPDATE", (key,))
        return conn

    def lock_waits(self, holder: Any) -> int:
        return postgres_lock_waits(self.server, holder)

    def diagnose(self) -> str:
        sessions = self.server.query("SELECT pid, datname, state, wait_event_type, wait_event, query"
                                     " FROM pg_stat_activity")
        return "pg_stat_activity:\n" + "\n".join(map(repr, sessions))


class Pair:
    """node-a and node-b, each with its own conf dir, sharing one ZooKeeper root and one pipeline.

    The pipeline's name and binlog server_id are this test's own: the source and target servers
    are shared with the whole session, and their fence and position rows (``setl.setl_position*``,
    keyed by pipeline) and binlog dump slot (keyed by server_id) must not be another test's.
    """

    def __init__(self, root: Path, zk_hosts: str, source: Any, source_db: str, target: Target) -> None:
        self.root, self.zk_hosts, self.chroot = root, zk_hosts, unique_root()
        self.source, self.source_db, self.target = source, source_db, target
        self.name = f"frozen_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
        start = binlog_head(source)
        pipeline = {
            "source": mysql_source(source, start={"file": start.log, "pos": start.offset},
                                   server_id=3000 + int(time.time()) % 60000),
            "target": target.config,
            "tables": [{"source": rf"{re.escape(source_db)}\..*", "target": target.template}],
            "pipeline": {"parallelism": 2, "batch": {"max_rows": 500, "max_wait_ms": 50},
                         "retry": {"max_attempts": 20, "initial_backoff_ms": 50, "max_backoff_ms": 500}},
        }
        for name in ("node-a", "node-b"):
            conf = root / name / "conf"
            (conf / "pipelines").mkdir(parents=True)
            (conf / "setl.yaml").write_text(yaml.safe_dump({
                "node": {"id": name},
                "meta": {"store": "zookeeper"},
                "ha": {"zookeeper": zk_hosts, "chroot": self.chroot, "session_timeout_ms": SESSION_TIMEOUT_MS,
                       "standby_delay_ms": STANDBY_DELAY_MS},
            }))
            (conf / "pipelines" / f"{self.name}.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
        self.procs: dict[str, subprocess.Popen] = {}
        self.store = ZooKeeperMetaStore(Coordinator(zk_hosts, root=self.chroot, session_timeout=5,
                                                    give_up_after=30).start())

    def spawn(self, name: str) -> None:
        env = dict(os.environ)
        env.pop("SETL_FAULTS", None)
        with open(self.root / f"setl-{name}.log", "w") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "setl.cli", "--conf", str(self.root / name / "conf"), "start",
                 "--pipeline", self.name], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-6000:]
                         for p in sorted(self.root.glob("setl-*.log")))

    def wait(self, what: Callable[[], Any], message: str, timeout: float = 30, interval: float = 0.05) -> Any:
        def check() -> Any:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
            return what()

        return wait_until(check, timeout=timeout, interval=interval, message=lambda: f"{message}\n{self.logs()}")

    def holder(self) -> str | None:
        return self.store.members(self.name)[0]

    def acked(self) -> Ack | None:
        return self.store.position(self.name)

    def wait_caught_up(self, min_epoch: int = 0, timeout: float = 60) -> Ack:
        head = binlog_head(self.source)

        def caught_up() -> Ack | None:
            ack = self.acked()
            return ack if ack is not None and ack.position >= head and ack.epoch >= min_epoch else None

        return self.wait(caught_up, f"an ack at {head} (epoch >= {min_epoch})", timeout=timeout)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.store.close()


@pytest.fixture(params=["mariadb", "postgresql"])
def target(request) -> Target:
    if request.param == "mariadb":
        return MariaDBTarget(request.getfixturevalue("mariadb_target"), request.getfixturevalue("mysql_db"))
    return PostgresTarget(request.getfixturevalue("postgres_server"), request.getfixturevalue("postgres_db"))


def test_leader_frozen_inside_its_transaction_is_fenced(tmp_path, zookeeper_server, mariadb_source, source_db,
                                                         target):
    """Leader SIGSTOPped inside its load transaction: the standby takes over in bounded time (it kills
    the frozen sessions instead of waiting on their locks), the frozen commit never lands after
    SIGCONT, and the keyless table ends equal to the source, without duplicates."""
    src = f"`{source_db}`"
    with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {src}.k (id INT PRIMARY KEY, v INT NOT NULL)")
        cur.execute(f"CREATE TABLE {src}.loose (v INT NOT NULL)")
    target.execute("CREATE TABLE {schema}.k (id INT PRIMARY KEY, v INT NOT NULL)")
    target.execute("CREATE TABLE {schema}.loose (v INT NOT NULL)")
    pair = Pair(tmp_path, zookeeper_server.hosts, mariadb_source, source_db, target)

    def write(*statements: str) -> None:
        with contextlib.closing(mariadb_source.connect(autocommit=False)) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement.replace("{src}", src))
            conn.commit()

    try:
        pair.spawn("node-a")
        pair.wait(lambda: pair.holder() == "node-a", "node-a to hold p")
        pair.spawn("node-b")
        pair.wait(lambda: "node-b" in pair.store.members(pair.name)[1], "node-b to stand by")
        write("INSERT INTO {src}.k VALUES (1, 0), (2, 0)", "INSERT INTO {src}.loose VALUES (1), (1)")
        before = pair.wait_caught_up()

        blocker = target.lock("k", 1)
        try:
            write("INSERT INTO {src}.loose VALUES (7)", "UPDATE {src}.k SET v = 1 WHERE id = 1")
            try:
                # Polled every 0.3 s: InnoDB refreshes INFORMATION_SCHEMA.INNODB_TRX only after 100 ms
                # without a read of it, so polling faster than that (a fast machine) never sees a change.
                pair.wait(lambda: target.lock_waits(blocker) >= 1, "node-a's load to wait inside its transaction",
                          timeout=90, interval=0.3)
            except TimeoutError as exc:  # say why: the target's sessions and node-a's threads
                pair.procs["node-a"].send_signal(signal.SIGUSR1)
                time.sleep(2)
                raise TimeoutError(f"{exc}\n{target.diagnose()}\n{pair.logs()}") from None
            pair.procs["node-a"].send_signal(signal.SIGSTOP)
        finally:
            blocker.rollback()
            blocker.close()
        frozen = time.monotonic()
        pair.wait(lambda: pair.holder() == "node-b", "node-b to take over", timeout=20)
        ack = pair.wait_caught_up(min_epoch=before.epoch + 1, timeout=40)
        took = time.monotonic() - frozen
        print(f"freeze to the new leader's first ack past the frozen batch: {took:.1f}s")
        # Without the kill, the new leader waits on the frozen transaction's locks: 50 s and more.
        assert took < (SESSION_TIMEOUT_MS + STANDBY_DELAY_MS) / 1000 + 20, pair.logs()
        write("INSERT INTO {src}.loose VALUES (8)", "UPDATE {src}.k SET v = 2 WHERE id = 2")
        pair.wait_caught_up(min_epoch=ack.epoch)

        pair.procs["node-a"].send_signal(signal.SIGCONT)
        pair.wait(lambda: "node-a" in pair.store.members(pair.name)[1], "node-a to stand by again", timeout=60)
        write("INSERT INTO {src}.loose VALUES (9)")
        final = pair.wait_caught_up(min_epoch=ack.epoch)
        assert pair.holder() == "node-b" and final.epoch >= ack.epoch
        with contextlib.closing(mariadb_source.connect()) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {src}.k")
            keyed = sorted(cur.fetchall())
            cur.execute(f"SELECT * FROM {src}.loose")
            loose = Counter(row[0] for row in cur.fetchall())
        assert target.rows("k") == keyed
        assert Counter(row[0] for row in target.rows("loose")) == loose, pair.logs()
        assert "took the" in pair.logs() and "fence for epoch" in pair.logs()
    finally:
        pair.close()
