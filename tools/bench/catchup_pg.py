"""Catch-up into PostgreSQL: setl against pg_chameleon's replica, on the same sysbench backlog.

Starts a MariaDB source and a PostgreSQL server (setl.testing.servers), prepares `--tables` sysbench
tables in schema ``sb`` (the state P0), then brings two PostgreSQL databases to P0 with each tool's
own copy: setl's (``start: snapshot``, tables as setl creates them) and pg_chameleon 2.0.21's
``init_replica`` (tools/bench/snapshot.py's runner and venv). Both are kept as templates. It then
records a `--seconds` sysbench ``oltp_write_only`` backlog P0..P1 and, in `--repeat` rounds, replays
it from a fresh copy of each template:

* ``setl``: ``setl start --until-caught-up`` from P0 (the catch-up tools/bench/catchup.py times into
  MariaDB), timed from its start to its exit;
* ``pg_chameleon``: ``start_replica`` (its read and replay processes, with the settings of the
  snapshot runner: ``replica_batch_size``/``replay_max_rows`` 10000, ``sleep_loop`` 1 as in its
  example config), timed from its start until every batch it stored is replayed and its newest batch
  starts at P1 or later (``sch_chameleon.t_replica_batch``), then stopped with SIGINT.

Each target is compared with the source row by row at the end of every round. Printed: rows/s and the
ratio setl / pg_chameleon (medians), the CPU per row change of each tool's processes and of the
PostgreSQL server meanwhile (the source's binlog dump is left out), and peak RSS (for pg_chameleon
the sum over its three processes).

    python3 tools/bench/catchup_pg.py [--seconds 20] [--repeat 3] [--tables 4] [--table-size 10000]
                                      [--chameleon-venv DIR] [--only-setl] [--profile DIR]

``--profile DIR`` records setl's runs under py-spy as catchup.py does (DIR/NAME.txt); ``--only-setl``
leaves pg_chameleon out.

Measured 2026-11-27 on the shared 2-core machine (``--seconds 20 --repeat 3``, 299,045 row changes,
load average about 4): setl 33,750 rows/s, pg_chameleon 3,080, **setl / pg_chameleon 10.96** (rounds
9.46, 11.02, 13.35); CPU per row: setl 24.9 µs + PostgreSQL 3.5, pg_chameleon 150.7 + 78.4. Every
target equal to the source. docs/performance.md has a second run and the profile.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pwd
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.testing.servers import MariaDBServer, PostgresServer  # noqa: E402
from tools import sysbench  # noqa: E402


def _bench(name: str) -> ModuleType:
    """A sibling bench script as a module (tools/bench is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


catchup = _bench("catchup")  # backlog, child runs, CPU and RSS
snapshot = _bench("snapshot")  # pg_chameleon's venv and init_replica
pg_floor = _bench("pg_floor")  # a postmaster's CPU with its reaped backends


def write_conf(folder: Path, name: str, source: MariaDBServer, pg: PostgresServer, database: str,
               start: Any) -> Path:
    """A conf dir with one pipeline of schema ``sb`` into PostgreSQL database `database`."""
    conf = folder / "conf"
    (conf / "pipelines").mkdir(parents=True, exist_ok=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"node": {"id": "bench"},
                                                    "meta": {"store": "sqlite", "path": str(folder / "meta.db")}}))
    (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump({
        "source": {"type": "mysql", "host": source.host, "port": source.port, "user": "root",
                   "server_id": 5000 + sum(map(ord, name)), "start": start},
        "target": {"type": "postgresql", "host": pg.host, "port": pg.port, "user": pg.user, "database": database},
        "tables": [{"source": r"sb\..*"}],
        "pipeline": {"parallelism": 3, "batch": {"max_rows": 5000, "max_wait_ms": 100}},
    }, sort_keys=False))
    return conf


def copy_database(pg: PostgresServer, name: str, template: str, timeout: float = 60.0) -> None:
    """(Re)create database `name` as a copy of `template` (retried while the tool that last used
    either still has a backend on it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pg.query(f'DROP DATABASE IF EXISTS "{name}"')
            pg.query(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            return
        except Exception as exc:  # psycopg.errors.ObjectInUse: a backend still closing
            if "being accessed by other users" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def differences(source: MariaDBServer, pg: PostgresServer, database: str, tables: list[str]) -> list[str]:
    """The tables of schema ``sb`` whose rows differ between the source and `database` (trailing
    blanks of text ignored: MariaDB's CHAR reads without them, a PostgreSQL character(n) with)."""
    def norm(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return [tuple(v.rstrip(" ") if isinstance(v, str) else v for v in row) for row in rows]

    found = []
    for table in tables:
        columns = "id" if table == "marker" else "id, k, c, pad"
        query = f"SELECT {columns} FROM sb.{table} ORDER BY id"
        if norm(source.query(query)) != norm(pg.query(query, dbname=database)):
            found.append(table)
    return found


def tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            pass
    return found


CHAMELEON_DONE = """
SELECT (SELECT ARRAY[split_part(t_binlog_name, '.', 2)::bigint, i_binlog_position]
          FROM sch_chameleon.t_replica_batch ORDER BY i_id_batch DESC LIMIT 1),
       (SELECT count(*) FROM sch_chameleon.t_replica_batch
         WHERE NOT b_replayed AND i_id_batch < (SELECT max(i_id_batch) FROM sch_chameleon.t_replica_batch))
"""


def chameleon_replica(script: Path, work: Path, pg: PostgresServer, database: str, end: tuple[str, int],
                      log: Path, timeout: float = 1800) -> tuple[float, float, float]:
    """pg_chameleon's ``start_replica`` of the source (configured by `snapshot.run_chameleon`), until
    `database` holds every change before `end` (the end of the backlog's last rows event: a batch
    of pg_chameleon starts there, not after the transaction's XID): (wall seconds, CPU seconds of its
    processes, peak RSS MiB summed over them)."""
    home = work / "chameleon-home"
    user: dict[str, Any] = {}
    if os.geteuid() == 0:  # it refuses root: the postgres OS user, as the runner does
        account = pwd.getpwnam(PostgresServer.os_user)
        user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    target = [catchup._log_number(end[0]), end[1]]
    with open(log, "w") as out:
        began = time.perf_counter()
        proc = subprocess.Popen([str(script), "start_replica", "--source", "mysql", "--config", "bench"],
                                env={**os.environ, "HOME": str(home)}, cwd=str(home), stdout=out,
                                stderr=subprocess.STDOUT, **user)
        deadline = time.monotonic() + timeout
        rss: dict[int, float] = {}
        usage = None
        conn = pg.connect(dbname=database)
        try:
            while True:
                for pid in tree(proc.pid):
                    rss[pid] = max(rss.get(pid, 0.0), catchup.peak_rss_mib(pid))
                newest, pending = conn.execute(CHAMELEON_DONE).fetchone()
                if newest is not None and list(newest) >= target and pending == 0:
                    wall = time.perf_counter() - began
                    break
                if proc.poll() is not None:
                    proc.wait()
                    raise SystemExit(f"pg_chameleon start_replica ended ({proc.returncode}):\n"
                                     f"{log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"pg_chameleon did not reach {end} within {timeout:.0f}s")
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)  # its handler ends the read and replay processes
            if _waits(proc, 60):
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            conn.close()
            if usage is None:  # failed or stuck: its processes go (the whole tree, while the parent holds it)
                for pid in tree(proc.pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait(30)
    if usage is None:
        raise SystemExit("pg_chameleon did not stop within 60 s of SIGINT")
    return wall, usage.ru_utime + usage.ru_stime, sum(rss.values())


def _waits(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether `proc` exits within `timeout` (left unreaped, for `os.wait4`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.05)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="sysbench backlog duration")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chameleon-venv", metavar="DIR", help="a venv with pg_chameleon to reuse (made if missing)")
    parser.add_argument("--only-setl", action="store_true", help="no pg_chameleon (setl's figures alone)")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="setl's runs under py-spy (DIR/NAME.txt)")
    args = parser.parse_args(argv)
    tables = [f"sbtest{n}" for n in range(1, args.tables + 1)] + ["marker"]
    with tempfile.TemporaryDirectory(prefix="setl-bench-pg-") as tmp, \
            MariaDBServer(Path(tmp) / "source", server_id=1) as source, PostgresServer() as pg:
        work = Path(tmp)
        print(f"MariaDB source :{source.port}, PostgreSQL :{pg.port}; preparing sysbench tables", flush=True)
        src = sysbench.Conn.from_server(source, "sb")
        sysbench.prepare(src, tables=args.tables, table_size=args.table_size, ddl_in_binlog=False)
        source.query("CREATE TABLE sb.marker (id INT PRIMARY KEY)")  # its row ends the backlog
        p0 = catchup.head(source)

        script, why = (None, "--only-setl") if args.only_setl else snapshot.chameleon_venv(work, args.chameleon_venv)
        if script is not None:
            pg.query('CREATE DATABASE "chameleon"')
            took = snapshot.run_chameleon(script, work, source, pg, "chameleon")
            if isinstance(took, str):
                raise SystemExit(took)
            copy_database(pg, "chameleon_p0", "chameleon")
        else:
            print(f"pg_chameleon not measured: {why}", flush=True)
        pg.query('CREATE DATABASE "setl_p0"')
        conf = write_conf(work / "p0", "p0", source, pg, "setl_p0", "snapshot")
        catchup.run_child([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", "p0",
                           "--until-caught-up"])
        start = catchup.head(source)
        if start != p0:
            raise SystemExit(f"the source moved from {p0} to {start} while the targets were copied")
        for database in ["setl_p0"] + (["chameleon_p0"] if script else []):
            if differences(source, pg, database, tables):
                raise SystemExit(f"{database} differs from the source at P0")
        print(f"recording a {args.seconds:.0f}s oltp_write_only backlog ({args.threads} threads, "
              f"{args.tables} tables)", flush=True)
        backlog = sysbench.run(src, seconds=args.seconds, threads=args.threads, tables=args.tables,
                               table_size=args.table_size)
        last = catchup.head(source)
        source.query("INSERT INTO sb.marker VALUES (1)")
        end = catchup.head(source)
        events = source.query(f"SHOW BINLOG EVENTS IN '{last[0]}' FROM {last[1]}")
        rows_end = (last[0], max(int(e[4]) for e in events if e[2].endswith("_rows_v1") or e[2].endswith("_rows")))
        rows, _, _, _ = catchup.run_child([sys.executable, str(Path(catchup.__file__)), "--child", "source",
                                           "--port", str(source.port), "--start-file", start[0], "--start-pos",
                                           str(start[1]), "--end-file", end[0], "--end-pos", str(end[1]),
                                           "--server-id", "4100"])  # counts the row changes
        assert rows is not None
        total = rows["rows"]
        print(f"backlog: {backlog.transactions} transactions ({backlog.tps:.0f}/s), {total} row changes, binlog "
              f"{start[0]}:{start[1]} -> {end[0]}:{end[1]}", flush=True)

        results: dict[str, list[tuple[float, float, float, float]]] = {}  # name -> [(rows/s, cpu, pg cpu, rss)]
        postmaster = pg.pid or 0
        for n in range(args.repeat):
            database = f"setl{n}"
            copy_database(pg, database, "setl_p0")
            conf = write_conf(work / f"run{n}", f"bench{n}", source, pg, database, {"file": start[0], "pos": start[1]})
            command = [sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", f"bench{n}",
                       "--until-caught-up"]
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                command = ["py-spy", "record", "--threads", "--gil", "--native", "--rate", "200", "--format", "raw",
                           "-o", str(args.profile / f"bench{n}.txt"), "--", *command]
            server = pg_floor.cpu_of(postmaster)
            _, wall, rss, _ = catchup.run_child(command)
            cpu = catchup.LAST_CHILD_CPU[0]
            time.sleep(0.5)  # its backends have exited: let the postmaster reap them
            results.setdefault("setl", []).append((total / wall, cpu, pg_floor.cpu_of(postmaster) - server, rss))
            different = differences(source, pg, database, tables)
            line = f"round {n + 1}: setl {total / wall:,.0f} rows/s ({'equal' if not different else different})"
            if different:
                raise SystemExit(f"{line}: setl's target differs from the source")
            if script is not None:
                copy_database(pg, "chameleon", "chameleon_p0")
                server = pg_floor.cpu_of(postmaster)
                wall, cpu, rss = chameleon_replica(script, work, pg, "chameleon", rows_end, work / f"chameleon{n}.log")
                time.sleep(0.5)
                results.setdefault("pg_chameleon", []).append(
                    (total / wall, cpu, pg_floor.cpu_of(postmaster) - server, rss))
                different = differences(source, pg, "chameleon", tables)
                line += f"; pg_chameleon {total / wall:,.0f} rows/s ({'equal' if not different else different})"
                if different:
                    raise SystemExit(f"{line}: pg_chameleon's target differs from the source")
            print(line, flush=True)

        print(f"\n{total} row changes; medians of {args.repeat} rounds (wall time from each tool's start, its "
              f"start-up included)")
        print(f"{'consumer':<14} {'rows/s':>9} {'CPU µs/row: tool':>17} {'PostgreSQL':>11} {'sum':>6} {'peak RSS':>9}")
        for name, values in results.items():
            rate = statistics.median(v[0] for v in values)
            own = statistics.median(v[1] for v in values) / total * 1e6
            server = statistics.median(v[2] for v in values) / total * 1e6
            print(f"{name:<14} {rate:>9,.0f} {own:>17.1f} {server:>11.1f} {own + server:>6.1f} "
                  f"{statistics.median(v[3] for v in values):>7.0f}MB")
        if "pg_chameleon" in results:
            ratios = [s[0] / c[0] for s, c in zip(results["setl"], results["pg_chameleon"])]
            rates = {name: statistics.median(v[0] for v in values) for name, values in results.items()}
            print(f"setl / pg_chameleon: {rates['setl'] / rates['pg_chameleon']:.2f} (ratio of medians; per round "
                  f"{', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
