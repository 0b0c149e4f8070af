"""Sink cost: `MysqlLoad` and `PostgresqlLoad` against a bare driver loop; `ParquetLoad`'s Spark writer against pyarrow.

Each run loads the same batches into a fresh table: inserts of every key, then updates of each
key in a later batch, then deletes of half of them (sysbench-like rows: int key, int, two
strings). The sink merges, upserts, fences and writes its position per batch; the baseline, in the
same run, sends the same rows with the driver's ``executemany`` (INSERT, UPDATE by key, DELETE by
key) in one transaction per batch, with no merge, position or retry. Prints median rows/s, median
per-batch latency, peak RSS and the sink/baseline ratio for each target.

The Parquet part loads the same batches into a fresh directory with ``writer: arrow`` (the
baseline) and ``writer: spark`` (on a local Spark session warmed up by one untimed pass, whose
time is printed apart), and prints, per writer, median rows/s, median per-batch latency and peak
RSS of the Python process and of Spark's JVM during the run (high-water marks reset before each
run through ``/proc/PID/clear_refs``; the JVM is running, idle, during the arrow run too), then
the spark/arrow ratio.

    PYTHONPATH=. python3 tools/bench/bench_sinks.py [--rows 20000] [--batch 2000] [--repeat 3]
                                                    [--targets all|sql|parquet]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from setl.model import Batch, Op, Position, RowChange
from setl.sinks.mysql import MysqlLoad
from setl.sinks.parquet import ParquetLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.testing.servers import MariaDBServer, PostgresServer
from setl.testing.spark import local_spark

DDL = "CREATE TABLE {t} (id INT PRIMARY KEY, k INT NOT NULL, c VARCHAR(120) NOT NULL, pad VARCHAR(60) NOT NULL)"


def row(i: int, version: int) -> dict[str, Any]:
    return {"id": i, "k": i * version, "c": f"{i:08d}-{version}" * 6, "pad": f"pad-{i}" * 5}


def workload(schema: str, rows: int, size: int) -> list[list[RowChange]]:
    """Batches of inserts, then of updates, then of deletes of every other key."""
    def change(op: Op, before: Any, after: Any) -> RowChange:
        return RowChange(op, schema, "bench", ("id",), before, after)

    changes = [change(Op.INSERT, None, row(i, 1)) for i in range(rows)]
    changes += [change(Op.UPDATE, row(i, 1), row(i, 2)) for i in range(rows)]
    changes += [change(Op.DELETE, row(i, 2), None) for i in range(0, rows, 2)]
    return [changes[k:k + size] for k in range(0, len(changes), size)]


def timed(batches: list[list[RowChange]], apply: Callable[[int, list[RowChange]], None]) -> tuple[float, float]:
    """(rows/s, median seconds per batch) of applying every batch in order."""
    latencies = []
    start = time.perf_counter()
    for number, changes in enumerate(batches, start=1):
        began = time.perf_counter()
        apply(number, changes)
        latencies.append(time.perf_counter() - began)
    elapsed = time.perf_counter() - start
    return sum(map(len, batches)) / elapsed, statistics.median(latencies)


def sink_apply(load: Any, pipeline: str) -> Callable[[int, list[RowChange]], None]:
    def apply(number: int, changes: list[RowChange]) -> None:
        load.load(Batch(pipeline, number, 1, Position("bench", number - 1), Position("bench", number),
                        tuple(changes)))
    return apply


def driver_apply(conn: Any, table: str, mark: str) -> Callable[[int, list[RowChange]], None]:
    columns = ["id", "k", "c", "pad"]
    insert = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join([mark] * 4)})"
    update = f"UPDATE {table} SET k = {mark}, c = {mark}, pad = {mark} WHERE id = {mark}"
    delete = f"DELETE FROM {table} WHERE id = {mark}"

    def apply(number: int, changes: list[RowChange]) -> None:
        with conn.cursor() as cur:
            by_op: dict[Op, list[RowChange]] = {}
            for change in changes:
                by_op.setdefault(change.op, []).append(change)
            if Op.INSERT in by_op:
                cur.executemany(insert, [[c.after[k] for k in columns] for c in by_op[Op.INSERT]])
            if Op.UPDATE in by_op:
                cur.executemany(update, [[c.after["k"], c.after["c"], c.after["pad"], c.after["id"]]
                                         for c in by_op[Op.UPDATE]])
            if Op.DELETE in by_op:
                cur.executemany(delete, [[c.before["id"]] for c in by_op[Op.DELETE]])
        conn.commit()
    return apply


@contextlib.contextmanager
def servers() -> Iterator[tuple[MariaDBServer, PostgresServer]]:
    mariadb, postgres = MariaDBServer(server_id=9), PostgresServer()
    try:
        yield mariadb.start(), postgres.start()
    finally:
        mariadb.cleanup()
        postgres.cleanup()


def bench_mysql(server: MariaDBServer, batches_of: Callable[[str], list], run: int) -> dict[str, tuple]:
    results = {}
    for mode in ("baseline", "sink"):
        schema = f"bench_{mode}_{run}"
        server.query(f"CREATE DATABASE {schema}")
        server.query(DDL.format(t=f"{schema}.bench"))
        batches = batches_of(schema)
        if mode == "sink":
            load = MysqlLoad(server.target_config(), pipeline="bench", position_schema=schema)
            results[mode] = timed(batches, sink_apply(load, "bench"))
            load.close()
        else:
            import pymysql

            with contextlib.closing(pymysql.connect(**server.connect_args())) as conn:
                results[mode] = timed(batches, driver_apply(conn, f"{schema}.bench", "%s"))
        server.query(f"DROP DATABASE {schema}")
    return results


def bench_postgres(server: PostgresServer, batches_of: Callable[[str], list], run: int) -> dict[str, tuple]:
    results = {}
    for mode in ("baseline", "sink"):
        schema = f"bench_{mode}_{run}"
        server.query(f"CREATE SCHEMA {schema}")
        server.query(DDL.format(t=f"{schema}.bench"))
        batches = batches_of(schema)
        if mode == "sink":
            load = PostgresqlLoad(server.target_config(), pipeline=f"bench_{run}")
            results[mode] = timed(batches, sink_apply(load, f"bench_{run}"))
            load.close()
        else:
            import psycopg

            with psycopg.connect(**server.connect_args()) as conn:
                results[mode] = timed(batches, driver_apply(conn, f"{schema}.bench", "%s"))
        server.query(f"DROP SCHEMA {schema} CASCADE")
    return results


def reset_peak(pid: int) -> None:
    """Start a process's peak-RSS (VmHWM) afresh: Linux resets it on "5" in clear_refs."""
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")


def peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def bench_parquet(batches: list[list[RowChange]], jvm: int, run: int) -> dict[str, tuple]:
    """Per writer: (rows/s, median batch seconds, peak MB of this process, peak MB of the JVM)."""
    results = {}
    for writer in ("arrow", "spark"):
        with tempfile.TemporaryDirectory(prefix="bench-parquet-") as folder:
            load = ParquetLoad(folder, pipeline=f"bench_{run}", writer=writer)
            load.open()
            for pid in (os.getpid(), jvm):
                reset_peak(pid)
            rate, latency = timed(batches, sink_apply(load, f"bench_{run}"))
            results[writer] = (rate, latency, peak_mb(os.getpid()), peak_mb(jvm))
            load.close()
    return results


def parquet_main(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    spark = local_spark()
    jvm = int(spark._jvm.ProcessHandle.current().pid())
    batches = workload("shop", args.rows, args.batch)
    with tempfile.TemporaryDirectory(prefix="bench-parquet-") as folder:
        # one untimed pass, so the JVM's JIT has compiled the write path before the timed runs
        timed(batches, sink_apply(ParquetLoad(folder, pipeline="warmup", writer="spark"), "warmup"))
    print(f"parquet    Spark start and one warm-up pass {time.perf_counter() - began:.1f} s (not counted)")
    runs = [bench_parquet(batches, jvm, run) for run in range(args.repeat)]
    medians = {writer: tuple(statistics.median(r[writer][i] for r in runs) for i in range(4))
               for writer in ("arrow", "spark")}
    for writer, (rate, latency, python_mb, jvm_mb) in medians.items():
        print(f"parquet    {writer:8} {rate:9.0f} rows/s  batch p50 {1000 * latency:7.1f} ms  "
              f"peak RSS python {python_mb:5.0f} MB, jvm {jvm_mb:5.0f} MB")
    print(f"parquet    ratio spark/arrow {medians['spark'][0] / medians['arrow'][0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--targets", choices=("all", "sql", "parquet"), default="all")
    args = parser.parse_args()
    total = sum(map(len, workload("s", args.rows, args.batch)))
    print(f"{total} changes ({args.rows} inserts, updates, {args.rows // 2} deletes) in batches of "
          f"{args.batch}, {args.repeat} runs each (medians)")
    if args.targets != "parquet":
        sql_main(args)
    if args.targets != "sql":
        parquet_main(args)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def sql_main(args: argparse.Namespace) -> None:
    with servers() as (mariadb, postgres):
        for name, bench, server in (("mariadb", bench_mysql, mariadb), ("postgresql", bench_postgres, postgres)):
            runs = [bench(server, lambda schema: workload(schema, args.rows, args.batch), run)
                    for run in range(args.repeat)]
            medians = {mode: (statistics.median(r[mode][0] for r in runs), statistics.median(r[mode][1] for r in runs))
                       for mode in ("baseline", "sink")}
            for mode, (rate, latency) in medians.items():
                print(f"{name:10} {mode:8} {rate:9.0f} rows/s  batch p50 {1000 * latency:7.1f} ms")
            print(f"{name:10} ratio sink/baseline {medians['sink'][0] / medians['baseline'][0]:.2f}")


if __name__ == "__main__":
    main()
