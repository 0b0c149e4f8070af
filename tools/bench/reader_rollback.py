"""What a rollback costs the binlog source with `sources.reader_process`, old code against new in the
same run: the source's `seek` back to one position, then `poll` until its first row change, repeated.

    python3 tools/bench/reader_rollback.py [--rollbacks 10] [--rounds 2] TREE [TREE ...]

TREE is a built checkout (``build_ext --inplace``). One MariaDB source with one transaction of 100 rows
after the start; each TREE runs in a Python of its own (its PYTHONPATH), in alternated rounds, opens
once (its first rows read, then 2 s for a background start to end), then rolls back `--rollbacks`
times. Per rollback: the wall time from `seek` to the first row (what the pipeline waits), the CPU
of every process of the source (node and reader processes, reaped or alive) over the same span, and
the CPU of the whole rollback once 2 s later (a spare started in the background included).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTLE = 2.0


def children_cpu() -> float:
    """CPU seconds of this process's live children (from /proc), and of those it reaped."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            pids = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + reaped.ru_utime + reaped.ru_stime


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + children_cpu()


def child(args: argparse.Namespace) -> int:
    """One TREE's loop (run with its PYTHONPATH): one JSON line of per-rollback figures."""
    from setl.model import Position, RowChange
    from setl.sources.mysql_binlog import MysqlBinlogSource

    start = Position(args.start_file, args.start_pos)
    src = MysqlBinlogSource(host="127.0.0.1", port=args.port, user="root", password="", server_id=args.server_id,
                            pipeline="rollback", reader_process=True)

    def first_row() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            tx = src.poll(0.5)
            if tx is not None and any(isinstance(c, RowChange) for c in tx.changes):
                return
        raise SystemExit("no row within 60 s")

    walls, critical, totals = [], [], []
    try:
        src.open(start)
        first_row()
        time.sleep(SETTLE)
        for _ in range(args.rollbacks):
            cpu0, t0 = cpu(), time.perf_counter()
            src.seek(start)
            first_row()
            walls.append(time.perf_counter() - t0)
            critical.append(cpu() - cpu0)
            time.sleep(SETTLE)
            totals.append(cpu() - cpu0)
    finally:
        src.close()
    print(json.dumps({"wall": walls, "critical": critical, "total": totals}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollbacks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start-file", help=argparse.SUPPRESS)
    parser.add_argument("--start-pos", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server-id", type=int, default=6001, help=argparse.SUPPRESS)
    parser.add_argument("trees", nargs="*", metavar="TREE")
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    sys.path.insert(0, str(ROOT))
    from setl.testing.servers import MariaDBServer

    with tempfile.TemporaryDirectory(prefix="setl-reader-rollback-") as tmp, \
            MariaDBServer(Path(tmp) / "source", server_id=1) as source:
        source.query("CREATE DATABASE bench")
        source.query("CREATE TABLE bench.t (id INT PRIMARY KEY, v VARCHAR(40))")
        log, pos = source.query("SHOW MASTER STATUS")[0][:2]
        source.query("INSERT INTO bench.t VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(100)))
        figures: dict[str, dict[str, list[float]]] = {t: {"wall": [], "critical": [], "total": []} for t in args.trees}
        server_id = 6000
        for n in range(args.rounds):
            for tree in args.trees if n % 2 == 0 else args.trees[::-1]:
                server_id += 1
                env = {**os.environ, "PYTHONPATH": tree}
                done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                                       "--port", str(source.port), "--start-file", log, "--start-pos", str(pos),
                                       "--server-id", str(server_id), "--rollbacks", str(args.rollbacks)],
                                      env=env, cwd=tree, capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                out = json.loads(done.stdout.strip().splitlines()[-1])
                for key in figures[tree]:
                    figures[tree][key] += out[key]
                print(f"{tree} round {n}: wall median {statistics.median(out['wall']) * 1000:.0f} ms, CPU to the "
                      f"first row {statistics.median(out['critical']) * 1000:.0f} ms, CPU in all "
                      f"{statistics.median(out['total']) * 1000:.0f} ms, load {os.getloadavg()[0]:.1f}", flush=True)
        for tree, got in figures.items():
            print(f"median {tree} ({len(got['wall'])} rollbacks): seek to first row "
                  f"{statistics.median(got['wall']) * 1000:.0f} ms wall, "
                  f"{statistics.median(got['critical']) * 1000:.0f} ms CPU (node and reader processes); "
                  f"{statistics.median(got['total']) * 1000:.0f} ms CPU in all, the next spare's start included")
    return 0


if __name__ == "__main__":
    sys.exit(main())
