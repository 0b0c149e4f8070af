"""The control API under load: 50 clients polling ``GET /api/v1/pipelines`` (with a token) while a
pipeline catches up on a backlog, against the same catch-up with no client (the issue's goal: the
catch-up rate within 5 %, and the API's p99 latency).

Writes a conf dir with one pipeline, a JSON-lines file source holding `--changes` row changes, into
a SQLite target, with ``http.api`` on. Each round runs ``setl start --until-caught-up`` twice from an
empty target and meta store, once alone (the baseline) and once with `--clients` threads each
polling every `--interval` seconds from the moment the endpoint answers to the exit, and prints the
rate ``--until-caught-up`` reports for each, their ratio, the node's CPU seconds for each (steadier
than rates on a shared machine), and the polls' median, p95 and p99.

    PYTHONPATH=. python tools/bench/bench_api.py [--changes 200000] [--clients 50] [--interval 0.5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-viewer-" + "b" * 24


def write_conf(conf: Path, changes: int, port: int) -> None:
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"node: {{id: bench}}\nmeta: {{store: sqlite, path: meta.db}}\n"
                                    f"http: {{listen: '127.0.0.1:{port}', api: {{tokens_env: BENCH_TOKENS}}}}\n")
    with (conf / "source.jsonl").open("w") as out:
        for n in range(0, changes, 100):  # transactions of 100 inserts
            rows = [{"op": "insert", "schema": "demo", "table": "t", "key": ["id"],
                     "after": {"id": i, "v": "x" * 40}} for i in range(n, min(changes, n + 100))]
            out.write(json.dumps({"changes": rows}) + "\n")
    (conf / "pipelines" / "p.yaml").write_text(
        "source: {type: file, path: source.jsonl}\n"
        "target: {type: sqlite, path: target.db}\n"
        "tables: [{source: 'demo\\..*'}]\n"
        "pipeline: {parallelism: 3, batch: {max_rows: 5000, max_wait_ms: 50}}\n")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def poll(url: str, interval: float, stop: threading.Event, took: list[float], when: list[float],
         errors: list[str]) -> None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    while not stop.is_set():
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
            took.append(time.perf_counter() - began)
            when.append(began)
        except (urllib.error.URLError, OSError) as exc:
            if took:  # refused before the endpoint is up: not a sample
                errors.append(f"{began:.3f} {exc}")
            stop.wait(0.05)
            continue
        stop.wait(max(0.0, interval - (time.perf_counter() - began)))


def run(conf: Path, port: int, clients: int, interval: float) -> tuple[float, float, list[float], list[str]]:
    """One catch-up from scratch; the rate it reports, the node's CPU seconds, and the polls'
    latencies and errors."""
    for name in ("meta.db", "meta.db-wal", "meta.db-shm", "target.db", "target.db-wal", "target.db-shm"):
        (conf / name).unlink(missing_ok=True)
    stop = threading.Event()
    took: list[float] = []
    when: list[float] = []
    errors: list[str] = []
    threads = [threading.Thread(target=poll, args=(f"http://127.0.0.1:{port}/api/v1/pipelines", interval, stop,
                                                   took, when, errors), name=f"client-{n}", daemon=True)
               for n in range(clients)]
    for thread in threads:
        thread.start()
    env = {**os.environ, "BENCH_TOKENS": f"bench viewer {TOKEN}"}
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", "p",
                               "--until-caught-up"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    ended = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    late = [e for e in errors if float(e.split()[0]) < ended - 1.0]  # not the ones as the node exits
    if os.environ.get("BENCH_DEBUG"):
        first = min(when, default=ended)
        buckets: dict[int, list[float]] = {}
        for t, took_s in zip(when, took, strict=True):
            buckets.setdefault(int(t - first), []).append(took_s)
        for second, values in sorted(buckets.items()):
            print(f"  t+{second}s: {len(values)} polls, max {max(values) * 1000:.0f} ms", file=sys.stderr)
        print("\n".join(late[:5]), file=sys.stderr)
    errors[:] = late
    if done.returncode != 0:
        raise SystemExit(f"setl exited {done.returncode}: {done.stderr[-3000:]}")
    found = re.search(r"changes \(([\d,]+)/s\)", done.stdout)
    if found is None:
        raise SystemExit(f"no rate in setl's summary: {done.stdout}")
    return float(found.group(1).replace(",", "")), cpu, took, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between one client's polls")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from setl.testing.servers import free_port

    tmp = Path(tempfile.mkdtemp(prefix="setl-bench-api-"))
    try:
        conf = tmp / "conf"
        port = free_port()
        write_conf(conf, args.changes, port)
        alone, polled, latencies, errors, cpu_alone, cpu_polled = [], [], [], [], [], []
        for round_ in range(args.rounds):
            rate, cpu, _, _ = run(conf, port, 0, args.interval)
            alone.append(rate)
            cpu_alone.append(cpu)
            rate_with, cpu_with, took, failed = run(conf, port, args.clients, args.interval)
            polled.append(rate_with)
            cpu_polled.append(cpu_with)
            latencies += took
            errors += failed
            print(f"round {round_ + 1}: alone {rate:,.0f} rows/s, {cpu:.1f} CPU s; with {args.clients} clients "
                  f"{rate_with:,.0f} rows/s, {cpu_with:.1f} CPU s ({len(took)} polls)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base, loaded = statistics.median(alone), statistics.median(polled)
    print(f"{args.changes:,} changes, file source -> SQLite; {args.clients} clients polling /api/v1/pipelines every "
          f"{args.interval:g}s")
    print(f"catch-up: alone {base:,.0f} rows/s (baseline), with clients {loaded:,.0f} rows/s: ratio "
          f"{loaded / base:.3f} (goal >= 0.95: {'met' if loaded / base >= 0.95 else 'NOT met'})")
    print(f"the node's CPU time (user + system): alone {statistics.median(cpu_alone):.1f} s, with clients "
          f"{statistics.median(cpu_polled):.1f} s (the clients' requests cost the difference)")
    if latencies:
        print(f"poll latency: median {statistics.median(latencies) * 1000:.1f} ms, p95 "
              f"{percentile(latencies, 95) * 1000:.1f} ms, p99 {percentile(latencies, 99) * 1000:.1f} ms over "
              f"{len(latencies)} polls; {len(errors)} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
