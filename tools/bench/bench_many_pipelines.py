"""Many pipelines in one node: shared task threads against a thread-per-task layout.

Runs `--pipelines` pipelines on the in-memory harness (a scripted source per pipeline, a
MemorySink, one SQLite meta store for the node) in one process, in two layouts:

* shared: every scheduler runs on one node-wide TaskExecutionService (and one
  SerialExecutorService for per_table loads) under the node's cap on batches in flight
  (`runtime.max_batches_in_flight`, by default 4x workers; 0 for none), as
  `setl start --all` does;
* baseline: every scheduler makes private services sized so that each of its activities
  (Select, Load, Termin, the drain and `parallelism` Extract/Transform tasks) has a thread
  of its own: the thread-per-task layout.

and two workloads:

* backlog: every source holds `--transactions` transactions at start; rows/s until all are acked;
* steady: a feeder appends `--rate` transactions per second to every source for `--seconds`;
  batch latency from Select's hand-off to the ack (p50/p99), at the same offered load.

Each (layout, workload) runs in its own subprocess (so peak RSS is its own), `--repeat` times;
medians are printed, with the peak thread count (the bench's own sampler and feeder not counted),
and the issue's goal checked: at most 16 threads, p99 no worse than 2x the baseline's (both
workloads), backlog rows/s not lower.

    PYTHONPATH=. python tools/bench/bench_many_pipelines.py [--pipelines 100] [--transactions 60]
        [--rows 10] [--rate 5] [--seconds 5] [--parallelism 3] [--mode ordered|per_table]
        [--workers 4] [--max-batches-in-flight N] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from setl.config import BatchSettings, LoadSettings, PipelineSettings, RetrySettings, RuntimeConfig
from setl.meta import SqliteMetaStore
from setl.model import Ack, Batch
from setl.runtime import SerialExecutorService, TaskExecutionService
from setl.scheduler import BatchCap, Listener, Outcome, Scheduler
from setl.stages import Extract, Transform
from setl.testing.harness import MemorySink, ScriptedSource, insert


class Latency(Listener):
    """Select hand-off to ack, per batch."""

    def __init__(self) -> None:
        self.handed: dict[tuple[int, int], float] = {}
        self.latencies: list[float] = []

    def on_handoff(self, batch: Batch, in_flight: int) -> None:
        self.handed[(batch.id, batch.epoch)] = time.perf_counter()

    def on_ack(self, ack: Ack, batch: Batch) -> None:
        self.latencies.append(time.perf_counter() - self.handed.pop((batch.id, batch.epoch)))


class ThreadSampler:
    """Samples the process's thread count until stopped; `own` bench threads are not counted."""

    def __init__(self, own: int = 1, interval: float = 0.005) -> None:
        self.own = own
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> "ThreadSampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, threading.active_count() - self.own)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def transaction(pipeline: int, n: int, rows: int) -> list:
    return [insert(f"t{(n + k) % 3}", {"id": n * rows + k, "v": pipeline}) for k in range(rows)]


def run_layout(args: argparse.Namespace, shared: bool, workload: str, folder: Path) -> dict:
    settings = PipelineSettings(
        parallelism=args.parallelism,
        batch=BatchSettings(max_rows=args.batch_rows, max_wait_ms=args.max_wait_ms),
        load=LoadSettings(mode=args.mode),
        retry=RetrySettings(max_attempts=3, initial_backoff_ms=10, max_backoff_ms=50),
    )
    meta = SqliteMetaStore(folder / "meta.db")
    tasks = serial = cap = None
    if shared:
        limit = runtime_config(args).batch_cap
        cap = BatchCap(limit) if limit else None
        tasks = TaskExecutionService(args.workers, args.max_workers, idle_backoff=args.idle_ms / 1000.0,
                                     name="node-task")
        serial = SerialExecutorService(16, args.workers, name="node-load")
    steady = workload == "steady"
    initial = 0 if steady else args.transactions
    sources = [ScriptedSource([transaction(i, n, args.rows) for n in range(initial)], name=f"p{i}")
               for i in range(args.pipelines)]
    listeners = [Latency() for _ in range(args.pipelines)]
    schedulers = [
        Scheduler(f"p{i}", settings, sources[i], Extract(), Transform(), MemorySink(),
                  meta, listener=listeners[i], tasks=tasks, serial=serial, batch_cap=cap)
        for i in range(args.pipelines)
    ]
    with ThreadSampler(own=2 if steady else 1) as sampler:
        started = time.perf_counter()
        for scheduler in schedulers:
            scheduler.start(until_caught_up=not steady)
        if steady:
            fed = feed(sources, args)
            deadline = time.monotonic() + 120
            while any(s.acked_rows < fed * args.rows for s in schedulers) and time.monotonic() < deadline:
                time.sleep(0.01)
            for scheduler in schedulers:
                scheduler.stop()
        outcomes = [scheduler.wait() for scheduler in schedulers]
        elapsed = time.perf_counter() - started
    if tasks is not None:
        tasks.shutdown()
    if serial is not None:
        serial.shutdown()
    meta.close()
    expected = Outcome.STOPPED if steady else Outcome.CAUGHT_UP
    assert all(o is expected for o in outcomes), outcomes
    rows = sum(s.acked_rows for s in schedulers)
    per_pipeline = (fed if steady else args.transactions) * args.rows
    assert rows == args.pipelines * per_pipeline, rows
    latencies = sorted(x for listener in listeners for x in listener.latencies)
    return {
        "threads": sampler.peak,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "rows_per_s": rows / elapsed,
        "batches": len(latencies),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    """The shared layout's `runtime:` section, as setl.yaml would give it."""
    if args.max_batches_in_flight is None:
        return RuntimeConfig(workers=args.workers, max_workers=args.max_workers)
    return RuntimeConfig(workers=args.workers, max_workers=args.max_workers,
                         max_batches_in_flight=args.max_batches_in_flight)


def feed(sources: list[ScriptedSource], args: argparse.Namespace) -> int:
    """Append one transaction to every source `args.rate` times a second for `args.seconds`; returns how many."""
    result: list[int] = []

    def run() -> None:
        start = time.monotonic()
        n = 0
        while n < args.rate * args.seconds:
            for i, source in enumerate(sources):
                source.append(transaction(i, n, args.rows))
            n += 1
            time.sleep(max(0.0, start + n / args.rate - time.monotonic()))
        result.append(n)

    feeder = threading.Thread(target=run, name="bench-feeder")
    feeder.start()
    feeder.join()
    return result[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--transactions", type=int, default=60, help="backlog per pipeline")
    parser.add_argument("--rows", type=int, default=10, help="per transaction")
    parser.add_argument("--rate", type=int, default=5, help="steady: transactions/s per pipeline")
    parser.add_argument("--seconds", type=int, default=5, help="steady: how long to feed")
    parser.add_argument("--batch-rows", type=int, default=50)
    parser.add_argument("--max-wait-ms", type=int, default=20)
    parser.add_argument("--parallelism", type=int, default=3)
    parser.add_argument("--mode", choices=["ordered", "per_table"], default="ordered")
    parser.add_argument("--workers", type=int, default=4, help="shared task workers (and per_table load workers)")
    parser.add_argument("--max-workers", type=int, default=12)
    parser.add_argument("--max-batches-in-flight", type=int,
                        help="shared: the node's cap (default 4x workers, as in setl.yaml; 0: none)")
    parser.add_argument("--idle-ms", type=int, default=10, help="shared service's idle back-off")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layout", choices=["shared", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=["backlog", "steady"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.layout:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_layout(args, args.layout == "shared", args.workload, Path(tmp))))
        return

    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeat):
        for workload in ("backlog", "steady"):
            for layout in ("shared", "baseline"):
                out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--layout", layout,
                                      "--workload", workload], capture_output=True, text=True, check=True)
                runs.setdefault((layout, workload), []).append(json.loads(out.stdout.strip().splitlines()[-1]))

    def med(layout: str, workload: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[(layout, workload)])

    print(f"{args.pipelines} pipelines, parallelism {args.parallelism}, load mode {args.mode}, batches of "
          f"<= {args.batch_rows} rows or {args.max_wait_ms} ms, {args.rows} rows per transaction; "
          f"medians of {args.repeat} runs")
    print(f"backlog {args.transactions} transactions per pipeline; steady {args.rate} transactions/s per pipeline "
          f"for {args.seconds} s ({args.pipelines * args.rate * args.rows:,} rows/s offered)")
    cap = runtime_config(args).batch_cap
    labels = {"shared": f"shared {args.workers}..{args.max_workers} workers, cap {cap or 'none'}",
              "baseline": "thread per task"}
    for layout, label in labels.items():
        print(f"{label:32s}: backlog {med(layout, 'backlog', 'rows_per_s'):8,.0f} rows/s, "
              f"{med(layout, 'backlog', 'threads'):4.0f} threads, p50 {med(layout, 'backlog', 'p50_ms'):6.1f} ms "
              f"p99 {med(layout, 'backlog', 'p99_ms'):6.1f} ms | "
              f"steady p50 {med(layout, 'steady', 'p50_ms'):5.1f} ms p99 {med(layout, 'steady', 'p99_ms'):6.1f} ms, "
              f"{med(layout, 'steady', 'threads'):4.0f} threads | peak RSS "
              f"{max(med(layout, w, 'peak_rss_mib') for w in ('backlog', 'steady')):.0f} MiB")

    def ratio(workload: str, key: str) -> float:
        return med("shared", workload, key) / med("baseline", workload, key)

    print(f"shared/baseline: threads {ratio('steady', 'threads'):.3f}, backlog p99 {ratio('backlog', 'p99_ms'):.2f}, "
          f"steady p99 {ratio('steady', 'p99_ms'):.2f}, steady p50 {ratio('steady', 'p50_ms'):.2f}, "
          f"backlog rows/s {ratio('backlog', 'rows_per_s'):.2f}")
    threads = max(med("shared", w, "threads") for w in ("backlog", "steady"))
    checks = {
        f"<= 16 threads ({threads:.0f})": threads <= 16,
        f"backlog p99 <= 2x ({ratio('backlog', 'p99_ms'):.2f}x)": ratio("backlog", "p99_ms") <= 2,
        f"steady p99 <= 2x ({ratio('steady', 'p99_ms'):.2f}x)": ratio("steady", "p99_ms") <= 2,
        f"backlog rows/s >= 1x ({ratio('backlog', 'rows_per_s'):.2f}x)": ratio("backlog", "rows_per_s") >= 1,
    }
    print("goal: " + "; ".join(f"{name} {'met' if ok else 'NOT MET'}" for name, ok in checks.items()))


if __name__ == "__main__":
    main()
