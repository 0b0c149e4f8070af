"""The node's HTTP endpoint with many pipelines: how fast /api/status (and /metrics, /api/history)
answer while a node runs `--pipelines` pipelines (the issue's goal: /api/status under 50 ms with 100).

Writes a conf dir with N pipelines, each a JSON-lines file source followed live into its own SQLite
target, runs ``setl start --all`` with ``http.listen`` on, feeds every source `--rate` transactions a
second, and once every pipeline runs times `--requests` GETs of each path, spaced 50 ms apart (the
page asks once a second). Prints the median, p95 and p99 in ms, and, as the baseline measured in the
same run, the wall time of ``setl status --json`` (what an operator would run instead).

    PYTHONPATH=. python tools/bench/bench_status_api.py [--pipelines 100] [--requests 200] [--rate 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write_conf(conf: Path, pipelines: int, port: int) -> list[Path]:
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"node: {{id: bench}}\nmeta: {{store: sqlite, path: meta.db}}\n"
                                    f"http: {{listen: '127.0.0.1:{port}'}}\n")
    files = []
    for n in range(pipelines):
        source = conf / f"source{n}.jsonl"
        source.write_text("")
        files.append(source)
        (conf / "pipelines" / f"p{n:03d}.yaml").write_text(
            f"source: {{type: file, path: source{n}.jsonl, follow: true}}\n"
            f"target: {{type: sqlite, path: target{n}.db}}\n"
            "tables: [{source: 'demo\\..*'}]\n"
            "pipeline: {parallelism: 2, batch: {max_rows: 500, max_wait_ms: 50}}\n")
    return files


def feed(files: list[Path], rate: float, stop: threading.Event) -> None:
    n = 0
    while not stop.wait(1.0 / rate):
        n += 1
        for source in files:
            line = {"changes": [{"op": "insert", "schema": "demo", "table": "t", "key": ["id"],
                                 "after": {"id": n, "v": "x" * 20}}]}
            with source.open("a") as out:
                out.write(json.dumps(line) + "\n")


def get(url: str) -> tuple[float, bytes]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return time.perf_counter() - began, body


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rate", type=float, default=2.0, help="transactions per second fed to every source")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from setl.testing.servers import free_port

    with tempfile.TemporaryDirectory(prefix="setl-bench-api-") as tmp:
        conf = Path(tmp) / "conf"
        port = free_port()
        files = write_conf(conf, args.pipelines, port)
        base = f"http://127.0.0.1:{port}"
        log = open(Path(tmp) / "setl.log", "w")
        node = subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(conf), "start", "--all"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()
        feeder = threading.Thread(target=feed, args=(files, args.rate, stop), name="bench-feed", daemon=True)
        try:
            deadline = time.monotonic() + 180
            while True:
                if node.poll() is not None:
                    raise SystemExit(f"setl exited {node.returncode}: {(Path(tmp) / 'setl.log').read_text()[-3000:]}")
                try:
                    status = json.loads(get(base + "/api/status")[1])
                    if sum(1 for row in status["pipelines"] if row["running_here"]) == args.pipelines:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the pipelines did not all start within 180 s")
                time.sleep(0.5)
            feeder.start()
            time.sleep(5)  # some history and acks
            results: dict[str, list[float]] = {}
            sizes: dict[str, int] = {}
            for _ in range(args.requests):
                for path in ("/api/status", "/metrics", "/api/history?since=0&step=1", "/healthz"):
                    took, body = get(base + path)
                    results.setdefault(path, []).append(took)
                    sizes[path] = len(body)
                time.sleep(0.05)
            cli = []
            for _ in range(5):
                began = time.perf_counter()
                subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "status", "--json"],
                               cwd=ROOT, capture_output=True, check=True)
                cli.append(time.perf_counter() - began)
            acked = sum(row["figures"]["acked_rows"] for row in json.loads(get(base + "/api/status")[1])["pipelines"])
        finally:
            stop.set()
            node.terminate()
            node.wait(60)
            log.close()
    print(f"{args.pipelines} pipelines in one node, {args.rate:g} tx/s fed to each; {acked} rows acked meanwhile")
    print(f"{'path':<32} {'median ms':>10} {'p95 ms':>8} {'p99 ms':>8} {'bytes':>9}")
    for path, values in results.items():
        print(f"{path:<32} {statistics.median(values) * 1000:>10.1f} {percentile(values, 95) * 1000:>8.1f} "
              f"{percentile(values, 99) * 1000:>8.1f} {sizes[path]:>9}")
    api = statistics.median(results["/api/status"])
    print(f"baseline `setl status --json` (a process): median {statistics.median(cli) * 1000:.0f} ms; "
          f"/api/status is {statistics.median(cli) / api:.0f}x faster; goal /api/status < 50 ms: "
          f"{'met' if api < 0.05 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
