"""Catch-up of the other tables with one table quarantined, against none (issue 37; goal >= 0.9x).

Starts a MariaDB source, and a MariaDB and a PostgreSQL target (setl.testing.servers). Each run
records a backlog of `--transactions` transactions, each inserting `--rows` rows into each of 4
tables and updating one, then times ``setl start --until-caught-up`` (``on_table_error:
quarantine``) over it into fresh target tables. In the ``quarantined`` runs the target's ``t4``
column is too narrow for every value, so ``t4`` is quarantined at its first change and all its
changes are kept on the target; in the ``none`` runs every table applies. Each round runs, per
target, one pair (none and quarantined, which goes first alternating by round). Each run checks
the other tables equal to the source and, when quarantined, that every change of ``t4`` is kept.

Per run it prints the other tables' rows/s (wall time of the whole command, its start included),
the CPU seconds of the setl process and of the target server, per other-table row (a steadier
measure than wall time on a shared machine),
the latency as the time between two acks on the target (the target's position row polled every
10 ms: one batch's commit cycle; p50 and p99) and the process's peak RSS; per pair the ratio
quarantined/none; per target the medians and the median of the pairs' ratios.

    python3 tools/bench/bench_quarantine.py [--transactions 1500] [--rows 10] [--repeat 3]
                                            [--targets mariadb,postgresql] [--compare-tree DIR]

With ``--compare-tree DIR`` each pair is run once more with another checkout's code (its compiled
modules built), in alternating order with this one's, and the medians of both are printed with
the ratios new/old of each mode.

Figures: docs/performance.md ("Quarantine").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
import yaml

from setl.sinks.sql_quarantine import decode_run
from setl.testing.servers import MariaDBServer, PostgresServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catchup import peak_rss_mib  # the same VmHWM reading for every bench

TABLES = ("t1", "t2", "t3", "t4")
PG_DATABASE = "bench_q"


def backlog(source: MariaDBServer, db: str, transactions: int, rows: int) -> int:
    """The tables (made outside the binlog) and their backlog; the row changes written per table."""
    with contextlib.closing(source.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE DATABASE `{db}`")
        for table in TABLES:
            cur.execute(f"CREATE TABLE `{db}`.`{table}` (id INT PRIMARY KEY, v VARCHAR(20))")
    with contextlib.closing(pymysql.connect(**source.connect_args(autocommit=False))) as conn, conn.cursor() as cur:
        for txn in range(transactions):
            base = txn * rows
            for table in TABLES:
                cur.executemany(f"INSERT INTO `{db}`.`{table}` VALUES (%s, %s)",
                                [(i, f"row {i}") for i in range(base, base + rows)])
                cur.execute(f"UPDATE `{db}`.`{table}` SET v = 'updated' WHERE id = %s", (base,))
            conn.commit()
    return transactions * (rows + 1)


class Target:
    """One target server: its tables per run, its pipeline config, its reads."""

    def __init__(self, kind: str, server: Any) -> None:
        self.kind, self.server = kind, server

    def query(self, sql: str, args: Any = None) -> list[tuple]:
        if self.kind == "postgresql":
            return self.server.query(sql, args, dbname=PG_DATABASE)
        return self.server.query(sql, args)

    def make_tables(self, dst: str, mode: str) -> None:
        self.query(f"CREATE {'SCHEMA' if self.kind == 'postgresql' else 'DATABASE'} {dst}")
        for table in TABLES:
            width = 2 if mode == "quarantined" and table == "t4" else 20
            self.query(f"CREATE TABLE {dst}.{table} (id INT PRIMARY KEY, v VARCHAR({width}))")

    def drop(self, dst: str) -> None:
        self.query(f"DROP {'SCHEMA' if self.kind == 'postgresql' else 'DATABASE'} {dst}"
                   f"{' CASCADE' if self.kind == 'postgresql' else ''}")

    def config(self) -> dict[str, Any]:
        server = self.server
        if self.kind == "postgresql":
            return {"type": "postgresql", "host": server.host, "port": server.port, "user": server.user,
                    "database": PG_DATABASE}
        return {"type": "mysql", "host": server.host, "port": server.port, "user": server.user,
                "password": server.password}

    def poller(self) -> Any:
        """A new autocommit connection for polling the position row."""
        if self.kind == "postgresql":
            return self.server.connect(dbname=PG_DATABASE)
        return pymysql.connect(**self.server.connect_args(autocommit=True))


def server_cpu(pid: int | None) -> float:
    """CPU seconds a server has used, its reaped children's included (PostgreSQL's backends)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def watch_acks(target: Target, pipeline: str, stop: threading.Event, acks: list[float]) -> None:
    """Append the time of each change of `pipeline`'s position row on the target until `stop`."""
    columns = '"offset", "row"' if target.kind == "postgresql" else "`offset`, `row`"
    sql = f"SELECT {columns} FROM setl.setl_position WHERE pipeline = %s"
    last = None
    with contextlib.closing(target.poller()) as conn:
        while not stop.is_set():
            try:
                cur = conn.cursor()
                cur.execute(sql, (pipeline,))
                row = cur.fetchone()
                cur.close()
            except Exception:  # the position table does not exist before the first batch
                row = None
            if row is not None and row != last:
                last = row
                acks.append(time.monotonic())
            time.sleep(0.01)


HERE = Path(__file__).resolve().parents[2]


def one_run(root: Path, source: MariaDBServer, target: Target, mode: str, number: int,
            args: argparse.Namespace, tree: Path = HERE) -> dict[str, float]:
    """One catch-up: the other tables' rows/s, the ack intervals' p50/p99 (ms), the peak RSS (MiB)."""
    src, dst, name = f"bq_src_{number}", f"bq_dst_{number}", f"bq{number}"
    head = source.query("SHOW MASTER STATUS")[0]
    per_table = backlog(source, src, args.transactions, args.rows)
    target.make_tables(dst, mode)
    conf = root / name
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(conf / "meta.db")}}))
    (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump({
        "source": {"type": "mysql", "host": source.host, "port": source.port, "user": source.user,
                   "password": source.password, "server_id": 900 + number,
                   "start": {"file": head[0], "pos": int(head[1])}},
        "target": target.config(),
        "tables": [{"source": rf"{src}\..*", "target": f"{dst}.{{table}}"}],
        "pipeline": {"on_table_error": "quarantine", "create_tables": False},
    }))
    acks: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch_acks, args=(target, name, stop, acks), name="bench-acks")
    watcher.start()
    began = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    applied = server_cpu(target.server.pid)
    proc = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", name,
                             "--until-caught-up"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=tree, env=env)
    rss = 0.0
    while True:
        rss = max(rss, peak_rss_mib(proc.pid))  # sampled until the child exits (a zombie has none)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    seconds = time.monotonic() - began
    stop.set()
    watcher.join()  # its connection closed: the server's CPU below has no more of it
    time.sleep(0.3)  # PostgreSQL's backends of the run exited and reaped
    cpu = usage.ru_utime + usage.ru_stime
    cpu_target = server_cpu(target.server.pid) - applied
    stderr = proc.stderr.read() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{target.kind} {mode} run {number} failed: {stderr[-3000:]}")
    for table in TABLES[:3]:
        theirs = source.query(f"SELECT id, v FROM `{src}`.`{table}` ORDER BY id")
        ours = target.query(f"SELECT id, v FROM {dst}.{table} ORDER BY id")
        if [tuple(r) for r in theirs] != [tuple(r) for r in ours]:
            raise SystemExit(f"{target.kind} {mode} run {number}: {table} differs")
    q = "`" if target.kind == "mariadb" else '"'  # CHANGE is a reserved word in MariaDB
    kept = sum(len(decode_run(bytes(blob))) for (blob,) in target.query(
        f"SELECT {q}change{q} FROM setl.setl_position_kept WHERE pipeline = %s", (name,)))  # a row holds a run
    if mode == "quarantined" and kept != per_table:
        raise SystemExit(f"{target.kind} quarantined run {number}: {kept} changes kept, {per_table} expected")
    if mode == "none" and kept:
        raise SystemExit(f"{target.kind} run {number}: {kept} changes kept with none quarantined")
    gaps = [(b - a) * 1000 for a, b in zip(acks[1:], acks[2:])]  # the first ack includes the start
    p50 = statistics.median(gaps) if gaps else float("nan")
    p99 = sorted(gaps)[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else float("nan")
    rate = 3 * per_table / seconds
    us_row = (cpu + cpu_target) * 1e6 / (3 * per_table)
    label = "" if tree == HERE else f" ({tree})"
    print(f"{target.kind:>10} {mode:>11}{label} run {number}: {seconds:6.2f}s, other tables {rate:9,.0f} rows/s, "
          f"ack every {p50:5.1f} ms p50 / {p99:6.1f} ms p99 ({len(acks)} acks), peak RSS {rss:5.1f} MiB, CPU "
          f"{cpu:5.1f}s + target {cpu_target:5.1f}s = {us_row:5.1f} us per other-table row, kept {kept:,}",
          flush=True)
    source.query(f"DROP DATABASE `{src}`")
    target.drop(dst)
    return {"rate": rate, "p50": p50, "p99": p99, "rss": rss, "cpu": us_row}


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in ("rate", "p50", "p99", "rss", "cpu")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=1500)
    parser.add_argument("--rows", type=int, default=10, help="rows inserted per table per transaction")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--targets", default="mariadb,postgresql", help="comma-separated: mariadb, postgresql")
    parser.add_argument("--compare-tree", type=Path, help="another checkout of setl, run in the same rounds")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.targets.split(",") if k.strip()]
    if not kinds or set(kinds) - {"mariadb", "postgresql"}:
        parser.error("--targets takes mariadb and/or postgresql")
    trees = [HERE] + ([args.compare_tree.resolve()] if args.compare_tree else [])
    found = {(kind, tree, mode): [] for kind in kinds for tree in trees for mode in ("none", "quarantined")}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="setl-bench-q-") as folder:
        source = stack.enter_context(MariaDBServer(server_id=1))
        targets = {}
        if "mariadb" in kinds:
            targets["mariadb"] = Target("mariadb", stack.enter_context(MariaDBServer(server_id=2)))
        if "postgresql" in kinds:
            pg = stack.enter_context(PostgresServer())
            pg.query(f"CREATE DATABASE {PG_DATABASE}")
            targets["postgresql"] = Target("postgresql", pg)
        number = 0
        for round_ in range(args.repeat):
            for kind in kinds:
                for tree in (trees if round_ % 2 == 0 else trees[::-1]):
                    modes = ("none", "quarantined") if round_ % 2 == 0 else ("quarantined", "none")
                    for mode in modes:
                        found[kind, tree, mode].append(
                            one_run(Path(folder), source, targets[kind], mode, number, args, tree))
                        number += 1
                    pair = found[kind, tree, "quarantined"][-1]["rate"] / found[kind, tree, "none"][-1]["rate"]
                    print(f"{kind:>10} round {round_}{'' if tree == HERE else f' ({tree})'}: ratio quarantined/none "
                          f"{pair:.2f}", flush=True)
    for kind in kinds:
        for tree in trees:
            none, quarantined = found[kind, tree, "none"], found[kind, tree, "quarantined"]
            ratios = [q["rate"] / n["rate"] for n, q in zip(none, quarantined)]
            line = []
            for mode, runs in (("none", none), ("quarantined", quarantined)):
                med = medians(runs)
                line.append(f"{mode} {med['rate']:,.0f} rows/s, ack {med['p50']:.0f}/{med['p99']:.0f} ms p50/p99, "
                            f"RSS {med['rss']:.0f} MiB, {med['cpu']:.1f} us CPU per row")
            print(f"{kind}{'' if tree == HERE else f' ({tree})'} medians: {'; '.join(line)}; ratio quarantined/none: "
                  f"median of pairs {statistics.median(ratios):.2f} (pairs {', '.join(f'{r:.2f}' for r in ratios)}), "
                  f"of medians {medians(quarantined)['rate'] / medians(none)['rate']:.2f}; in CPU per row "
                  f"(none/quarantined) {medians(none)['cpu'] / medians(quarantined)['cpu']:.2f}")
        if len(trees) > 1:
            print(f"{kind} new/old rows/s: " + ", ".join(
                f"{mode} {medians(found[kind, HERE, mode])['rate'] / medians(found[kind, trees[1], mode])['rate']:.2f}"
                for mode in ("none", "quarantined")))


if __name__ == "__main__":
    main()
