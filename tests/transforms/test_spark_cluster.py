"""The same pipeline on a Spark standalone cluster: only ``spark.master`` in setl.yaml changes.

`setl start` runs as an operator runs it, against a real master and worker on loopback (the
`spark_standalone` fixture); its Parquet change log, replayed with plain pyarrow, must equal the
reference state with the same transforms applied in Python, and the master must have run it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

from setl.sources.file import encode_transaction
from setl.testing.harness import delete, insert, parquet_state, reference_state, update
from setl.testing.servers import SparkStandalone, wait_until

TABLE = "demo.customers"
CHAIN = [
    {"use": "rename", "columns": {"name": "customer"}},
    {"use": "add_column", "name": "score", "expr": "v * 2 + 1"},
    {"use": "mask", "columns": ["card"], "keep_last": 4},
]


def make_stream(n: int) -> list[list]:
    """`n` transactions over 80 keys: inserts, updates and deletes (deleted keys come back)."""
    rows: dict[int, dict] = {}
    txs = []
    for i in range(n):
        key = (i * 7919) % 80
        row = {"id": key, "name": f"c{i} ✓", "card": f"{4000_0000_0000 + i * 37:016d}", "v": i}
        if key not in rows:
            txs.append([insert("customers", row)])
            rows[key] = row
        elif i % 4 == 0:
            txs.append([delete("customers", rows.pop(key))])
        else:
            txs.append([update("customers", rows[key], row)])
            rows[key] = row
    return txs


def expected(txs: list[list]) -> dict:
    """The reference state of the table with the chain applied in Python, keyed by id."""
    out = {}
    for row in reference_state(txs)[TABLE].values():
        card = row["card"]
        out[(row["id"],)] = {"id": row["id"], "customer": row["name"], "v": row["v"],
                             "score": row["v"] * 2 + 1,
                             "card": "*" * max(len(card) - 4, 0) + card[-4:]}
    return out


def write_conf(root: Path, master_url: str, app_name: str, stream: Path) -> Path:
    """A conf dir with two pipelines on one stream: pyarrow writes p1's Parquet, the cluster p2's."""
    conf = root / "conf"
    (conf / "pipelines").mkdir(parents=True)
    setl_yaml = {
        "meta": {"store": "sqlite", "path": str(root / "meta.db")},
        "spark": {
            "master": master_url,
            "app_name": app_name,
            "conf": {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.driver.memory": "512m",
                "spark.executor.memory": "512m",
                "spark.cores.max": 1,
                "spark.pyspark.python": sys.executable,
            },
        },
    }
    (conf / "setl.yaml").write_text(json.dumps(setl_yaml))  # JSON is YAML
    for name, writer in (("p1", "arrow"), ("p2", "spark")):
        pipeline = {
            "source": {"type": "file", "path": str(stream), "follow": False},
            "target": {"type": "parquet", "path": str(root / f"out-{name}"), "writer": writer},
            "pipeline": {"batch": {"max_rows": 60, "max_wait_ms": 5}},
            "tables": [{"source": r"demo\.customers", "transforms": CHAIN}],
        }
        (conf / "pipelines" / f"{name}.yaml").write_text(json.dumps(pipeline))
    return conf


def test_a_pipeline_runs_on_a_standalone_cluster_by_changing_spark_master(
    spark_standalone: SparkStandalone, tmp_path: Path,
):
    """`setl start` with spark.master set to a standalone cluster transforms (and, with writer: spark,
    writes) on the cluster's executor, and both Parquet change logs replay to the expected state."""
    txs = make_stream(300)
    stream = tmp_path / "stream.jsonl"
    stream.write_text("".join(encode_transaction(tx) for tx in txs), encoding="utf-8")
    app_name = f"setl-cluster-{uuid.uuid4().hex[:8]}"
    conf = write_conf(tmp_path, spark_standalone.master_url, app_name, stream)

    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    result = subprocess.run(
        [sys.executable, "-m", "setl.cli", "--conf", str(conf), "start",
         "--pipeline", "p1", "--pipeline", "p2", "--until-caught-up"],
        env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]

    want = expected(txs)
    assert len(want) > 20
    assert parquet_state(tmp_path / "out-p1", TABLE) == want
    assert parquet_state(tmp_path / "out-p2", TABLE) == want

    # The application ran on the cluster: the master lists it as finished, and its one executor, on
    # the worker, ran a task for every batch's transform (both pipelines) and wrote p2's files.
    apps = wait_until(
        lambda: [a for a in spark_standalone.status()["completedapps"] if a["name"] == app_name],
        timeout=20, message=lambda: f"application {app_name} among the master's completed apps")
    (app,) = apps
    (executor_log,) = (spark_standalone.worker.work_dir / app["id"]).glob("*/stderr")
    log = executor_log.read_text(errors="replace")
    p1_files = list((tmp_path / "out-p1" / TABLE).glob("part-*.parquet"))
    p2_files = list((tmp_path / "out-p2" / TABLE).glob("part-*.parquet"))
    # several batches each; the two pipelines may cut them differently (max_wait_ms cuts by time)
    assert len(p1_files) > 1 and len(p2_files) > 1
    assert log.count("Finished task") >= len(p1_files) + 2 * len(p2_files)
    # each of p2's files was first a task's output on the executor (in its hidden staging directory)
    staged = re.compile(re.escape(f"{tmp_path / 'out-p2' / TABLE}/")
                        + r"\.(part-[^/]+\.parquet)\.[0-9a-f]{32}\.spark/")
    saved = {m.group(1) for line in log.splitlines() if "Saved output of task" in line
             for m in [staged.search(line)] if m}
    assert saved == {f.name for f in p2_files}
