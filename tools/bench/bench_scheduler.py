"""Scheduler overhead: Select -> Termin with pre-built batches and no-op stages.

Prints rows/s and per-batch overhead of the full scheduler (permits, pool,
ordered load, Termin acks into a real SQLite meta store), against a baseline
measured in the same run: one thread calling the same no-op stages and the same
meta-store ack for each batch, with no scheduling at all.

    python tools/bench/bench_scheduler.py [--batches 400] [--rows 5000] [--parallelism 3] [--repeat 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

from setl.config import BatchSettings, PipelineSettings
from setl.meta import SqliteMetaStore
from setl.model import Op, Position, RowChange, Transaction
from setl.scheduler import Scheduler
from setl.stages import Extract, Load, Select, Transform


class PrebuiltSource(Select):
    """Hands out the same pre-built transaction `batches` times, one per poll."""

    def __init__(self, batches: int, rows: int) -> None:
        changes = tuple(
            RowChange(Op.INSERT, "bench", "t", ("id",), None, {"id": i, "v": i}) for i in range(rows)
        )
        self.txs = [Transaction(changes, Position("bench", n + 1)) for n in range(batches)]
        self.index = 0

    def open(self, start):
        self.index = start.offset if start else 0

    def poll(self, timeout):
        if self.index >= len(self.txs):
            time.sleep(timeout)
            return None
        tx = self.txs[self.index]
        self.index += 1
        return tx

    def tell(self):
        return Position("bench", self.index)

    def head(self):
        return Position("bench", len(self.txs))


class NoopLoad(Load):
    def load(self, batch):
        pass


def run_scheduler(batches: int, rows: int, parallelism: int, folder: Path, n: int) -> float:
    meta = SqliteMetaStore(folder / f"meta-{n}.db")
    settings = PipelineSettings(parallelism=parallelism, batch=BatchSettings(max_rows=rows, max_wait_ms=1000))
    scheduler = Scheduler("bench", settings, PrebuiltSource(batches, rows), Extract(), Transform(), NoopLoad(), meta)
    start = time.perf_counter()
    scheduler.run(until_caught_up=True)
    elapsed = time.perf_counter() - start
    assert scheduler.acked_rows == batches * rows, scheduler.acked_rows
    meta.close()
    return elapsed


def run_baseline(batches: int, rows: int, folder: Path, n: int) -> float:
    """The same stage calls and acks in one thread, without the scheduler."""
    from setl.model import Batch

    meta = SqliteMetaStore(folder / f"base-{n}.db")
    source, extract, transform, load = PrebuiltSource(batches, rows), Extract(), Transform(), NoopLoad()
    source.open(None)
    start = time.perf_counter()
    previous = Position("bench", 0)
    for batch_id in range(1, batches + 1):
        tx = source.poll(0)
        batch = Batch("bench", batch_id, 1, previous, tx.end, tuple(tx.changes))
        load.load(transform.transform(extract.extract(batch)))
        meta.ack("bench", batch_id, 1, batch.end, rows=len(batch))
        previous = tx.end
    elapsed = time.perf_counter() - start
    meta.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--parallelism", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    total = args.batches * args.rows
    sched, base = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for n in range(args.repeat):
            base.append(run_baseline(args.batches, args.rows, folder, n))
            sched.append(run_scheduler(args.batches, args.rows, args.parallelism, folder, n))
    s, b = statistics.median(sched), statistics.median(base)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"batches={args.batches} rows/batch={args.rows} parallelism={args.parallelism} repeats={args.repeat}")
    print(f"scheduler : {total / s:12,.0f} rows/s   {s / args.batches * 1000:7.3f} ms/batch (median)")
    print(f"baseline  : {total / b:12,.0f} rows/s   {b / args.batches * 1000:7.3f} ms/batch "
          "(one thread, no scheduling)")
    print(f"overhead per batch: {(s - b) / args.batches * 1000:.3f} ms   ratio scheduler/baseline rows/s: {b / s:.2f}")
    print(f"peak RSS: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
