"""The README's first command on the bundled config: `tools/demo.py up` starts two MariaDB servers
and fills the source, `setl start --pipeline p1 --until-caught-up` replicates, `verify` agrees.

Runs on the bundled `conf/pipelines/p1.yaml` (unchanged) with the servers on free ports and in a
temp dir, and a temp meta store, so it touches nothing in the checkout's `var/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from setl.testing.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def main_job(tmp_path):
    """A copy of conf/ with a temp meta store, and the env that points p1 and the demo at free ports."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    shutil.copy(ROOT / "conf" / "pipelines" / "p1.yaml", conf / "pipelines")
    (conf / "setl.yaml").write_text(f"meta: {{store: sqlite, path: {tmp_path / 'meta.db'}}}\n")
    env = dict(os.environ, SETL_P1_SOURCE_PORT=str(free_port()), SETL_P1_TARGET_PORT=str(free_port()))
    env.pop("SETL_FAULTS", None)

    def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)

    def demo(*args: str) -> subprocess.CompletedProcess:
        return run("tools/demo.py", "--conf", str(conf), "--servers", str(tmp_path / "servers"), *args)

    def setl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return run("-m", "setl.cli", "--conf", str(conf), *args, timeout=timeout)

    def target(sql: str) -> list[tuple]:
        import pymysql

        with contextlib.closing(pymysql.connect(host="127.0.0.1", port=int(env["SETL_P1_TARGET_PORT"]),
                                                user="root")) as conn, conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    try:
        yield demo, setl, target
    finally:
        demo("down")


def test_p1_replicates_the_demo_schema_and_setup_is_rerunnable(main_job):
    """`demo.py up` then `setl start --pipeline p1 --until-caught-up` leave every demo table equal;
    re-running adds nothing."""
    demo, setl, target = main_job
    up = demo("up", "--transactions", "500")
    assert up.returncode == 0, up.stderr
    assert "created the demo schema" in up.stdout and "the target is empty" in up.stdout
    assert "wrote 500 transactions" in up.stdout

    start = setl("start", "--pipeline", "p1", "--until-caught-up", timeout=300)
    assert start.returncode == 0, start.stderr[-3000:]
    verify = demo("verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "3 of 3 tables equal" in verify.stdout and "audit_log" not in verify.stdout
    # The empty target got its tables from the source (create_tables), the rows from the snapshot,
    # and demo.orders went through the Spark step that adds amount_cents.
    copied = json.loads(setl("status", "--json").stdout)[0]["snapshot"]
    assert sorted((t["table"], t["status"]) for t in copied) == [
        ("demo.customers", "done"), ("demo.orders", "done"), ("demo.products", "done")]
    ((orders, exact),) = target("SELECT COUNT(*), SUM(amount_cents = amount * 100) FROM demo.orders")
    assert orders > 0 and orders == exact

    load = demo("load", "--seconds", "2", "--rate", "50")
    assert load.returncode == 0, load.stderr
    assert demo("verify").returncode == 1  # the target is behind until setl runs again

    again = demo("up")
    assert again.returncode == 0 and "reused" in again.stdout and "nothing to add" in again.stdout
    start = setl("start", "--pipeline", "p1", "--until-caught-up", timeout=300)
    assert start.returncode == 0, start.stderr[-3000:]
    assert demo("verify").returncode == 0
    status = json.loads(setl("status", "--json").stdout)
    assert [(s["pipeline"], s["status"], s["error"]) for s in status] == [("p1", "stopped", None)]
    assert status[0]["position"]["log"].startswith("mysql-bin.")
