"""The cost of batch DDL tasks: the same binlog backlog replicated with and without them.

Starts a MariaDB source and target (setl.testing.servers) and writes one backlog: `--rows` rows
of a fact table in transactions of `--tx-rows`, split into `--tasks` batch DDL tasks (one signal
row each; `--op delete_where` deletes the task's own day before its rows, a full scan of the
target table since `day` has no index of its own; `--op none` leaves only the bookkeeping).
Then, `--repeat` times each and alternating, a child process replicates the whole backlog into
an emptied target with the scheduler (ordered loads, default batch settings):

* **baseline**: no `pipeline.ddl_tasks` (the signal table is excluded by a table rule);
* **tasks**: `pipeline.ddl_tasks.signal_table` set.

Prints, for each, the median rows/s (from the scheduler's start to its last ack), the median of
the per-batch load latency p50, the child's peak RSS, and the ratio tasks/baseline.

    python3 tools/bench/bench_ddltask.py [--rows 60000] [--tx-rows 200] [--tasks 30] [--repeat 3]
        [--op delete_where|none]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymysql
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from setl.config import load_node, load_pipeline  # noqa: E402
from setl.connectors import registry  # noqa: E402
from setl.meta.sqlite import SqliteMetaStore  # noqa: E402
from setl.pipeline import build_stages  # noqa: E402
from setl.scheduler import Outcome, Scheduler  # noqa: E402
from setl.testing.servers import MariaDBServer  # noqa: E402

COLUMNS = "id INT NOT NULL, day INT NOT NULL, v INT, note VARCHAR(64), PRIMARY KEY (id, day)"
SIGNAL = ("CREATE TABLE setl_signal (task_id VARCHAR(191) PRIMARY KEY, op_type VARCHAR(32) NOT NULL,"
          " op_db VARCHAR(64) NOT NULL, op_table VARCHAR(64) NOT NULL,"
          " op_partition VARCHAR(255) NOT NULL DEFAULT '', overwrite BOOLEAN NOT NULL DEFAULT FALSE)")


def write_backlog(source: MariaDBServer, rows: int, tx_rows: int, tasks: int, op: str) -> dict:
    """Create the source tables and the backlog; return where it starts and ends."""
    source.query("CREATE DATABASE bsrc")
    source.query(f"CREATE TABLE bsrc.fact ({COLUMNS})")
    source.query(f"CREATE TABLE bsrc.{SIGNAL.removeprefix('CREATE TABLE ')}")
    start = source.query("SHOW MASTER STATUS")[0][:2]
    per_task = max(1, rows // tasks)
    args = source.connect_args(database="bsrc", autocommit=False)
    with contextlib.closing(pymysql.connect(**args)) as conn, conn.cursor() as cur:
        written = 0
        while written < rows:
            task = written // per_task
            if written % per_task == 0:
                cur.execute("INSERT INTO setl_signal VALUES (%s, %s, 'bsrc', 'fact', %s, 0)",
                            (f"t{task}", op, f"day={task}"))
            count = min(tx_rows, rows - written, per_task - written % per_task)
            cur.executemany("INSERT INTO fact VALUES (%s, %s, %s, %s)",
                            [(written + i, task, i, "x" * 40) for i in range(count)])
            conn.commit()
            written += count
    return {"file": start[0], "pos": int(start[1])}


def write_conf(root: Path, source: MariaDBServer, target: MariaDBServer, start: dict, tasks: bool) -> Path:
    conf = root / ("conf-tasks" if tasks else "conf-baseline")
    (conf / "pipelines").mkdir(parents=True)
    node = {"meta": {"store": "sqlite", "path": str(conf / "meta.db")}}
    (conf / "setl.yaml").write_text(yaml.safe_dump(node))
    pipeline: dict = {"parallelism": 3}
    if tasks:
        pipeline["ddl_tasks"] = {"signal_table": "bsrc.setl_signal"}
    (conf / "pipelines" / "bench.yaml").write_text(yaml.safe_dump({
        "source": {"type": "mysql", "host": source.host, "port": source.port, "user": "root",
                   "server_id": 9001, "flavor": "mariadb", "start": start},
        "target": {"type": "mysql", "host": target.host, "port": target.port, "user": "root"},
        "tables": [{"source": r"bsrc\.setl_signal", "exclude": True},
                   {"source": r"bsrc\..*", "target": "bdst.{table}"}],
        "pipeline": pipeline}))
    return conf


def run_once(conf: Path) -> dict:
    """In a child process: replicate the backlog once; rows/s, load latency p50, peak RSS."""
    node, config = load_node(conf), load_pipeline(conf, "bench", registry())
    meta = SqliteMetaStore(conf / "meta.db")
    stages = build_stages(node, config, meta)
    latencies: list[float] = []
    load = stages.load
    inner_load = load.load

    def timed(batch) -> None:
        began = time.perf_counter()
        inner_load(batch)
        latencies.append(time.perf_counter() - began)

    load.load = timed  # type: ignore[method-assign]
    scheduler = Scheduler("bench", config.pipeline, stages.select, stages.extract, stages.transform,
                          load, meta, node_id="bench")
    load.open()
    began = time.perf_counter()
    try:
        outcome = scheduler.run(until_caught_up=True)
    finally:
        load.close()
    elapsed = time.perf_counter() - began
    assert outcome is Outcome.CAUGHT_UP, scheduler.error
    return {"rows_per_s": scheduler.acked_rows / elapsed, "rows": scheduler.acked_rows,
            "load_p50_ms": 1000 * statistics.median(latencies),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--tx-rows", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--op", choices=["delete_where", "none"], default="delete_where")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_once(args.child)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-ddltask-") as tmp:
        root = Path(tmp)
        source, target = MariaDBServer(root / "src", server_id=1), MariaDBServer(root / "dst", server_id=2)
        try:
            source.start()
            target.start()
            start = write_backlog(source, args.rows, args.tx_rows, args.tasks, args.op)
            confs = {mode: write_conf(root, source, target, start, mode == "tasks")
                     for mode in ("baseline", "tasks")}
            results: dict[str, list[dict]] = {"baseline": [], "tasks": []}
            for _ in range(args.repeat):
                for mode, conf in confs.items():
                    target.query("DROP DATABASE IF EXISTS bdst")
                    target.query("DROP DATABASE IF EXISTS setl")
                    target.query("CREATE DATABASE bdst")
                    target.query(f"CREATE TABLE bdst.fact ({COLUMNS})")
                    (conf / "meta.db").unlink(missing_ok=True)
                    out = subprocess.run([sys.executable, __file__, "--child", str(conf)], check=True,
                                         capture_output=True, text=True).stdout
                    result = json.loads(out.strip().splitlines()[-1])
                    count = target.query("SELECT count(*) FROM bdst.fact")[0][0]
                    assert count == args.rows, f"{mode}: target holds {count} rows, expected {args.rows}"
                    results[mode].append(result)
        finally:
            source.cleanup()
            target.cleanup()
    print(f"{args.rows} rows in transactions of {args.tx_rows}, {args.tasks} tasks ({args.op}), "
          f"{args.repeat} runs each (medians)")
    medians = {}
    for mode, runs in results.items():
        medians[mode] = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "rows"}
        m = medians[mode]
        print(f"  {mode:9} {m['rows_per_s']:9.0f} rows/s   load p50 {m['load_p50_ms']:6.1f} ms/batch"
              f"   peak RSS {m['peak_rss_mb']:6.1f} MB")
    ratio = medians["tasks"]["rows_per_s"] / medians["baseline"]["rows_per_s"]
    print(f"  ratio tasks/baseline: {ratio:.2f} (rows/s)")


if __name__ == "__main__":
    main()
