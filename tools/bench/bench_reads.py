"""Loading snapshot reads (`Op.READ` row changes, as an initial snapshot emits them) into MariaDB and
PostgreSQL, against bare-driver baselines measured in the same run.

Each run loads the same rows (sysbench-like: int key, int, CHAR(120), CHAR(60)) into a fresh table,
in batches of ``--batch`` READ changes, one transaction per batch:

* MariaDB: ``sink`` is `MysqlLoad` (merge, fence, multi-row ``INSERT ... ON DUPLICATE KEY UPDATE``,
  position row); ``executemany`` is PyMySQL's ``executemany`` of the same upsert per batch, with
  nothing else; ``client`` is the ``mariadb`` command-line client loading a mysqldump-style file
  (extended INSERTs of about 1 MB, one COMMIT per batch), written before its clock starts.
* PostgreSQL: ``sink`` is `PostgresqlLoad` (``COPY`` into a temporary table, then ``INSERT ... SELECT
  ... ON CONFLICT DO UPDATE``); ``executemany`` is psycopg's ``executemany`` of the same upsert
  (pipelined by psycopg); ``copy`` is psycopg's plain ``COPY`` of the rows into the empty table,
  the fastest a Python client can send them.
* ``sink keyless``: the sink into the same table without a primary key (plain inserts).

Prints median rows/s over ``--repeat`` runs and each mode's ratio to the sink's.

    PYTHONPATH=. python3 tools/bench/bench_reads.py [--rows 200000] [--batch 5000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from setl.model import Batch, Op, Position, RowChange
from setl.sinks.mysql import MysqlLoad
from setl.sinks.postgresql import PostgresqlLoad
from setl.testing.servers import MariaDBServer, PostgresServer

COLUMNS = ("id", "k", "c", "pad")
KEYED = "CREATE TABLE {t} (id INT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, pad CHAR(60) NOT NULL)"
KEYLESS = "CREATE TABLE {t} (id INT NOT NULL, k INT NOT NULL, c CHAR(120) NOT NULL, pad CHAR(60) NOT NULL)"
UPSERT = {
    "mysql": "INSERT INTO {t} (id, k, c, pad) VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE"
             " k = VALUES(k), c = VALUES(c), pad = VALUES(pad)",
    "postgresql": "INSERT INTO {t} (id, k, c, pad) VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                  " k = EXCLUDED.k, c = EXCLUDED.c, pad = EXCLUDED.pad",
}


def image(i: int) -> dict[str, Any]:
    return {"id": i, "k": (i * 7919) % 1_000_003, "c": f"{i:011d}-" * 10, "pad": f"{i:011d}-" * 5}


def reads(schema: str, table: str, rows: int, size: int, key: tuple[str, ...] = ("id",)) -> list[Batch]:
    """`rows` snapshot reads cut into batches of `size`, each one transaction of a snapshot chunk."""
    batches = []
    for number, start in enumerate(range(0, rows, size), start=1):
        at = Position("snapshot", number)
        changes = tuple(RowChange(Op.READ, schema, table, key, None, image(i), at, 0.0)
                        for i in range(start, min(rows, start + size)))
        batches.append(Batch("bench", number, 1, Position("snapshot", number - 1), at, changes))
    return batches


def rate(rows: int, work: Callable[[], None]) -> float:
    began = time.perf_counter()
    work()
    return rows / (time.perf_counter() - began)


def load_all(load: Any, batches: list[Batch]) -> Callable[[], None]:
    def work() -> None:
        for batch in batches:
            load.load(batch)
    return work


def executemany(conn: Any, statement: str, batches: list[Batch]) -> Callable[[], None]:
    def work() -> None:
        for batch in batches:
            with conn.cursor() as cur:
                cur.executemany(statement, [[c.after[k] for k in COLUMNS] for c in batch.changes])  # type: ignore[index]
            conn.commit()
    return work


def copy_rows(conn: Any, table: str, batches: list[Batch]) -> Callable[[], None]:
    def work() -> None:
        for batch in batches:
            with conn.cursor() as cur, cur.copy(f"COPY {table} (id, k, c, pad) FROM STDIN") as copy:
                for change in batch.changes:
                    copy.write_row([change.after[k] for k in COLUMNS])
            conn.commit()
    return work


def dump_file(path: str, table: str, batches: list[Batch]) -> None:
    """The rows as mysqldump writes them: extended INSERTs of about 1 MB; a COMMIT per batch."""
    with open(path, "w", encoding="utf-8") as out:
        out.write("SET autocommit = 0;\n")
        for batch in batches:
            statement: list[str] = []
            size = 0
            for change in batch.changes:
                row = change.after
                assert row is not None
                values = f"({row['id']},{row['k']},'{row['c']}','{row['pad']}')"
                statement.append(values)
                size += len(values)
                if size > 1_000_000:
                    out.write(f"INSERT INTO {table} VALUES {','.join(statement)};\n")
                    statement, size = [], 0
            if statement:
                out.write(f"INSERT INTO {table} VALUES {','.join(statement)};\n")
            out.write("COMMIT;\n")


def mariadb_client(server: MariaDBServer, path: str) -> Callable[[], None]:
    def work() -> None:
        with open(path, "rb") as data:
            subprocess.run(["mariadb", f"--defaults-file={server.defaults_file}", "--protocol=TCP",
                            "--host=127.0.0.1", f"--port={server.port}"], stdin=data, check=True, timeout=600)
    return work


def bench_mysql(server: MariaDBServer, rows: int, size: int, run: int) -> dict[str, float]:
    results = {}
    for mode in ("client", "executemany", "sink", "sink keyless"):
        schema = f"reads_{mode.replace(' ', '_')}_{run}"
        server.query(f"CREATE DATABASE {schema}")
        server.query((KEYLESS if mode == "sink keyless" else KEYED).format(t=f"{schema}.bench"))
        batches = reads(schema, "bench", rows, size, () if mode == "sink keyless" else ("id",))
        if mode.startswith("sink"):
            load = MysqlLoad(server.target_config(), pipeline="bench", position_schema=schema)
            load.open()
            results[mode] = rate(rows, load_all(load, batches))
            load.close()
        elif mode == "executemany":
            import pymysql

            with contextlib.closing(pymysql.connect(**server.connect_args())) as conn:
                results[mode] = rate(rows, executemany(conn, UPSERT["mysql"].format(t=f"{schema}.bench"), batches))
        else:
            with tempfile.TemporaryDirectory(prefix="bench-reads-") as folder:
                path = os.path.join(folder, "dump.sql")
                dump_file(path, f"{schema}.bench", batches)
                results[mode] = rate(rows, mariadb_client(server, path))
        count = server.query(f"SELECT COUNT(*) FROM {schema}.bench")[0][0]
        assert count == rows, f"mysql {mode}: {count} rows, expected {rows}"
        server.query(f"DROP DATABASE {schema}")
    return results


def bench_postgres(server: PostgresServer, rows: int, size: int, run: int) -> dict[str, float]:
    import psycopg

    results = {}
    for mode in ("copy", "executemany", "sink", "sink keyless"):
        schema = f"reads_{mode.replace(' ', '_')}_{run}"
        server.query(f"CREATE SCHEMA {schema}")
        server.query((KEYLESS if mode == "sink keyless" else KEYED).format(t=f"{schema}.bench"))
        batches = reads(schema, "bench", rows, size, () if mode == "sink keyless" else ("id",))
        if mode.startswith("sink"):
            load = PostgresqlLoad(server.target_config(), pipeline=f"bench_{run}_{mode.replace(' ', '_')}")
            load.open()
            results[mode] = rate(rows, load_all(load, batches))
            load.close()
        else:
            with psycopg.connect(**server.connect_args()) as conn:
                if mode == "executemany":
                    statement = UPSERT["postgresql"].format(t=f"{schema}.bench")
                    results[mode] = rate(rows, executemany(conn, statement, batches))
                else:
                    results[mode] = rate(rows, copy_rows(conn, f"{schema}.bench", batches))
        count = server.query(f"SELECT COUNT(*) FROM {schema}.bench")[0][0]
        assert count == rows, f"postgresql {mode}: {count} rows, expected {rows}"
        server.query(f"DROP SCHEMA {schema} CASCADE")
    return results


@contextlib.contextmanager
def servers() -> Iterator[tuple[MariaDBServer, PostgresServer]]:
    mariadb, postgres = MariaDBServer(server_id=9), PostgresServer()
    try:
        yield mariadb.start(), postgres.start()
    finally:
        mariadb.cleanup()
        postgres.cleanup()


def report(target: str, runs: list[dict[str, float]]) -> None:
    medians = {mode: statistics.median(run[mode] for run in runs) for mode in runs[0]}
    for mode, value in medians.items():
        print(f"{target:10} {mode:13} {value:9.0f} rows/s   sink/{mode} {medians['sink'] / value:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--targets", choices=("all", "mysql", "postgresql"), default="all")
    args = parser.parse_args()
    print(f"{args.rows} READ rows in batches of {args.batch}, median of {args.repeat} runs")
    with servers() as (mariadb, postgres):
        if args.targets in ("all", "mysql"):
            report("mariadb", [bench_mysql(mariadb, args.rows, args.batch, run) for run in range(args.repeat)])
        if args.targets in ("all", "postgresql"):
            report("postgresql", [bench_postgres(postgres, args.rows, args.batch, run) for run in range(args.repeat)])


if __name__ == "__main__":
    main()
