"""``source.snapshot.engine: spark``: chunk reads run as Spark tasks on the standalone cluster fixture
(only ``spark.master`` names it), and the target ends equal to the source."""

from __future__ import annotations

import json
import re
import sys
import uuid

import pytest

from setl.testing.servers import wait_until
from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target
from tests.snapshot import tables as t

pytestmark = pytest.mark.timeout(400)

ROWS = 6000
CHUNK = 1000


def test_chunks_read_as_spark_tasks_on_a_standalone_cluster(tmp_path, spark_standalone, mariadb_source,
                                                            mariadb_target, source_db, mysql_db):
    """Every keyed chunk is a task on the cluster's executor (running setl's code shipped with the job,
    not the older setl its Python has installed); the keyless table falls back to one consistent read
    by setl; CHECKSUM TABLE agrees after catching up."""
    t.create(mariadb_source, source_db)
    t.create(mariadb_target, mysql_db)
    t.fill(mariadb_source, source_db, ROWS, binlog=False)
    app_name = f"setl-snapshot-{uuid.uuid4().hex[:8]}"
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=2105, start="snapshot",
                                                     snapshot={"chunk_rows": CHUNK, "engine": "spark"}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{re.escape(source_db)}\..*", "target": f"{mysql_db}.{{table}}"}])
    (setl.conf / "setl.yaml").write_text(json.dumps({
        "meta": {"store": "sqlite", "path": str(setl.meta_path)},
        "spark": {"master": spark_standalone.master_url, "app_name": app_name,
                  "conf": {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                           "spark.driver.memory": "512m", "spark.executor.memory": "512m", "spark.cores.max": 1,
                           "spark.pyspark.python": sys.executable}}}))
    with t.Writer(mariadb_source, source_db, ROWS, seed=9):
        result = setl.start_until_caught_up(timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
    result = setl.start_until_caught_up(timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert t.checksums(mariadb_source, source_db) == t.checksums(mariadb_target, mysql_db), setl.logs()
    chunks = {s["table"].split(".", 1)[1]: s["chunks"] for s in setl.status()["snapshot"]}
    apps = wait_until(
        lambda: [a for a in spark_standalone.status()["completedapps"] if a["name"] == app_name],
        timeout=30, message=lambda: f"application {app_name} among the master's completed apps")
    (app,) = apps
    # Under load the worker may launch a second executor for the app (the first one lost or slow
    # to register): count the tasks of all of them.
    executor_logs = list((spark_standalone.worker.work_dir / app["id"]).glob("*/stderr"))
    assert executor_logs, "no executor ran for the application"
    finished = sum(log.read_text(errors="replace").count("Finished task") for log in executor_logs)
    keyed = chunks["ints"] + chunks["strs"] + chunks["comp"]
    assert keyed >= 2 * ROWS // CHUNK
    assert finished >= keyed, (finished, chunks)
