"""End to end, real source to real target: rows/s of a pipeline with and without a Spark transform.

The issue's goal: with parallelism 3, a pipeline with a simple transform keeps at least 0.7 of
the rows/s of the same pipeline without one. This measures it on whole pipelines:

* source: a real MariaDB binlog (setl.testing.servers, in a temp dir), with a backlog of
  ``--rows`` row changes on ``shop.orders`` recorded before timing: inserts in transactions of
  100 rows, then updates of every 10th row (also 100 per transaction);
* targets (``--targets``): MariaDB, PostgreSQL (same ``shop.orders`` with a ``total`` column) and
  the Parquet directory target;
* ``baseline``: the pipeline with no transform;
* ``spark``: the same pipeline with one built-in step, ``add_column total = qty * price``.

Each run is built from a generated conf dir and scheduled as ``setl start`` does it (the stages
from `setl.pipeline.build_stages`, the scheduler on the node's shared task threads, the garbage
collector tuned by `setl.node.tune_gc`), with ``parallelism: 3`` and batches of
``--batch-rows``, and reads the same binlog range into a fresh target table (its own schema per
run) until caught up. The Spark session is started before timing and its JVM warmed with
``--warmup-transforms`` batches, as on a node that has run a while; the two modes alternate
``--repeat`` times per target, after one untimed pair. Printed per target: median rows/s of each,
their ratio, median batch latency (Select's hand-off to the ack), CPU per 10k rows in this
process and in the Spark JVM, and peak memory. Every run checks the target's row count (and a
sum of ``total`` for the spark runs against the source) so a fast wrong run cannot count.

    python3 tools/bench/bench_transform_e2e.py [--rows 100000] [--repeat 3] [--targets mariadb,postgresql,parquet]
                                               [--warmup-transforms 200] [--gc-threshold 20000]
                                               [--spark-conf KEY=VALUE ...]

For the transform's own floor (an in-memory source and a sink that does nothing), see
bench_pipeline_transform.py.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline_transform import JvmClock, LatencyListener  # noqa: E402

from setl.config import RuntimeConfig, load_node, load_pipeline  # noqa: E402
from setl.connectors import registry  # noqa: E402
from setl.meta.sqlite import SqliteMetaStore  # noqa: E402
from setl.node import node_batch_cap, shared_services, tune_gc  # noqa: E402
from setl.pipeline import build_stages  # noqa: E402
from setl.scheduler import Outcome, Scheduler  # noqa: E402

TX_ROWS = 100
COLUMNS = ("id INT PRIMARY KEY, customer VARCHAR(64) NOT NULL, qty INT NOT NULL, price DECIMAL(12,2) NOT NULL, "
           "note VARCHAR(32), created DATETIME(6) NOT NULL")


def record_backlog(source, rows: int) -> tuple[tuple[str, int], tuple[str, int]]:
    """Write the backlog into shop.orders; return the binlog range that holds it."""
    source.query("CREATE DATABASE shop")
    source.query(f"CREATE TABLE shop.orders ({COLUMNS})")
    start = head(source)
    conn = source.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            for first in range(0, rows * 10 // 11, TX_ROWS):
                values = [(n, f"customer-{n % 997}", n % 7 + 1, f"{n % 10_000}.{n % 100:02d}",
                           None if n % 5 else "gift wrap",
                           f"2026-11-21 10:{n // 60 % 60:02d}:{n % 60:02d}.{n % 10**6:06d}")
                          for n in range(first, first + TX_ROWS)]
                cur.executemany("INSERT INTO shop.orders VALUES (%s, %s, %s, %s, %s, %s)", values)
                conn.commit()
            inserted = first + TX_ROWS
            ids = list(range(9, inserted, 10))
            for i in range(0, len(ids), TX_ROWS):
                cur.executemany("UPDATE shop.orders SET qty = qty + 1 WHERE id = %s",
                                [(n,) for n in ids[i:i + TX_ROWS]])
                conn.commit()
    finally:
        conn.close()
    return start, head(source)


def head(server) -> tuple[str, int]:
    file, pos = server.query("SHOW MASTER STATUS")[0][:2]
    return file, int(pos)


def write_conf(folder: Path, name: str, source, start: tuple[str, int], target_yaml: str, *, transform: bool,
               batch_rows: int, schema: str) -> Path:
    conf = folder / "conf"
    (conf / "pipelines").mkdir(parents=True, exist_ok=True)
    (conf / "setl.yaml").write_text(f"node:\n  id: bench\nmeta:\n  store: sqlite\n  path: {folder / 'meta.db'}\n")
    steps = "\n    transforms:\n      - {use: add_column, name: total, expr: 'qty * price'}" if transform else ""
    (conf / "pipelines" / f"{name}.yaml").write_text(f"""\
source:
  type: mysql
  host: {source.host}
  port: {source.port}
  user: root
  server_id: {4000 + len(list(folder.parent.iterdir()))}
  start: {{file: {start[0]}, pos: {start[1]}}}
target:
{target_yaml}
tables:
  - source: 'shop\\.orders'
    target: '{schema}.orders'{steps}
pipeline:
  parallelism: 3
  batch:
    max_rows: {batch_rows}
    max_wait_ms: 100
""")
    return conf


class Target:
    """One kind of target: its conf, a fresh table per run, and a check of what a run wrote."""

    name = ""

    def yaml(self, folder: Path) -> str:
        raise NotImplementedError

    def prepare(self, schema: str) -> None:
        """Create `schema`.orders (with the transform's ``total`` column) empty."""

    def check(self, schema: str, folder: Path) -> tuple[int, float | None]:
        """Row count and sum(total) of what the run left (the Parquet log counts changes)."""
        raise NotImplementedError


class SqlTarget(Target):
    """A SQL server target: the table's rows and their sum(total)."""

    def __init__(self, server) -> None:
        self.server = server

    def check(self, schema: str, folder: Path) -> tuple[int, float | None]:
        count, total = self.server.query(f"SELECT COUNT(*), SUM(total) FROM {schema}.orders")[0]
        return int(count), None if total is None else float(total)


class MariaDBTarget(SqlTarget):
    name = "mariadb"

    def yaml(self, folder: Path) -> str:
        return f"  type: mysql\n  host: {self.server.host}\n  port: {self.server.port}\n  user: root"

    def prepare(self, schema: str) -> None:
        self.server.query(f"CREATE DATABASE {schema}")
        self.server.query(f"CREATE TABLE {schema}.orders ({COLUMNS}, total DECIMAL(20,2))")


class PostgresTarget(SqlTarget):
    name = "postgresql"

    def yaml(self, folder: Path) -> str:
        return f"  type: postgresql\n  host: {self.server.host}\n  port: {self.server.port}\n  user: postgres"

    def prepare(self, schema: str) -> None:
        self.server.query(f"CREATE SCHEMA {schema}")
        self.server.query(f"CREATE TABLE {schema}.orders (id INT PRIMARY KEY, customer VARCHAR(64) NOT NULL, "
                          "qty INT NOT NULL, price NUMERIC(12,2) NOT NULL, note VARCHAR(32), "
                          "created TIMESTAMP(6) NOT NULL, total NUMERIC(20,2))")


class ParquetTarget(Target):
    name = "parquet"

    def yaml(self, folder: Path) -> str:
        return f"  type: parquet\n  path: {folder / 'out'}"

    def check(self, schema: str, folder: Path) -> tuple[int, float | None]:
        from setl.sinks.parquet import read_table

        table = read_table(folder / "out", f"{schema}.orders")
        if "total" not in table.column_names:
            return table.num_rows, None
        # The change log: the last image of each key is the row's state, in (log, offset, seq) order.
        rows = zip(*(table.column(c).to_pylist() for c in ("_setl_log", "_setl_offset", "_setl_seq", "id", "total")))
        seen = {key: float(total) for _, _, _, key, total in sorted(rows, key=lambda r: r[:3])}
        return table.num_rows, sum(seen.values())


def warm_up(spark, batches: int, rows: int) -> None:
    """Put `batches` in-memory batches shaped like shop.orders through the same transform."""
    import datetime as dt
    import decimal

    from setl.config import TableRule, TransformStep
    from setl.model import Batch, Op, Position, RowChange
    from setl.plugins import Registry
    from setl.transforms.stage import SparkTransform

    rules = [TableRule(source=r"warm\.orders",
                       transforms=(TransformStep("add_column", {"name": "total", "expr": "qty * price"}),))]
    stage = SparkTransform.from_rules(rules, Registry().discover(), pipeline="warm-up", session=lambda: spark)
    end = Position("warm-up", rows)
    changes = tuple(RowChange(Op.INSERT, "warm", "orders", ("id",), None,
                              {"id": n, "customer": f"customer-{n % 997}", "qty": n % 7 + 1,
                               "price": decimal.Decimal(f"{n % 10_000}.{n % 100:02d}"), "note": None,
                               "created": dt.datetime(2026, 11, 21, 10, 0, n % 60, n)}, end, 0.0)
                    for n in range(rows))
    began = time.perf_counter()
    for n in range(batches):
        stage.transform(Batch("warm-up", n + 1, 1, Position("warm-up", 0), end, changes))
    if batches:
        print(f"warm-up: {batches} transforms of {rows} rows in {time.perf_counter() - began:.1f} s", flush=True)


def run_once(target: Target, source, start, folder: Path, name: str, *, transform: bool, batch_rows: int,
             jvm: JvmClock) -> dict[str, float]:
    schema = name.replace("-", "_")
    target.prepare(schema)
    conf = write_conf(folder, name, source, start, target.yaml(folder), transform=transform, batch_rows=batch_rows,
                      schema=schema)
    node, config = load_node(conf), load_pipeline(conf, name, registry())
    stages = build_stages(node, config)  # its Spark transform gets the node's session: `spark`, already warm
    # The scheduler as a node runs it: on the node's shared task threads, under its batch cap.
    tasks, serial = shared_services(node)
    listener = LatencyListener()
    stages.load.open()
    scheduler = Scheduler(name, config.pipeline, stages.select, stages.extract, stages.transform, stages.load,
                          SqliteMetaStore(":memory:"), node_id=node.node.id, listener=listener, tasks=tasks,
                          serial=serial, batch_cap=node_batch_cap(node))
    cpu0, jvm0, t0 = time.process_time(), jvm(), time.perf_counter()
    outcome = scheduler.run(until_caught_up=True)
    elapsed = time.perf_counter() - t0
    cpu, jvm_cpu = time.process_time() - cpu0, jvm() - jvm0
    tasks.shutdown(timeout=10.0)
    serial.shutdown_now()
    stages.load.close()
    stages.transform.close()
    assert outcome is Outcome.CAUGHT_UP, outcome
    return {"seconds": elapsed, "cpu": cpu, "jvm": jvm_cpu, "latency": statistics.median(listener.latencies),
            "check": target.check(schema, folder)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="row changes in the backlog")
    parser.add_argument("--batch-rows", type=int, default=5000, help="pipeline batch.max_rows")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--targets", default="mariadb,postgresql,parquet")
    parser.add_argument("--warmup-transforms", type=int, default=200,
                        help="batches of --batch-rows put through the transform before timing, as a node that has "
                             "run a while has done (its JIT-compiled JVM); 0 for a cold start")
    parser.add_argument("--gc-threshold", type=int, default=RuntimeConfig().gc_threshold, metavar="N",
                        help="runtime.gc_threshold, applied as `setl start` does after the warm-up "
                             "(default: setl's; 0: Python's own garbage-collector settings)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a spark.* setting on top of setl's defaults (repeatable)")
    args = parser.parse_args(argv)
    kinds = [t.strip() for t in args.targets.split(",") if t.strip()]

    from setl.config import SparkConfig
    from setl.spark import get_session
    from setl.testing.servers import MariaDBServer, PostgresServer

    extra = dict(item.split("=", 1) for item in args.spark_conf)
    # What `setl start` builds from the default spark settings (plus --spark-conf).
    spark = get_session(SparkConfig(conf=extra))
    warm_up(spark, args.warmup_transforms, args.batch_rows)
    tune_gc(RuntimeConfig(gc_threshold=args.gc_threshold))
    jvm = JvmClock()
    with tempfile.TemporaryDirectory(prefix="setl-bench-e2e-") as tmp:
        tmp_path = Path(tmp)
        tmp_path.chmod(0o755)  # PostgreSQL runs as its own OS user
        servers = [MariaDBServer(tmp_path / "source", server_id=1).start()]
        try:
            source = servers[0]
            targets: list[Target] = []
            for kind in kinds:
                if kind == "mariadb":
                    servers.append(MariaDBServer(tmp_path / "target-mariadb", server_id=2).start())
                    targets.append(MariaDBTarget(servers[-1]))
                elif kind == "postgresql":
                    servers.append(PostgresServer(tmp_path / "target-postgresql").start())
                    targets.append(PostgresTarget(servers[-1]))
                elif kind == "parquet":
                    targets.append(ParquetTarget())
                else:
                    parser.error(f"unknown target {kind!r}")
            start, end = record_backlog(source, args.rows)
            expected = source.query("SELECT COUNT(*), SUM(qty * price) FROM shop.orders")[0]
            changes = args.rows * 10 // 11 // TX_ROWS * TX_ROWS
            changes += len(range(9, changes, 10))
            print(f"backlog: {changes} row changes on shop.orders, binlog {start[0]}:{start[1]} -> {end[0]}:{end[1]}; "
                  f"parallelism 3, batches of {args.batch_rows}, spark {spark.sparkContext.master}, "
                  f"{os.cpu_count()} cpus, extra spark conf {extra or 'none'}, gc threshold {gc.get_threshold()}",
                  flush=True)
            runs = tmp_path / "runs"
            runs.mkdir()
            report = []
            for target in targets:
                results: dict[str, list[dict]] = {"baseline": [], "spark": []}
                for n in range(args.repeat + 1):  # the first pair warms caches, codegen and the JIT
                    for mode in ("baseline", "spark"):
                        name = f"{target.name}_{mode}_{n}"
                        folder = runs / name
                        folder.mkdir()
                        r = run_once(target, source, start, folder, name, transform=mode == "spark",
                                     batch_rows=args.batch_rows, jvm=jvm)
                        count, total = r["check"]
                        want = changes if target.name == "parquet" else int(expected[0])
                        assert count == want, (target.name, mode, count, want)
                        if mode == "spark":
                            assert total is not None and abs(total - float(expected[1])) < 0.01, (total, expected[1])
                        if n:
                            results[mode].append(r)
                        print(f"  {name}: {changes / r['seconds']:,.0f} rows/s", flush=True)
                report.append((target.name, results))
            print(f"\n{changes} row changes per run; medians of {args.repeat} runs per mode")
            print(f"{'target':<11} {'mode':<9} {'rows/s':>9} {'batch latency':>13} {'py cpu/10k':>10} "
                  f"{'jvm cpu/10k':>11}")
            for name, results in report:
                for mode, values in results.items():
                    rate = statistics.median(changes / v["seconds"] for v in values)
                    latency = statistics.median(v["latency"] for v in values)
                    print(f"{name:<11} {mode:<9} {rate:>9,.0f} {latency * 1000:>10.0f} ms"
                          f" {statistics.median(v['cpu'] for v in values) * 10_000 / changes * 1000:>7.0f} ms"
                          f" {statistics.median(v['jvm'] for v in values) * 10_000 / changes * 1000:>8.0f} ms")
                pairs = [b["seconds"] / s["seconds"] for b, s in zip(results["baseline"], results["spark"])]
                ratio = statistics.median(changes / v["seconds"] for v in results["spark"]) / \
                    statistics.median(changes / v["seconds"] for v in results["baseline"])
                print(f"{name:<11} ratio spark/baseline {ratio:.3f} (per pair: {', '.join(f'{p:.3f}' for p in pairs)};"
                      " goal >= 0.7)")
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"peak RSS: python {peak:.0f} MiB, spark JVM {jvm.rss_mib():.0f} MiB")
        finally:
            for server in reversed(servers):
                server.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
