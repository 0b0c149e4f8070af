"""A cluster of `setl start --all` nodes sharing one ZooKeeper root, each configured with the same
small pipelines (each its own pair of source tables: one keyed, one keyless, and optionally a
sysbench table) from one MariaDB source into one MariaDB target: the rig of the scale-out tests
(tests/ha/test_cluster.py) and of tools/bench/bench_cluster.py."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from setl.ha import Coordinator
from setl.ha.cluster import cluster_view
from setl.meta.zookeeper import ZooKeeperMetaStore
from setl.status import dead_runs
from setl.testing.servers import wait_until
from tests.e2e.setl_process import binlog_head, mysql_source, mysql_target
from tests.ha.zk import unique_root
from tools import sysbench

SESSION_TIMEOUT_MS = 2000
STANDBY_DELAY_MS = 500
REASSIGN_AFTER_MS = 1000
JOIN_GRACE_MS = 3000
SYSBENCH_ROWS = 200  # per sysbench table
KEYED_ROWS = 20


class Fleet:
    """Nodes `names`, pipelines ``<prefix>0`` .. ``<prefix>(count-1)``; `start_load` writes to every
    pipeline's tables from one thread. With `with_sysbench`, pipeline i also carries sysbench table
    ``sbtest<i+1>``, which `start_load` loads with sysbench ``oltp_write_only``."""

    def __init__(self, root: Path, zk_hosts: str, source: Any, source_db: str, target: Any, target_db: str, *,
                 names: tuple[str, ...], pipelines: int, node_extra: dict[str, dict[str, Any]] | None = None,
                 weights: dict[int, int] | None = None, session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 join_grace_ms: int = JOIN_GRACE_MS, with_sysbench: bool = False) -> None:
        self.root, self.zk_hosts = root, zk_hosts
        self.source, self.source_db, self.target, self.target_db = source, source_db, target, target_db
        self.chroot = unique_root()
        prefix = f"c{uuid.uuid4().hex[:6]}_"
        self.pipelines = [f"{prefix}{i}" for i in range(pipelines)]
        with self._source() as cur:
            for name in self.pipelines:
                cur.execute(f"CREATE TABLE `{name}_keyed` (id INT PRIMARY KEY, v INT NOT NULL)")
                cur.execute(f"CREATE TABLE `{name}_log` (seq INT NOT NULL, v INT NOT NULL)")  # keyless
        start = binlog_head(source)
        with self._source() as cur:
            for name in self.pipelines:
                cur.executemany(f"INSERT INTO `{name}_keyed` VALUES (%s, 0)", [(i,) for i in range(KEYED_ROWS)])
        self.sysbench_tables = len(self.pipelines) if with_sysbench else 0
        self._sysbench: sysbench.Running | None = None
        if self.sysbench_tables:  # the DDL kept out of the binlog (the target gets it here), the rows in it
            sysbench.prepare(self.sysbench_conn(source, source_db), tables=self.sysbench_tables,
                             table_size=SYSBENCH_ROWS, ddl_in_binlog=False)
            sysbench.create_tables(self.sysbench_conn(target, target_db), tables=self.sysbench_tables)
        self.names = names
        server_ids = {name: 2000 + uuid.uuid4().int % 60000 for name in self.pipelines}  # one binlog slot each
        for node in names:
            conf = self.conf(node)
            (conf / "pipelines").mkdir(parents=True)
            settings: dict[str, Any] = {
                "node": {"id": node},
                "meta": {"store": "zookeeper"},
                "ha": {"zookeeper": zk_hosts, "chroot": self.chroot, "session_timeout_ms": session_timeout_ms,
                       "standby_delay_ms": STANDBY_DELAY_MS, "reassign_after_ms": REASSIGN_AFTER_MS,
                       "join_grace_ms": join_grace_ms, "expected_nodes": list(names)},
                "runtime": {"workers": 2},
            }
            for key, value in (node_extra or {}).get(node, {}).items():
                settings[key] = {**settings.get(key, {}), **value} if isinstance(value, dict) else value
            (conf / "setl.yaml").write_text(yaml.safe_dump(settings))
            for i, name in enumerate(self.pipelines):
                pipeline = {
                    "source": mysql_source(source, start={"file": start.log, "pos": start.offset},
                                           server_id=server_ids[name]),
                    "target": mysql_target(target),
                    "tables": [{"source": rf"{re.escape(source_db)}\.({re.escape(name)}_.*"
                                          + (f"|sbtest{i + 1})" if with_sysbench else ")"),
                                "target": f"{target_db}.{{table}}"}],
                    "pipeline": {"parallelism": 2, "batch": {"max_rows": 200, "max_wait_ms": 50},
                                 "weight": (weights or {}).get(i, 1),
                                 "retry": {"max_attempts": 10, "initial_backoff_ms": 50, "max_backoff_ms": 500}},
                }
                (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
        self.procs: dict[str, subprocess.Popen] = {}
        self._spawned = 0
        self._store: ZooKeeperMetaStore | None = None
        self._load_stop = threading.Event()
        self._loader: threading.Thread | None = None
        self.written = 0

    @contextlib.contextmanager
    def _source(self):
        conn = self.source.connect(database=self.source_db)
        try:
            with conn.cursor() as cur:
                yield cur
        finally:
            conn.close()

    @staticmethod
    def sysbench_conn(server: Any, database: str) -> sysbench.Conn:
        return sysbench.Conn.from_server(server, database)

    def conf(self, node: str) -> Path:
        return self.root / node / "conf"

    @property
    def store(self) -> ZooKeeperMetaStore:
        if self._store is None:
            self._store = ZooKeeperMetaStore(
                Coordinator(self.zk_hosts, root=self.chroot, session_timeout=5, give_up_after=30).start())
        return self._store

    # -- processes

    def spawn(self, node: str) -> subprocess.Popen:
        self._spawned += 1
        env = dict(os.environ)
        env.pop("SETL_FAULTS", None)
        with open(self.root / f"setl-{self._spawned:02d}-{node}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(self.conf(node)), "start",
                                     "--all"], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        self.procs[node] = proc
        return proc

    def cli(self, node: str, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(self.conf(node)), *args],
                              capture_output=True, text=True, timeout=timeout)

    def kill(self, node: str) -> None:
        self.procs[node].send_signal(signal.SIGKILL)
        self.procs[node].wait(10)

    def stop_all(self) -> dict[str, int | None]:
        codes = {}
        for node, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            codes[node] = proc.returncode
        return codes

    def close(self) -> None:
        self.stop_load()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if self._store is not None:
            self._store.close()

    def logs(self, tail: int | None = 3000) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-tail if tail else 0:]
                         for p in sorted(self.root.glob("setl-*.log")))

    def _alive(self) -> None:
        for node, proc in self.procs.items():
            if proc.poll() not in (None, -signal.SIGKILL):
                raise AssertionError(f"{node} exited with {proc.returncode}:\n{self.logs()}")

    # -- load

    def start_load(self, rate: float = 60.0, sysbench_rate: int = 40, seconds: float = 600) -> None:
        """About `rate` transactions/s over all pipelines: each inserts a keyless row and updates a
        keyed one, in one transaction; with sysbench tables, sysbench too (`sysbench_rate`
        transactions/s over them, for at most `seconds`)."""
        if self.sysbench_tables:
            self._sysbench = sysbench.start(self.sysbench_conn(self.source, self.source_db), seconds=seconds,
                                            threads=2, rate=sysbench_rate, tables=self.sysbench_tables,
                                            table_size=SYSBENCH_ROWS)

        def run() -> None:
            rng = random.Random(7)
            conn = self.source.connect(database=self.source_db)
            try:
                with conn.cursor() as cur:
                    while not self._load_stop.is_set():
                        name = self.pipelines[self.written % len(self.pipelines)]
                        cur.execute("BEGIN")
                        cur.execute(f"INSERT INTO `{name}_log` VALUES (%s, %s)", (self.written, rng.randrange(1000)))
                        cur.execute(f"UPDATE `{name}_keyed` SET v = v + 1 WHERE id = %s", (rng.randrange(KEYED_ROWS),))
                        cur.execute("COMMIT")
                        self.written += 1
                        self._load_stop.wait(1.0 / rate)
            finally:
                conn.close()

        self._load_stop.clear()
        self._loader = threading.Thread(target=run, name="fleet-load", daemon=True)
        self._loader.start()

    def stop_load(self) -> None:
        self._load_stop.set()
        if self._loader is not None:
            self._loader.join(10)
            self._loader = None
        if self._sysbench is not None:
            self._sysbench.stop()  # what it committed is in the binlog; the rest rolled back
            self._sysbench = None

    # -- observations

    def view(self) -> dict[str, Any]:
        return cluster_view(self.store.coordinator, dead=functools.partial(dead_runs, self.store))

    def holders(self) -> dict[str, str | None]:
        return {name: self.store.members(name)[0] for name in self.pipelines}

    def counts(self, nodes: tuple[str, ...] | list[str]) -> dict[str, int]:
        held = self.holders()
        return {node: sum(1 for h in held.values() if h == node) for node in nodes}

    def wait_spread(self, nodes: tuple[str, ...] | list[str], low: int, high: int, timeout: float = 90) -> float:
        """Wait until every pipeline is held by one of `nodes`, each holding `low`..`high`;
        returns the seconds waited."""
        began = time.monotonic()

        def spread() -> bool:
            self._alive()
            held = self.holders()
            counts = self.counts(nodes)
            return all(h in nodes for h in held.values()) and all(low <= c <= high for c in counts.values())

        wait_until(spread, timeout=timeout, interval=0.1,
                   message=lambda: f"pipelines spread {low}..{high} over {nodes}: {self.holders()}\n{self.logs()}")
        return time.monotonic() - began

    def rows(self, server: Any, database: str, name: str) -> tuple[list[tuple], list[tuple]]:
        conn = server.connect(database=database)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT id, v FROM `{name}_keyed` ORDER BY id")
                keyed = [tuple(r) for r in cur.fetchall()]
                cur.execute(f"SELECT seq, v FROM `{name}_log` ORDER BY seq, v")
                log = [tuple(r) for r in cur.fetchall()]
        except Exception:
            return [], []
        finally:
            conn.close()
        return keyed, log

    def sysbench_checksums(self, server: Any, database: str) -> dict[str, int | None]:
        if not self.sysbench_tables:
            return {}
        return sysbench.checksums(self.sysbench_conn(server, database),
                                  [f"sbtest{n}" for n in range(1, self.sysbench_tables + 1)])

    def equal(self) -> bool:
        sums = self.sysbench_checksums(self.source, self.source_db)
        return all(self.rows(self.source, self.source_db, n) == self.rows(self.target, self.target_db, n)
                   for n in self.pipelines) and sums == self.sysbench_checksums(self.target, self.target_db)

    def wait_equal(self, timeout: float = 90) -> None:
        def equal() -> bool:
            self._alive()
            return self.equal()

        wait_until(equal, timeout=timeout, interval=0.5, message=lambda: f"targets equal to sources\n{self.logs()}")

    def assert_exact(self) -> None:
        """Every pipeline's keyed table equal, and its keyless table holding each source row exactly
        once (a batch applied twice would repeat rows)."""
        total = 0
        for name in self.pipelines:
            source_keyed, source_log = self.rows(self.source, self.source_db, name)
            target_keyed, target_log = self.rows(self.target, self.target_db, name)
            assert target_keyed == source_keyed, name
            assert target_log == source_log, (name, len(target_log), len(source_log))
            assert len({seq for seq, _ in target_log}) == len(target_log), f"{name}: a row applied twice"
            total += len(source_log)
        assert total == self.written and total > 0, (total, self.written)
        sums = self.sysbench_checksums(self.source, self.source_db)
        assert all(sums.values()) and sums == self.sysbench_checksums(self.target, self.target_db), sums

    def assert_epochs_never_go_back(self) -> None:
        for name in self.pipelines:
            history = list(reversed(self.store.history(name, 10_000)))
            assert history, name
            epochs = [a.epoch for a in history]
            assert epochs == sorted(epochs), (name, epochs)
            for before, after in zip(history, history[1:]):
                if before.epoch == after.epoch:
                    assert after.batch_id == before.batch_id + 1, (name, before, after)
