"""Catch-up and lag: setl end to end against a raw python-mysql-replication parse of the same binlog.

Starts a MariaDB source and target (setl.testing.servers), records a sysbench `oltp_write_only`
backlog on 4 tables, then, on that same binlog range and each in its own process:

* ``raw``: a bare pymysqlreplication loop that only parses the rows (the baseline);
* ``source``: setl's binlog source alone, with and without its table-map cache;
* ``setl``: ``setl start --pipeline ... --until-caught-up`` into the MariaDB target (a generated
  conf dir), checked afterwards with CHECKSUM TABLE against the source;
* with ``--native``, MariaDB's own replica of the same range from the same starting state, twice:
  one SQL thread (``native-1``, the default) and ``slave_parallel_threads=4``,
  ``slave_parallel_mode=optimistic`` (``native-4-optimistic``), each timed to the backlog's end,
  checked with CHECKSUM TABLE, its server's CPU counted, and setl's rate given as a ratio to each.

With ``--big-transaction ROWS`` the source alone also reads one transaction of ROWS rows and
reports the most row changes it held at once (its queue plus the piece being assembled).

It prints rows/s, peak RSS and the ratio to the raw parse (medians over `--repeat` runs), then
runs setl against a steady `--rate` sysbench load and prints replication lag p50/p99: the time
from a source commit (a marker row written every 20 ms, its client-side commit time) to that row
being visible in the target, where it lands in the same transaction as the acked position.

    python3 tools/bench/catchup.py [--seconds 30] [--repeat 3] [--lag-seconds 20] [--rate 1000]
                                   [--big-transaction 1000000] [--compare-tree DIR] [--http] [--skip-readers]
                                   [--tables 4] [--load-mode ordered|per_table|both]

With ``--http`` each repeat also catches up with the node's HTTP endpoint and metrics on
(``http.listen``), scraped every second on /metrics and /api/status as Prometheus and the status page
would, in alternating order with the run without, and prints the ratio of the medians (the goal: at
most 3% slower). ``--skip-readers`` leaves out the raw parse and source-only runs.

With ``--load-mode both`` each repeat catches up with ``pipeline.load.mode: ordered`` and with
``per_table`` (in alternating order: only the first run of all inserts rows, later ones update them)
and prints the ratio of the medians; ``--tables 8`` spreads the backlog over 8 tables. Measured
2026-11-26 (``--tables 8 --seconds 20 --repeat 3 --load-mode both --skip-readers --no-lag``, 634k
row changes, load average about 1): ordered 14,495 rows/s (13,140-15,691), per_table 12,383
(11,223-14,227), **per_table/ordered 0.85**. End to end on one 2-core machine the load is not what
bounds a catch-up (the sink alone takes 140,000+ rows/s, `bench_per_table.py`): the binlog read
and the stages before the load are, and per_table's extra transactions (a part per table per
batch, then `mark_loaded`) take CPU from them.

With ``--pipelines K`` (issue 35, goal 2; ``--pipelines 2,4,8`` for several counts) the backlog is
caught up by one node in several ways, each in its own ``setl start --until-caught-up`` and in
alternating order per repeat: one pipeline selecting every table (the baseline), one pipeline
selecting one table (what reading past the rows of unselected tables costs), K pipelines each
selecting its share of the tables with a binlog stream each (the largest K), and K pipelines with
``sources.shared_reader_server_id`` (one stream) for each K. It prints
each one's process CPU seconds (user + system) and its ratio to the baseline, and checks the target.

With ``--reader-process`` each repeat also catches up with ``sources.reader_process: true`` (the
binlog reader in a process of its own), in alternating order with the run without; it prints both
rates, their ratio (and to the native replica with ``--native``), and each process's CPU and peak
RSS (the node's, and its reader process's, sampled every 10 ms from /proc).

With ``--compare-tree DIR`` each repeat also catches up with the code of another checkout (for
example ``git worktree add /tmp/old c1bc4f4``), so that old and new are measured in the same run.
The other checkout always goes second in a repeat, which favoured it by 3-5% here (2026-11-26:
old and new code each came out ahead when run second): run it again from the other tree
(``python3 DIR/tools/bench/catchup.py --compare-tree .``) and compare both ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# --- children: each measures one reader over [start, end) and prints one JSON line -------------


def child_raw(args: argparse.Namespace) -> dict:
    """The baseline: pymysqlreplication alone, parsing every row of the range (no setl import)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    settings = {"host": "127.0.0.1", "port": args.port, "user": "root", "password": ""}
    began = time.perf_counter()
    stream = BinLogStreamReader(connection_settings=settings, server_id=args.server_id, resume_stream=True,
                                log_file=args.start_file, log_pos=args.start_pos, blocking=False,
                                only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent])
    rows = 0
    end = (args.end_file, args.end_pos)
    for event in stream:
        rows += len(event.rows)
        if (stream.log_file, event.packet.log_pos) >= end:
            break
    stream.close()
    return {"rows": rows, "seconds": time.perf_counter() - began}


def child_source(args: argparse.Namespace) -> dict:
    """setl's binlog source alone: every transaction of the range, as the scheduler would poll it."""
    sys.path.insert(0, str(args.root))
    from setl.model import Position
    from setl.sources.mysql_binlog import MysqlBinlogSource

    if not Path(sys.modules["setl"].__file__ or "").resolve().is_relative_to(args.root.resolve()):
        raise SystemExit(f"setl was imported from {sys.modules['setl'].__file__}, not from {args.root}")

    src = MysqlBinlogSource(port=args.port, server_id=args.server_id, start="earliest",
                            table_map_cache=not args.no_cache, max_rows_in_memory=args.max_rows,
                            reader_process=args.child_reader_process)
    end = Position(args.end_file, args.end_pos)
    began = time.perf_counter()
    src.open(Position(args.start_file, args.start_pos))
    rows = 0
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        tx = src.poll(1.0)
        if tx is None:
            continue
        rows += len(tx.changes)
        if tx.complete and tx.end >= end:
            break
    seconds = time.perf_counter() - began
    hits = src.table_maps.hits if src.table_maps else 0
    src.close()
    return {"rows": rows, "seconds": seconds, "table_map_hits": hits, "peak_buffered_rows": src.peak_buffered_rows}


# --- driver -----------------------------------------------------------------------------------


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that over from the
    forked copy of this (bigger) driver process across exec."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a live process has used so far; 0 when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: label -> [(CPU seconds of the consumer process, CPU seconds of the server that applied)], per run
CPU: dict[str, list[tuple[float, float]]] = {}
LAST_CHILD_CPU = [0.0]  # the CPU seconds (user + system, its children's included) of the last run_child
LAST_CHILD_SYS = [0.0]  # of which system (kernel) CPU seconds
#: the last run_child's own children (a reader process): pid -> (CPU seconds, peak RSS MiB), as last sampled
LAST_GRANDCHILDREN: dict[int, tuple[float, float]] = {}


def child_pids(pid: int) -> list[int]:
    """The live children of process `pid` (from /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def run_child(argv: list[str], timeout: float = 3600, cwd: Path = ROOT) -> tuple[dict | None, float, float, str]:
    """Run a child process in `cwd`; (its JSON line if any, wall seconds, peak RSS in MiB, its output).
    Its CPU seconds are left in `LAST_CHILD_CPU[0]`."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), name="bench-child-output")
    reader.start()
    deadline = time.monotonic() + timeout
    rss = 0.0
    LAST_GRANDCHILDREN.clear()
    while True:
        rss = max(rss, peak_rss_mib(proc.pid))  # sampled until the child exits (a zombie has none)
        for kid in child_pids(proc.pid):  # its reader process: the last sample before it ends
            cpu, kid_rss = process_cpu(kid), peak_rss_mib(kid)
            if cpu or kid_rss:
                LAST_GRANDCHILDREN[kid] = (cpu, max(kid_rss, LAST_GRANDCHILDREN.get(kid, (0.0, 0.0))[1]))
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            LAST_CHILD_CPU[0] = usage.ru_utime + usage.ru_stime
            LAST_CHILD_SYS[0] = usage.ru_stime
            break
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.01)
    wall = time.perf_counter() - began
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = "".join(output)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{text[-3000:]}")
    result = None
    for line in reversed(output):
        if line.startswith("{"):
            result = json.loads(line)
            break
    return result, wall, rss, text


def write_conf(folder: Path, name: str, source, target, start, *, max_wait_ms: int, http: str | None = None,
               load_mode: str = "ordered", tables: tuple[str, ...] = (r"sbtest\..*", r"bench\..*"),
               shared: int | None = None, reader_process: bool = False) -> Path:
    conf = folder / "conf"
    (conf / "pipelines").mkdir(parents=True, exist_ok=True)
    (conf / "setl.yaml").write_text(f"node:\n  id: bench\nmeta:\n  store: sqlite\n  path: {folder / 'meta.db'}\n"
                                    + (f"http:\n  listen: {http}\n" if http else "")
                                    + (f"sources:\n  shared_reader_server_id: {shared}\n" if shared else "")
                                    + ("sources:\n  reader_process: true\n" if reader_process else ""))
    rules = "".join(f"  - source: '{t}'\n" for t in tables)
    (conf / "pipelines" / f"{name}.yaml").write_text(f"""\
source:
  type: mysql
  host: {source.host}
  port: {source.port}
  user: root
  server_id: {5000 + len(list((conf / 'pipelines').iterdir()))}
  start: {{file: {start[0]}, pos: {start[1]}}}
target:
  type: mysql
  host: {target.host}
  port: {target.port}
  user: root
tables:
{rules}pipeline:
  parallelism: 3
  batch:
    max_rows: 5000
    max_wait_ms: {max_wait_ms}
  load:
    mode: {load_mode}
""")
    return conf


class Scraper:
    """GETs /metrics and /api/status of a node every second, as Prometheus and the status page do."""

    def __init__(self, base: str) -> None:
        self.base, self.scrapes = base, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def _run(self) -> None:
        import urllib.request

        while not self._stop.wait(1.0):
            for path in ("/metrics", "/api/status"):
                try:
                    with urllib.request.urlopen(self.base + path, timeout=5) as response:
                        response.read()
                    self.scrapes += 1
                except OSError:
                    pass  # not listening yet, or already gone

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


#: label -> [(the reader process's CPU seconds, its peak RSS MiB)], per run with `--reader-process`
READER_PROCESS: dict[str, list[tuple[float, float]]] = {}


def _children_total() -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB) of the reader child and its spare, summed."""
    return (sum(cpu for cpu, _ in LAST_GRANDCHILDREN.values()), sum(rss for _, rss in LAST_GRANDCHILDREN.values()))


def catch_up(folder: Path, name: str, source, target, start, args: argparse.Namespace,
             http: bool, load_mode: str = "ordered", reader_process: bool = False) -> tuple[float, float]:
    """One `setl start --until-caught-up` of the backlog; (wall seconds, peak RSS MiB)."""
    from setl.testing.servers import free_port

    port = free_port() if http else None
    conf = write_conf(folder, name, source, target, start, max_wait_ms=args.max_wait_ms,
                      http=f"127.0.0.1:{port}" if port else None, load_mode=load_mode,
                      reader_process=reader_process)
    argv = [sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", name, "--until-caught-up"]
    if args.profile:  # sampled stacks per thread, for `tools/bench/profile_split.py`
        args.profile.mkdir(parents=True, exist_ok=True)
        sampled = ["--gil"] if not args.profile_idle else ["--idle"]
        argv = ["py-spy", "record", "--threads", *sampled, "--native", "--rate", "200", "--format", "raw",
                "-o", str(args.profile / f"{name}.txt"), "--", *argv]
    if not http:
        applied = process_cpu(target.pid)
        _, wall, rss, _ = run_child(argv)
        label = ("setl" if not args.profile else "setl (under py-spy)") + (", reader process" if reader_process else "")
        CPU.setdefault(label, []).append((LAST_CHILD_CPU[0], process_cpu(target.pid) - applied))
        if reader_process:
            # The active reader child and its spare started ahead (`Spare`, a rollback's next child):
            # their CPU summed, their peak RSS summed (both are resident at once).
            if not 1 <= len(LAST_GRANDCHILDREN) <= 2:
                raise SystemExit(f"expected a reader process and its spare, saw {sorted(LAST_GRANDCHILDREN)}")
            READER_PROCESS.setdefault(label, []).append(_children_total())
        return wall, rss
    with Scraper(f"http://127.0.0.1:{port}") as scraper:
        _, wall, rss, _ = run_child(argv)
    if scraper.scrapes == 0:
        raise SystemExit("the node's endpoint never answered")
    return wall, rss


def reader_process_catch_up(n: int, source, target, start, args: argparse.Namespace, tmp: Path, mode: str,
                            rows: int, runs: dict[str, list[tuple[float, float]]], equal) -> None:
    """``--reader-process``: one catch-up with ``sources.reader_process: true``, its rate into `runs`;
    the target checked against the source after it (`equal`)."""
    wall, rss = catch_up(tmp / f"proc{n}", f"proc{n}", source, target, start, args, False, mode, reader_process=True)
    runs.setdefault("setl start --until-caught-up, sources.reader_process", []).append((rows / wall, rss))
    same = equal()
    print(f"target equals source after the reader-process catch-up (CHECKSUM TABLE): {same}", flush=True)
    if not same:
        raise SystemExit("the target differs from the source after the reader-process catch-up")


def pipelines_bench(source, target, start, tmp: Path, rows: int, tables: list[str], args: argparse.Namespace
                    ) -> None:
    """``--pipelines K``: the CPU of K pipelines on one source, each selecting its share of the
    tables, with a stream each and with the shared reader, against one pipeline selecting all."""
    import sysbench

    counts = pipeline_counts(args.pipelines)
    k = max(counts)
    if k > len(tables):
        raise SystemExit(f"--pipelines {k} needs at least as many --tables")

    def share(i: int, k: int) -> tuple[str, ...]:
        mine = "|".join(t.removeprefix("sbtest") for n, t in enumerate(tables) if n % k == i)
        return (rf"sbtest\.sbtest({mine})$",)

    variants: dict[str, list[tuple[str, tuple[str, ...]]]] = {
        "1 pipeline, every table (baseline)": [("all", (r"sbtest\..*",))],
    }
    if args.stream_each:
        variants["1 pipeline, one table"] = [("one", (r"sbtest\.sbtest1$",))]
        variants[f"{k} pipelines, a stream each"] = [(f"own{i}", share(i, k)) for i in range(k)]
    for count in counts:
        variants[f"{count} pipelines, shared reader"] = [(f"shared{count}x{i}", share(i, count)) for i in range(count)]
    before = f"{k} pipelines, shared reader, code of {args.compare_tree}"
    if args.compare_tree:  # the same K pipelines by another checkout's code, on the same backlog
        variants[before] = [(f"before{k}x{i}", share(i, k)) for i in range(k)]
    cpu: dict[str, list[tuple[float, float, float]]] = {}  # label -> [(process CPU s, target CPU s, wall s)]
    for n in range(args.repeat):
        order = list(variants) if n % 2 == 0 else list(reversed(variants))
        for label in order:
            folder = tmp / f"k{n}-{len(cpu.get(label, []))}-{label.replace(',', '').replace(' ', '')}"
            shared = 4999 if "shared" in label else None
            conf = None
            for name, rules in variants[label]:
                conf = write_conf(folder, f"{name}_{n}", source, target, start, max_wait_ms=args.max_wait_ms,
                                  tables=rules, shared=shared)
            assert conf is not None
            names = [arg for name, _ in variants[label] for arg in ("--pipeline", f"{name}_{n}")]
            applied = process_cpu(target.pid)
            argv = [sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", *names, "--until-caught-up"]
            if args.profile:  # sampled stacks of the thread holding the GIL (py-spy raw format)
                args.profile.mkdir(parents=True, exist_ok=True)
                argv = ["py-spy", "record", "--threads", "--gil", "--rate", "200", "--format", "raw", "-o",
                        str(args.profile / f"{folder.name}.txt"), "--", *argv]
            _, wall, _, out = run_child(argv, cwd=args.compare_tree if label == before else ROOT)
            streams = out.count("reading the mariadb binlog")  # the binlog streams it opened
            drops, rewinds = out.count("dropped from the shared binlog stream"), out.count("rewinds to")
            cpu.setdefault(label, []).append((LAST_CHILD_CPU[0], process_cpu(target.pid) - applied, wall))
            batches = acked_batches(folder / "meta.db")
            BATCHES.setdefault(label, []).append(batches)
            selected = tables if "one table" not in label else tables[:1]
            same = sysbench.checksums(sysbench.Conn.from_server(source), selected) == \
                sysbench.checksums(sysbench.Conn.from_server(target), selected)
            print(f"repeat {n + 1}: {label}: {LAST_CHILD_CPU[0]:.1f} CPU s (system {LAST_CHILD_SYS[0]:.1f}), "
                  f"{wall:.1f} s wall, {batches} batches acked, {streams} binlog "
                  f"stream(s) opened, {drops} drop(s), {rewinds} rewind(s); target equals source (CHECKSUM TABLE): "
                  f"{same}", flush=True)
            if not same:
                raise SystemExit(f"{label}: the target differs from the source")
    base = statistics.median(c for c, _, _ in cpu["1 pipeline, every table (baseline)"])
    print(f"\n{rows} row changes on {len(tables)} tables; medians of {args.repeat} runs (setl start "
          f"--until-caught-up, start-up included)\n{'consumer':<40} {'CPU s':>7} {'µs/row':>7} {'ratio':>6} "
          f"{'target CPU s':>13} {'wall s':>7} {'batches':>8}")
    for label, values in cpu.items():
        own = statistics.median(c for c, _, _ in values)
        print(f"{label:<40} {own:>7.1f} {own / rows * 1e6:>7.1f} {own / base:>6.2f} "
              f"{statistics.median(a for _, a, _ in values):>13.1f} {statistics.median(w for _, _, w in values):>7.1f} "
              f"{statistics.median(BATCHES[label]):>8.0f}")


#: label -> the batches its pipelines acked, per run (``--pipelines``)
BATCHES: dict[str, list[int]] = {}


def acked_batches(meta: Path) -> int:
    """The batches the pipelines of a run acked, from its SQLite meta store: each pipeline's last
    acked batch id (ids count from 1 at a start with no position)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(meta)) as conn:
        return int(conn.execute("SELECT COALESCE(SUM(batch_id), 0) FROM position").fetchone()[0])


def pipeline_counts(text: str) -> list[int]:
    """The pipeline counts of ``--pipelines`` (``8`` or ``2,4,8``)."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise SystemExit(f"--pipelines {text!r}: expected K or K,K,...") from None
    if not counts or counts[0] < 1:
        raise SystemExit(f"--pipelines {text!r}: expected counts of at least 1")
    return counts


def head(server) -> tuple[str, int]:
    file, pos = server.query("SHOW MASTER STATUS")[0][:2]
    return file, int(pos)


def read_tables(source, database: str, tables: list[str]) -> dict[str, list[tuple]]:
    """The prepared rows of each table (the state at the backlog's start)."""
    src = source.connect(database=database)
    try:
        with src.cursor() as read:
            rows = {}
            for table in tables:
                read.execute(f"SELECT * FROM `{table}`")
                rows[table] = list(read.fetchall())
            return rows
    finally:
        src.close()


def write_tables(target, database: str, rows: dict[str, list[tuple]], *, replace: bool = False) -> None:
    """Write `rows` to the target's tables, outside any binlog reader's range (emptied first with `replace`)."""
    dst = target.connect(database=database)
    try:
        with dst.cursor() as write:
            write.execute("SET SESSION sql_log_bin = 0")
            for table, values in rows.items():
                if replace:
                    write.execute(f"TRUNCATE TABLE `{table}`")
                marks = ", ".join(["%s"] * len(values[0]))
                write.executemany(f"INSERT INTO `{table}` VALUES ({marks})", values)
        dst.commit()
    finally:
        dst.close()


#: MariaDB's own replica in each mode catchup.py --native runs: label -> slave_parallel_threads
#: (0: the one SQL thread applies every event, the default) and slave_parallel_mode
NATIVE_MODES: dict[str, tuple[int, str]] = {
    "native-1": (0, "optimistic"),
    "native-4-optimistic": (4, "optimistic"),
}
NATIVE_LABELS = {
    "native-1": "MariaDB's own replication (one SQL thread)",
    "native-4-optimistic": "MariaDB's own replication (4 threads, optimistic)",
}


def native_catch_up(replica, source, start: tuple[str, int], end: tuple[str, int], p0: dict[str, list[tuple]],
                    timeout: float = 3600, *, threads: int = 0, mode: str = "optimistic") -> float:
    """MariaDB's own replication of the backlog: the replica reset to the backlog's starting state,
    then ``CHANGE MASTER TO`` its start and ``START SLAVE UNTIL`` its end, with `threads` parallel
    applier threads in `mode` (``slave_parallel_threads``, ``slave_parallel_mode``; 0 threads is the
    default, one SQL thread), timed until the SQL thread has executed, in order, the last event.
    Returns wall seconds."""
    import pymysql.cursors

    conn = replica.connect(cursorclass=pymysql.cursors.DictCursor, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute("RESET SLAVE ALL")
            # both are read when the slave starts; they can only change while it is stopped
            cur.execute(f"SET GLOBAL slave_parallel_threads = {int(threads)}")
            cur.execute("SET GLOBAL slave_parallel_mode = %s", (mode,))
            cur.execute("SELECT @@slave_parallel_threads AS threads, @@slave_parallel_mode AS mode")
            now = cur.fetchone()
            if (int(now["threads"]), now["mode"]) != (threads, mode):
                raise SystemExit(f"the native replica kept slave_parallel_threads={now['threads']}, "
                                 f"slave_parallel_mode={now['mode']} (asked {threads}, {mode})")
        write_tables(replica, "sbtest", p0, replace=True)
        with conn.cursor() as cur:
            cur.execute(f"CHANGE MASTER TO MASTER_HOST='{source.host}', MASTER_PORT={source.port}, "
                        f"MASTER_USER='root', MASTER_PASSWORD='', MASTER_LOG_FILE='{start[0]}', "
                        f"MASTER_LOG_POS={start[1]}, MASTER_USE_GTID=no")
            began = time.perf_counter()
            cur.execute(f"START SLAVE UNTIL MASTER_LOG_FILE='{end[0]}', MASTER_LOG_POS={end[1]}")
            deadline = time.monotonic() + timeout
            workers = 0  # the most parallel applier threads seen while it applied
            while True:
                cur.execute("SHOW SLAVE STATUS")
                status = cur.fetchone()
                failure = status["Last_SQL_Error"] or status["Last_IO_Error"]
                if failure:
                    raise SystemExit(f"the native replica failed: {failure}")
                if workers < threads:
                    workers = max(workers, native_workers(cur))
                if (_log_number(status["Relay_Master_Log_File"]), int(status["Exec_Master_Log_Pos"])) >= \
                        (_log_number(end[0]), end[1]):
                    wall = time.perf_counter() - began
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("the native replica did not reach the backlog's end in time")
                time.sleep(0.005)
            cur.execute("STOP SLAVE")
        if workers != threads:  # a parallel run that applied on the SQL thread alone measures nothing new
            raise SystemExit(f"the native replica ran {workers} parallel applier threads, not {threads}")
        return wall
    finally:
        conn.close()


def native_workers(cur) -> int:
    """The replica's parallel applier threads running now (``slave_parallel_threads`` of them while
    a slave runs in parallel mode, none otherwise)."""
    cur.execute("SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE USER = 'system user' "
                "AND COMMAND = 'Slave_worker'")
    return int(cur.fetchone()["n"])


def _log_number(name: str) -> int:
    return int(name.rsplit(".", 1)[-1]) if name else -1


def measure_lag(source, target, conf: Path, name: str, seconds: float, rate: int,
                tables: int = 4) -> tuple[list[float], dict]:
    """Run setl and a steady sysbench load; return the commit-to-target lags of the marker rows."""
    sys.path.insert(0, str(ROOT / "tools"))
    import sysbench

    proc = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", name],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    committed: dict[int, float] = {}
    lags: list[float] = []
    stop = threading.Event()

    def write_marks() -> None:
        conn = source.connect(database="bench")
        n = 0
        with conn.cursor() as cur:
            while not stop.is_set():
                n += 1
                cur.execute("INSERT INTO lag (id) VALUES (%s)", (n,))
                committed[n] = time.time()
                stop.wait(0.02)
        conn.close()

    def watch_target() -> None:
        conn = target.connect(database="bench")
        seen = 0
        with conn.cursor() as cur:
            while not stop.is_set() or seen < len(committed):
                cur.execute("SELECT COALESCE(MAX(id), 0) FROM lag")
                newest = cur.fetchone()[0]
                now = time.time()
                for n in range(seen + 1, newest + 1):
                    lags.append(max(0.0, now - committed.get(n, now)))
                seen = max(seen, newest)
                if stop.is_set() and time.time() > stopped_at + 30:
                    break
                time.sleep(0.005)
        conn.close()

    stopped_at = float("inf")
    time.sleep(2.0)  # let setl start and catch up before the load
    load = sysbench.start(sysbench.Conn.from_server(source), seconds=seconds, threads=4, rate=rate, tables=tables)
    threads = [threading.Thread(target=write_marks, name="bench-marks"),
               threading.Thread(target=watch_target, name="bench-watch")]
    for thread in threads:
        thread.start()
    result = load.wait()
    stopped_at = time.time()
    stop.set()
    for thread in threads:
        thread.join()
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    if proc.returncode not in (0, -15):
        raise SystemExit(f"setl start failed ({proc.returncode}):\n{err[-3000:]}")
    return lags, {"tps": result.tps, "marks": len(committed)}


def big_transaction(source, rows: int, max_rows: int, me: list[str]) -> None:
    """One INSERT ... SELECT of `rows` rows, read by the source alone: rate, peak buffered rows, peak RSS."""
    source.query("CREATE TABLE bench.big (id INT PRIMARY KEY, pad CHAR(100) NOT NULL)")
    start = head(source)
    source.query(f"INSERT INTO bench.big SELECT seq, REPEAT('x', 100) FROM bench.seq_1_to_{rows}")
    end = head(source)
    result, wall, rss, _ = run_child([*me, "--child", "source", "--port", str(source.port), "--server-id", "4300",
                                      "--start-file", start[0], "--start-pos", str(start[1]), "--end-file", end[0],
                                      "--end-pos", str(end[1]), "--max-rows", str(max_rows)])
    print(f"\none transaction of {result['rows']} rows ({(end[1] - start[1]) / 2**20:.0f} MB of binlog) read by the "
          f"source alone in pieces of {max_rows}: {result['rows'] / wall:.0f} rows/s, peak buffered rows "
          f"{result['peak_buffered_rows']}, peak RSS {rss:.0f}MB", flush=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30, help="sysbench backlog duration")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=10_000)
    parser.add_argument("--tables", type=int, default=4, help="sysbench tables the backlog spreads over")
    parser.add_argument("--load-mode", choices=["ordered", "per_table", "both"], default="ordered",
                        help="the pipeline's load.mode; both: each repeat catches up with each, in turn")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lag-seconds", type=float, default=20)
    parser.add_argument("--rate", type=int, default=1000, help="sysbench transactions/s for the lag phase")
    parser.add_argument("--max-wait-ms", type=int, default=100, help="pipeline batch.max_wait_ms")
    parser.add_argument("--compare-tree", type=Path, metavar="DIR",
                        help="also catch up with the setl code of checkout DIR, in the same run (old against new)")
    parser.add_argument("--http", action="store_true",
                        help="also catch up with the HTTP endpoint and metrics on, scraped every second")
    parser.add_argument("--skip-readers", action="store_true", help="no source-only runs (the raw parse stays)")
    parser.add_argument("--lag", action=argparse.BooleanOptionalAction, default=True, help="the lag phase")
    parser.add_argument("--native", action="store_true",
                        help="also replay the backlog with MariaDB's own replication (a replica at its start), "
                             "with one SQL thread and with 4 optimistic parallel threads; ratios setl / each")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record each catch-up under py-spy (collapsed stacks per thread in DIR/NAME.txt)")
    parser.add_argument("--profile-idle", action="store_true",
                        help="with --profile: sample every thread at all times, waiting included (not the GIL holder)")
    parser.add_argument("--child", choices=["raw", "source"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server-id", type=int, default=4001, help=argparse.SUPPRESS)
    parser.add_argument("--start-file", help=argparse.SUPPRESS)
    parser.add_argument("--start-pos", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end-file", help=argparse.SUPPRESS)
    parser.add_argument("--end-pos", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-cache", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-reader-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--max-rows", type=int, default=5000,
                        help="the source's max_rows_in_memory (pieces of a larger transaction)")
    parser.add_argument("--reader-process", action="store_true",
                        help="also catch up with sources.reader_process on (the reader in a process of its own)")
    parser.add_argument("--pipelines", default="", metavar="K[,K...]",
                        help="measure K pipelines on the source (a stream each for the largest K, and shared for "
                             "each K) against one; only that")
    parser.add_argument("--stream-each", action=argparse.BooleanOptionalAction, default=True,
                        help="with --pipelines: also one pipeline of one table and K pipelines with a stream each "
                             "(--no-stream-each: only the baseline and the shared reader)")
    parser.add_argument("--big-transaction", type=int, default=0, metavar="ROWS",
                        help="also read one transaction of ROWS rows with the source alone (e.g. 1000000)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps((child_raw if args.child == "raw" else child_source)(args)))
        return 0

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tools"))
    import sysbench

    from setl.testing.servers import MariaDBServer
    from tools.bench.harness import byte_compile

    byte_compile(ROOT, *([args.compare_tree] if args.compare_tree else []))
    with tempfile.TemporaryDirectory(prefix="setl-bench-") as tmp, \
            MariaDBServer(Path(tmp) / "source", server_id=1) as source, \
            MariaDBServer(Path(tmp) / "target", server_id=2) as target, contextlib.ExitStack() as stack:
        print(f"MariaDB source :{source.port}, target :{target.port}; preparing sysbench tables", flush=True)
        tables = [f"sbtest{n}" for n in range(1, args.tables + 1)]
        sysbench.prepare(sysbench.Conn.from_server(source), tables=args.tables, table_size=args.table_size)
        sysbench.create_tables(sysbench.Conn.from_server(target), tables=args.tables)
        p0 = read_tables(source, "sbtest", tables)
        write_tables(target, "sbtest", p0)
        replica = None
        if args.native:  # MariaDB's own replica, at the same starting state as the target
            replica = stack.enter_context(MariaDBServer(Path(tmp) / "replica", server_id=3,
                                                        options={"log_slave_updates": 1}))
            sysbench.create_tables(sysbench.Conn.from_server(replica), tables=args.tables)
        for server in (source, target):
            server.query("CREATE DATABASE bench")
            server.query("CREATE TABLE bench.lag (id INT PRIMARY KEY, at TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6))")
        start = head(source)
        print(f"recording a {args.seconds:.0f}s oltp_write_only backlog ({args.threads} threads, {args.tables} tables)",
              flush=True)
        backlog = sysbench.run(sysbench.Conn.from_server(source), seconds=args.seconds, threads=args.threads,
                               tables=args.tables, table_size=args.table_size)
        end = head(source)
        print(f"backlog: {backlog.transactions} transactions ({backlog.tps:.0f}/s), binlog {start[0]}:{start[1]}"
              f" -> {end[0]}:{end[1]}", flush=True)
        span = ["--port", str(source.port), "--start-file", start[0], "--start-pos", str(start[1]),
                "--end-file", end[0], "--end-pos", str(end[1])]
        me = [sys.executable, str(Path(__file__).resolve())]
        if args.pipelines:
            result, _, _, _ = run_child([*me, "--child", "raw", *span, "--server-id", "4100"])
            pipelines_bench(source, target, start, Path(tmp), result["rows"], tables, args)
            return 0
        runs: dict[str, list[tuple[float, float]]] = {}  # name -> [(rows/s, rss MiB)]

        def equal() -> bool:
            return sysbench.checksums(sysbench.Conn.from_server(source), tables) == \
                sysbench.checksums(sysbench.Conn.from_server(target), tables)

        rows = 0
        for n in range(args.repeat):
            result, wall, rss, _ = run_child([*me, "--child", "raw", *span, "--server-id", str(4100 + n)])
            rows = result["rows"]
            runs.setdefault("raw parse (pymysqlreplication)", []).append((rows / wall, rss))
            for cache in (True, False) if not args.skip_readers else ():
                extra = [] if cache else ["--no-cache"]
                result, wall, rss, _ = run_child([*me, "--child", "source", *span, "--server-id",
                                                  str(4200 + 2 * n + cache), *extra])
                label = f"setl source only, table-map cache {'on' if cache else 'off'}"
                runs.setdefault(label, []).append((result["rows"] / wall, rss))
                CPU.setdefault(label, []).append((LAST_CHILD_CPU[0], 0.0))
                if args.reader_process and cache:  # the source alone, its reader in a process of its own
                    result, wall, rss, _ = run_child([*me, "--child", "source", *span, "--server-id",
                                                      str(4600 + n), "--child-reader-process"])
                    label = "setl source only, reader process"
                    runs.setdefault(label, []).append((result["rows"] / wall, rss))
                    CPU.setdefault(label, []).append((LAST_CHILD_CPU[0], 0.0))
                    if 1 <= len(LAST_GRANDCHILDREN) <= 2:
                        READER_PROCESS.setdefault(label, []).append(_children_total())
                if args.compare_tree and cache:  # the same reader with the other checkout's code
                    result, wall, rss, _ = run_child([*me, "--child", "source", *span, "--server-id",
                                                      str(4400 + n), "--root", str(args.compare_tree)])
                    label = f"setl source only, code of {args.compare_tree}"
                    runs.setdefault(label, []).append((result["rows"] / wall, rss))
                    CPU.setdefault(label, []).append((LAST_CHILD_CPU[0], 0.0))
            # With --http, alternate which of the two goes first (the first run of all inserts, later ones update).
            modes = ["ordered", "per_table"] if args.load_mode == "both" else [args.load_mode]
            if n % 2:  # every run after the first applies updates only: alternate which goes first
                modes.reverse()
            if args.reader_process and n % 2:  # and before in odd ones
                reader_process_catch_up(n, source, target, start, args, Path(tmp), modes[0], rows, runs, equal)
            for mode in modes:
                for http in ((False, True) if n % 2 == 0 else (True, False)) if args.http else (False,):
                    suffix = "" if mode == "ordered" else f"_{mode}"
                    folder = Path(tmp) / ((f"run{n}" if not http else f"http{n}") + suffix)
                    name = (f"bench{n}" if not http else f"http{n}") + suffix
                    wall, rss = catch_up(folder, name, source, target, start, args, http, mode)
                    label = ("setl start --until-caught-up (MariaDB target)" + (", HTTP + metrics on" if http else "")
                             + ("" if mode == "ordered" else f", load.mode {mode}"))
                    runs.setdefault(label, []).append((rows / wall, rss))
            if args.reader_process and n % 2 == 0:  # the reader in a process of its own: after in even repeats
                reader_process_catch_up(n, source, target, start, args, Path(tmp), modes[0], rows, runs, equal)
            if replica is not None:  # each mode from the same starting state; alternate which goes first
                for key in list(NATIVE_MODES) if n % 2 == 0 else list(reversed(NATIVE_MODES)):
                    threads, mode = NATIVE_MODES[key]
                    applied = process_cpu(replica.pid)
                    wall = native_catch_up(replica, source, start, end, p0, threads=threads, mode=mode)
                    CPU.setdefault(key, []).append((0.0, process_cpu(replica.pid) - applied))
                    runs.setdefault(NATIVE_LABELS[key], []).append((rows / wall, 0.0))
                    same = sysbench.checksums(sysbench.Conn.from_server(source), tables) == \
                        sysbench.checksums(sysbench.Conn.from_server(replica), tables)
                    print(f"{key} replica equals source after catch-up (CHECKSUM TABLE): {same}", flush=True)
                    if not same:
                        raise SystemExit(f"the {key} replica differs from the source after its catch-up")
            if args.compare_tree:  # the same catch-up by another checkout's code (python -m imports from cwd)
                # with --reader-process, the old code's reader process too (old against new of that path)
                conf = write_conf(Path(tmp) / f"old{n}", f"old{n}", source, target, start, max_wait_ms=args.max_wait_ms,
                                  reader_process=args.reader_process)
                applied = process_cpu(target.pid)
                _, wall, rss, out = run_child([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start",
                                               "--pipeline", f"old{n}", "--until-caught-up"], cwd=args.compare_tree)
                old = ", reader process" if args.reader_process else ""
                runs.setdefault(f"the same{old}, code of {args.compare_tree}", []).append((rows / wall, rss))
                CPU.setdefault(f"setl{old} at {args.compare_tree}", []).append(
                    (LAST_CHILD_CPU[0], process_cpu(target.pid) - applied))
            if n == 0:
                same = sysbench.checksums(sysbench.Conn.from_server(source), tables) == \
                    sysbench.checksums(sysbench.Conn.from_server(target), tables)
                print(f"target equals source after catch-up (CHECKSUM TABLE): {same}", flush=True)
            print(f"repeat {n + 1}/{args.repeat} done", flush=True)

        baseline = statistics.median(r for r, _ in runs["raw parse (pymysqlreplication)"])
        print(f"\n{rows} row changes; medians of {args.repeat} runs (wall time of each process, start-up included)")
        print(f"{'reader':<52} {'rows/s':>9} {'ratio':>6} {'peak RSS':>9}")
        for label, values in runs.items():
            rate = statistics.median(r for r, _ in values)
            rss = statistics.median(m for _, m in values)
            print(f"{label:<52} {rate:>9.0f} {rate / baseline:>6.2f} {rss:>7.0f}MB")
        if args.native:  # setl against each native mode, from the medians of this run
            for key, native_label in NATIVE_LABELS.items():
                native = statistics.median(r for r, _ in runs[native_label])
                for label, values in runs.items():
                    if label.startswith("setl start") or label.startswith("the same, code of"):
                        print(f"{label} / {key}: {statistics.median(r for r, _ in values) / native:.2f}")
        if CPU:
            print(f"\nCPU per row change, µs (medians; the applying server is setl's target or the replica; "
                  f"the source's binlog dump is left out)\n{'consumer':<48} {'process':>9} {'applying server':>16} "
                  f"{'sum':>7}")
            for label, values in CPU.items():
                own = statistics.median(c for c, _ in values) / rows * 1e6
                server = statistics.median(a for _, a in values) / rows * 1e6
                print(f"{label:<48} {own:>9.1f} {server:>16.1f} {own + server:>7.1f}")
        if args.reader_process:
            off = [r for r, _ in runs["setl start --until-caught-up (MariaDB target)"]]
            on = [r for r, _ in runs["setl start --until-caught-up, sources.reader_process"]]
            print(f"sources.reader_process on / off: {statistics.median(on) / statistics.median(off):.2f} "
                  f"(medians; runs off {[round(r) for r in off]}, on {[round(r) for r in on]})")
            for label, values in READER_PROCESS.items():
                node = statistics.median(c for c, _ in CPU[label]) / rows * 1e6
                child = statistics.median(c for c, _ in values) / rows * 1e6
                print(f"{label}: CPU µs per row change: node process {node - child:.1f} (its reader process "
                      f"counted out), reader process and its spare {child:.1f}; their peak RSS "
                      f"{statistics.median(m for _, m in values):.0f} MB")
        if args.http:
            off = [r for r, _ in runs["setl start --until-caught-up (MariaDB target)"]]
            on = [r for r, _ in runs["setl start --until-caught-up (MariaDB target), HTTP + metrics on"]]
            print(f"HTTP endpoint + metrics on / off: {statistics.median(on) / statistics.median(off):.3f} "
                  f"(medians; runs off {[round(r) for r in off]}, on {[round(r) for r in on]})")
        if args.load_mode == "both":
            ordered = [r for r, _ in runs["setl start --until-caught-up (MariaDB target)"]]
            per_table = [r for r, _ in runs["setl start --until-caught-up (MariaDB target), load.mode per_table"]]
            print(f"load.mode per_table / ordered: {statistics.median(per_table) / statistics.median(ordered):.2f} "
                  f"(medians; runs ordered {[round(r) for r in ordered]}, per_table {[round(r) for r in per_table]})")


        if not args.lag:
            return 0
        print(f"\nlag under a steady {args.rate} transactions/s for {args.lag_seconds:.0f}s", flush=True)
        first = "_per_table" if args.load_mode == "per_table" else ""  # the first catch-up's conf and pipeline
        lags, info = measure_lag(source, target, Path(tmp) / f"run0{first}" / "conf", f"bench0{first}",
                                 args.lag_seconds, args.rate, args.tables)
        if not lags:
            print("no marker row reached the target")
            return 1
        print(f"sysbench {info['tps']:.0f} tx/s; {len(lags)} of {info['marks']} marker rows seen in the target; "
              f"lag p50 {percentile(lags, 50) * 1000:.0f} ms, p99 {percentile(lags, 99) * 1000:.0f} ms, "
              f"max {max(lags) * 1000:.0f} ms")
        if args.big_transaction:  # after the lag phase: setl's pipeline there would replicate it too
            big_transaction(source, args.big_transaction, args.max_rows, me)
    return 0


if __name__ == "__main__":
    sys.exit(main())
