"""Snapshot throughput: `setl start` with ``start: snapshot`` against ``mariadb-dump --single-transaction |
mariadb`` (and, with ``--postgres``, against pg_chameleon's ``init_replica``) on the same sysbench
tables, in the same run; what the copy costs the source's writers; and setl's peak RSS.

Starts a MariaDB source and target (setl.testing.servers), prepares `--tables` sysbench tables of
`--table-size` rows, then, in `--repeat` rounds (medians and per-round ratios are printed, since a
shared 2-core machine is noisy):

* ``dump``: ``mariadb-dump --single-transaction sb | mariadb`` into an empty target database; then
  ``setl``: ``setl start --until-caught-up`` with ``start: snapshot`` into another (tables created
  empty beforehand), checked with CHECKSUM TABLE; its peak RSS (the child's ``ru_maxrss``) and CPU
  seconds, and the CPU per row used by setl (or the dump's two clients) and by each server;
* with ``--postgres``: setl into a PostgreSQL database (it creates the tables; ``COPY`` path),
  against pg_chameleon 2.0.21 ``init_replica`` of the same schema (installed from PyPI into a
  throwaway venv under the bench's temp dir, or ``--chameleon-venv DIR``; it refuses to run as root,
  so as root it runs as the ``postgres`` OS user, with Debian's ``/usr/bin/python3``); both checked
  by count and sums against the source. If pg_chameleon cannot be installed or run, a line says why;
* ``sysbench``: transactions/s of an uncapped ``oltp_write_only`` run alone, while setl copies the
  same tables (the copy must not throttle the source), while setl only follows the binlog (``start:
  latest``, no copy: what any binlog reader costs the source), and while the dump does (the same CPU
  contention on a small machine, with the dump's one long transaction); each run starts once the
  servers are idle, and "alone" is the mean of a run before and one after. ``--source-core``
  repeats it with the source and sysbench on one core, the copy and the target on the other (a
  source with a host of its own);
* ``--rss-sizes 500000,2000000``: only setl's peak RSS, one copy per table size.

    python3 tools/bench/snapshot.py [--tables 4] [--table-size 500000] [--repeat 3] [--postgres]
        [--chunk-rows 10000] [--threads 2] [--load-mode ordered|per_table] [--no-sysbench] [--source-core]
        [--only-setl]
        [--profile FILE [--profile-gil]]   # py-spy raw stacks of the first setl run, per thread, idle
                                           # included (or only those holding the GIL); FILE-postgres
        [--postgres --skip-mariadb]        # only the PostgreSQL comparison
        [--compare-tree DIR]               # each setl copy once more by another checkout's code (after
                                           # it in odd rounds, before it in even ones)
    python3 tools/bench/snapshot.py --rss-sizes 500000,2000000

Measured (medians of 3 rounds, 2 shared cores at load average 2 to 4; docs/snapshot.md has the
analysis and the figures before), ``--table-size 500000 --repeat 3 --postgres``:

* into MariaDB: setl 91,600 rows/s, 0.85x the dump's 112,900 (rounds 0.85, 0.86, 0.81; goal 0.8).
  CPU per row: setl 5.3 µs, source 0.7, target 8.1-8.7; the dump's clients 1.5, source 0.5,
  target 7.2-8.0; with ``--load-mode per_table``: 108,400 rows/s, 0.91x the dump (0.91, 0.93, 0.91);
* into PostgreSQL: setl 151,500 rows/s, 0.71x pg_chameleon 2.0.21 ``init_replica``'s 200,600
  (rounds 0.67, 0.77, 0.71; goal 3x);
* sysbench during the setl copy 0.75x of alone (rounds 0.75, 0.81, 0.59; goal 0.9; 0.98x before the
  copy got faster), during the dump 1.09x: the faster copy takes more of the two shared cores;
* ``--rss-sizes 500000,2000000``: peak RSS 175 MiB for 4 x 500k rows, 183 MiB for 4 x 2M.

Session 14 (docs/snapshot.md: the Python cost per copied row cut by a third), ``--table-size 500000
--repeat 3 --no-sysbench --postgres``: into MariaDB 90,836 rows/s, 0.97x the dump's 93,831 (rounds
1.03, 0.88, 0.97; setl CPU 4.7-5.0 us/row, target 7.9-8.5, the dump's target 8.1-8.6); into
PostgreSQL 125,258 rows/s, 0.70x pg_chameleon's 173,853 (0.70, 0.74, 0.68). ``--load-mode
per_table``: 0.78x (0.78, 0.85, 0.73). With the straight COPY into PostgreSQL, the machine idle:
into MariaDB 0.91x the dump (0.91, 0.92, 0.90), into PostgreSQL 164,145 rows/s, 0.95x pg_chameleon
(0.95, 0.96, 0.83).

Later, ``--table-size 500000 --repeat 3 --source-core`` (after the sysbench changes above): setl
0.80x the dump (0.84, 0.79, 0.80); on the shared cores sysbench ran at 0.77x of alone during the
copy (0.88, 0.77, 0.50), 0.80x while setl only followed the binlog (1.00, 0.80, 0.80), 1.02x during
the dump; with the source on its own core, 0.93x during the copy (0.93, 0.97, 0.92), 0.69x while
only following (0.64, 0.88, 0.69), 1.26x during the dump. "Alone" swung from 1,700 to 4,100 tx/s
within one round: on these 2 cores each figure is within its noise.
"""

from __future__ import annotations

import argparse
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.testing.servers import MariaDBServer, PostgresServer  # noqa: E402
from tools import sysbench  # noqa: E402
from tools.bench.harness import byte_compile, children_cpu, cores, cpu_seconds, following, on, settle  # noqa: E402


@attrs.frozen
class Run:
    """One `setl start --until-caught-up`: wall seconds, CPU seconds (user + system) and peak RSS (KiB)."""

    seconds: float
    cpu: float
    rss: int


def follow_setl(conf: Path, name: str, seconds: float) -> None:
    """`setl start` (a pipeline that follows the binlog, no copy) for `seconds`, then stopped
    as an operator does (SIGTERM: it drains and exits)."""
    with following(conf, name):
        time.sleep(seconds)


def run_setl(conf: Path, name: str, profile: str | None = None, gil: bool = False, tree: Path | None = None) -> Run:
    """`setl start --until-caught-up` (`profile`: py-spy's collapsed stacks, per thread and idle
    included, to that file, or with `gil` only the samples of the thread holding the GIL: where
    setl's one Python core goes; the RSS and CPU are then py-spy's; `tree`: another checkout's code)."""
    log = conf.parent / f"{name}.log"
    which = ["--gil"] if gil else ["--idle"]
    spy = ["py-spy", "record", "-r", "100", "--threads", *which, "-f", "raw", "-o", profile, "--"] if profile else []
    with open(log, "w") as out:
        began = time.perf_counter()
        argv = [*spy, sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", name,
                "--until-caught-up"]
        env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=str(tree) if tree is not None else None)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"setl failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return Run(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)


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


CHAMELEON = "pg_chameleon==2.0.21"


def chameleon_venv(work: Path, reuse: str | None) -> tuple[Path | None, str]:
    """A throwaway venv with pg_chameleon under `work` (or `reuse`, a venv made before): its
    ``chameleon`` script, or None and why not."""
    venv = Path(reuse) if reuse else work / "chameleon-venv"
    script = venv / "bin" / "chameleon"
    if not script.exists():
        print(f"installing {CHAMELEON} into {venv} ...", flush=True)
        # Debian's python3 when there is one: pg_chameleon refuses root and runs as the postgres
        # user (`run_chameleon`), who may not reach a Python under root's home (pyenv).
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        made = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode == 0:
            made = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", CHAMELEON], capture_output=True,
                                  text=True)
        if made.returncode != 0 or not script.exists():
            lines = [line for line in (made.stderr + made.stdout).splitlines()
                     if line.strip() and not line.startswith("WARNING")]
            return None, f"pip install {CHAMELEON} failed: {lines[-1] if lines else made.returncode}"
    return script, ""


def run_chameleon(script: Path, work: Path, source: MariaDBServer, pg: PostgresServer, database: str) -> float | str:
    """pg_chameleon's ``init_replica`` of the ``sb`` schema into `database` (schema ``sb``): its
    seconds, or why it could not run (the last line of its error)."""
    home = work / "chameleon-home"
    for folder in (".pg_chameleon/configuration", "pid", "logs"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    out_dir = work / "chameleon-out"
    out_dir.mkdir(exist_ok=True)
    config = {
        # log_dest stdout: init_replica runs in the foreground (with "file" it daemonizes)
        "pid_dir": str(home / "pid"), "log_dir": str(home / "logs"), "log_dest": "stdout", "log_level": "info",
        "log_days_keep": 1, "rollbar_key": "", "rollbar_env": "",
        # a password, though trust auth ignores it: pg_chameleon's libpq string breaks on an empty one
        "pg_conn": {"host": pg.host, "port": str(pg.port), "user": pg.user, "password": "unused", "database": database,
                    "charset": "utf8"},
        "sources": {"mysql": {
            "db_conn": {"host": source.host, "port": str(source.port), "user": source.user, "password": "",
                        "charset": "utf8", "connect_timeout": 10},
            "schema_mappings": {"sb": "sb"}, "limit_tables": None, "skip_tables": None, "grant_select_to": None,
            "lock_timeout": "120s", "my_server_id": 4242, "replica_batch_size": 10000, "replay_max_rows": 10000,
            "batch_retention": "1 day", "copy_max_memory": "300M", "copy_mode": "file", "out_dir": str(out_dir),
            "sleep_loop": 1, "on_error_replay": "continue", "on_error_read": "continue",
            "auto_maintenance": "disabled", "gtid_enable": False, "type": "mysql", "keep_existing_schema": False,
            "net_read_timeout": 600, "skip_events": {"insert": None, "delete": None, "update": None}}},
    }
    (home / ".pg_chameleon" / "configuration" / "bench.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "HOME": str(home)}
    as_user: list[str] = []
    if os.geteuid() == 0:  # "pg_chameleon cannot be run as root": run it as PostgreSQL's OS user
        account = pwd.getpwnam(PostgresServer.os_user)
        os.chmod(work, 0o755)
        for path in (home, out_dir, *home.rglob("*"), *out_dir.rglob("*")):
            os.chown(path, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", account.pw_name, "--", "env", f"HOME={home}"]

    def chameleon(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*as_user, str(script), *argv, "--config", "bench"], env=env,
                              capture_output=True, text=True, timeout=3600, cwd=str(home))

    for step in (("create_replica_schema",), ("add_source", "--source", "mysql")):
        done = chameleon(*step)
        if done.returncode != 0 or "FATAL" in done.stdout:
            return f"chameleon {step[0]} failed: {_last_line(done)}"
    began = time.perf_counter()
    done = chameleon("init_replica", "--source", "mysql")
    seconds = time.perf_counter() - began
    if done.returncode != 0 or "FATAL" in done.stdout:
        return f"chameleon init_replica failed: {_last_line(done)}"
    return seconds


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    fatal = [line for line in lines if "FATAL" in line or "Error" in line]
    if fatal:
        return fatal[-1].strip()
    return lines[-1] if lines else f"exit code {done.returncode}"


def pg_summary(pg: PostgresServer, database: str, schema: str, tables: int) -> list[tuple[int, ...]] | str:
    """Per sysbench table: rows, sum of id, sum of k (a light equality check against the source);
    or the error reading them."""
    try:
        return [tuple(int(v or 0) for v in pg.query(f'SELECT count(*), sum(id), sum(k) FROM "{schema}"."sbtest{n}"',
                                                    dbname=database)[0]) for n in range(1, tables + 1)]
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def mariadb_summary(server: MariaDBServer, schema: str, tables: int) -> list[tuple[int, ...]]:
    return [tuple(int(v or 0) for v in server.query(f"SELECT count(*), sum(id), sum(k) FROM `{schema}`.`sbtest{n}`")[0])
            for n in range(1, tables + 1)]


def postgres(args: argparse.Namespace, work: Path, source: MariaDBServer, pipeline: Any, conf: Path) -> None:
    """setl into PostgreSQL (COPY) against pg_chameleon's ``init_replica``, in rounds: median rows/s and ratio."""
    rows = args.tables * args.table_size
    expected = mariadb_summary(source, "sb", args.tables)
    script, why = chameleon_venv(work, args.chameleon_venv)
    with PostgresServer() as pg:
        ratios: list[float] = []
        setls: list[Run] = []
        chams: list[float] = []
        olds: list[float] = []
        for round_ in range(1, args.repeat + 1):
            database = f"setl{round_}"
            profile = f"{args.profile}-postgres" if args.profile and round_ == 1 else None

            def old_copy(db: str = f"old{round_}", n: int = round_) -> Run:
                return other_code(args, conf, pipeline(db, pg), n, rows,
                                  lambda: pg_summary(pg, db, "sb", args.tables) == expected,
                                  lambda: pg.query(f'DROP DATABASE "{db}"'))
            old = old_copy() if args.compare_tree and round_ % 2 == 0 else None
            run = run_setl(conf, pipeline(database, pg), profile, args.profile_gil)
            equal = pg_summary(pg, database, "sb", args.tables) == expected
            pg.query(f'DROP DATABASE "{database}"')
            setls.append(run)
            line = (f"round {round_}: setl into PostgreSQL {rows / run.seconds:,.0f} rows/s (CPU {run.cpu:.1f}s, peak "
                    f"RSS {run.rss / 1024:.0f} MiB, target {'equal' if equal else 'DIFFERENT'})")
            if script is not None:
                database = f"chameleon{round_}"
                pg.query(f'CREATE DATABASE "{database}"')
                took = run_chameleon(script, work, source, pg, database)
                if isinstance(took, str):
                    script, why = None, took
                else:
                    found = pg_summary(pg, database, "sb", args.tables)
                    if found != expected:
                        script, why = None, f"pg_chameleon's copy differs from the source: {found}"
                    else:
                        chams.append(rows / took)
                        ratios.append(took / run.seconds)
                        line += (f"; pg_chameleon init_replica {rows / took:,.0f} rows/s (target equal): setl "
                                 f"{ratios[-1]:.2f}x")
                pg.query(f'DROP DATABASE "{database}"')
            print(line, flush=True)
            if not equal:
                raise SystemExit("setl's copy into PostgreSQL differs from the source")
            if args.compare_tree:
                old = old or old_copy()
                olds.append(_against_tree(args.compare_tree, round_, run, old))
        if olds:
            print(f"into PostgreSQL, {_tree_median(args.compare_tree, olds)}", flush=True)
        line = f"setl into PostgreSQL: median {median([rows / r.seconds for r in setls]):,.0f} rows/s"
        if ratios:
            line += (f" = {median(ratios):.2f}x pg_chameleon 2.0.21 init_replica (median {median(chams):,.0f} rows/s, "
                     f"{len(ratios)} rounds)")
        print(line, flush=True)
        if why:
            print(f"pg_chameleon not measured: {why}", flush=True)


def other_code(args: argparse.Namespace, conf: Path, name: str, round_: int, rows: int,
               equal: Callable[[], bool], drop: Callable[[], None]) -> Run:
    """The same copy (pipeline `name`) by the code of ``--compare-tree``: checked with `equal`,
    dropped with `drop`. Odd rounds run it right after this code's copy, even rounds right before."""
    pipeline = conf / "pipelines" / f"{name}.yaml"
    mine = pipeline.read_text()
    if args.load_chunks != "ordered":  # a checkout before load.chunks refuses the key: it loads chunks in order
        settings = yaml.safe_load(mine)
        settings["pipeline"]["load"].pop("chunks")
        pipeline.write_text(yaml.safe_dump(settings, sort_keys=False))
    try:
        old = run_setl(conf, name, tree=args.compare_tree)
    finally:
        pipeline.write_text(mine)
    same = equal()
    drop()
    print(f"round {round_}: the code of {args.compare_tree} {rows / old.seconds:,.0f} rows/s (CPU {old.cpu:.1f}s, "
          f"target {'equal' if same else 'DIFFERENT'})", flush=True)
    if not same:
        raise SystemExit(f"the copy by {args.compare_tree} differs from the source")
    return old


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _against_tree(tree: str, round_: int, run: Any, old: Any) -> float:
    """One round's ratio of this code's copy to `tree`'s (its seconds over ours), printed."""
    ratio = old.seconds / run.seconds
    print(f"round {round_}: this code {ratio:.2f}x the code of {tree} (CPU {run.cpu:.1f}s against {old.cpu:.1f}s)",
          flush=True)
    return ratio


def _tree_median(tree: str, ratios: list[float]) -> str:
    """The rounds' ratios of this code to `tree`'s: their median, then each."""
    return f"this code / the code of {tree}: median {median(ratios):.2f}x ({', '.join(f'{r:.2f}' for r in ratios)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=500_000)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measurement (medians are printed)")
    parser.add_argument("--threads", type=int, default=2, help="sysbench threads for the tps comparison")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each sysbench run")
    parser.add_argument("--profile", metavar="FILE",
                        help="py-spy collapsed stacks of the first setl run (with --postgres, of the first run into "
                             "PostgreSQL too, in FILE-postgres)")
    parser.add_argument("--skip-mariadb", action="store_true",
                        help="with --postgres: only the PostgreSQL comparison (no copy into MariaDB, no dump)")
    parser.add_argument("--profile-gil", action="store_true",
                        help="with --profile: only samples holding the GIL (setl's Python CPU), no idle threads")
    parser.add_argument("--only-setl", action="store_true", help="no dump, no sysbench: setl's rows/s and peak RSS")
    parser.add_argument("--no-sysbench", action="store_true", help="no sysbench comparison")
    parser.add_argument("--source-core", action="store_true",
                        help="the sysbench comparison once more with the source and sysbench on one core and the copy "
                             "and the target on the other (a source host of its own)")
    parser.add_argument("--load-mode", choices=["ordered", "per_table"], default="ordered",
                        help="the pipelines' load.mode")
    parser.add_argument("--load-chunks", choices=["ordered", "per_table"], default="ordered",
                        help="the pipelines' load.chunks (ordered mode: a snapshot's chunks as per-table parts); "
                             "--compare-tree's code runs without the key")
    parser.add_argument("--postgres", action="store_true",
                        help="also setl into PostgreSQL against pg_chameleon 2.0.21 init_replica (in a throwaway venv)")
    parser.add_argument("--chameleon-venv", metavar="DIR", help="a venv with pg_chameleon to reuse (made if missing)")
    parser.add_argument("--compare-tree", type=Path, metavar="DIR",
                        help="each round, the same setl copy once more by another checkout's code (built in place), "
                             "right after this code's: the ratio of the two")
    parser.add_argument("--rss-sizes", metavar="N,N", help="only setl's peak RSS, one copy per table size "
                        "(e.g. 500000,2000000 rows per table): bounded memory as tables grow")
    args = parser.parse_args()
    sizes = [int(n) for n in args.rss_sizes.split(",")] if args.rss_sizes else [args.table_size]
    args.table_size = sizes[0]
    rows = args.tables * args.table_size
    byte_compile(ROOT, *([args.compare_tree] if args.compare_tree else []))
    with tempfile.TemporaryDirectory(prefix="setl-bench-snapshot-") as tmp, MariaDBServer() as source, \
            MariaDBServer() as target:
        work = Path(tmp)
        src = sysbench.Conn.from_server(source, "sb")
        print(f"preparing {args.tables} x {args.table_size} sysbench rows ...", flush=True)
        sysbench.prepare(src, tables=args.tables, table_size=args.table_size, ddl_in_binlog=False)
        expected = sysbench.checksums(src)
        conf = work / "conf"
        (conf / "pipelines").mkdir(parents=True)
        (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(work / "meta.db")}}))
        names = iter(range(1, 1000))

        def pipeline(target_db: str, pg: PostgresServer | None = None, start: str = "snapshot") -> str:
            """A `start: snapshot` pipeline of the sysbench tables into `target_db` (made empty first;
            with `pg`, a PostgreSQL database whose tables setl creates; `start: latest`: no copy,
            the binlog followed from its end)."""
            number = next(names)
            name = f"snap{number}"
            if pg is None:
                sysbench.create_tables(sysbench.Conn.from_server(target, target_db), tables=args.tables,
                                       log_bin=False)
                into: dict[str, object] = {"type": "mysql", "host": target.host, "port": target.port,
                                           "user": target.user}
                template = f"{target_db}.{{table}}"
            else:
                pg.query(f'CREATE DATABASE "{target_db}"')
                into = {"type": "postgresql", "host": pg.host, "port": pg.port, "user": pg.user,
                        "database": target_db}
                template = "sb.{table}"
            (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump({
                "source": {"type": "mysql", "host": source.host, "port": source.port, "user": source.user,
                           "server_id": 3000 + number, "start": start,
                           "snapshot": {"chunk_rows": args.chunk_rows}},
                "target": into,
                "tables": [{"source": r"sb\..*", "target": template}],
                "pipeline": {"parallelism": 4, "batch": {"max_rows": args.chunk_rows, "max_wait_ms": 100},
                             "load": {"mode": args.load_mode, **(
                                 {"chunks": args.load_chunks} if args.load_chunks != "ordered" else {})}},
            }, sort_keys=False))
            return name

        if args.rss_sizes:
            for size in sizes:
                if size != args.table_size:
                    source.query("DROP DATABASE sb")
                    print(f"preparing {args.tables} x {size} sysbench rows ...", flush=True)
                    sysbench.prepare(src, tables=args.tables, table_size=size, ddl_in_binlog=False)
                    args.table_size = size
                run = run_setl(conf, pipeline("copied"))
                equal = sysbench.checksums(src) == sysbench.checksums(sysbench.Conn.from_server(target, "copied"))
                target.query("DROP DATABASE copied")
                print(f"{args.tables} x {size} rows: setl peak RSS {run.rss / 1024:.0f} MiB "
                      f"({args.tables * size / run.seconds:,.0f} rows/s, target {'equal' if equal else 'DIFFERENT'})",
                      flush=True)
            return 0

        # setl into MariaDB against the dump, in rounds
        ratios: list[float] = []
        dumps: list[float] = []
        setls: list[Run] = []
        olds: list[float] = []  # --compare-tree: this code's speed / the other's, per round
        for round_ in range(1, 0 if args.skip_mariadb else args.repeat + 1):
            dump_seconds = 0.0
            costs = ""
            if not args.only_setl:
                before, clients = cpu_seconds(source, target), children_cpu()
                dump_seconds = dump(source, target)
                after, clients = cpu_seconds(source, target), children_cpu() - clients
                costs = (f"; CPU us/row: dump clients {clients / rows * 1e6:.1f}, source "
                         f"{(after[0] - before[0]) / rows * 1e6:.1f}, target {(after[1] - before[1]) / rows * 1e6:.1f}")
                dumps.append(rows / dump_seconds)
                target.query("DROP DATABASE dumped")

            def old_copy(n: int = round_) -> Run:
                return other_code(args, conf, pipeline("copied"), n, rows,
                                  lambda: expected == sysbench.checksums(sysbench.Conn.from_server(target, "copied")),
                                  lambda: target.query("DROP DATABASE copied"))
            old = old_copy() if args.compare_tree and round_ % 2 == 0 else None
            name = pipeline("copied")
            before = cpu_seconds(source, target)
            run = run_setl(conf, name, args.profile if round_ == 1 else None, args.profile_gil)
            after = cpu_seconds(source, target)
            costs = (f"; CPU us/row: setl {run.cpu / rows * 1e6:.1f}, source "
                     f"{(after[0] - before[0]) / rows * 1e6:.1f}, target "
                     f"{(after[1] - before[1]) / rows * 1e6:.1f}{costs}")
            equal = expected == sysbench.checksums(sysbench.Conn.from_server(target, "copied"))
            target.query("DROP DATABASE copied")
            setls.append(run)
            ratio = ""
            if dump_seconds:
                ratios.append(dump_seconds / run.seconds)
                ratio = f", {ratios[-1]:.2f}x the dump ({rows / dump_seconds:,.0f} rows/s)"
            print(f"round {round_}: setl {rows / run.seconds:,.0f} rows/s{ratio}; setl CPU {run.cpu:.1f}s in "
                  f"{run.seconds:.1f}s, peak RSS {run.rss / 1024:.0f} MiB, target {'equal' if equal else 'DIFFERENT'}"
                  f"{costs}", flush=True)
            if not equal:
                raise SystemExit("setl's copy differs from the source")
            if args.compare_tree:
                old = old or old_copy()
                olds.append(_against_tree(args.compare_tree, round_, run, old))
        if olds:
            print(f"into MariaDB, {_tree_median(args.compare_tree, olds)}", flush=True)
        setl_rate = median([rows / r.seconds for r in setls]) if setls else 0.0
        line = f"setl into MariaDB: {rows} rows, median {setl_rate:,.0f} rows/s"
        if ratios:
            line += (f" = {median(ratios):.2f}x the dump (median of {len(ratios)} rounds; dump median "
                     f"{median(dumps):,.0f} rows/s)")
        if setls:
            print(f"{line}; peak RSS {max(r.rss for r in setls) / 1024:.0f} MiB, CPU "
                  f"{median([r.cpu for r in setls]):.1f}s", flush=True)
        if args.postgres:
            postgres(args, work, source, pipeline, conf)
        if args.only_setl or args.no_sysbench:
            return 0

        # sysbench alone, while setl copies the same tables, and while the dump does (the same CPU
        # contention on a small machine, with the dump's one long transaction); with --source-core,
        # once more with the source and sysbench on one core and the copy and the target on the
        # other, as when the source has a host of its own
        layouts = [False, True] if args.source_core else [False]
        for split in layouts:
            with cores(split, source, target) as (source_side, copy_side):
                sysbench_rounds(args, src, source, target, conf, pipeline, source_side, copy_side)
    return 0


def sysbench_rounds(args: argparse.Namespace, src: sysbench.Conn, source: MariaDBServer, target: MariaDBServer,
                    conf: Path, pipeline: Any, source_side: set[int], copy_side: set[int]) -> None:
    """sysbench alone, during a setl copy, during the dump and alone again, in rounds, each run
    once the servers are idle: the tx/s during each copy as a ratio of the mean of the two runs
    alone in the same round, and the medians."""
    split = source_side != copy_side
    where = (f"source and sysbench on CPU {sorted(source_side)}, the copy and the target on CPU "
             f"{sorted(copy_side)}" if split else "all on the shared cores")
    during_setl: list[float] = []
    during_dump: list[float] = []
    during_follow: list[float] = []  # setl only following the binlog: what any binlog reader costs
    for round_ in range(1, args.repeat + 1):
        def load(seconds: float = args.seconds) -> sysbench.Running:
            settle(source, target)
            with on(source_side):
                return sysbench.start(src, seconds=seconds, threads=args.threads, tables=args.tables,
                                      table_size=args.table_size)

        alone = load().wait()
        name = pipeline("copied")
        running = load()
        with on(copy_side):
            run = run_setl(conf, name)
        with_setl = running.wait()
        target.query("DROP DATABASE copied")
        name = pipeline("followed", start="latest")
        running = load()
        with on(copy_side):
            follow_setl(conf, name, args.seconds)
        with_follow = running.wait()
        target.query("DROP DATABASE followed")
        running = load()
        with on(copy_side):
            took = dump(source, target)
        with_dump = running.wait()
        target.query("DROP DATABASE dumped")
        again = load().wait()  # alone once more: the mean of before and after is the reference
        reference = (alone.tps + again.tps) / 2
        during_setl.append(with_setl.tps / reference)
        during_dump.append(with_dump.tps / reference)
        during_follow.append(with_follow.tps / reference)
        print(f"round {round_} ({where}): sysbench {alone.tps:,.0f} and {again.tps:,.0f} tx/s alone (before and "
              f"after), {with_setl.tps:,.0f} during the setl "
              f"copy ({during_setl[-1]:.2f}x; the copy took {run.seconds:.1f}s, peak RSS {run.rss / 1024:.0f} MiB), "
              f"{with_follow.tps:,.0f} while setl only follows the binlog ({during_follow[-1]:.2f}x), "
              f"{with_dump.tps:,.0f} during the dump ({during_dump[-1]:.2f}x; it took {took:.1f}s)", flush=True)
    print(f"sysbench during the setl copy ({where}): median {median(during_setl):.2f}x of alone; while setl only "
          f"follows the binlog: {median(during_follow):.2f}x; during the dump: {median(during_dump):.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
