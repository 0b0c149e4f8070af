"""Two (or more) `setl start` nodes as subprocesses sharing one ZooKeeper root, replicating a
sysbench-loaded MariaDB source into a MariaDB target: the rig of the HA fault-injection tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from setl.ha import Coordinator
from setl.meta.zookeeper import ZooKeeperMetaStore
from setl.model import Ack, Position
from setl.testing.servers import wait_until
from tests.e2e.setl_process import binlog_head, mysql_source, mysql_target
from tests.ha.proxy import TcpProxy
from tests.ha.zk import unique_root
from tools import sysbench

TABLES = 2
TABLE_SIZE = 300
SESSION_TIMEOUT_MS = 2000
STANDBY_DELAY_MS = 500


class Cluster:
    """Nodes named `names`, each with its own conf dir under `root`, one pipeline `name`.

    The pipeline's name and binlog server_id are the cluster's own: the source and target servers
    are shared with the whole test session, and their position and fence rows (keyed by pipeline)
    and binlog dump slot (keyed by server_id) must not be another test's. A target row left by an
    earlier test's pipeline of the same name would be taken as this pipeline's position.
    """

    def __init__(self, root: Path, zk_hosts: str, source, source_db: str, target, target_db: str, *,
                 names: tuple[str, ...] = ("node-a", "node-b"), standby_delay_ms: int = STANDBY_DELAY_MS,
                 proxied: bool = False) -> None:
        self.root = root
        self.source, self.source_db = source, source_db
        self.target, self.target_db = target, target_db
        self.chroot = unique_root()
        self.zk_hosts = zk_hosts
        self.name = f"p{uuid.uuid4().hex[:8]}"
        start = binlog_head(source)
        sysbench.prepare(self.source_conn, tables=TABLES, table_size=TABLE_SIZE, ddl_in_binlog=False)
        sysbench.create_tables(self.target_conn, tables=TABLES)
        pipeline = {
            "source": mysql_source(source, start={"file": start.log, "pos": start.offset},
                                   server_id=2000 + uuid.uuid4().int % 60000),
            "target": mysql_target(target),
            "tables": [{"source": rf"{re.escape(source_db)}\..*", "target": f"{target_db}.{{table}}"}],
            "pipeline": {"parallelism": 3, "batch": {"max_rows": 2000, "max_wait_ms": 50},
                         "retry": {"max_attempts": 10, "initial_backoff_ms": 50, "max_backoff_ms": 500}},
        }
        self.names = names
        # proxied: each node reaches ZooKeeper through a TcpProxy of its own, which `expire` cuts.
        self.proxies = {name: TcpProxy(zk_hosts).start() for name in names} if proxied else {}
        for name in names:
            conf = self.conf(name)
            (conf / "pipelines").mkdir(parents=True)
            (conf / "setl.yaml").write_text(yaml.safe_dump({
                "node": {"id": name},
                "meta": {"store": "zookeeper"},
                "ha": {"zookeeper": self.proxies[name].address if proxied else zk_hosts, "chroot": self.chroot,
                       "session_timeout_ms": SESSION_TIMEOUT_MS,
                       "standby_delay_ms": standby_delay_ms,
                       # the rig starts its nodes one at a time, each after the one before holds or stands by
                       "join_grace_ms": 0},
            }))
            (conf / "pipelines" / f"{self.name}.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
        self.procs: dict[str, subprocess.Popen] = {}
        self._spawned = 0
        self._store: ZooKeeperMetaStore | None = None

    @property
    def source_conn(self) -> sysbench.Conn:
        return sysbench.Conn.from_server(self.source, self.source_db)

    @property
    def target_conn(self) -> sysbench.Conn:
        return sysbench.Conn.from_server(self.target, self.target_db)

    def conf(self, name: str) -> Path:
        return self.root / name / "conf"

    @property
    def store(self) -> ZooKeeperMetaStore:
        """A meta store on its own session, for reading what the nodes wrote."""
        if self._store is None:
            self._store = ZooKeeperMetaStore(
                Coordinator(self.zk_hosts, root=self.chroot, session_timeout=5, give_up_after=30).start())
        return self._store

    # -- processes

    def spawn(self, name: str, faults: list[dict] | None = None) -> subprocess.Popen:
        """`setl start` of the pipeline on node `name`, with `faults` (`setl.failpoints`) if given."""
        self._spawned += 1
        env = dict(os.environ)
        env.pop("SETL_FAULTS", None)
        if faults:
            env["SETL_FAULTS"] = json.dumps(faults)
        with open(self.root / f"setl-{self._spawned:02d}-{name}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(self.conf(name)), "start",
                                     "--pipeline", self.name], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        self.procs[name] = proc
        return proc

    def cli(self, name: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(self.conf(name)), *args],
                              capture_output=True, text=True, timeout=timeout)

    def signal(self, name: str, sig: int) -> None:
        self.procs[name].send_signal(sig)
        if sig == signal.SIGKILL:
            self.procs[name].wait(10)

    def expire(self, name: str, timeout: float = 30) -> None:
        """Expire node `name`'s ZooKeeper session, the node running: cut its proxy (a cluster made
        with ``proxied=True``) until the server has expired the session, which it shows by dropping
        the node's ephemeral member node, then heal it; the node reconnects to learn its session
        expired."""
        proxy = self.proxies[name]
        proxy.cut()
        try:
            def gone() -> bool:
                holder, standbys = self.members()
                return holder != name and name not in standbys

            wait_until(gone, timeout=timeout, interval=0.05,
                       message=lambda: f"{name}'s session to expire behind its cut proxy ({self.members()})")
        finally:
            proxy.heal()

    def stop_all(self) -> dict[str, int]:
        codes = {}
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            codes[name] = proc.returncode
        return codes

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        if self._store is not None:
            self._store.close()
        for proxy in self.proxies.values():
            proxy.close()

    def logs(self, tail: int | None = 4000) -> str:
        """Each node's log (its last `tail` characters; None: all of it, to search)."""
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-tail if tail else 0:]
                         for p in sorted(self.root.glob("setl-*.log")))

    # -- observations

    def members(self) -> tuple[str | None, list[str]]:
        return self.store.members(self.name)

    def acked(self) -> Ack | None:
        return self.store.position(self.name)

    def _alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() not in (None, -signal.SIGKILL):
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.logs()}")

    def wait_holder(self, name: str, timeout: float = 30) -> None:
        def held() -> bool:
            self._alive()
            return self.members()[0] == name

        wait_until(held, timeout=timeout, interval=0.05, message=lambda: f"{name} to hold p ({self.members()})")

    def wait_standby(self, name: str, timeout: float = 30) -> None:
        def standing() -> bool:
            self._alive()
            return name in self.members()[1]

        wait_until(standing, timeout=timeout, interval=0.05, message=lambda: f"{name} to stand by ({self.members()})")

    def wait_ack(self, after_batch: int = 0, min_epoch: int = 0, timeout: float = 30) -> Ack:
        def acked() -> Ack | None:
            self._alive()
            ack = self.acked()
            return ack if ack is not None and ack.batch_id > after_batch and ack.epoch >= min_epoch else None

        return wait_until(acked, timeout=timeout, interval=0.02,
                          message=lambda: f"an ack after batch {after_batch} at epoch >= {min_epoch} ({self.acked()})")

    def wait_caught_up(self, timeout: float = 60) -> None:
        head: Position = binlog_head(self.source)

        def caught_up() -> bool:
            self._alive()
            ack = self.acked()
            return ack is not None and ack.position >= head

        wait_until(caught_up, timeout=timeout, interval=0.1, message=lambda: f"an ack at {head} ({self.acked()})")

    def load(self, seconds: float, rate: int = 150) -> sysbench.Running:
        return sysbench.start(self.source_conn, seconds=seconds, threads=2, rate=rate, tables=TABLES,
                              table_size=TABLE_SIZE)

    def assert_equal(self) -> None:
        """Every sysbench table has the same CHECKSUM in the source and the target."""
        mine = sysbench.checksums(self.source_conn)
        assert len(mine) == TABLES and all(mine.values()), mine
        assert sysbench.checksums(self.target_conn) == mine

    def assert_epochs_never_go_back(self) -> None:
        """Ack history, oldest first: epochs never decrease and batch ids only grow within an epoch
        (so no deposed leader acked after a newer one)."""
        history = list(reversed(self.store.history(self.name, 10_000)))
        assert history
        epochs = [a.epoch for a in history]
        assert epochs == sorted(epochs), epochs
        for before, after in zip(history, history[1:]):
            if before.epoch == after.epoch:
                assert after.batch_id == before.batch_id + 1
