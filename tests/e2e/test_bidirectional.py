"""A two-way channel between two live MariaDB primaries (docs/bidirectional.md): users write both
sides at once, each direction's loader marks its writes with the channel's reserved server_id, the
other direction's reader drops them whole. Both sides end equal, and both binlogs stop growing
once the writers stop: no change, row or DDL, returns to where it started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from setl.ha import Coordinator
from setl.meta import SqliteMetaStore
from setl.meta.zookeeper import ZooKeeperMetaStore
from setl.model import Position
from setl.testing.servers import MariaDBServer, wait_until

SPLIT = 200  # pipeline.batch.max_rows: a bigger transaction is read and loaded in pieces


@contextlib.contextmanager
def two_primaries(tmp_path_factory: pytest.TempPathFactory, name: str, first_id: int, *, domains: int = 0,
                  interleaved: bool = True, setup: Callable[[MariaDBServer], None] | None = None
                  ) -> Iterator[list[MariaDBServer]]:
    """Two started primaries with binlogs (dirs `name`1 and `name`2), server_ids `first_id` + 1 and + 2,
    GTID domains `domains` + 1 and + 2, auto-increments interleaved unless told not; `setup` run on each."""
    servers = [MariaDBServer(tmp_path_factory.mktemp(f"{name}{i}"), server_id=first_id + i,
                             options={"gtid_domain_id": domains + i, **({"auto_increment_increment": 2,
                                                                        "auto_increment_offset": i}
                                                                       if interleaved else {})}) for i in (1, 2)]
    try:
        for server in servers:
            server.start()
            if setup is not None:
                setup(server)
        yield servers
    finally:
        for server in servers:
            server.cleanup()


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MariaDBServer]]:
    """Two primaries with binlogs, distinct server_ids and GTID domains, and interleaved auto-increments."""
    with two_primaries(tmp_path_factory, "site", 10) as servers:
        yield servers


class Channel:
    """`conf/channels/NAME.yaml` over two sites, and `setl` run on it as a subprocess."""

    def __init__(self, root: Path, name: str, east: MariaDBServer, west: MariaDBServer, schema: str,
                 node: str = "conf", settings: dict | None = None, **extra: Any) -> None:
        self.root, self.name, self.schema, self.node = root, name, schema, node
        self.conf = root / node
        (self.conf / "channels").mkdir(parents=True, exist_ok=True)
        self.meta_path = root / "meta.db"
        self.store: Any = None  # the meta store the acks are read from (None: the SQLite file)
        (self.conf / "setl.yaml").write_text(yaml.safe_dump(settings or {"meta": {"store": "sqlite",
                                                                                   "path": str(self.meta_path)}}))
        self.servers = {"east": east, "west": west}
        self.config: dict[str, Any] = {
            "sites": {site: {"host": s.host, "port": s.port, "user": s.user, "password": s.password,
                             "setl_server_id": 4000 + i, "setl_gtid_domain_id": 40 + i}
                      for i, (site, s) in enumerate(self.servers.items(), 1)},
            "tables": [{"source": rf"{schema}\..*"}],
            "pipeline": {"parallelism": 2, "batch": {"max_rows": SPLIT, "max_wait_ms": 50},
                         "retry": {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 500}},
            **extra}
        self.write()
        self.pipelines = [f"{name}.east-to-west", f"{name}.west-to-east"]
        self.spawned = 0

    def write(self) -> None:
        (self.conf / "channels" / f"{self.name}.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "setl.cli", "--conf", str(self.conf), *args]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout)

    def spawn(self, faults: list[dict] | None = None) -> subprocess.Popen:
        """`setl start` of both directions in one node (with `faults`: SETL_FAULTS), logging to a file."""
        self.spawned += 1
        env = {k: v for k, v in os.environ.items() if k != "SETL_FAULTS"}
        if faults:
            env["SETL_FAULTS"] = json.dumps(faults)
        with open(self.root / f"setl-{self.node}-{self.spawned}.log", "w") as log:
            return subprocess.Popen(self.argv("start", *(a for p in self.pipelines for a in ("--pipeline", p))),
                                    stdout=log, stderr=subprocess.STDOUT, text=True, env=env)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-6000:] for p in sorted(self.root.glob("setl-*.log")))

    def acked(self, pipeline: str) -> Position | None:
        if self.store is not None:
            ack = self.store.position(pipeline)
            return ack.position if ack is not None else None
        if not self.meta_path.exists():
            return None
        meta = SqliteMetaStore(self.meta_path)
        try:
            ack = meta.position(pipeline)
        finally:
            meta.close()
        return ack.position if ack is not None else None


def head(server: MariaDBServer) -> Position:
    log, offset = server.query("SHOW MASTER STATUS")[0][:2]
    return Position(log, int(offset))


def rows(server: MariaDBServer, table: str) -> list[tuple]:
    return [tuple(r) for r in server.query(f"SELECT * FROM {table} ORDER BY 1")]


def columns(server: MariaDBServer, schema: str, table: str) -> list[str]:
    return [r[0] for r in server.query("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                                       "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (schema, table))]


def settled(channel: Channel, east: MariaDBServer, west: MariaDBServer, proc: subprocess.Popen,
            timeout: float = 90) -> tuple[Position, Position]:
    """Wait until both directions acked their source's head and the heads stood still meanwhile (a
    loop-back would have written the other side before its ack); the heads then."""
    seen: list[tuple] = []

    def still() -> bool:
        assert proc.poll() is None, channel.logs()
        heads = (head(east), head(west))
        acks = (channel.acked(channel.pipelines[0]), channel.acked(channel.pipelines[1]))
        state = (heads, acks)
        caught_up = acks[0] is not None and acks[1] is not None and acks[0].log == heads[0].log \
            and acks[0].offset == heads[0].offset and acks[1].log == heads[1].log and acks[1].offset == heads[1].offset
        seen.append(state)
        return caught_up and len(seen) >= 2 and seen[-2] == state

    wait_until(still, timeout=timeout, interval=0.5, message=lambda: f"not settled: {seen[-3:]}\n{channel.logs()}")
    return seen[-1][0]


def running(proc: subprocess.Popen, channel: Channel) -> bool:
    assert proc.poll() is None, channel.logs()
    return True


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)


def equal_sites(tmp_path: Path, name: str, east: MariaDBServer, west: MariaDBServer, schema: str,
                *tables: str, **kwargs: Any) -> Channel:
    """`tables` made on both sites alike, and a channel over them whose directions start at each site's head."""
    for server in (east, west):
        server.query(f"CREATE DATABASE {schema}")
        for table in tables:
            server.query(f"CREATE TABLE {schema}.{table}")
    channel = Channel(tmp_path, name, east, west, schema, **kwargs)
    for site, server in channel.servers.items():
        at = head(server)
        channel.config["sites"][site]["start"] = {"file": at.log, "pos": at.offset}
    channel.write()
    return channel


@pytest.mark.parametrize("mode", ["ordered", "per_table"])
def test_writes_on_both_sides_end_equal_and_nothing_returns(tmp_path, sites, mode):
    """Rows, a DDL on each side and a transaction split in pieces cross once each way; then both binlogs stand still."""
    east, west = sites
    schema = f"app_both_{mode}"
    channel = equal_sites(tmp_path, f"both_{mode}", east, west, schema,
                          "t (id INT AUTO_INCREMENT PRIMARY KEY, site VARCHAR(8), n INT)")
    channel.config["pipeline"]["load"] = {"mode": mode}
    channel.write()
    proc = channel.spawn()
    try:
        for i in range(20):  # auto-increment hands out odd keys on east, even on west
            east.query(f"INSERT INTO {schema}.t (site, n) VALUES ('east', {i})")
            west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', {i})")
        east.query(f"UPDATE {schema}.t SET n = n + 100 WHERE site = 'east' AND n < 5")
        west.query(f"DELETE FROM {schema}.t WHERE site = 'west' AND n >= 15")
        east.query(f"ALTER TABLE {schema}.t ADD COLUMN note VARCHAR(20) NULL")  # DDL on east ...
        west.query(f"CREATE TABLE {schema}.u (id INT PRIMARY KEY, v VARCHAR(10))")  # ... and on west
        wait_until(lambda: running(proc, channel) and "note" in columns(west, schema, "t")
                   and columns(east, schema, "u") == ["id", "v"], timeout=60, message=channel.logs)
        west.query(f"INSERT INTO {schema}.t (site, n, note) VALUES ('west', 99, 'after ddl')")
        big = ", ".join(f"({k}, 'v{k % 10}')" for k in range(1, 3 * SPLIT + 51))
        east.query(f"INSERT INTO {schema}.u (id, v) VALUES {big}")  # one transaction of 650 rows: 4 pieces
        heads = settled(channel, east, west, proc)
        for table in ("t", "u"):
            assert rows(east, f"{schema}.{table}") == rows(west, f"{schema}.{table}"), table
        assert len(rows(east, f"{schema}.u")) == 3 * SPLIT + 50
        assert len(rows(east, f"{schema}.t")) == 20 + 15 + 1
        assert columns(east, schema, "t") == columns(west, schema, "t") == ["id", "site", "n", "note"]
        time.sleep(2)  # several heartbeats and batch waits: a returning change would move a head
        assert (head(east), head(west)) == heads, channel.logs()
        assert proc.poll() is None, channel.logs()
        if mode != "ordered":
            return  # the channel's status and verify: once is enough
        status = channel.run("status", "--channel", channel.name, "--json")
        assert status.returncode == 0, status.stderr
        assert [(r["pipeline"], r["status"]) for r in json.loads(status.stdout)] == [
            (channel.pipelines[0], "running"), (channel.pipelines[1], "running")]
        assert all(r["lag_seconds"] is not None for r in json.loads(status.stdout)), status.stdout
        text = channel.run("status", "--channel", channel.name)
        assert f"channel {channel.name}: east -> west running, lag" in text.stdout, text.stdout
        assert f"channel {channel.name}: west -> east running, lag" in text.stdout, text.stdout
        verify = channel.run("verify", "--channel", channel.name)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert verify.stdout.count(f"-- {channel.name}.") == 2, verify.stdout
    finally:
        assert stop(proc) == 0, channel.logs()


def test_kill_9_inside_a_split_transaction_then_restart_ends_equal_without_a_loop(tmp_path, sites):
    """SIGKILL of the node while it loads a transaction's pieces into the other site; a restart ends equal and still."""
    east, west = sites
    schema = "app_kill"
    channel = equal_sites(tmp_path, "kill", east, west, schema, "u (id INT PRIMARY KEY, v VARCHAR(10))")
    proc = channel.spawn(faults=[{"stage": "load", "action": "slow", "seconds": 0.3, "times": None}])
    try:
        west.query(f"INSERT INTO {schema}.u VALUES (0, 'west')")
        big = ", ".join(f"({k}, 'v{k % 10}')" for k in range(1, 10 * SPLIT + 1))
        east.query(f"INSERT INTO {schema}.u (id, v) VALUES {big}")  # one transaction: 10 pieces of SPLIT rows

        def inside() -> bool:
            assert proc.poll() is None, channel.logs()
            count = west.query(f"SELECT COUNT(*) FROM {schema}.u")[0][0]
            return SPLIT < count < 9 * SPLIT

        wait_until(inside, timeout=60, interval=0.02, message=channel.logs)
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    ack = channel.acked(channel.pipelines[0])
    assert ack is not None and ack.row > 0, ack  # the kill struck inside the transaction, after a piece's ack
    east.query(f"UPDATE {schema}.u SET v = 'after' WHERE id = 1")
    proc = channel.spawn()
    try:
        heads = settled(channel, east, west, proc)
        assert rows(east, f"{schema}.u") == rows(west, f"{schema}.u")
        assert len(rows(west, f"{schema}.u")) == 10 * SPLIT + 1
        time.sleep(2)  # several heartbeats and batch waits: a returning change would move a head
        assert (head(east), head(west)) == heads, channel.logs()
    finally:
        assert stop(proc) == 0, channel.logs()


def test_kill_9_of_the_leader_hands_both_directions_to_the_standby(tmp_path, sites, zookeeper_server):
    """Both directions fail over to the standby node (ZooKeeper) after a kill -9 under writes: equal, then still."""
    east, west = sites
    schema = "app_ha"
    chroot = f"/setl-channel-{uuid.uuid4().hex[:8]}"

    def node(name: str) -> dict:
        return {"node": {"id": name}, "meta": {"store": "zookeeper"},
                "ha": {"zookeeper": zookeeper_server.hosts, "chroot": chroot, "session_timeout_ms": 2000,
                       "standby_delay_ms": 500, "join_grace_ms": 0}}

    a = equal_sites(tmp_path, "ha", east, west, schema, "t (id INT AUTO_INCREMENT PRIMARY KEY, site VARCHAR(8), n INT)",
                    node="node-a", settings=node("node-a"))
    b = Channel(tmp_path, "ha", east, west, schema, node="node-b", settings=node("node-b"))
    b.config = a.config
    b.write()
    store = ZooKeeperMetaStore(Coordinator(zookeeper_server.hosts, root=chroot, session_timeout=5,
                                           give_up_after=30).start())
    a.store = b.store = store
    first = a.spawn()
    second = None
    try:
        wait_until(lambda: running(first, a) and all(store.members(p)[0] == "node-a" for p in a.pipelines),
                   timeout=60, message=a.logs)
        second = b.spawn()
        # the cluster may move one direction to node-b on its join (rebalanced): node-a holds one or both
        both = {"node-a", "node-b"}
        wait_until(lambda: running(second, b) and all({store.members(p)[0], *store.members(p)[1]} == both
                                                      for p in b.pipelines), timeout=60, message=b.logs)
        assert any(store.members(p)[0] == "node-a" for p in a.pipelines)
        for i in range(30):
            east.query(f"INSERT INTO {schema}.t (site, n) VALUES ('east', {i})")
            west.query(f"INSERT INTO {schema}.t (site, n) VALUES ('west', {i})")
        first.kill()
        first.wait(10)
        for i in range(30, 60):
            east.query(f"INSERT INTO {schema}.t (site, n) VALUES ('east', {i})")
            west.query(f"UPDATE {schema}.t SET n = n + 1000 WHERE site = 'west' AND n = {i - 30}")
        wait_until(lambda: running(second, b) and all(store.members(p)[0] == "node-b" for p in b.pipelines),
                   timeout=60, message=b.logs)
        heads = settled(b, east, west, second)
        assert rows(east, f"{schema}.t") == rows(west, f"{schema}.t")
        assert len(rows(east, f"{schema}.t")) == 90
        time.sleep(2)  # several heartbeats and batch waits: a returning change would move a head
        assert (head(east), head(west)) == heads, b.logs()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        code = stop(second) if second is not None else 0
        store.close()
        assert code == 0, b.logs()
