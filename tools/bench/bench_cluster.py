"""Scale-out: 1, 2 and 3 nodes (separate ``setl start --all`` processes on one ZooKeeper) running
the same pipelines; total rows/s, and how long a hand-over takes.

Starts a MariaDB source and target and a ZooKeeper (setl.testing.servers). For each node count,
a fresh set of `--pipelines` pipelines (the rig of tests/ha/test_cluster.py: each its own keyed,
keyless and sysbench source table) gets a backlog of `--rows` keyless inserts each, in transactions
of 100 rows, and `--sysbench-seconds` of sysbench ``oltp_write_only`` over the sysbench tables; the
nodes are started together and timed until every target equals its source (node
start-up included: also printed alone, as the time to the first pipeline running). With 2 or more
nodes, under a steady load (the keyless writer and sysbench at a capped rate):

* **move**: ``setl cluster move`` of one pipeline; the time from the request to the first ack by
  the new owner (old owner drains, releases; new owner takes the mainstem and resumes from the ack);
* **kill -9**: of one node; the time until each of its pipelines acks again on another node
  (session timeout + standby delay, or + reassign delay without a live standby);
* **rejoin**: the killed node started again; the time until the pipelines are even again (at most
  one apart per node, no move in flight), and the moves that took.

Every round ends with each target checked equal to its source and its keyless table exact.
On one 2-core machine all nodes share the same two cores: the figures show correctness and
hand-over times, not scaling (see docs/cluster.md for the expected scaling on separate hosts).

    python3 tools/bench/bench_cluster.py [--nodes 1,2,3] [--pipelines 6] [--rows 5000] [--sysbench-seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.testing.servers import MariaDBServer, ZooKeeperServer, wait_until  # noqa: E402
from tests.ha.fleet import SYSBENCH_ROWS, Fleet  # noqa: E402
from tools import sysbench  # noqa: E402


def backlog(fleet: Fleet, rows: int) -> int:
    """`rows` keyless inserts per pipeline, 100 to a transaction; returns the total."""
    conn = fleet.source.connect(database=fleet.source_db)
    try:
        with conn.cursor() as cur:
            for name in fleet.pipelines:
                for start in range(0, rows, 100):
                    cur.execute("BEGIN")
                    cur.executemany(f"INSERT INTO `{name}_log` VALUES (%s, %s)",
                                    [(fleet.written + i, i % 1000) for i in range(min(100, rows - start))])
                    cur.execute("COMMIT")
                    fleet.written += min(100, rows - start)
    finally:
        conn.close()
    return rows * len(fleet.pipelines)


def loaded(fleet: Fleet) -> int:
    """Rows in the keyless target tables (checked exact at the end of each round)."""
    conn = fleet.target.connect(database=fleet.target_db)
    try:
        with conn.cursor() as cur:
            found = 0
            for name in fleet.pipelines:
                try:
                    cur.execute(f"SELECT COUNT(*) FROM `{name}_log`")
                except Exception:  # not created yet
                    continue
                found += cur.fetchone()[0]
            return found
    finally:
        conn.close()


def acked_again(fleet: Fleet, names: list[str], timeout: float = 120) -> float:
    """Seconds until each pipeline in `names` has a new epoch's ack."""
    began = time.monotonic()
    epochs = {name: fleet.store.state(name).epoch for name in names}

    def again() -> bool:
        for name in names:
            ack = fleet.store.position(name)
            if ack is None or ack.epoch <= epochs[name]:
                return False
        return True

    wait_until(again, timeout=timeout, interval=0.02, message=lambda: f"{names} to ack again\n{fleet.logs()}")
    return time.monotonic() - began


def even(fleet: Fleet, names: tuple[str, ...]) -> bool:
    """Every pipeline runs where it is assigned, no move in flight, node counts at most one apart."""
    view = fleet.view()
    if any(row["node"] != row["holder"] or row["moving_from"] for row in view["pipelines"].values()):
        return False
    counts = fleet.counts(names)
    return sum(counts.values()) == len(fleet.pipelines) and max(counts.values()) - min(counts.values()) <= 1


def one_round(folder: Path, zk: ZooKeeperServer, source: MariaDBServer, target: MariaDBServer, nodes: int,
              args: argparse.Namespace) -> dict[str, float]:
    tag = f"r{nodes}_{int(time.time() * 1000) % 10_000_000}"
    source.query(f"CREATE DATABASE {tag}")
    target.query(f"CREATE DATABASE {tag}")
    names = tuple(f"n{i + 1}" for i in range(nodes))
    fleet = Fleet(folder / tag, zk.hosts, source, tag, target, tag, names=names, pipelines=args.pipelines,
                  with_sysbench=args.sysbench_seconds > 0)
    found: dict[str, float] = {}
    try:
        keyless = total = backlog(fleet, args.rows)
        if args.sysbench_seconds > 0:  # a sysbench backlog too: oltp_write_only over one table a pipeline
            result = sysbench.run(fleet.sysbench_conn(source, tag), seconds=args.sysbench_seconds, threads=4,
                                  tables=args.pipelines, table_size=SYSBENCH_ROWS)
            total += result.row_changes
            print(f"  sysbench backlog: {result.transactions:,} transactions ({result.row_changes:,} row changes) "
                  f"over {args.pipelines} tables", flush=True)
        began = time.monotonic()
        for name in names:
            fleet.spawn(name)
        wait_until(lambda: any(h is not None for h in fleet.holders().values()), timeout=120, interval=0.05,
                   message="a first pipeline to run")
        found["start"] = time.monotonic() - began
        wait_until(lambda: loaded(fleet) >= keyless, timeout=900, interval=0.1,
                   message=lambda: f"{keyless} rows in the targets ({loaded(fleet)})\n{fleet.logs()}")
        wait_until(fleet.equal, timeout=900, interval=0.5, message=lambda: f"equal tables\n{fleet.logs()}")
        found["catch_up"] = time.monotonic() - began
        found["rows_per_s"] = total / found["catch_up"]
        found["rows_per_s_after_start"] = total / (found["catch_up"] - found["start"])
        held = fleet.counts(names)
        found["start_moves"] = fleet.view()["moves"]
        print(f"  {nodes} node(s): {total:,} rows in {found['catch_up']:.1f}s = {found['rows_per_s']:,.0f} rows/s "
              f"({found['rows_per_s_after_start']:,.0f} rows/s after the {found['start']:.1f}s start); "
              f"pipelines per node {held}, {found['start_moves']:.0f} moves since the start", flush=True)
        if nodes >= 2:
            fleet.start_load(rate=args.rate)
            time.sleep(2)
            holders = fleet.holders()
            name = fleet.pipelines[0]
            to = next(n for n in names if n != holders[name])
            began = time.monotonic()
            done = fleet.cli(names[0], "cluster", "move", "--pipeline", name, "--to", to, "--timeout", "0")
            assert done.returncode == 0, done.stderr
            found["move"] = acked_again(fleet, [name])
            wait_until(lambda: all(not row["moving_from"] for row in fleet.view()["pipelines"].values()),
                       timeout=120, message="moves to settle")
            fleet.wait_spread(names, 0, args.pipelines, timeout=60)
            victim = names[-1]
            mine = [p for p, h in fleet.holders().items() if h == victim]
            if mine:
                fleet.kill(victim)
                found["kill"] = acked_again(fleet, mine)
            print(f"    move {name} -> {to}: acked by the new owner after {found['move']:.2f}s; kill -9 of {victim} "
                  f"({len(mine)} pipelines): all acked again after {found.get('kill', float('nan')):.2f}s", flush=True)
            if mine:
                wait_until(lambda: even(fleet, names[:-1]), timeout=120, message="the survivors to settle")
                moves = fleet.view()["moves"]
                began = time.monotonic()
                fleet.spawn(victim)
                wait_until(lambda: even(fleet, names), timeout=300, interval=0.05,
                           message=lambda: f"{victim} to get its share back\n{fleet.logs()}")
                found["rejoin"] = time.monotonic() - began
                found["rejoin_moves"] = fleet.view()["moves"] - moves
                print(f"    {victim} started again: pipelines even after {found['rejoin']:.2f}s (process start "
                      f"included), {found['rejoin_moves']:.0f} moves; per node {fleet.counts(names)}", flush=True)
            fleet.stop_load()
        fleet.wait_equal(timeout=300)
        fleet.stop_all()
        fleet.assert_exact()
        fleet.assert_epochs_never_go_back()
        print("    targets equal to sources, keyless rows exact, epochs monotonic", flush=True)
    finally:
        fleet.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1,2,3", help="node counts to run (default 1,2,3)")
    parser.add_argument("--pipelines", type=int, default=6, help="pipelines (default 6)")
    parser.add_argument("--rows", type=int, default=5000, help="backlog rows per pipeline (default 5000)")
    parser.add_argument("--rate", type=float, default=60, help="transactions/s during the hand-overs")
    parser.add_argument("--sysbench-seconds", type=float, default=10,
                        help="seconds of sysbench oltp_write_only backlog over one table a pipeline, caught up "
                             "with the keyless rows; sysbench also runs during the hand-overs (0: none)")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    results = {}
    with contextlib.ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="setl-bench-cluster-"))  # kept if a run fails, for its logs
        source = stack.enter_context(MariaDBServer(server_id=1))
        target = stack.enter_context(MariaDBServer(server_id=2))
        zk = stack.enter_context(ZooKeeperServer())
        print(f"{args.pipelines} pipelines, {args.rows:,} backlog rows each; nodes share this machine's cores")
        for nodes in counts:
            results[nodes] = one_round(folder, zk, source, target, nodes, args)
    shutil.rmtree(folder, ignore_errors=True)
    base = results[counts[0]]["rows_per_s"]
    print()
    print(f"{'nodes':>5} {'rows/s':>10} {'vs ' + str(counts[0]):>6} {'move s':>7} {'kill s':>7} {'rejoin s':>8} "
          f"{'moves':>5}")
    for nodes, found in results.items():
        print(f"{nodes:>5} {found['rows_per_s']:>10,.0f} {found['rows_per_s'] / base:>6.2f} "
              f"{found.get('move', float('nan')):>7.2f} {found.get('kill', float('nan')):>7.2f} "
              f"{found.get('rejoin', float('nan')):>8.2f} {found.get('rejoin_moves', float('nan')):>5.0f}")


if __name__ == "__main__":
    main()
