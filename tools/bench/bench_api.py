"""The control API under load: 50 clients polling ``GET /api/v1/pipelines`` (with a token) while a
pipeline catches up on a backlog, against the same catch-up with no client (the issue's goal: the
catch-up rate within 5 %, and the API's p99 latency).

Writes a conf dir with one pipeline, a JSON-lines file source holding `--changes` row changes, into
a SQLite target, with ``http.api`` on. Each round runs ``setl start --until-caught-up`` three times
on the same backlog, each from an empty target and meta store, and checks that the target holds
every source row once:

- ``alone``: no client;
- ``busy``: `--clients` threads polling a decoy HTTP server in the bench's own process, as often
  and for as many bytes as the real clients: the machine is as busy, the node serves nothing;
- ``polled``: the same threads polling the node's ``GET /api/v1/pipelines`` with a token, from
  the moment the endpoint answers to the exit.

The arms' order rotates from round to round, so a machine getting busier or quieter does not
favour one. Per round it prints each run's rate (as ``--until-caught-up`` reports it), CPU seconds
and peak RSS (from ``wait4``, per run), and the ratios polled/alone and polled/busy; at the end the
median of each ratio over the rounds (the goal: at least 0.95), the node's CPU per poll, and the
polls' median, p95 and p99 latency. On a 2-core machine a busy neighbour makes the node *faster*
(its threads hand batches to each other, and a busy machine wakes them sooner), which is why the
``busy`` arm is there: polled/busy is the effect of serving the polls alone.

    PYTHONPATH=. python tools/bench/bench_api.py [--changes 200000] [--clients 50] [--interval 0.5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


def source_ids(conf: Path) -> Iterator[int]:
    with (conf / "source.jsonl").open() as lines:
        for line in lines:
            yield from (change["after"]["id"] for change in json.loads(line)["changes"])


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


def run(conf: Path, url: str, clients: int, interval: float) -> tuple[float, float, float, list[float], list[str]]:
    """One catch-up from scratch, `clients` threads polling `url` meanwhile; the rate it reports,
    the node's CPU seconds and peak RSS (MiB), and the polls' latencies and errors."""
    for name in ("meta.db", "meta.db-wal", "meta.db-shm", "target.db", "target.db-wal", "target.db-shm"):
        (conf / name).unlink(missing_ok=True)
    stop = threading.Event()
    took: list[float] = []
    when: list[float] = []
    errors: list[str] = []
    threads = [threading.Thread(target=poll, args=(url, interval, stop, took, when, errors), name=f"client-{n}",
                                daemon=True)
               for n in range(clients)]
    for thread in threads:
        thread.start()
    env = {**os.environ, "BENCH_TOKENS": f"bench viewer {TOKEN}"}
    out, err = conf / "stdout.txt", conf / "stderr.txt"
    try:
        with out.open("w") as stdout, err.open("w") as stderr:
            node = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", "p",
                                     "--until-caught-up"], cwd=ROOT, env=env, stdout=stdout, stderr=stderr)
            # wait4: this run's own CPU time and peak RSS (RUSAGE_CHILDREN would mix every run's)
            _, code, usage = os.wait4(node.pid, 0)
            node.returncode = os.waitstatus_to_exitcode(code)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    ended = time.perf_counter()
    cpu = usage.ru_utime + usage.ru_stime
    peak = usage.ru_maxrss / 1024  # KiB on Linux
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
    if node.returncode != 0:
        raise SystemExit(f"setl exited {node.returncode}: {err.read_text()[-3000:]}")
    with sqlite3.connect(conf / "target.db") as db:  # a fast run that lost rows is no figure
        rows, distinct = db.execute('SELECT COUNT(*), COUNT(DISTINCT id) FROM "demo.t"').fetchone()
    if rows != distinct or rows != sum(1 for _ in source_ids(conf)):
        raise SystemExit(f"the target has {rows} rows ({distinct} distinct ids), not the source's")
    found = re.search(r"changes \(([\d,]+)/s\)", out.read_text())
    if found is None:
        raise SystemExit(f"no rate in setl's summary: {out.read_text()}")
    return float(found.group(1).replace(",", "")), cpu, peak, took, errors


class Decoy:
    """An HTTP server in the bench's process that answers every GET with `size` bytes: the
    ``busy`` arm's clients poll it, so the machine is as busy as with clients polling the node
    but the node serves nothing."""

    def __init__(self, size: int) -> None:
        body = b"x" * size

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="decoy", daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


ARMS = ("alone", "busy", "polled")


def cpu_seconds(pid: int) -> float:
    """A running process's CPU time so far (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cost(conf: Path, port: int, changes: int, clients: int, interval: float, seconds: float,
              rounds: int) -> None:
    """The CPU the node spends per poll, free of the catch-up's noise: the node runs the pipeline,
    caught up and following its file, while windows of `seconds` with no client and with `clients`
    polling alternate; the difference of its CPU time over the polls served."""
    for name in ("meta.db", "meta.db-wal", "meta.db-shm", "target.db", "target.db-wal", "target.db-shm"):
        (conf / name).unlink(missing_ok=True)
    env = {**os.environ, "BENCH_TOKENS": f"bench viewer {TOKEN}"}
    with (conf / "idle.txt").open("w") as log:
        node = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--pipeline", "p"],
                                cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(1.0)
            try:
                with sqlite3.connect(conf / "target.db") as db:
                    if db.execute('SELECT COUNT(*) FROM "demo.t"').fetchone()[0] == changes:
                        break
            except sqlite3.Error:
                continue
        else:
            raise SystemExit("the node did not catch up in 600 s")
        time.sleep(2.0)
        url = f"http://127.0.0.1:{port}/api/v1/pipelines"
        alone: list[float] = []
        per_poll: list[float] = []
        latencies: list[float] = []
        for round_ in range(rounds):
            window: dict[bool, tuple[float, int]] = {}
            for polled in ((False, True) if round_ % 2 == 0 else (True, False)):
                stop = threading.Event()
                took: list[float] = []
                threads = [threading.Thread(target=poll, args=(url, interval, stop, took, [], []), daemon=True)
                           for _ in range(clients if polled else 0)]
                before = cpu_seconds(node.pid)
                for thread in threads:
                    thread.start()
                time.sleep(seconds)
                stop.set()
                for thread in threads:
                    thread.join(10)
                window[polled] = (cpu_seconds(node.pid) - before, len(took))
                latencies += took
            (cpu_alone, _), (cpu_polled, polls) = window[False], window[True]
            alone.append(cpu_alone / seconds)
            per_poll.append((cpu_polled - cpu_alone) / polls if polls else 0.0)
            print(f"idle round {round_ + 1}: alone {cpu_alone / seconds * 1000:.0f} ms CPU/s; polled "
                  f"{cpu_polled / seconds * 1000:.0f} ms CPU/s, {polls} polls ({polls / seconds:.0f}/s): "
                  f"{per_poll[-1] * 1000:.2f} ms per poll", flush=True)
    finally:
        node.terminate()
        node.wait(60)
    cost = statistics.median(per_poll)
    rate = clients / interval
    print(f"idle node: {statistics.median(alone) * 1000:.0f} ms CPU/s alone; {cost * 1000:.2f} ms of CPU per poll "
          f"(median of {rounds} rounds): {rate:.0f} polls/s take {cost * rate * 100:.1f}% of one core; poll p99 "
          f"{percentile(latencies, 99) * 1000 if latencies else 0:.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between one client's polls")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three runs (alone, busy, polled)")
    parser.add_argument("--idle-seconds", type=float, default=10.0,
                        help="each window of the idle node's cost per poll (0: not measured)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from setl.testing.servers import free_port

    tmp = Path(tempfile.mkdtemp(prefix="setl-bench-api-"))
    decoy = Decoy(1024)  # the status document of one pipeline is about 860 bytes
    results: dict[str, list[tuple[float, float, float, list[float], list[str]]]] = {arm: [] for arm in ARMS}
    try:
        conf = tmp / "conf"
        port = free_port()
        write_conf(conf, args.changes, port)
        if args.idle_seconds > 0:
            idle_cost(conf, port, args.changes, args.clients, args.interval, args.idle_seconds, args.rounds)
        urls = {"alone": "", "busy": decoy.url, "polled": f"http://127.0.0.1:{port}/api/v1/pipelines"}
        for round_ in range(args.rounds):
            order = ARMS[round_ % 3:] + ARMS[:round_ % 3]  # each arm first, second and third in turn
            found = {arm: run(conf, urls[arm], 0 if arm == "alone" else args.clients, args.interval) for arm in order}
            for arm in ARMS:
                results[arm].append(found[arm])
            line = "; ".join(f"{arm} {found[arm][0]:,.0f} rows/s, {found[arm][1]:.1f} CPU s, {found[arm][2]:.0f} MiB"
                             for arm in ARMS)
            polled = found["polled"]
            print(f"round {round_ + 1} ({' -> '.join(order)}): {line}; polls {len(polled[3])}, p99 "
                  f"{percentile(polled[3], 99) * 1000 if polled[3] else 0:.0f} ms; ratio polled/alone "
                  f"{polled[0] / found['alone'][0]:.3f}, polled/busy {polled[0] / found['busy'][0]:.3f}", flush=True)
    finally:
        decoy.close()
        shutil.rmtree(tmp, ignore_errors=True)
    rates = {arm: [r[0] for r in results[arm]] for arm in ARMS}
    cpus = {arm: [r[1] for r in results[arm]] for arm in ARMS}
    latencies = [t for r in results["polled"] for t in r[3]]
    errors = [e for r in results["polled"] for e in r[4]]
    print(f"{args.changes:,} changes, file source -> SQLite; {args.clients} clients polling /api/v1/pipelines every "
          f"{args.interval:g}s; {args.rounds} rounds")
    print("catch-up, median rows/s: " + ", ".join(f"{arm} {statistics.median(rates[arm]):,.0f}" for arm in ARMS))
    for base in ("alone", "busy"):
        ratios = [p / b for p, b in zip(rates["polled"], rates[base], strict=True)]
        ratio = statistics.median(ratios)
        print(f"ratio polled/{base} per round {', '.join(f'{r:.3f}' for r in ratios)}: median {ratio:.3f} "
              f"(goal >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")
    polls = [len(r[3]) for r in results["polled"]]
    extra = [(p - a) / n * 1000 for p, a, n in zip(cpus["polled"], cpus["alone"], polls, strict=True) if n]
    cpu_a, cpu_p = statistics.median(cpus["alone"]), statistics.median(cpus["polled"])
    cpu_b = statistics.median(cpus["busy"])
    print(f"the node's CPU time (user + system), median: alone {cpu_a:.2f} s, busy {cpu_b:.2f} s, "
          f"polled {cpu_p:.2f} s ({(cpu_p / cpu_a - 1) * 100:+.1f}% over alone); per poll, median over rounds "
          f"{statistics.median(extra):.2f} ms")
    print("the node's peak RSS, max: " + ", ".join(f"{arm} {max(r[2] for r in results[arm]):.0f} MiB" for arm in ARMS))
    if latencies:
        print(f"poll latency: median {statistics.median(latencies) * 1000:.1f} ms, p95 "
              f"{percentile(latencies, 95) * 1000:.1f} ms, p99 {percentile(latencies, 99) * 1000:.1f} ms over "
              f"{len(latencies)} polls; {len(errors)} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
