"""Catch-up of the other tables with one table quarantined, against none (issue 37; goal >= 0.9x).

Starts a MariaDB source and target (setl.testing.servers). Each run records a backlog of
`--transactions` transactions, each inserting `--rows` rows into each of 4 tables and updating one,
then times ``setl start --until-caught-up`` (``on_table_error: quarantine``) over it into fresh
target tables. In the ``quarantined`` runs the target's ``t4`` column is too narrow for every value,
so ``t4`` is quarantined at its first change and all its changes are kept on the target; in the
``none`` runs every table applies. Runs alternate (none, quarantined, ...) over `--repeat` rounds.
Each run checks the other tables equal to the source (CHECKSUM TABLE) and, when quarantined, that
every change of ``t4`` is kept. Prints each mode's median rows/s of the other tables (wall time of
the whole command, its start included) and the ratio.

    python3 tools/bench/bench_quarantine.py [--transactions 1500] [--rows 10] [--repeat 3]

Measured 2026-11-28, ``--transactions 3000 --repeat 3`` on a shared 2-core machine (load average
5-8): none 20,640 rows/s, one quarantined 17,097, ratio 0.83 (runs 0.60-1.05; goal >= 0.9).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymysql
import yaml

from setl.testing.servers import MariaDBServer

TABLES = ("t1", "t2", "t3", "t4")


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


def one_run(root: Path, source: MariaDBServer, target: MariaDBServer, mode: str, number: int,
            args: argparse.Namespace) -> float:
    """One catch-up; the other tables' rows/s."""
    src, dst, name = f"bq_src_{number}", f"bq_dst_{number}", f"bq{number}"
    head = source.query("SHOW MASTER STATUS")[0]
    per_table = backlog(source, src, args.transactions, args.rows)
    with contextlib.closing(target.connect()) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{dst}`")
        for table in TABLES:
            width = 2 if mode == "quarantined" and table == "t4" else 20
            cur.execute(f"CREATE TABLE `{dst}`.`{table}` (id INT PRIMARY KEY, v VARCHAR({width}))")
    conf = root / name
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(yaml.safe_dump({"meta": {"store": "sqlite", "path": str(conf / "meta.db")}}))
    (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump({
        "source": {"type": "mysql", "host": source.host, "port": source.port, "user": source.user,
                   "password": source.password, "server_id": 900 + number,
                   "start": {"file": head[0], "pos": int(head[1])}},
        "target": {"type": "mysql", "host": target.host, "port": target.port, "user": target.user,
                   "password": target.password},
        "tables": [{"source": rf"{src}\..*", "target": f"{dst}.{{table}}"}],
        "pipeline": {"on_table_error": "quarantine", "create_tables": False},
    }))
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", name,
                           "--until-caught-up"], capture_output=True, text=True)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"{mode} run {number} failed: {done.stderr[-3000:]}")
    for table in TABLES[:3]:
        theirs = source.query(f"CHECKSUM TABLE `{src}`.`{table}`")[0][1]
        ours = target.query(f"CHECKSUM TABLE `{dst}`.`{table}`")[0][1]
        if theirs != ours:
            raise SystemExit(f"{mode} run {number}: {table} differs")
    kept = target.query("SELECT COUNT(*) FROM setl.setl_position_kept WHERE pipeline = %s", (name,))[0][0]
    if mode == "quarantined" and kept != per_table:
        raise SystemExit(f"quarantined run {number}: {kept} changes kept, {per_table} expected")
    rate = 3 * per_table / seconds
    print(f"{mode:>11} run {number}: {seconds:6.2f}s, other tables {rate:10,.0f} rows/s, kept {kept:,}", flush=True)
    for server, db in ((source, src), (target, dst)):
        server.query(f"DROP DATABASE `{db}`")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=1500)
    parser.add_argument("--rows", type=int, default=10, help="rows inserted per table per transaction")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    found: dict[str, list[float]] = {"none": [], "quarantined": []}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="setl-bench-q-") as folder:
        source = stack.enter_context(MariaDBServer(server_id=1))
        target = stack.enter_context(MariaDBServer(server_id=2))
        number = 0
        for _ in range(args.repeat):
            for mode in ("none", "quarantined"):
                found[mode].append(one_run(Path(folder), source, target, mode, number, args))
                number += 1
    none, quarantined = statistics.median(found["none"]), statistics.median(found["quarantined"])
    print(f"median rows/s of the other tables: none {none:,.0f}, one quarantined {quarantined:,.0f}, "
          f"ratio {quarantined / none:.2f}")


if __name__ == "__main__":
    main()
