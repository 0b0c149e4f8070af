"""How fast can PostgreSQL itself take the snapshot bench's rows, on this machine, against
pg_chameleon's ``init_replica`` in the same run? A ceiling for any tool that copies MariaDB into
PostgreSQL, so that a goal stated as a multiple of pg_chameleon can be checked against what the
hardware allows.

Starts a MariaDB source and a PostgreSQL server (setl.testing.servers), prepares `--tables` sysbench
tables of `--table-size` rows (as tools/bench/snapshot.py does), writes each table once to a file in
PostgreSQL's text format (``mariadb --batch``: the source's cost of handing the rows out, measured on
its own), reads them once more with PyMySQL in this process (the CPU a Python tool spends on a row
before it does anything with it), then, in `--repeat` rounds:

* ``keyed``: server-side ``COPY ... FROM 'file'`` into the tables as setl creates them (primary
  key; ``varchar`` for ``CHAR``), two tables at a time (one per core): no client, no network, no
  parsing of a driver's result, no transform; PostgreSQL's own ingest and nothing else;
* ``unkeyed, key after``: the same into tables without a key, then ``ADD PRIMARY KEY`` (the way
  pg_chameleon loads: index after the data);
* ``pg_chameleon``: 2.0.21 ``init_replica`` of the same tables (tools/bench/snapshot.py's runner;
  it needs a venv with pg_chameleon, made under the temp dir or reused with ``--chameleon-venv``).

The lines printed are rows/s and CPU per row of each, medians over the rounds, the ratio of the
faster floor to pg_chameleon, and the CPU a row that 3x pg_chameleon leaves a copying tool on this
machine's cores once PostgreSQL's ingest and the source's reads are paid: a tool that copies into
PostgreSQL does at least what the floor does (the rows have to be read, ingested and keyed), plus its
own work on the same cores.

    python3 tools/bench/pg_floor.py [--tables 4] [--table-size 500000] [--repeat 3] [--chameleon-venv DIR]

Measured on the 2-core machine, ``--table-size 500000 --repeat 3`` (4 x 500k rows; medians):

* the source hands the rows out at 742,000 rows/s (0.56 µs of server CPU a row, 0.88 in ``mariadb``);
  a bare PyMySQL read costs 2.57 µs of CPU a row;
* PostgreSQL's COPY from files: keyed 1,464,000 rows/s (1.24 µs CPU a row), unkeyed then keyed
  1,860,000 rows/s (1.01 µs);
* pg_chameleon 2.0.21 ``init_replica``: 213,000 rows/s (rounds 197k, 223k, 213k), so 3x of it is
  640,000 rows/s: 3.13 µs of CPU a row for everything on 2 cores. PostgreSQL's ingest and the
  source's reads take 1.57 of them, which leaves 1.56 µs a row for the copying tool, less than a
  bare PyMySQL read of the row (2.57).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pymysql
import pymysql.cursors

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.testing.servers import MariaDBServer, PostgresServer  # noqa: E402
from tools import sysbench  # noqa: E402


def _snapshot_bench():  # type: ignore[no-untyped-def]
    """tools/bench/snapshot.py as a module (tools/bench is not a package): its pg_chameleon runner."""
    spec = importlib.util.spec_from_file_location("snapshot_bench", Path(__file__).with_name("snapshot.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COLUMNS = "id integer {key}, k integer NOT NULL DEFAULT 0, c varchar(120) NOT NULL DEFAULT '', " \
          "pad varchar(60) NOT NULL DEFAULT ''"


def export(source: MariaDBServer, table: str, path: Path) -> None:
    """`table` of schema ``sb`` in PostgreSQL's text COPY format (tab-separated; the sysbench
    columns hold no NULL, tab, newline or backslash)."""
    with open(path, "wb") as out:
        subprocess.run(["mariadb", "--batch", "--skip-column-names", "--raw", "-h", source.host,
                        "-P", str(source.port), "-u", source.user, "-e", f"SELECT id, k, c, pad FROM sb.{table}"],
                       stdout=out, check=True)


def driver_read(source: MariaDBServer, tables: list[str]) -> float:
    """CPU seconds this process spends reading every row of `tables` with PyMySQL (unbuffered, tuples,
    nothing else done with them): what a Python tool pays before it does anything with a row."""
    conn = pymysql.connect(host=source.host, port=source.port, user=source.user, database="sb",
                           cursorclass=pymysql.cursors.SSCursor)
    began = time.process_time()
    try:
        with conn.cursor() as cur:
            for table in tables:
                cur.execute(f"SELECT id, k, c, pad FROM {table}")
                while cur.fetchmany(10_000):
                    pass
    finally:
        conn.close()
    return time.process_time() - began


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process `pid`, with those of its children it has reaped (a
    postmaster reaps every backend whose connection closed)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def copy_in(pg: PostgresServer, database: str, files: dict[str, Path], keyed: bool) -> tuple[float, float]:
    """Create the tables (with or without their key) and server-side COPY each file into its
    table, two at a time; without the key, add it afterwards. Wall seconds from the first COPY,
    and the CPU seconds the server spent meanwhile."""
    pg.query(f'CREATE DATABASE "{database}"')
    pg.query("CREATE SCHEMA sb", dbname=database)
    for table in files:
        pg.query(f"CREATE TABLE sb.{table} ({COLUMNS.format(key='PRIMARY KEY' if keyed else 'NOT NULL')})",
                 dbname=database)
    pending = list(files.items())
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                table, path = pending.pop()
            try:
                pg.query(f"COPY sb.{table} FROM '{path}'", dbname=database)
                if not keyed:
                    pg.query(f"ALTER TABLE sb.{table} ADD PRIMARY KEY (id)", dbname=database)
            except BaseException as exc:  # reported after the join
                failures.append(exc)
                return

    postmaster = pg.pid
    assert postmaster is not None
    cpu = cpu_of(postmaster)
    began = time.perf_counter()
    workers = [threading.Thread(target=worker) for _ in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    took = time.perf_counter() - began
    if failures:
        raise failures[0]
    time.sleep(0.5)  # the backends have exited; let the postmaster reap them
    return took, cpu_of(postmaster) - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chameleon-venv", metavar="DIR", help="a venv with pg_chameleon to reuse (made if missing)")
    args = parser.parse_args()
    rows = args.tables * args.table_size
    bench = _snapshot_bench()
    with tempfile.TemporaryDirectory(prefix="setl-bench-pgfloor-") as tmp, MariaDBServer() as source, \
            PostgresServer() as pg:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the PostgreSQL server (its own OS user) reads the files
        src = sysbench.Conn.from_server(source, "sb")
        print(f"preparing {args.tables} x {args.table_size} sysbench rows ...", flush=True)
        sysbench.prepare(src, tables=args.tables, table_size=args.table_size, ddl_in_binlog=False)
        expected = bench.mariadb_summary(source, "sb", args.tables)
        files = {f"sbtest{n}": work / f"sbtest{n}.tsv" for n in range(1, args.tables + 1)}
        began, server_cpu = time.perf_counter(), cpu_of(source.pid or 0)
        client_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        for table, path in files.items():
            export(source, table, path)
            os.chmod(path, 0o644)
        took = time.perf_counter() - began
        source_cpu = (cpu_of(source.pid or 0) - server_cpu) / rows * 1e6
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client = (after.ru_utime + after.ru_stime - client_cpu.ru_utime - client_cpu.ru_stime) / rows * 1e6
        print(f"the source hands out the rows (mariadb --batch to files, one table at a time): {rows / took:,.0f} "
              f"rows/s; CPU per row: server {source_cpu:.2f} µs, client {client:.2f} µs", flush=True)
        python_read = driver_read(source, list(files)) / rows * 1e6
        print(f"a bare PyMySQL read of the same rows (tuples, nothing done with them): {python_read:.2f} µs of "
              f"CPU a row", flush=True)
        script, why = bench.chameleon_venv(work, args.chameleon_venv)
        keyed: list[float] = []
        unkeyed: list[float] = []
        cpu: dict[bool, list[float]] = {True: [], False: []}  # PostgreSQL's CPU µs per row, keyed or not
        chameleon: list[float] = []
        for round_ in range(1, args.repeat + 1):
            line = f"round {round_}:"
            for name, found, key in (("keyed", keyed, True), ("unkeyed, key after", unkeyed, False)):
                database = f"{'keyed' if key else 'unkeyed'}{round_}"
                took, spent = copy_in(pg, database, files, key)
                cpu[key].append(spent / rows * 1e6)
                if bench.pg_summary(pg, database, "sb", args.tables) != expected:
                    raise SystemExit(f"the {name} COPY differs from the source")
                pg.query(f'DROP DATABASE "{database}"')
                found.append(rows / took)
                line += f" COPY {name} {found[-1]:,.0f} rows/s ({cpu[key][-1]:.2f} µs CPU a row);"
            if script is not None:
                database = f"chameleon{round_}"
                pg.query(f'CREATE DATABASE "{database}"')
                took_or_why = bench.run_chameleon(script, work, source, pg, database)
                if isinstance(took_or_why, str):
                    script, why = None, took_or_why
                elif bench.pg_summary(pg, database, "sb", args.tables) != expected:
                    script, why = None, "pg_chameleon's copy differs from the source"
                else:
                    chameleon.append(rows / took_or_why)
                    line += f" pg_chameleon init_replica {chameleon[-1]:,.0f} rows/s"
                pg.query(f'DROP DATABASE "{database}"')
            print(line, flush=True)
        floor = max(statistics.median(keyed), statistics.median(unkeyed))
        ingest = min(statistics.median(cpu[True]), statistics.median(cpu[False]))
        print(f"PostgreSQL's own ingest (median): keyed {statistics.median(keyed):,.0f} rows/s "
              f"({statistics.median(cpu[True]):.2f} µs CPU a row), unkeyed then keyed "
              f"{statistics.median(unkeyed):,.0f} rows/s ({statistics.median(cpu[False]):.2f} µs)", flush=True)
        if chameleon:
            cham = statistics.median(chameleon)
            cores = os.cpu_count() or 1
            budget = cores / (3 * cham) * 1e6
            print(f"pg_chameleon 2.0.21 init_replica (median): {cham:,.0f} rows/s; 3x of it is {3 * cham:,.0f} rows/s; "
                  f"the faster floor is {floor / cham:.2f}x pg_chameleon", flush=True)
            servers = ingest + source_cpu
            print(f"at 3x pg_chameleon, {cores} cores give {budget:.2f} µs of CPU a row to everything; PostgreSQL's "
                  f"ingest and the source's reads take {servers:.2f}, leaving {budget - servers:.2f} µs a row for the "
                  f"copying tool itself (a bare PyMySQL read alone takes {python_read:.2f})", flush=True)
        else:
            print(f"pg_chameleon not measured: {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
