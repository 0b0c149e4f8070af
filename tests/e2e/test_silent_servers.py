"""A server that accepts connections and never answers (a wrong port, a black hole, a frozen
process) never hangs setl: `check` says which one within its connect timeout, `start` shows
``retrying`` with the cause, and SIGTERM ends the process within its grace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from setl.cli import stop_grace
from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target
from tests.helpers.silent import SilentListener
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(240)


def _silent_target(kind: str, silent: SilentListener) -> dict[str, Any]:
    if kind == "mysql":
        return {"type": "mysql", "host": silent.host, "port": silent.port, "user": "root"}
    return {"type": "postgresql", "host": silent.host, "port": silent.port, "user": "postgres", "database": "x"}


@pytest.mark.parametrize("kind", ["mysql", "postgresql"])
def test_check_names_a_target_that_never_answers(tmp_path, mariadb_source, source_db, kind) -> None:
    """`setl check` ends within the connect timeout with one error line naming the silent target."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY)")
    with SilentListener() as silent:
        setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source), target=_silent_target(kind, silent),
                           tables=[{"source": rf"{source_db}\.t", "target": "shop.t"}])
        began = time.monotonic()
        result = setl.run("check", "--pipeline", setl.name, timeout=120)
        assert time.monotonic() - began < 40
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "target" in errors[0], result.stdout
    if kind == "mysql":
        assert f"{silent.host}:{silent.port}" in errors[0] and "did not finish the handshake" in errors[0]
    assert "Error:" not in errors[0], "no Python class name before the cause"


def test_check_names_a_source_that_never_answers(tmp_path, mariadb_target, mysql_db) -> None:
    """`setl check` ends within the connect timeout naming the silent source."""
    with SilentListener() as silent:
        source = {"type": "mysql", "host": silent.host, "port": silent.port, "user": "root", "server_id": 1501}
        setl = SetlProcess(tmp_path, source=source, target=mysql_target(mariadb_target, database=mysql_db),
                           tables=[{"source": r"shop\.t", "target": f"{mysql_db}.t"}])
        began = time.monotonic()
        result = setl.run("check", "--pipeline", setl.name, timeout=120)
        assert time.monotonic() - began < 40
    assert result.returncode != 0
    errors = [line for line in result.stdout.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "source" in errors[0] and f"{silent.port}" in errors[0], result.stdout
    assert "did not finish the handshake" in errors[0]


def test_start_against_a_silent_target_shows_retrying_and_stops_on_sigterm(tmp_path, mariadb_source,
                                                                           source_db) -> None:
    """`setl start` with a target that never answers: status ``retrying`` with the cause, and one
    SIGTERM ends the process at once, exit 0 (it was retrying, nothing failed)."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY)")
    with SilentListener() as silent:
        setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source), target=_silent_target("mysql", silent),
                           tables=[{"source": rf"{source_db}\.t", "target": "shop.t"}])
        proc = setl.spawn()
        try:
            def retrying() -> bool:
                status = setl.status()
                return status.get("status") == "retrying" and "did not finish the handshake" in str(status)

            wait_until(retrying, timeout=90, interval=1, message="status retrying with the cause")
            began = time.monotonic()
            code = setl.stop(proc, timeout=60)
            assert time.monotonic() - began < 15, "a retrying start stops at once"
        finally:
            if proc.poll() is None:
                proc.kill()
    assert code == 0, setl.logs()[-3000:]


def test_sigterm_ends_a_node_whose_target_froze_mid_run_within_its_grace(tmp_path, mariadb_source, source_db,
                                                                         mariadb_factory) -> None:
    """A target SIGSTOPped while batches are loading: SIGTERM still ends setl within its grace (the
    drain, then 30 s), and once the target runs again a restart brings it level with the source."""
    target = mariadb_factory()
    target.query("CREATE DATABASE shop")
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY, v VARCHAR(20))")
    head = binlog_head(mariadb_source)  # its own reader id, from here: not the shared server's history
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=1502,
                                                     start={"file": head.log, "pos": head.offset}),
                       target=mysql_target(target), tables=[{"source": rf"{source_db}\.t", "target": "shop.t"}],
                       pipeline={"parallelism": 2, "batch": {"max_rows": 100, "max_wait_ms": 50},
                                 "drain_timeout_ms": 2000})
    proc = setl.spawn()
    pid = target.pid
    assert pid is not None
    frozen = False
    try:
        mariadb_source.query(f"INSERT INTO `{source_db}`.t VALUES (1, 'before')")
        wait_until(lambda: target.query("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'shop' "
                                        "AND table_name = 't'")[0][0] == 1 and
                   target.query("SELECT COUNT(*) FROM shop.t")[0][0] == 1, timeout=60, interval=0.5,
                   message="the first row on the target")
        os.kill(pid, signal.SIGSTOP)
        frozen = True
        for i in range(2, 50):
            mariadb_source.query(f"INSERT INTO `{source_db}`.t VALUES ({i}, 'while frozen')")
        time.sleep(2)  # the loads are now waiting on the frozen server
        began = time.monotonic()
        setl.stop(proc, timeout=120)
        took = time.monotonic() - began
        grace = 2 + 30
        assert took < grace + 10, f"stopped after {took:.0f}s"
    finally:
        if proc.poll() is None:
            proc.kill()
        if frozen:
            os.kill(pid, signal.SIGCONT)
    assert stop_grace([]) == 60  # the default drain (30 s) and 30 s
    result = setl.start_until_caught_up(timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert target.query("SELECT id, v FROM shop.t ORDER BY id") == mariadb_source.query(
        f"SELECT id, v FROM `{source_db}`.t ORDER BY id")


def _zookeeper_conf(tmp_path, silent: SilentListener) -> Any:
    """A conf dir whose node keeps its meta store in a ZooKeeper that never answers."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text(f"meta: {{store: zookeeper}}\nha: {{zookeeper: '{silent.host}:{silent.port}'}}\n")
    (conf / "pipelines" / "p1.yaml").write_text("source: {type: mysql}\ntarget: {type: mysql}\n"
                                                "tables: [{source: 'a\\\\.b', target: 'a.b'}]\n")
    return conf


def test_a_zookeeper_that_never_answers_is_an_error_in_time_and_sigterm_stops_the_wait(tmp_path) -> None:
    """The meta store in a ZooKeeper that accepts and never answers: `setl status` ends with one
    line within its connect timeout; `setl start` waits for it (retrying) and one SIGTERM ends it."""
    with SilentListener() as silent:
        conf = _zookeeper_conf(tmp_path, silent)
        argv = [sys.executable, "-m", "setl.cli", "--conf", str(conf)]
        began = time.monotonic()
        status = subprocess.run([*argv, "status"], capture_output=True, text=True, timeout=120)
        assert time.monotonic() - began < 60
        assert status.returncode == 1 and "ZooKeeper" in status.stderr and "Traceback" not in status.stderr, \
            status.stderr
        proc = subprocess.Popen([*argv, "start", "--pipeline", "p1"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: len(silent.accepted) >= 2, timeout=60, interval=0.2,
                       message="start trying the meta store")
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert proc.returncode != 0


def test_check_names_a_frozen_postgresql_target_in_time(tmp_path, mariadb_source, source_db, postgres_server,
                                                        postgres_db) -> None:
    """A SIGSTOPped PostgreSQL target: `setl check` ends within its connect timeout with one error
    line naming the target, and the server serves again once thawed."""
    mariadb_source.query(f"CREATE TABLE `{source_db}`.t (id INT PRIMARY KEY)")
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source),
                       target={"type": "postgresql", "host": postgres_server.host, "port": postgres_server.port,
                               "user": postgres_server.user, "database": postgres_db},
                       tables=[{"source": rf"{source_db}\.t", "target": "shop.t"}])
    pid = postgres_server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        result = setl.run("check", "--pipeline", setl.name, timeout=120)
        assert time.monotonic() - began < 40
    finally:
        os.kill(pid, signal.SIGCONT)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "target" in errors[0] and "Error:" not in errors[0], result.stdout
    assert postgres_server.query("SELECT 1", dbname=postgres_db) == [(1,)]
