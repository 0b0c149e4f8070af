"""Per-batch cost of the Spark Transform stage against the bare Arrow round trip, measured in the same run.

For each batch size it reports the median of:

* ``arrow``: the baseline; an Arrow table of the batch goes into a Spark DataFrame and
  comes back with ``toArrow()``, with no transform and no Python rows;
* ``stage``: `SparkTransform.transform` with a two-step chain
  (``add_column`` + ``filter``), from RowChanges to RowChanges, including
  setl's conversions between rows and Arrow;

and the ratio stage / arrow.

Run: python tools/bench/bench_transform.py [--sizes 1000 10000 50000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import statistics
import time

from setl.config import SparkConfig, TransformStep
from setl.model import Batch, Op, Position, RowChange
from setl.plugins import Registry
from setl.spark import from_arrow, get_session, to_arrow
from setl.transforms.frames import rows_to_table
from setl.transforms.stage import SparkTransform


def make_batch(rows: int) -> Batch:
    """Mostly inserts with 10% updates, rows shaped like an OLTP orders table."""
    start = dt.datetime(2024, 1, 1, 12, 0, 0, 123456)
    changes = []
    for i in range(rows):
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
            changes.append(RowChange(Op.UPDATE, "shop", "orders", ("id",), before, image, Position("b", i), 1.7e9))
        else:
            changes.append(RowChange(Op.INSERT, "shop", "orders", ("id",), None, image, Position("b", i), 1.7e9))
    return Batch("bench", 1, 1, Position("b", 0), Position("b", rows), tuple(changes))


def median_seconds(fn, repeat: int) -> float:
    fn()  # warm-up: JIT, code generation, caches
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 50_000])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    t0 = time.perf_counter()
    spark = get_session(SparkConfig(master=args.master, app_name="setl-bench",
                                    conf={"spark.sql.shuffle.partitions": "2"}))
    print(f"Spark session ({args.master}) started in {time.perf_counter() - t0:.1f} s")

    registry = Registry().discover()
    chain = [
        registry.validate(TransformStep("add_column", {"name": "amount_cents", "expr": "cast(amount * 100 as bigint)"})),
        registry.validate(TransformStep("filter", {"condition": "customer <> 'customer-0'"})),
    ]
    stage = SparkTransform({"shop.orders": chain}, pipeline="bench", session=lambda: spark)

    print(f"{'rows':>8}  {'arrow round trip':>16}  {'stage, 2 steps':>14}  {'ratio':>5}  {'stage rows/s':>12}")
    for size in args.sizes:
        batch = make_batch(size)
        images = [c.after for c in batch.changes]
        table, _ = rows_to_table(images)
        baseline = median_seconds(lambda: to_arrow(from_arrow(spark, table)), args.repeat)
        full = median_seconds(lambda: stage.transform(batch), args.repeat)
        print(f"{size:>8}  {baseline * 1000:>13.0f} ms  {full * 1000:>11.0f} ms  {full / baseline:>5.2f}"
              f"  {size / full:>12,.0f}")


if __name__ == "__main__":
    main()
