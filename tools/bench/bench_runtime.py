"""Benchmarks for setl.runtime, each against a baseline measured in the same run.

Run: python tools/bench/bench_runtime.py
"""

from __future__ import annotations

import argparse
import concurrent.futures
import threading
import time

from setl.runtime import Progress, SerialExecutorService, TaskExecutionService


def bench_serial(tasks: int, slots: int, workers: int) -> None:
    """Slot-ordered throughput against an unordered ThreadPoolExecutor of the same size."""
    sink = [0] * slots

    def work(slot: int) -> None:
        sink[slot] += 1

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for i in range(tasks):
            pool.submit(work, i % slots)
    baseline = time.perf_counter() - start

    start = time.perf_counter()
    ex = SerialExecutorService(slots, workers, name="bench-serial")
    for i in range(tasks):
        ex.submit(work, i % slots, slot=i % slots)
    ex.shutdown(wait=True)
    serial = time.perf_counter() - start
    print(
        f"serial executor: {tasks} tasks, {slots} slots, {workers} workers: "
        f"{tasks / serial:,.0f} tasks/s; ThreadPoolExecutor (no ordering) {tasks / baseline:,.0f} tasks/s; "
        f"ratio {baseline / serial:.2f}"
    )


class Steps:
    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0
        self.last = time.monotonic()  # so the wait for the first call counts as a gap too
        self.max_gap = 0.0

    def call(self) -> Progress:
        now = time.monotonic()
        self.max_gap = max(self.max_gap, now - self.last)
        self.last = now
        self.calls += 1
        sum(range(200))  # a little work per call
        return Progress.DONE if self.calls >= self.n else Progress.PROGRESS


def bench_sharing(tasks: int, calls: int) -> None:
    """Many small tasks on 2 shared threads against one thread per task."""
    start = time.perf_counter()
    svc = TaskExecutionService(2, 8, name="bench-share")
    handles = [svc.submit(Steps(calls)) for _ in range(tasks)]
    for handle in handles:
        handle.wait()
    peak = svc.thread_count
    svc.shutdown()
    shared = time.perf_counter() - start

    def drive(task: Steps) -> None:
        while task.call() is not Progress.DONE:
            pass

    start = time.perf_counter()
    threads = [threading.Thread(target=drive, args=(Steps(calls),), name=f"bench-own-{i}") for i in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    own = time.perf_counter() - start
    print(
        f"thread sharing: {tasks} tasks x {calls} calls: {peak} threads in {shared:.2f}s; "
        f"one thread per task: {tasks} threads in {own:.2f}s; ratio {own / shared:.2f}"
    )


class Slow:
    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds, self.calls = n, seconds, 0

    def call(self) -> Progress:
        self.calls += 1
        time.sleep(self.seconds)
        return Progress.DONE if self.calls >= self.n else Progress.PROGRESS


def bench_latency(fast: int, slow_seconds: float) -> None:
    """Worst wait of a quick task for its next call next to a slow one: dynamic pool against a fixed one."""
    results = {}
    for label, max_workers in (("fixed", 1), ("dynamic", 4)):
        svc = TaskExecutionService(1, max_workers, overrun_threshold=0.1, max_overruns=1000, name=f"bench-{label}")
        svc.submit(Slow(3, slow_seconds))
        quick = [Steps(2000) for _ in range(fast)]
        for handle in [svc.submit(t) for t in quick]:
            handle.wait()
        svc.shutdown()
        results[label] = max(t.max_gap for t in quick)
    print(
        f"latency next to {slow_seconds:.1f}s calls: worst wait dynamic {results['dynamic'] * 1000:.1f} ms, "
        f"fixed pool {results['fixed'] * 1000:.1f} ms; ratio {results['fixed'] / results['dynamic']:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=20000)
    args = parser.parse_args()
    bench_serial(args.tasks, slots=8, workers=4)
    bench_sharing(tasks=200, calls=200)
    bench_latency(fast=20, slow_seconds=0.5)


if __name__ == "__main__":
    main()
