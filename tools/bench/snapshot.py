"""Snapshot throughput: `setl start` with ``start: snapshot`` against ``mariadb-dump --single-transaction |
mariadb`` on the same sysbench tables, in the same run; and what the copy costs the source's writers.

Starts a MariaDB source and target (setl.testing.servers), prepares `--tables` sysbench tables of
`--table-size` rows, then prints:

* ``dump``: ``mariadb-dump --single-transaction DB | mariadb`` into an empty target database;
* ``setl``: ``setl start --until-caught-up`` with ``start: snapshot`` into another (tables created
  empty beforehand), checked with CHECKSUM TABLE; its peak RSS (the child's ``ru_maxrss``);
* ``sysbench``: transactions/s of an uncapped ``oltp_write_only`` run alone, while setl copies the
  same tables (the copy must not throttle the source), and while the dump does (the same CPU
  contention on a small machine, with the dump's one long transaction).

    python3 tools/bench/snapshot.py [--tables 4] [--table-size 500000] [--chunk-rows 10000] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.testing.servers import MariaDBServer  # noqa: E402
from tools import sysbench  # noqa: E402


def run_setl(conf: Path, name: str, profile: str | None = None) -> tuple[float, int, str]:
    """`setl start --until-caught-up`: seconds, peak RSS (KiB) and its log (`profile`: py-spy's
    collapsed stacks to that file; the RSS is then py-spy's)."""
    log = conf.parent / f"{name}.log"
    spy = ["py-spy", "record", "-r", "100", "-f", "raw", "-o", profile, "--"] if profile else []
    with open(log, "w") as out:
        began = time.perf_counter()
        argv = [*spy, sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", name,
                "--until-caught-up"]
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"setl failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return seconds, usage.ru_maxrss, log.read_text()


def dump(source: MariaDBServer, target: MariaDBServer) -> float:
    """The baseline, ``mariadb-dump --single-transaction sb | mariadb dumped``: its seconds."""
    target.query("CREATE DATABASE dumped")
    began = time.perf_counter()
    dumping = subprocess.Popen(["mariadb-dump", "--single-transaction", "-h", source.host, "-P", str(source.port),
                                "-u", source.user, "sb"], stdout=subprocess.PIPE)
    subprocess.run(["mariadb", "-h", target.host, "-P", str(target.port), "-u", target.user, "dumped"],
                   stdin=dumping.stdout, check=True)
    assert dumping.wait() == 0
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=500_000)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=2, help="sysbench threads for the tps comparison")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each sysbench run")
    parser.add_argument("--profile", metavar="FILE", help="py-spy collapsed stacks of the first setl run")
    parser.add_argument("--only-setl", action="store_true", help="no dump, no sysbench: setl's rows/s and peak RSS")
    args = parser.parse_args()
    rows = args.tables * args.table_size
    with tempfile.TemporaryDirectory(prefix="setl-bench-snapshot-") as tmp, MariaDBServer() as source, \
            MariaDBServer() as target:
        work = Path(tmp)
        src = sysbench.Conn.from_server(source, "sb")
        print(f"preparing {args.tables} x {args.table_size} sysbench rows ...", flush=True)
        sysbench.prepare(src, tables=args.tables, table_size=args.table_size, ddl_in_binlog=False)

        dump_seconds = 0.0
        if not args.only_setl:
            dump_seconds = dump(source, target)
            print(f"dump:  {rows} rows in {dump_seconds:.1f}s = {rows / dump_seconds:,.0f} rows/s", flush=True)

        # setl, start: snapshot
        sysbench.create_tables(sysbench.Conn.from_server(target, "copied"), tables=args.tables, log_bin=False)
        conf = work / "conf"
        (conf / "pipelines").mkdir(parents=True)
        (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(work / "meta.db")}}))

        def pipeline(name: str, target_db: str) -> None:
            (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump({
                "source": {"type": "mysql", "host": source.host, "port": source.port, "user": source.user,
                           "server_id": 3000 + len(name), "start": "snapshot",
                           "snapshot": {"chunk_rows": args.chunk_rows}},
                "target": {"type": "mysql", "host": target.host, "port": target.port, "user": target.user},
                "tables": [{"source": r"sb\..*", "target": f"{target_db}.{{table}}"}],
                "pipeline": {"parallelism": 4, "batch": {"max_rows": args.chunk_rows, "max_wait_ms": 100}},
            }, sort_keys=False))

        pipeline("snap", "copied")
        seconds, rss, _ = run_setl(conf, "snap", args.profile)
        equal = sysbench.checksums(src) == sysbench.checksums(sysbench.Conn.from_server(target, "copied"))
        ratio = f" ({rows / seconds / (rows / dump_seconds):.2f}x the dump)" if dump_seconds else ""
        print(f"setl:  {rows} rows in {seconds:.1f}s = {rows / seconds:,.0f} rows/s{ratio}, peak RSS "
              f"{rss / 1024:.0f} MiB, target {'equal' if equal else 'DIFFERENT'}", flush=True)
        if args.only_setl:
            return 0

        # sysbench alone, then while setl copies the same tables again
        alone = sysbench.run(src, seconds=args.seconds, threads=args.threads, tables=args.tables,
                             table_size=args.table_size)
        sysbench.create_tables(sysbench.Conn.from_server(target, "copied2"), tables=args.tables, log_bin=False)
        pipeline("snap2", "copied2")
        running = sysbench.start(src, seconds=args.seconds, threads=args.threads, tables=args.tables,
                                 table_size=args.table_size)
        seconds2, rss2, _ = run_setl(conf, "snap2")
        during = running.wait()
        # the same CPU contention from the baseline: sysbench while mariadb-dump copies the tables
        target.query("DROP DATABASE dumped")
        running = sysbench.start(src, seconds=args.seconds, threads=args.threads, tables=args.tables,
                                 table_size=args.table_size)
        dump_seconds2 = dump(source, target)
        during_dump = running.wait()
        print(f"sysbench: {alone.tps:,.0f} tx/s alone, {during.tps:,.0f} tx/s during the setl copy "
              f"({during.tps / alone.tps:.2f}x; the copy took {seconds2:.1f}s, peak RSS {rss2 / 1024:.0f} MiB), "
              f"{during_dump.tps:,.0f} tx/s during the dump ({during_dump.tps / alone.tps:.2f}x; "
              f"it took {dump_seconds2:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
