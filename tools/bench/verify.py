"""`setl verify` throughput against shipping the rows: verify of sysbench tables (pipeline idle,
tables equal, then with one row in every `--differ-every` differing) against a plain chunked
``SELECT`` of every row on the source and on the target, in the same run.

Starts a MariaDB source and a MariaDB target (or, with ``--postgres``, a PostgreSQL target)
(setl.testing.servers), prepares `--tables` sysbench tables of `--table-size` rows, copies them with
``setl start --until-caught-up`` (``start: snapshot``), and then, in `--repeat` rounds:

* ``select``: every row of every table read in primary-key chunks of `--chunk-rows` rows
  (``WHERE id > last ORDER BY id LIMIT n``, all columns, fetched into Python) from the source and
  then from the target: what a comparison that ships the rows must at least spend;
* ``verify``: `setl.verify.run.verify_pipeline` on the same tables (in this process, so no start-up
  is counted), expected equal;
* ``verify, differing``: the same after one target row in every `--differ-every` was changed
  (expected to find exactly those), then the rows are put back.

Prints rows/s of each and the ratios verify/select (time), medians over the rounds.

With ``--sysbench``, instead: what a check costs the source's writers (the issue's third figure).
After the copy the pipeline is started (``setl start``, following the binlog) and runs throughout,
so that the ratio isolates verify's cost and verify's lag checks read a figure; then, in
`--repeat` rounds, an uncapped sysbench ``oltp_write_only`` run of `--seconds` with `--threads`
on the source alone, one while verify of the tables runs over and over (`verify_pipeline` on a
thread of this process, the CLI's defaults with ``--max-lag 30``; the pass under way when the run
ends is cut at its next chunk, so verify reads through the whole run), and one alone again, each
started once the servers are idle (tools/bench/harness.py). Prints per round the tx/s, the ratio
to alone (the mean of before and after), verify's passes and rows compared, the source server's
CPU and the part of it beyond its CPU per transaction alone (verify's reads), the busy time of the
source's CPUs split into the server's, sysbench's and the rest, InnoDB's counters per second, and
the median of the rounds' ratios. ``--source-core`` repeats it with the source and sysbench on one
core, verify, the pipeline and the target on the other (as tools/bench/snapshot.py), a source host
of its own; ``--max-rows-per-second`` is verify's throttle.

    python3 tools/bench/verify.py [--tables 4] [--table-size 250000] [--repeat 3] [--chunk-rows 10000]
        [--differ-every 100000] [--postgres] [--engine local|spark]
    python3 tools/bench/verify.py --sysbench [--threads 2] [--seconds 20] [--source-core]
        [--max-rows-per-second N] [--tables 4] [--table-size 250000] [--repeat 3]

Measured (``--tables 4 --table-size 100000 --repeat 5 --differ-every 100000``, 2 cores shared with
other work at load average 11 to 12, so rows/s swing by 3x from round to round; the ratios are the
median of each round's ratio, select and verify run back to back):

* MariaDB target: verify 0.78x the time of the select of both ends (rounds 1.08, 0.73, 1.10,
  0.78, 0.67); with one row in 100,000 changed (4 rows, found exactly) 0.91x (1.71, 0.78, 0.91,
  0.76, 1.18). Goals: 1.0x and 1.2x.
* PostgreSQL target: 0.79x (0.76, 0.77, 0.79, 1.00, 0.81); differing 0.89x (1.20, 0.79, 0.89,
  1.18, 0.83).

At the issue's size, ``--tables 4 --table-size 1000000 --repeat 3 --differ-every 100000``
(2026-11-27, load average 4.8 before, 1.6 after): select of both ends 149,953 rows/s; verify 1.10x
its time (rounds 1.14, 0.89, 1.10; goal 1.0x, not met), one row in 100,000 differing 1.10x (1.10,
0.99, 1.23; goal 1.2x, met). An earlier run at the same size under a test suite's load: 1.02x and
1.16x.

``--sysbench --source-core --tables 4 --table-size 250000 --repeat 3`` (2 threads, 20 s runs;
2026-11-27, 2 cores shared with another engineer's work, load average 1.6 to 4.9), four runs:

* source on a core of its own: medians 0.89x, 0.83x, 0.65x, 0.86x of alone (rounds 0.89, 0.87,
  1.19; 0.86, 0.82, 0.83; 0.88, 0.65, 0.64; 0.74, 0.86, 0.86): median of the 12 rounds 0.86x.
  Goal 0.9x: not met. "Alone" is 2,600 to 3,900 tx/s and swings by up to 25% within a round;
* all on the shared cores: 0.80x, 0.83x, 0.97x, 0.87x (rounds 0.85, 0.79, 0.80; 0.94, 0.83, 0.71;
  0.99, 0.94, 0.97; 0.92, 0.87, 0.79): 0.86x over the 12 rounds.

Why (the last run splits the source core's time): that core is nearly full, alone too (busy 0.87
to 0.98: the server 0.55 to 0.67, sysbench's client 0.1, other processes 0.12 to 0.23, the
machine's other work, which no one pins), and verify's reads take 0.11 to 0.17 of it (0.11 to 0.19
over the runs; the server's CPU beyond its CPU per transaction alone), a fifth to a quarter of what
the server had: about what sysbench loses. In the 0.65x run's last two rounds the server itself got
less CPU while verify ran (0.58 against 0.66, 0.50 against 0.61; that run did not split the core's
time, other work is the likely taker). Not a lock
or I/O stall: InnoDB's row lock waits stay at 1/s and free-page waits at 0 (pool misses go from
about 2,000 to 2,300 pages/s: verify's scans do not fit the test servers' 64 MB pool). Under this
write rate verify compares only 16,000 to 29,000 rows/s (no pass of the 1M rows ends within a
20 s run). By the arithmetic (about 10,000 row changes/s over 100 chunks, and at least the
pipeline's 0.1-0.2 s lag between the source's snapshot and the target's read) nearly every chunk
has been written in between (the target is past the snapshot's position), so it is drilled down to
row hashes and re-read by key: more source work per row than an equal chunk (not counted per chunk
by the bench).

With verify's ``--max-rows-per-second 10000`` (two runs, load average 1.7 to 5.0): 0.88x and 0.91x
on the source's own core (0.75, 1.23, 0.88; 1.02, 0.84, 0.91: 0.90x over the 6 rounds), 0.96x and
1.00x shared (0.93, 1.02, 0.96; 1.03, 0.99, 1.00: 0.99x), verify's reads 0.02 to 0.06 of a core,
80,000 to 160,000 rows compared per 20 s: at the goal, within the noise. The throttle paces the
chunk aggregates only, not the drill-down and re-check reads, so under a heavy write load it bounds
the source's work less than its figure says. MariaDB gives a client no CPU priority for its statements (no resource
groups), so the throttle is the one lever verify has.

Where the time goes (one 100k-row sysbench table, best of 3, same machine): MariaDB hashes it in
0.35-0.5 s against 0.8-0.9 s to ship it to PyMySQL; PostgreSQL hashes it in 0.23 s against 0.16 s
to ship it to psycopg (md5 0.075 s, the 60-bit cast 0.056 s, the row text 0.085 s): into
PostgreSQL the source's share is what makes verify cheaper than shipping rows.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.config import load_node, load_pipeline  # noqa: E402
from setl.connectors import registry  # noqa: E402
from setl.errors import SetlError  # noqa: E402
from setl.meta import open_meta_store  # noqa: E402
from setl.model import TableName  # noqa: E402
from setl.status import lag_seconds  # noqa: E402
from setl.testing.servers import MariaDBServer, PostgresServer  # noqa: E402
from setl.verify.report import Report  # noqa: E402
from setl.verify.run import verify_pipeline  # noqa: E402
from tools import sysbench  # noqa: E402
from tools.bench.harness import busy, children_cpu, cores, cpu_seconds, following, on, settle  # noqa: E402


def chunked_select(conn: Any, table: str, chunk_rows: int, postgres: bool) -> int:
    """Every row of `table`, read in key chunks into Python; the rows read."""
    last, total = 0, 0
    while True:
        sql = f"SELECT id, k, c, pad FROM {table} WHERE id > %s ORDER BY id LIMIT %s"
        if postgres:
            rows = conn.execute(sql, (last, chunk_rows)).fetchall()
            conn.rollback()
        else:
            with conn.cursor() as cur:
                cur.execute(sql, (last, chunk_rows))
                rows = cur.fetchall()
        if not rows:
            return total
        total += len(rows)
        last = rows[-1][0]


class _Stopped(SetlError):
    """The sysbench window ended: the pass under way ends without a report (a SetlError, which
    verify passes on as it is, as a scheduled check's stop)."""


class Checking:
    """`verify_pipeline` of `tables` over and over on a thread of its own, from `start` until `stop`
    (which ends the pass under way at its next chunk or wait, as a node's stop ends a scheduled
    check): what a user running `setl verify` in a loop puts on both ends. Settings as the CLI's
    defaults, ``--max-lag 30`` included (the pipeline runs, so its lag is published)."""

    def __init__(self, settings: Any, config: Any, tables: list[TableName], chunk_rows: int,
                 max_rows_per_second: float = 0.0) -> None:
        self.settings, self.config, self.tables, self.chunk_rows = settings, config, tables, chunk_rows
        self.max_rows_per_second = max_rows_per_second
        self.reports: list[Report] = []
        self.rows = 0  # source rows compared, the pass cut short by `stop` included
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-verify", daemon=True)

    def start(self) -> None:
        """Start the loop (the thread runs on the CPUs of the thread calling this)."""
        self._thread.start()

    def stop(self) -> None:
        """End the loop at the pass's next chunk or wait."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise SystemExit(f"verify failed during the sysbench run: {self.error!r}")

    def _loop(self) -> None:
        meta = open_meta_store(self.settings)
        done: dict[str, int] = {}

        def progress(table: str, rows: int, estimate: int, finished: bool) -> None:
            done[table] = rows
            if self._stop.is_set():
                raise _Stopped("the sysbench window ended")

        def sleep(seconds: float) -> None:
            if self._stop.wait(seconds):
                raise _Stopped("the sysbench window ended")

        try:
            while not self._stop.is_set():
                done.clear()
                try:
                    self.reports.append(verify_pipeline(
                        self.settings, self.config, meta, self.tables, chunk_rows=self.chunk_rows, max_lag=30.0,
                        lag_timeout=600.0, max_rows_per_second=self.max_rows_per_second, progress=progress,
                        sleep=sleep))
                finally:
                    self.rows += sum(done.values())
        except _Stopped:
            pass
        except BaseException as exc:  # reported by stop()
            self.error = exc
        finally:
            meta.close()

    def summary(self) -> str:
        found = sum(len(t.missing) + len(t.extra) + len(t.different) for r in self.reports for t in r.tables)
        unsettled = sum(len(t.unsettled) for r in self.reports for t in r.tables)
        if not self.reports:  # the first pass was cut short: no verdict to show
            return f"no whole verify pass, {self.rows:,} rows compared"
        each = statistics.median(r.seconds for r in self.reports)
        return (f"{len(self.reports)} whole verify passes of {each:.1f}s, {self.rows:,} rows compared; {found} "
                f"differences, {unsettled} unsettled")


#: InnoDB's counters that tell a source slowed by something else than CPU: pages read into the
#: buffer pool (misses), waits for a free page, pages flushed, row lock waits
INNODB = ("Innodb_buffer_pool_reads", "Innodb_buffer_pool_wait_free", "Innodb_buffer_pool_pages_flushed",
          "Innodb_row_lock_waits")


def innodb(server: MariaDBServer) -> dict[str, int]:
    names = ", ".join(f"'{v}'" for v in INNODB)
    rows = server.query(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
    return {name: int(value) for name, value in rows}


def wait_running(settings: Any, name: str, follower: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Wait until the pipeline's `setl start` publishes its lag (it runs, and verify's lag checks
    read a figure)."""
    meta = open_meta_store(settings)
    try:
        deadline = time.monotonic() + timeout
        while lag_seconds(meta, name) is None:
            if follower.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"setl start --pipeline {name} did not come up within {timeout:.0f}s")
            time.sleep(0.5)
    finally:
        meta.close()


def sysbench_rounds(args: argparse.Namespace, src: sysbench.Conn, source: MariaDBServer, target: Any,
                    settings: Any, config: Any, tables: list[TableName], source_side: set[int],
                    copy_side: set[int], follower: subprocess.Popen[bytes]) -> list[float]:
    """sysbench alone, while verify runs in a loop and alone again, in rounds, the pipeline
    following the binlog throughout and each run started once the servers are idle: the tx/s while
    verify runs as a ratio of the mean of the two runs alone in the same round; the ratios."""
    split = source_side != copy_side
    where = (f"source and sysbench on CPU {sorted(source_side)}; verify, the pipeline and the target on CPU "
             f"{sorted(copy_side)}" if split else "all on the shared cores")
    if args.max_rows_per_second:
        where += f"; verify --max-rows-per-second {args.max_rows_per_second:,.0f}"
    ratios: list[float] = []
    meta = open_meta_store(settings)
    for round_ in range(1, args.repeat + 1):
        def load() -> sysbench.Running:
            settle(source, target)
            with on(source_side):
                return sysbench.start(src, seconds=args.seconds, threads=args.threads, tables=args.tables,
                                      table_size=args.table_size)

        def window(running: sysbench.Running) -> tuple[sysbench.RunResult, float, str, str]:
            """The run's report; the source server's CPU in cores; the source side's CPUs' busy time
            split into the server's, sysbench's and the rest (other processes the scheduler put
            there: on a shared machine, not only ours); InnoDB's counters per second."""
            cpu, full, client, counters = cpu_seconds(source)[0], busy(source_side), children_cpu(), innodb(source)
            result = running.wait()  # the only child that ends in the window: sysbench
            now = innodb(source)
            rates = "/".join(f"{(now[v] - counters[v]) / result.seconds:,.0f}" for v in INNODB)
            server = (cpu_seconds(source)[0] - cpu) / result.seconds
            full = (busy(source_side) - full) / result.seconds
            client = (children_cpu() - client) / result.seconds
            return result, server, f"{full:.2f} (sysbench {client:.2f}, rest {full - server - client:.2f})", rates

        before, cpu_before, full_before, io_before = window(load())
        running = load()
        checking = Checking(settings, config, tables, args.chunk_rows, args.max_rows_per_second)
        with on(copy_side):
            checking.start()
        during, cpu_during, full_during, io_during = window(running)
        lag = lag_seconds(meta, config.name)
        checking.stop()
        after, cpu_after, full_after, io_after = window(load())
        if follower.poll() is not None:
            raise SystemExit(f"the pipeline's setl start ended ({follower.returncode}) during the rounds")
        reference = (before.tps + after.tps) / 2
        ratios.append(during.tps / reference)
        # the source server's CPU per transaction alone, times the transactions while verify ran:
        # the rest of its CPU then is what verify's reads cost it
        per_tx = (cpu_before / before.tps + cpu_after / after.tps) / 2
        verify_share = cpu_during - per_tx * during.tps
        print(f"round {round_} ({where}): sysbench {before.tps:,.0f} and {after.tps:,.0f} tx/s alone (before and "
              f"after), {during.tps:,.0f} while verify runs ({ratios[-1]:.2f}x; {checking.summary()}; pipeline lag "
              f"{'-' if lag is None else f'{lag:.1f}s'} at the end); source server CPU {cpu_before:.2f}, "
              f"{cpu_during:.2f} and {cpu_after:.2f} cores (verify's reads about {verify_share:.2f}); CPU "
              f"{sorted(source_side)} busy {full_before}, {full_during} and {full_after} cores; source "
              f"InnoDB pool reads/free-page waits/pages flushed/row lock waits per s {io_before}, {io_during} and "
              f"{io_after}", flush=True)
    meta.close()
    print(f"sysbench while verify runs ({where}): median {statistics.median(ratios):.2f}x of alone "
          f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    parser.add_argument("--differ-every", type=int, default=100_000)
    parser.add_argument("--postgres", action="store_true", help="a PostgreSQL target instead of MariaDB")
    parser.add_argument("--engine", choices=["local", "spark"], default="local",
                        help="verify's --engine (spark: local[*] Spark, its session started before the rounds)")
    parser.add_argument("--sysbench", action="store_true",
                        help="instead of the timings: the source's sysbench tx/s alone and while verify runs in a "
                             "loop, the pipeline following the binlog throughout")
    parser.add_argument("--threads", type=int, default=2, help="with --sysbench: sysbench threads")
    parser.add_argument("--seconds", type=float, default=20.0, help="with --sysbench: length of each sysbench run")
    parser.add_argument("--max-rows-per-second", type=float, default=0.0,
                        help="with --sysbench: verify's --max-rows-per-second (default 0: unbounded, as verify's)")
    parser.add_argument("--source-core", action="store_true",
                        help="with --sysbench: once more with the source and sysbench on one core, verify, the "
                             "pipeline and the target on the other (a source host of its own)")
    args = parser.parse_args()
    rows = args.tables * args.table_size
    with tempfile.TemporaryDirectory(prefix="setl-bench-verify-") as tmp, MariaDBServer() as source, \
            (PostgresServer() if args.postgres else MariaDBServer()) as target:
        work = Path(tmp)
        src = sysbench.Conn.from_server(source, "sb")
        print(f"preparing {args.tables} x {args.table_size} sysbench rows ...", flush=True)
        sysbench.prepare(src, tables=args.tables, table_size=args.table_size, ddl_in_binlog=False)
        conf = work / "conf"
        (conf / "pipelines").mkdir(parents=True)
        (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(work / "meta.db")}}))
        if args.postgres:
            target.query('CREATE DATABASE "copied"')
            into: dict[str, Any] = {"type": "postgresql", "host": target.host, "port": target.port,
                                    "user": target.user, "database": "copied"}
            template = "sb.{table}"
        else:
            into = {"type": "mysql", "host": target.host, "port": target.port, "user": target.user}
            template = "copied.{table}"
        (conf / "pipelines" / "bench.yaml").write_text(yaml.safe_dump({
            "source": {"type": "mysql", "host": source.host, "port": source.port, "user": source.user,
                       "server_id": 3900, "start": "snapshot", "snapshot": {"chunk_rows": 10_000}},
            "target": into, "tables": [{"source": r"sb\..*", "target": template}],
            "pipeline": {"parallelism": 4, "batch": {"max_rows": 10_000, "max_wait_ms": 100}},
        }, sort_keys=False))
        print("copying with setl start --until-caught-up ...", flush=True)
        done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline",
                               "bench", "--until-caught-up"], capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"setl start failed:\n{done.stderr[-3000:]}")
        settings = load_node(conf)
        config = load_pipeline(conf, "bench", registry())
        names = [f"sbtest{i}" for i in range(1, args.tables + 1)]
        tables = [TableName("sb", n) for n in names]
        source_conn = source.connect(database="sb")
        target_conn = target.connect(dbname="copied") if args.postgres else target.connect(database="copied")
        target_names = [f'"sb"."{n}"' for n in names] if args.postgres else names

        if args.sysbench:
            source_conn.close()
            target_conn.close()
            with following(conf, "bench") as follower:
                wait_running(settings, "bench", follower)
                for split in [False, True] if args.source_core else [False]:
                    with cores(split, source, target, follower.pid) as (source_side, copy_side):
                        sysbench_rounds(args, src, source, target, settings, config, tables, source_side,
                                        copy_side, follower)
            return 0

        def select_all() -> float:
            began = time.perf_counter()
            read = sum(chunked_select(source_conn, n, args.chunk_rows, False) for n in names)
            read += sum(chunked_select(target_conn, n, args.chunk_rows, args.postgres) for n in target_names)
            assert read == 2 * rows, read
            return time.perf_counter() - began

        def verify() -> tuple[float, int]:
            meta = open_meta_store(settings)
            try:
                began = time.perf_counter()
                report = verify_pipeline(settings, config, meta, tables, chunk_rows=args.chunk_rows,
                                         engine=args.engine)
                seconds = time.perf_counter() - began
            finally:
                meta.close()
            assert sum(t.rows for t in report.tables) == rows
            return seconds, sum(len(t.different) for t in report.tables)

        def change(delta: str) -> int:
            changed = 0
            for name in target_names:
                sql = f"UPDATE {name} SET k = k {delta} WHERE id % {args.differ_every} = 1"
                if args.postgres:
                    changed += target_conn.execute(sql.replace("%", "%%"), ()).rowcount
                    target_conn.commit()
                else:
                    with target_conn.cursor() as cur:
                        changed += cur.execute(sql)
            return changed

        if args.engine == "spark":
            verify()  # the Spark session's start-up (once per process) is not counted
        selects, verifies, differing = [], [], []
        for round_ in range(1, args.repeat + 1):
            selects.append(select_all())
            seconds, found = verify()
            assert found == 0, found
            verifies.append(seconds)
            expected = change("+ 1")
            seconds, found = verify()
            change("- 1")
            assert found == expected, (found, expected)
            differing.append(seconds)
            print(f"round {round_}: select {rows / selects[-1]:,.0f} rows/s, verify {rows / verifies[-1]:,.0f} "
                  f"rows/s ({verifies[-1] / selects[-1]:.2f}x the select's time), with {found} rows differing "
                  f"{rows / differing[-1]:,.0f} rows/s ({differing[-1] / selects[-1]:.2f}x)", flush=True)
        select, equal, different = (statistics.median(v) for v in (selects, verifies, differing))
        # the machine is shared: a ratio within one round (select and verify back to back) is steadier
        # than the ratio of medians taken over different rounds
        ratio_equal = statistics.median(v / s for v, s in zip(verifies, selects))
        ratio_differing = statistics.median(d / s for d, s in zip(differing, selects))
        print(f"{'PostgreSQL' if args.postgres else 'MariaDB'} target, engine {args.engine}, "
              f"{args.tables} x {args.table_size} rows, "
              f"medians of {args.repeat}: select of both ends {rows / select:,.0f} rows/s; verify "
              f"{rows / equal:,.0f} rows/s, {ratio_equal:.2f}x the select's time (median of the rounds' ratios); "
              f"one row in {args.differ_every:,} differing {rows / different:,.0f} rows/s, {ratio_differing:.2f}x")
        source_conn.close()
        target_conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
