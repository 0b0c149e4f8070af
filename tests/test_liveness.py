"""Truthful status: liveness records in both meta stores, the single-node run lock, `setl status` after a kill -9."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from setl.meta import SqliteMetaStore
from setl.meta.base import STALE_AFTER, Liveness, Status
from setl.status import status_rows
from tests.ha.zk import unique_root
from tests.helpers.wait import wait_until
from tests.test_cli import SLOW_LOADS, Setup, make_stream


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _contract(meta, clock: Clock) -> None:
    """What both stores promise: claim, refuse while fresh, take when stale, beat, release."""
    first = Liveness("p", "t1", "node-1", "elsewhere", 4242, clock.now)
    assert meta.claim_run(first) is None
    assert meta.liveness("p").token == "t1" and meta.liveness("p").time == clock.now
    second = Liveness("p", "t2", "node-2", "elsewhere", 4343, clock.now)
    holder = meta.claim_run(second)
    assert holder is not None and holder.token == "t1" and holder.node == "node-1" and holder.pid == 4242
    clock.now += 1.0
    assert meta.beat(Liveness("p", "t1", "node-1", "elsewhere", 4242, 0.0, figures={"rows_per_second": 5.0}))
    record = meta.liveness("p")
    assert record.time == clock.now and record.figures == {"rows_per_second": 5.0}
    assert meta.claim_run(second) is not None  # still fresh
    clock.now += STALE_AFTER + 1
    assert meta.claim_run(second) is None  # stale: taken
    assert not meta.beat(first)  # the old holder learns it lost the record
    assert meta.liveness("p").token == "t2"
    assert meta.claim_run(Liveness("p", "t3", None, "x", 1, clock.now), stale_after=0.0) is None  # forced
    meta.release_run("p", "t2")  # not the holder: nothing happens
    assert meta.liveness("p").token == "t3"
    meta.release_run("p", "t3")
    assert meta.liveness("p") is None


def test_sqlite_liveness_contract(tmp_path):
    clock = Clock()
    meta = SqliteMetaStore(tmp_path / "meta.db", clock=clock)
    try:
        _contract(meta, clock)
    finally:
        meta.close()


def test_zookeeper_liveness_contract(zookeeper_server):
    from setl.ha import Coordinator
    from setl.meta.zookeeper import ZooKeeperMetaStore

    clock = Clock()
    coordinator = Coordinator(zookeeper_server.hosts, root=unique_root())
    meta = ZooKeeperMetaStore(coordinator.start(), clock=clock)
    try:
        _contract(meta, clock)
    finally:
        meta.close()


def test_a_record_of_a_process_gone_from_this_host_is_stale_at_once(tmp_path):
    """A kill -9 leaves a fresh-looking record; its pid is gone, so a restart is not blocked for STALE_AFTER."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    meta = SqliteMetaStore(tmp_path / "meta.db")
    try:
        here = Liveness.mine("p", "n", "old", time.time()).host
        assert meta.claim_run(Liveness("p", "old", "n", here, dead.pid, time.time())) is None
        assert meta.claim_run(Liveness.mine("p", "n", "new", time.time())) is None
        assert meta.liveness("p").token == "new"
    finally:
        meta.close()


def test_status_says_dead_for_running_state_without_a_fresh_beat(tmp_path):
    clock = Clock()
    meta = SqliteMetaStore(tmp_path / "meta.db", clock=clock)
    try:
        meta.set_state("p", Status.RUNNING, node="node-1")
        (row,) = status_rows(meta, ["p"], now=clock.now)
        assert row["status"] == "dead" and row["last_seen"] is None  # running, but nobody ever beat
        meta.claim_run(Liveness("p", "t", "node-1", "h", 1, clock.now, figures={"rows_per_second": 12.0}))
        meta.beat(Liveness("p", "t", "node-1", "h", 1, clock.now, figures={"rows_per_second": 12.0}))
        (row,) = status_rows(meta, ["p"], now=clock.now + 1)
        assert row["status"] == "running" and row["rows_per_second"] == 12.0
        (row,) = status_rows(meta, ["p"], now=clock.now + STALE_AFTER + 5)
        assert row["status"] == "dead" and row["last_seen"] == clock.now and row["node"] == "node-1"
        assert row["rows_per_second"] is None  # a dead process's figures are not shown as live
    finally:
        meta.close()


def _status(setup: Setup) -> dict:
    result = setup.run("status", "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    return row


def test_second_start_is_refused_kill_9_shows_dead_and_a_restart_works(tmp_path):
    setup = Setup(tmp_path, make_stream(400), max_rows=5, follow=True)
    first = setup.spawn("start", "--pipeline", "p", faults=SLOW_LOADS)
    try:
        running = wait_until(lambda: (row := _status(setup))["status"] == "running" and row["batch"]
                             and row["rows_per_second"] is not None and row, timeout=60, message="a beat")
        assert running["pid"] == first.pid
        assert isinstance(running["position"], dict) and running["position"]["log"] == setup.stream.name

        second = setup.run("start", "--pipeline", "p", timeout=60)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "already running" in lines[0], second.stderr

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        dead = _status(setup)
        assert dead["status"] == "dead" and dead["pid"] == first.pid
        text = setup.run("status").stdout
        lines = text.splitlines()
        assert lines[1].split()[:2] == ["p", "dead"], text  # the table keeps its columns
        assert re.search(r"^p: dead, last seen \d+s ago on ", lines[2]), text

        restarted = setup.run("start", "--pipeline", "p", "--until-caught-up", timeout=180)  # at once
        assert restarted.returncode == 0, restarted.stderr
        setup.assert_target_equals_stream()
        assert _status(setup)["status"] == "stopped"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_status_fits_80_columns_without_breaking_a_position_or_cutting_an_error(tmp_path):
    setup = Setup(tmp_path, make_stream(10))
    meta = SqliteMetaStore(setup.meta_path)
    try:
        from setl.model import Position

        meta.ack("p", 7, 1, Position("mysql-bin.000123", 123456789, row=42))
        meta.set_state("p", Status.PAUSED, error="stage=load table=shop.orders position=mysql-bin.000123:"
                       "123456789 cause: " + "a very long error message\nover two lines " * 5)
    finally:
        meta.close()
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(setup.conf), "status"],
                            capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.rstrip("\n").splitlines()
    assert len(lines) > 3, result.stdout  # the header, one line for the pipeline, its error folded whole
    assert all(len(line) <= 80 for line in lines), result.stdout
    assert "mysql-bin.000123:123456789+42" in lines[1] and "paused" in lines[1]
    assert lines[2].startswith("p: stage=load table=shop.orders")
    error = "".join(lines[2:])
    assert "…" not in error and error.endswith("over two lines") and error.count("a very long error message") == 5


@pytest.mark.parametrize("command", [["status", "--pipeline", "nope"], ["status", "--json", "--pipeline", "nope"]])
def test_status_of_an_unknown_pipeline_exits_2(tmp_path, command):
    setup = Setup(tmp_path, make_stream(10))
    for _ in range(2):  # before anything ran, and after
        result = setup.run(*command)
        assert result.returncode == 2 and "unknown pipeline 'nope'" in result.stderr, result.stderr
        assert setup.run("start", "--pipeline", "p", "--until-caught-up").returncode == 0
