"""HA costs: failover time, and the throughput cost of ZooKeeper-backed acks against SQLite ones.

Starts a MariaDB source and target and a ZooKeeper (setl.testing.servers), then:

* **failover**: two ``setl start`` nodes on ZooKeeper replicate a steady sysbench
  ``oltp_write_only`` load; `--runs` times, the holder is killed with SIGKILL and the time until
  the first ack by the other node is measured (polling the ZooKeeper position every 10 ms); the
  killed node is restarted as the standby before the next run. Prints p50 and max against the
  goal: session timeout + standby delay + 2 s.
* **ack cost**: the same recorded sysbench backlog replicated by ``setl start --until-caught-up``
  into a fresh target, `--repeat` times with ``meta.store: sqlite`` (the baseline) and as many
  with ``meta.store: zookeeper``, with the default batch settings. Rows/s count from the
  scheduler's start (its first log line) to the last ack, so process start-up is left out.
  Prints rows/s medians, their ratio and the median ratio of back-to-back pairs (steadier on a
  shared machine), ack latency p50 of each store measured in-process, and the nodes' peak RSS.

    python3 tools/bench/bench_failover.py [--runs 10] [--repeat 3] [--session-timeout-ms 3000]
        [--standby-delay-ms 1000] [--rate 300] [--backlog-seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.ha import Coordinator, Mainstem  # noqa: E402
from setl.meta import SqliteMetaStore  # noqa: E402
from setl.meta.zookeeper import ZooKeeperMetaStore  # noqa: E402
from setl.model import Position  # noqa: E402
from setl.testing.servers import MariaDBServer, ZooKeeperServer, wait_until  # noqa: E402
from tools import sysbench  # noqa: E402

TABLES = 4


def binlog_head(server: MariaDBServer) -> Position:
    log, offset = server.query("SHOW MASTER STATUS")[0][:2]
    return Position(log, int(offset))


class Rig:
    """Conf dirs for setl nodes replicating `source_db` into a target database."""

    def __init__(self, folder: Path, source: MariaDBServer, target: MariaDBServer, zk: ZooKeeperServer,
                 source_db: str, start: Position, args: argparse.Namespace) -> None:
        self.folder, self.source, self.target, self.zk = folder, source, target, zk
        self.source_db, self.start, self.args = source_db, start, args
        self.procs: dict[str, subprocess.Popen] = {}

    def write_conf(self, name: str, target_db: str, *, store: str, chroot: str) -> Path:
        conf = self.folder / name / "conf"
        (conf / "pipelines").mkdir(parents=True, exist_ok=True)
        node = {"node": {"id": name}}
        if store == "zookeeper":
            node |= {"meta": {"store": "zookeeper"},
                     "ha": {"zookeeper": self.zk.hosts, "chroot": chroot,
                            "session_timeout_ms": self.args.session_timeout_ms,
                            "standby_delay_ms": self.args.standby_delay_ms}}
        else:
            node |= {"meta": {"store": "sqlite", "path": str(self.folder / name / "meta.db")}}
        (conf / "setl.yaml").write_text(yaml.safe_dump(node))
        pipeline = {
            "source": {"type": "mysql", "host": self.source.host, "port": self.source.port, "user": "root",
                       "password": "", "server_id": 1700, "start": {"file": self.start.log, "pos": self.start.offset}},
            "target": {"type": "mysql", "host": self.target.host, "port": self.target.port, "user": "root",
                       "password": ""},
            "tables": [{"source": rf"{self.source_db}\..*", "target": f"{target_db}.{{table}}"}],
        }
        (conf / "pipelines" / "p.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
        return conf

    def spawn(self, name: str, conf: Path, *extra: str, level: str = "WARNING") -> subprocess.Popen:
        log = open(self.folder / f"{name}.log.tmp", "w")
        env = dict(os.environ, SETL_LOG_LEVEL=level)
        proc = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", "p",
                                 *extra], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        log.close()
        (self.folder / f"{name}.log.tmp").rename(self.folder / f"{name}-{proc.pid}.log")
        self.procs[name] = proc
        return proc

    def fresh_target(self, name: str) -> str:
        """A new target database, with the target's record of pipeline p forgotten."""
        with contextlib.suppress(Exception):  # no position table before the first run
            self.target.query("DELETE FROM setl.setl_position WHERE pipeline = 'p'")
        database = f"bench_{name}_{uuid.uuid4().hex[:6]}"
        sysbench.create_tables(sysbench.Conn.from_server(self.target, database), tables=TABLES)
        return database


def measure_failover(rig: Rig, runs: int, rate: int) -> list[float]:
    chroot = f"/bench-{uuid.uuid4().hex[:8]}"
    target_db = rig.fresh_target("failover")
    confs = {name: rig.write_conf(name, target_db, store="zookeeper", chroot=chroot) for name in ("a", "b")}
    store = ZooKeeperMetaStore(Coordinator(rig.zk.hosts, root=chroot, session_timeout=5).start())
    load = sysbench.start(sysbench.Conn.from_server(rig.source, rig.source_db), seconds=3600, threads=2, rate=rate,
                          tables=TABLES, table_size=1000)
    times = []
    try:
        rig.spawn("a", confs["a"])
        wait_until(lambda: store.members("p")[0] == "a", timeout=60, message="a to hold p")
        rig.spawn("b", confs["b"])
        wait_until(lambda: "b" in store.members("p")[1], timeout=60, message="b to stand by")
        holder, standby = "a", "b"
        for run in range(runs):
            wait_until(lambda: store.position("p") is not None, timeout=60, message="a first ack")
            before = store.position("p").batch_id
            wait_until(lambda before=before: store.position("p").batch_id > before, timeout=60,
                       message="acks under load")
            epoch = store.state("p").epoch
            killed = time.monotonic()
            rig.procs[holder].send_signal(signal.SIGKILL)
            rig.procs[holder].wait()
            wait_until(lambda epoch=epoch: (ack := store.position("p")) is not None and ack.epoch > epoch,
                       timeout=120, interval=0.01, message="the new holder's first ack")
            times.append(time.monotonic() - killed)
            print(f"  failover {run + 1}/{runs}: {times[-1]:.2f}s ({holder} killed, {standby} acked)", flush=True)
            rig.spawn(holder, confs[holder])
            wait_until(lambda h=holder: h in store.members("p")[1], timeout=60, message="the restarted standby")
            holder, standby = standby, holder
    finally:
        load.stop()
        for proc in rig.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        store.close()
    return times


def replicate_backlog(rig: Rig, store: str) -> tuple[float, int]:
    """`setl start --until-caught-up` over the whole backlog: the seconds from the scheduler's
    start (its first log line; process start-up left out) to its last ack, and the batches."""
    target_db = rig.fresh_target(store)
    name, chroot = f"{store}-{uuid.uuid4().hex[:4]}", f"/bench-{uuid.uuid4().hex[:8]}"
    conf = rig.write_conf(name, target_db, store=store, chroot=chroot)
    proc = rig.spawn(store, conf, "--until-caught-up", level="INFO")
    if proc.wait(900) != 0:
        raise SystemExit(f"setl failed with {store} acks; see {rig.folder}")
    mine = sysbench.checksums(sysbench.Conn.from_server(rig.source, rig.source_db))
    if sysbench.checksums(sysbench.Conn.from_server(rig.target, target_db)) != mine:
        raise SystemExit(f"target differs from the source after the {store} run")
    if store == "zookeeper":
        meta = ZooKeeperMetaStore(Coordinator(rig.zk.hosts, root=chroot).start())
    else:
        meta = SqliteMetaStore(rig.folder / name / "meta.db")
    try:
        last, batches = meta.position("p"), meta.position("p").batch_id
    finally:
        meta.close()
    started = None
    for line in (rig.folder / f"{store}-{proc.pid}.log").read_text().splitlines():
        if "stage=select starting at" in line:
            started = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            break
    if started is None:
        raise SystemExit(f"no scheduler start in the {store} run's log ({rig.folder})")
    return last.time - started, batches


def ack_latency(zk: ZooKeeperServer, folder: Path, n: int = 500) -> tuple[float, float]:
    """Median seconds of one ack: SQLite (WAL, synchronous=NORMAL) and ZooKeeper (fenced transaction)."""
    sqlite = SqliteMetaStore(folder / "lat.db")
    sqlite.next_epoch("p")
    zk_store = ZooKeeperMetaStore(Coordinator(zk.hosts, root=f"/lat-{uuid.uuid4().hex[:6]}").start())
    lease = Mainstem(zk_store.coordinator, "p", "bench").acquire(threading.Event())
    zk_store.coordinator.hold(lease)
    zk_epoch = zk_store.next_epoch("p")
    result = []
    for store, epoch in ((sqlite, 1), (zk_store, zk_epoch)):
        samples = []
        for i in range(n):
            began = time.perf_counter()
            store.ack("p", i + 1, epoch, Position("mysql-bin.000001", 4 + i), rows=5000)
            samples.append(time.perf_counter() - began)
        result.append(statistics.median(samples))
        store.close()
    return result[0], result[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="failovers to time (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="backlog replays per meta store (default 3)")
    parser.add_argument("--session-timeout-ms", type=int, default=3000)
    parser.add_argument("--standby-delay-ms", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=300, help="sysbench tx/s during the failovers")
    parser.add_argument("--backlog-seconds", type=float, default=10, help="sysbench run recorded as the backlog")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="setl-bench-failover-"))  # kept if a run fails, for its logs
        source = stack.enter_context(MariaDBServer(server_id=1))
        target = stack.enter_context(MariaDBServer(server_id=2))
        zk = stack.enter_context(ZooKeeperServer())
        source_db = "sb"
        start = binlog_head(source)
        conn = sysbench.Conn.from_server(source, source_db)
        sysbench.prepare(conn, tables=TABLES, table_size=1000, ddl_in_binlog=False)
        backlog = sysbench.run(conn, seconds=args.backlog_seconds, threads=4, tables=TABLES, table_size=1000)
        rows = TABLES * 1000 + backlog.row_changes
        rig = Rig(folder, source, target, zk, source_db, start, args)

        print(f"backlog: {TABLES}x1000 prepared rows + {backlog.transactions} sysbench transactions "
              f"(~{rows:,} row changes)")
        timings = {"sqlite": [], "zookeeper": []}
        for _ in range(args.repeat):
            for store in timings:
                seconds, batches = replicate_backlog(rig, store)
                timings[store].append(seconds)
                print(f"  {store:9}: {rows / seconds:9,.0f} rows/s ({seconds:.2f}s, {batches} batches, "
                      f"{rows / batches:,.0f} rows/batch)", flush=True)
        sqlite_ack, zk_ack = ack_latency(zk, folder)
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

        print(f"failover: {args.runs} kill -9 of the holder under {args.rate} tx/s, session timeout "
              f"{args.session_timeout_ms} ms, standby delay {args.standby_delay_ms} ms")
        times = measure_failover(rig, args.runs, args.rate)

    shutil.rmtree(folder, ignore_errors=True)
    s, z = statistics.median(timings["sqlite"]), statistics.median(timings["zookeeper"])
    goal = (args.session_timeout_ms + args.standby_delay_ms) / 1000 + 2
    print()
    print(f"failover kill -9 -> first ack: p50 {statistics.median(times):.2f}s  max {max(times):.2f}s  "
          f"(goal < {goal:.1f}s; {len(times)} runs)")
    print(f"sqlite acks   : {rows / s:9,.0f} rows/s (median of {args.repeat})  ack p50 {sqlite_ack * 1000:.2f} ms")
    print(f"zookeeper acks: {rows / z:9,.0f} rows/s (median of {args.repeat})  ack p50 {zk_ack * 1000:.2f} ms")
    pairs = statistics.median(a / b for a, b in zip(timings["sqlite"], timings["zookeeper"]))
    print(f"ratio zookeeper/sqlite rows/s: {s / z:.3f} of the medians, {pairs:.3f} median of back-to-back pairs "
          f"(throughput cost {100 * (1 - pairs):+.1f}%)")
    print(f"peak RSS of a setl node: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
