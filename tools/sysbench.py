#!/usr/bin/env python3
"""Prepare, run and clean up sysbench ``oltp_write_only`` against a MySQL/MariaDB server.

    python3 tools/sysbench.py prepare --port 13306 [--db sbtest] [--tables 4] [--table-size 10000]
    python3 tools/sysbench.py run     --port 13306 [--threads 4] [--seconds 30] [--rate 1000]
    python3 tools/sysbench.py checksum --port 13306 [--db sbtest]
    python3 tools/sysbench.py cleanup --port 13306

Used by the end-to-end tests, the README and the benchmarks through its function API:
`prepare`, `run`, `start` (a run in the background), `cleanup`, `create_tables` (sysbench's
schema, for a target that does not receive DDL) and `checksums`. Each takes a `Conn` saying
where to connect; `Conn.from_server` builds one from a `setl.testing.servers.MariaDBServer`.
Needs the ``sysbench`` binary (Debian package ``sysbench``, 1.0.x). A run writes about 4 row
changes per transaction (update by index, update of a non-indexed column, delete, insert).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import attrs

WORKLOAD = "oltp_write_only"


class SysbenchError(RuntimeError):
    """sysbench is missing, or a prepare/run/cleanup failed; the message ends with its output."""


@attrs.frozen
class Conn:
    """Where sysbench (and `checksums`) connect: a server and the database holding the tables."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = attrs.field(default="", repr=False)
    database: str = "sbtest"

    @classmethod
    def from_server(cls, server: Any, database: str = "sbtest") -> "Conn":
        """The root account of a `MariaDBServer` (anything with host, port, user, password)."""
        return cls(server.host, server.port, server.user, server.password, database)

    def connect(self, **overrides: Any):
        """An autocommit PyMySQL connection to `database`."""
        import pymysql

        args = dict(host=self.host, port=self.port, user=self.user, password=self.password,
                    database=self.database, autocommit=True, charset="utf8mb4")
        args.update(overrides)
        return pymysql.connect(**args)

    def argv(self) -> list[str]:
        return ["--db-driver=mysql", f"--mysql-host={self.host}", f"--mysql-port={self.port}",
                f"--mysql-user={self.user}", f"--mysql-password={self.password}",
                f"--mysql-db={self.database}"]


@attrs.frozen
class RunResult:
    """What a run reported: committed transactions and queries, ignored errors, and rates."""

    seconds: float
    transactions: int
    queries: int
    errors: int
    tps: float
    latency_p95_ms: float | None

    @property
    def row_changes(self) -> int:
        """Row changes written: each oltp_write_only transaction updates two rows, deletes one
        and inserts one (an approximation: an update or delete that finds no row writes none)."""
        return 4 * self.transactions


def _binary() -> str:
    path = shutil.which("sysbench")
    if path is None:
        raise SysbenchError("sysbench is not installed (apt-get install sysbench)")
    return path


def _argv(conn: Conn, command: str, *, tables: int, table_size: int, threads: int,
          extra: list[str] = ()) -> list[str]:
    return [_binary(), WORKLOAD, *conn.argv(), f"--tables={tables}", f"--table-size={table_size}",
            f"--threads={threads}", *extra, command]


def _check(argv: list[str], what: str, timeout: float) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise SysbenchError(f"sysbench {what} did not finish within {timeout:.0f}s") from exc
    if done.returncode != 0:
        raise SysbenchError(f"sysbench {what} failed with exit code {done.returncode}:\n"
                            f"{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def create_database(conn: Conn) -> None:
    """CREATE DATABASE IF NOT EXISTS `conn.database`."""
    with contextlib.closing(conn.connect(database=None)) as db, db.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{conn.database}`")


def prepare(conn: Conn, *, tables: int = 4, table_size: int = 10_000, threads: int = 1,
            ddl_in_binlog: bool = True, timeout: float = 600.0) -> None:
    """Create `tables` sysbench tables of `table_size` rows in `conn.database` (created if
    missing). Fails if the tables exist already.

    By default this is ``sysbench prepare``: DDL and rows are in the binlog. With
    ``ddl_in_binlog=False`` the tables are created with the DDL kept out of the binlog
    (`create_tables`, needs a privileged account) and filled with one ``INSERT ... SELECT`` per
    table (MariaDB's sequence engine), so a binlog reader sees row events only: for pipelines
    whose target gets its tables some other way."""
    if ddl_in_binlog:
        create_database(conn)
        _check(_argv(conn, "prepare", tables=tables, table_size=table_size, threads=threads),
               "prepare", timeout)
        return
    create_tables(conn, tables=tables, log_bin=False)
    with contextlib.closing(conn.connect()) as db, db.cursor() as cur:
        for n in range(1, tables + 1):
            # sysbench's shape: k random in 1..size, c and pad random digit groups
            cur.execute(f"INSERT INTO `sbtest{n}` (id, k, c, pad)"
                        f" SELECT seq, 1 + FLOOR(RAND() * {table_size}),"
                        "  LEFT(CONCAT_WS('-', FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11),"
                        "   FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11),"
                        "   FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11),"
                        "   FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11)), 119),"
                        "  CONCAT_WS('-', FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11),"
                        "   FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11), FLOOR(RAND() * 1e11))"
                        f" FROM seq_1_to_{int(table_size)}")


def cleanup(conn: Conn, *, tables: int = 4) -> None:
    """Drop the sysbench tables."""
    _check(_argv(conn, "cleanup", tables=tables, table_size=1, threads=1), "cleanup", 120)


def create_tables(conn: Conn, *, tables: int = 4, log_bin: bool = True) -> None:
    """sysbench's table definitions, empty, in `conn.database` (created if missing).

    For a target that must hold the tables before rows arrive. With ``log_bin=False`` the DDL
    stays out of the binary log (needs a privileged account)."""
    with contextlib.closing(conn.connect(database=None)) as db, db.cursor() as cur:
        if not log_bin:
            cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{conn.database}`")
        for n in range(1, tables + 1):
            cur.execute(f"CREATE TABLE IF NOT EXISTS `{conn.database}`.`sbtest{n}` ("
                        " `id` INT NOT NULL AUTO_INCREMENT,"
                        " `k` INT NOT NULL DEFAULT 0,"
                        " `c` CHAR(120) NOT NULL DEFAULT '',"
                        " `pad` CHAR(60) NOT NULL DEFAULT '',"
                        " PRIMARY KEY (`id`), KEY `k_1` (`k`)) ENGINE=InnoDB")


_TRANSACTIONS = re.compile(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec")
_QUERIES = re.compile(r"queries:\s+(\d+)")
_ERRORS = re.compile(r"ignored errors:\s+(\d+)")
_TOTAL_TIME = re.compile(r"total time:\s+([\d.]+)s")
_P95 = re.compile(r"95th percentile:\s+([\d.]+)")


def parse_run(output: str) -> RunResult:
    """The figures of a ``sysbench ... run`` report."""
    tx = _TRANSACTIONS.search(output)
    if tx is None:
        raise SysbenchError(f"no transaction count in sysbench's report:\n{output[-2000:]}")

    def number(pattern: re.Pattern[str], default: float | None = 0) -> Any:
        match = pattern.search(output)
        return float(match.group(1)) if match else default

    return RunResult(seconds=number(_TOTAL_TIME), transactions=int(tx.group(1)),
                     queries=int(number(_QUERIES)), errors=int(number(_ERRORS)),
                     tps=float(tx.group(2)), latency_p95_ms=number(_P95, None))


class Running:
    """A sysbench run in the background (see `start`)."""

    def __init__(self, argv: list[str], seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    @property
    def done(self) -> bool:
        return self.proc.poll() is not None

    def wait(self, timeout: float | None = None) -> RunResult:
        """Wait for the run to end (by default its duration plus 60 s) and return its report."""
        limit = timeout if timeout is not None else self.seconds + 60
        try:
            output, _ = self.proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired as exc:
            self.stop()
            raise SysbenchError(f"sysbench run did not end within {limit:.0f}s") from exc
        if self.proc.returncode != 0:
            raise SysbenchError(f"sysbench run failed with exit code {self.proc.returncode}:\n{output[-3000:]}")
        return parse_run(output)

    def stop(self) -> None:
        """Kill the run (its report is lost)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def start(conn: Conn, *, seconds: float, threads: int = 4, rate: int = 0, tables: int = 4,
          table_size: int = 10_000) -> Running:
    """Start ``oltp_write_only`` on prepared tables for `seconds`, in the background.

    `rate` caps the total transactions per second over all threads (0: as fast as it goes);
    `table_size` is the id range the run writes to (use the prepared size)."""
    extra = [f"--time={max(1, round(seconds))}", f"--rate={rate}", "--report-interval=0",
             "--histogram=off", "--percentile=95"]
    return Running(_argv(conn, "run", tables=tables, table_size=table_size, threads=threads, extra=extra),
                   seconds)


def run(conn: Conn, *, seconds: float, threads: int = 4, rate: int = 0, tables: int = 4,
        table_size: int = 10_000) -> RunResult:
    """`start` and wait for the report."""
    return start(conn, seconds=seconds, threads=threads, rate=rate, tables=tables,
                 table_size=table_size).wait()


def checksums(conn: Conn, tables: list[str] | None = None) -> dict[str, int | None]:
    """``CHECKSUM TABLE`` of `tables` (default: every base table) in `conn.database`; a missing
    table checks as None."""
    with contextlib.closing(conn.connect()) as db, db.cursor() as cur:
        if tables is None:
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
                        " AND table_type = 'BASE TABLE' ORDER BY table_name", (conn.database,))
            tables = [row[0] for row in cur.fetchall()]
        result: dict[str, int | None] = {}
        for name in tables:
            cur.execute(f"CHECKSUM TABLE `{conn.database}`.`{name}`")
            result[name] = cur.fetchone()[1]
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "run", "cleanup", "checksum"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3306)
    parser.add_argument("--user", default="root")
    parser.add_argument("--password", default="")
    parser.add_argument("--db", default="sbtest")
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--table-size", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--rate", type=int, default=0, help="total transactions/s cap (0: none)")
    args = parser.parse_args(argv)
    conn = Conn(args.host, args.port, args.user, args.password, args.db)
    try:
        if args.command == "prepare":
            prepare(conn, tables=args.tables, table_size=args.table_size)
            print(f"prepared {args.tables} tables of {args.table_size} rows in {args.db}")
        elif args.command == "cleanup":
            cleanup(conn, tables=args.tables)
            print(f"dropped {args.tables} tables in {args.db}")
        elif args.command == "checksum":
            for table, value in checksums(conn).items():
                print(f"{args.db}.{table}\t{value}")
        else:
            result = run(conn, seconds=args.seconds, threads=args.threads, rate=args.rate,
                         tables=args.tables, table_size=args.table_size)
            print(f"{result.transactions} transactions in {result.seconds:.1f}s ({result.tps:.0f}/s, "
                  f"about {result.row_changes} row changes), p95 latency {result.latency_p95_ms} ms, "
                  f"{result.errors} ignored errors")
    except SysbenchError as exc:
        print(f"sysbench.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
