"""End-to-end rows/s of a pipeline with and without a Spark Transform, measured in the same run.

ScriptedSource (transactions of 100 row changes, 90% inserts, 10% updates) -> scheduler
(parallelism 3, batches of --rows rows) -> default Extract -> Transform -> a sink, run over
the same script. The sink is a no-op that only counts rows (``--sink count``, the strictest
comparison: the pipeline does nothing else) or the Parquet target in a temp dir
(``--sink parquet``, a real target):

* ``baseline``: no transform (the base Transform passes batches through);
* ``spark``: a one-step `SparkTransform` (``add_column``) on the table.

The two alternate --repeat times after a warm-up (JVM JIT, code generation); the script
prints the median rows/s of each, their ratio (goal >= 0.7), the median batch latency
(hand-off by Select to ack), the CPU spent per 10k rows in this Python process and in
the Spark JVM (where the time goes), and peak memory.

    python tools/bench/bench_pipeline_transform.py [--batches 30] [--rows 10000] [--parallelism 3] [--repeat 3]

This is the transform's floor, not a pipeline's: with nothing else to do, the pipeline without a
transform runs at 300k+ rows/s, and on 2 cores the Spark JVM's own CPU per batch keeps the ratio far
below 0.7. For whole pipelines (a real binlog into real targets) see bench_transform_e2e.py.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

from setl.config import BatchSettings, PipelineSettings, TableRule, TransformStep
from setl.model import Ack, Batch, RowChange
from setl.plugins import Registry
from setl.scheduler import Listener, Outcome
from setl.sinks.parquet import ParquetLoad
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


class LatencyListener(Listener):
    """Seconds from each batch's hand-off by Select to its ack."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}
        self.latencies: list[float] = []

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        self.started[batch.id] = time.perf_counter()

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        self.latencies.append(time.perf_counter() - self.started[batch.id])


class JvmClock:
    """CPU seconds used so far by the Spark JVM (a child process of this one), from /proc; 0 if unknown."""

    def __init__(self) -> None:
        self.stat = None
        try:
            out = subprocess.run(["pgrep", "-P", str(os.getpid()), "java"], capture_output=True, text=True).stdout
            if out.split():
                self.stat = f"/proc/{out.split()[0]}/stat"
        except OSError:
            pass

    def __call__(self) -> float:
        if self.stat is None:
            return 0.0
        with open(self.stat) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        if self.stat is None:
            return 0.0
        with open(self.stat.replace("/stat", "/status")) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0


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


class CountingParquet(ParquetLoad):
    """The Parquet target, counting the rows it writes."""

    def __init__(self, path: str) -> None:
        super().__init__(path, pipeline="bench")
        self.rows = 0

    def load(self, batch: Batch) -> None:
        super().load(batch)
        self.rows += sum(1 for c in batch.changes if isinstance(c, RowChange))


def run(txs, transform: Transform, settings: PipelineSettings, jvm: JvmClock, sink_kind: str) -> dict[str, float]:
    sink: CountingSink | CountingParquet
    if sink_kind == "parquet":
        sink = CountingParquet(tempfile.mkdtemp(prefix="setl-bench-parquet-"))
    else:
        sink = CountingSink()
    listener = LatencyListener()
    cpu0, jvm0, t0 = time.process_time(), jvm(), time.perf_counter()
    result = run_pipeline(ScriptedSource(txs), sink, transform=transform, settings=settings, name="bench",
                          listener=listener)
    elapsed = time.perf_counter() - t0
    if isinstance(sink, CountingParquet):
        shutil.rmtree(sink.root, ignore_errors=True)
    assert result.outcome is Outcome.CAUGHT_UP, result.outcome
    assert sink.rows == sum(len(tx) for tx in txs), (sink.rows, sum(len(tx) for tx in txs))
    per_10k = 10_000 / sink.rows
    return {
        "rate": sink.rows / elapsed,
        "seconds": elapsed,
        "latency": statistics.median(listener.latencies),
        "py_cpu": (time.process_time() - cpu0) * per_10k,
        "jvm_cpu": (jvm() - jvm0) * per_10k,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--parallelism", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup-batches", type=int, default=40, help="batches through Spark before timing")
    parser.add_argument("--sink", choices=("count", "parquet"), default="count")
    parser.add_argument("--gc-script", action="store_true",
                        help="leave the scripted input in the garbage collector's full collections")
    args = parser.parse_args()

    spark = local_spark()
    jvm = JvmClock()
    registry = Registry().discover()
    rules = [TableRule(source=r"shop\.orders",
                       transforms=(TransformStep("add_column", {"name": "total", "expr": "qty * price"}),))]
    stage = SparkTransform.from_rules(rules, registry, pipeline="bench", session=lambda: spark)
    settings = PipelineSettings(parallelism=args.parallelism,
                                batch=BatchSettings(max_rows=args.rows, max_bytes=1 << 30, max_wait_ms=200))
    txs = make_script(args.batches, args.rows)
    total = sum(len(tx) for tx in txs)
    if not args.gc_script:
        # A real source holds a few transactions, not the whole run: keep the script's 100k's of
        # objects out of the garbage collector's full collections, for both runs alike.
        gc.collect()
        gc.freeze()

    run(make_script(args.warmup_batches, args.rows), stage, settings, jvm, args.sink)  # JIT, codegen, caches
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "spark": []}
    for _ in range(args.repeat):
        runs["baseline"].append(run(txs, Transform(), settings, jvm, args.sink))
        runs["spark"].append(run(txs, stage, settings, jvm, args.sink))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(f"rows: {total} in {args.batches} batches of {args.rows}, parallelism {args.parallelism}, sink {args.sink}, "
          f"spark master {spark.sparkContext.master}, {os.cpu_count()} cpus, medians of {args.repeat} runs")
    print(f"{'':24}{'rows/s':>10}  {'batch latency':>13}  {'py cpu/10k rows':>15}  {'jvm cpu/10k rows':>16}")
    for name, label in (("baseline", "baseline (no transform)"), ("spark", "spark (add_column)")):
        print(f"{label:24}{median(name, 'rate'):>10,.0f}  {median(name, 'latency') * 1000:>10.0f} ms"
              f"  {median(name, 'py_cpu') * 1000:>12.0f} ms  {median(name, 'jvm_cpu') * 1000:>13.0f} ms")
    ratios = [s["rate"] / b["rate"] for b, s in zip(runs["baseline"], runs["spark"])]
    print(f"ratio spark/baseline:   {median('spark', 'rate') / median('baseline', 'rate'):.3f} "
          f"(per pair: {', '.join(f'{r:.3f}' for r in ratios)}; goal >= 0.7)")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: python {peak_mib:.0f} MiB, spark JVM {jvm.rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
