"""Per-batch cost of the Spark Transform stage against the bare Arrow round trip, measured in the same run.

For each batch size (rows shaped like an OLTP orders table: int, text, DECIMAL, DATETIME(6),
bool, NULLs; 90% inserts, 10% updates) it reports the median wall time of:

* ``arrow``: the baseline; the batch's Arrow table (as the stage builds it) goes into a
  Spark DataFrame and comes back with ``toArrow()``, with no transform and no Python rows;
* ``chain``: the same with the two-step chain (``add_column`` + ``filter``) applied in Spark;
* ``stage``: `SparkTransform.transform` with that chain, from RowChanges to RowChanges,
  including setl's column-wise conversions between changes and Arrow;

the ratio stage / arrow, the stage's rows/s, and the CPU the stage spends in this Python
process per batch (the rest of its time is the Spark JVM and waiting for it).

Run: python tools/bench/bench_transform.py [--sizes 1000 10000 50000] [--repeat 9]
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import resource
import statistics
import time
from collections.abc import Callable

from setl.config import SparkConfig, TransformStep
from setl.model import Batch, Op, Position, RowChange
from setl.plugins import Registry, TransformContext
from setl.spark import from_arrow, get_session, to_arrow
from setl.testing.spark import LOCAL_SETTINGS
from setl.transforms.frames import SchemaCache
from setl.transforms.stage import SparkTransform, _Rows

CHAIN = (
    TransformStep("add_column", {"name": "amount_cents", "expr": "cast(amount * 100 as bigint)"}),
    TransformStep("filter", {"condition": "customer <> 'customer-0'"}),
)


def make_batch(rows: int) -> Batch:
    """Mostly inserts with 10% updates, rows shaped like an OLTP orders table, 100 changes per transaction."""
    start = dt.datetime(2024, 1, 1, 12, 0, 0, 123456)
    changes, position = [], Position("b", 0)
    for i in range(rows):
        if i % 100 == 0:
            position = Position("b", i + 100)
        image = {
            "id": i,
            "customer": f"customer-{i % 997}",
            "amount": decimal.Decimal(i % 10_000) / 100,
            "created": start + dt.timedelta(seconds=i, microseconds=i),
            "paid": i % 3 == 0,
            "note": None if i % 5 else "gift wrap",
        }
        if i % 10 == 9:
            before = dict(image, amount=image["amount"] + 1)
            changes.append(RowChange(Op.UPDATE, "shop", "orders", ("id",), before, image, position, 1.7e9))
        else:
            changes.append(RowChange(Op.INSERT, "shop", "orders", ("id",), None, image, position, 1.7e9))
    return Batch("bench", 1, 1, Position("b", 0), Position("b", rows), tuple(changes))


def medians(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this process, after one warm-up call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 50_000])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--master", default=LOCAL_SETTINGS.master)
    parser.add_argument("--warmup", type=int, default=40, help="stage runs on 10k rows before timing (JVM JIT)")
    args = parser.parse_args()

    t0 = time.perf_counter()
    spark = get_session(SparkConfig(master=args.master, app_name="setl-bench", conf=LOCAL_SETTINGS.conf))
    print(f"Spark session ({args.master}) started in {time.perf_counter() - t0:.1f} s")

    registry = Registry().discover()
    chain = [registry.validate(step, index=i) for i, step in enumerate(CHAIN)]
    stage = SparkTransform({"shop.orders": chain}, pipeline="bench", session=lambda: spark)
    warm = make_batch(10_000)
    for _ in range(args.warmup):
        stage.transform(warm)

    def spark_chain(df):
        for step in chain:
            context = TransformContext(pipeline="bench", source_table="shop.orders", target_table="shop.orders",
                                       batch_id=1, epoch=1, params=step.params, spark=spark, step=step.name)
            df = step.plugin.func(df, step.params, context)
        return df

    print(f"{'rows':>7}  {'arrow':>8}  {'chain':>8}  {'stage':>8}  {'stage/arrow':>11}  {'stage rows/s':>12}"
          f"  {'stage py cpu':>12}")
    for size in args.sizes:
        batch = make_batch(size)
        changes = list(batch.changes)
        table, _codecs = _Rows.of(range(size), changes).table(SchemaCache()["shop.orders"])
        # medians() calls each lambda before the loop moves on; the defaults bind this round's values.
        arrow, _ = medians(lambda table=table: to_arrow(from_arrow(spark, table)), args.repeat)
        with_chain, _ = medians(lambda table=table: to_arrow(spark_chain(from_arrow(spark, table))), args.repeat)
        full, cpu = medians(lambda batch=batch: stage.transform(batch), args.repeat)
        print(f"{size:>7}  {arrow * 1000:>5.0f} ms  {with_chain * 1000:>5.0f} ms  {full * 1000:>5.0f} ms"
              f"  {full / arrow:>11.2f}  {size / full:>12,.0f}  {cpu * 1000:>9.0f} ms")
    print(f"peak RSS (python): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
