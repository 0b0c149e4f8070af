"""End-to-end rows/s of a pipeline with and without a Spark Transform, measured in the same run.

ScriptedSource (transactions of 100 row changes, 90% inserts, 10% updates) -> scheduler
(parallelism 3, batches of --rows rows) -> default Extract -> Transform -> a no-op sink that
only counts rows, run twice over the same script:

* ``baseline``: no transform (the base Transform passes batches through);
* ``spark``: a one-step `SparkTransform` (``add_column``) on the table;

and the ratio spark / baseline (goal >= 0.7), plus the process's peak RSS (Python side;
the Spark JVM is a separate process). Spark is warmed up before timing.

    python tools/bench/bench_pipeline_transform.py [--batches 30] [--rows 10000] [--parallelism 3]
"""

from __future__ import annotations

import argparse
import resource
import time

from setl.config import BatchSettings, PipelineSettings, TableRule, TransformStep
from setl.model import Batch, RowChange
from setl.plugins import Registry
from setl.scheduler import Outcome
from setl.stages import Transform
from setl.testing.harness import MemorySink, ScriptedSource, insert, run_pipeline, update
from setl.testing.spark import local_spark
from setl.transforms.stage import SparkTransform

TX_ROWS = 100


class CountingSink(MemorySink):
    """A MemorySink that applies nothing: it only counts the rows it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = 0

    def load(self, batch: Batch) -> None:
        self.rows += sum(1 for c in batch.changes if isinstance(c, RowChange))


def make_script(batches: int, rows: int) -> list[list[RowChange]]:
    txs, n = [], 0
    for _ in range(batches * rows // TX_ROWS):
        tx = []
        for _ in range(TX_ROWS):
            row = {"id": n, "customer": f"customer-{n % 997}", "qty": n % 7 + 1, "price": n % 10_000,
                   "note": None if n % 5 else "gift wrap"}
            if n % 10 == 9:
                tx.append(update("orders", dict(row, qty=1), row, schema="shop"))
            else:
                tx.append(insert("orders", row, schema="shop"))
            n += 1
        txs.append(tx)
    return txs


def run(txs, transform: Transform, settings: PipelineSettings) -> tuple[float, int]:
    sink = CountingSink()
    t0 = time.perf_counter()
    result = run_pipeline(ScriptedSource(txs), sink, transform=transform, settings=settings, name="bench")
    elapsed = time.perf_counter() - t0
    assert result.outcome is Outcome.CAUGHT_UP, result.outcome
    return elapsed, sink.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--parallelism", type=int, default=3)
    args = parser.parse_args()

    spark = local_spark()
    registry = Registry().discover()
    rules = [TableRule(source=r"shop\.orders",
                       transforms=(TransformStep("add_column", {"name": "total", "expr": "qty * price"}),))]
    stage = SparkTransform.from_rules(rules, registry, pipeline="bench", session=lambda: spark)
    settings = PipelineSettings(parallelism=args.parallelism,
                                batch=BatchSettings(max_rows=args.rows, max_bytes=1 << 30, max_wait_ms=200))
    txs = make_script(args.batches, args.rows)
    total = sum(len(tx) for tx in txs)

    run(make_script(2, args.rows), stage, settings)  # warm-up: JVM, code generation, Arrow
    base_s, base_rows = run(txs, Transform(), settings)
    spark_s, spark_rows = run(txs, stage, settings)
    assert base_rows == spark_rows == total, (base_rows, spark_rows, total)

    base_rate, spark_rate = total / base_s, total / spark_s
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rows: {total} in {args.batches} batches of {args.rows}, parallelism {args.parallelism}, "
          f"spark master {spark.sparkContext.master}")
    print(f"baseline (no transform): {base_rate:12,.0f} rows/s  ({base_s:.2f} s)")
    print(f"spark (add_column):      {spark_rate:12,.0f} rows/s  ({spark_s:.2f} s)")
    print(f"ratio spark/baseline:    {spark_rate / base_rate:.3f}  (goal >= 0.7)")
    print(f"peak RSS (python):       {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
