"""`setl` as operators run it: subprocesses on a file-backed source and an SQLite target."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from setl.meta import SqliteMetaStore
from setl.model import Position
from setl.sources.file import encode_transaction
from setl.testing.harness import delete, insert, reference_state, update
from tests.helpers.wait import wait_until


def make_stream(n: int) -> list[list]:
    """n transactions over 200 keys: inserts, then updates and deletes of earlier rows."""
    rows: dict[int, dict] = {}
    txs = []
    for i in range(n):
        key = (i * 7919) % 200
        row = {"id": key, "v": i, "note": f"row {i} ✓"}
        if key not in rows:
            txs.append([insert("items", row)])
            rows[key] = row
        elif i % 5 == 0:
            txs.append([delete("items", rows.pop(key))])
        else:
            txs.append([update("items", rows[key], row)])
            rows[key] = row
    return txs


class Setup:
    def __init__(self, root: Path, txs: list[list], *, max_rows: int = 20, attempts: int = 3, follow: bool = False):
        self.root = root
        self.conf = root / "conf"
        (self.conf / "pipelines").mkdir(parents=True)
        self.stream = root / "stream.jsonl"
        self.target = root / "target.db"
        self.meta_path = root / "meta.db"
        self.txs = txs
        self.stream.write_text("".join(encode_transaction(tx) for tx in txs), encoding="utf-8")
        (self.conf / "setl.yaml").write_text(f"meta:\n  store: sqlite\n  path: {self.meta_path}\n")
        (self.conf / "pipelines" / "p.yaml").write_text(textwrap.dedent(f"""\
            source: {{type: file, path: {self.stream}, follow: {str(follow).lower()}}}
            target: {{type: sqlite, path: {self.target}}}
            pipeline:
              parallelism: 3
              batch: {{max_rows: {max_rows}, max_wait_ms: 5}}
              retry: {{max_attempts: {attempts}, initial_backoff_ms: 10, max_backoff_ms: 50}}
            """))

    def env(self, faults: list[dict] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("SETL_FAULTS", None)
        if faults:
            env["SETL_FAULTS"] = json.dumps(faults)
        return env

    def run(self, *args: str, faults=None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(self.conf), *args],
                              env=self.env(faults), capture_output=True, text=True, timeout=timeout)

    def spawn(self, *args: str, faults=None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "setl.cli", "--conf", str(self.conf), *args],
                                env=self.env(faults), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def acked(self):
        meta = SqliteMetaStore(self.meta_path)
        try:
            return meta.position("p")
        finally:
            meta.close()

    def target_rows(self) -> dict:
        db = sqlite3.connect(self.target)
        try:
            return {(r[0],): {"id": r[0], "v": r[1], "note": r[2]}
                    for r in db.execute('SELECT id, v, note FROM "demo.items"')}
        finally:
            db.close()

    def target_position(self) -> Position:
        db = sqlite3.connect(self.target)
        try:
            log, offset = db.execute("SELECT log, offset FROM setl_position WHERE pipeline = 'p'").fetchone()
            return Position(log, offset)
        finally:
            db.close()

    def end(self) -> Position:
        return Position(self.stream.name, self.stream.stat().st_size)

    def assert_target_equals_stream(self) -> None:
        assert self.target_rows() == reference_state(self.txs)["demo.items"]


SLOW_LOADS = [{"stage": "load", "action": "slow", "seconds": 0.03, "times": None}]


def test_start_until_caught_up_replicates_the_stream(tmp_path):
    """`setl start --until-caught-up` exits 0 with the target equal to the stream and the ack at its end."""
    setup = Setup(tmp_path, make_stream(500))
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    setup.assert_target_equals_stream()
    assert setup.acked().position == setup.end()


def test_sigkill_mid_stream_then_restart_ends_equal_to_the_stream(tmp_path):
    """A node killed with SIGKILL mid-stream resumes from its ack and ends with the target equal to the stream."""
    setup = Setup(tmp_path, make_stream(3000))
    proc = setup.spawn("start", "--pipeline", "p", "--until-caught-up", faults=SLOW_LOADS)
    try:
        wait_until(lambda: (a := setup.acked()) is not None and a.batch_id >= 10, timeout=60, message="10 acks")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.communicate()
    killed_at = setup.acked()
    assert killed_at.position < setup.end(), "the kill came too late to test anything"
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    setup.assert_target_equals_stream()
    meta = SqliteMetaStore(setup.meta_path)
    first_new = [a for a in reversed(meta.history("p", 10_000)) if a.epoch > killed_at.epoch][0]
    meta.close()
    assert first_new.batch_id == killed_at.batch_id + 1


def test_crash_between_load_and_ack_replays_nothing_lost(tmp_path):
    """A crash after a batch is loaded but before its ack resumes from the position the target holds."""
    setup = Setup(tmp_path, make_stream(400))
    result = setup.run("start", "--pipeline", "p", "--until-caught-up",
                       faults=[{"stage": "termin", "action": "crash", "batch": 5}])
    assert result.returncode == -signal.SIGKILL
    # Batch 5 is in the target, not acked; the ack of batch 4 may still have been on its way,
    # since Load and Termin run as separate tasks.
    assert setup.acked().batch_id in (3, 4)
    assert setup.target_position() > setup.acked().position
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    assert "target already holds" in result.stderr
    setup.assert_target_equals_stream()


def test_failing_load_pauses_and_the_pause_survives_until_resume(tmp_path):
    """Retries running out pause the pipeline with its error; a restart waits; `setl resume` continues."""
    setup = Setup(tmp_path, make_stream(300), attempts=2)
    result = setup.run("start", "--pipeline", "p", "--until-caught-up",
                       faults=[{"stage": "load", "batch": 3, "times": None}])
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("setl: error:") and "paused" in last

    status = json.loads(setup.run("status", "--json").stdout)
    assert status[0]["status"] == "paused"
    assert "injected load failure at batch 3" in status[0]["error"]
    assert "stage=load" in status[0]["error"]

    again = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert again.returncode == 1 and "setl resume --pipeline p" in again.stderr

    resumed = setup.run("resume", "--pipeline", "p")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout
    final = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert final.returncode == 0, final.stderr
    setup.assert_target_equals_stream()


def test_sigterm_drains_in_flight_batches_and_exits_zero(tmp_path):
    """SIGTERM stops gracefully: exit 0, and the ack equals what the target holds (no half-acked batch)."""
    setup = Setup(tmp_path, make_stream(3000), follow=True)
    proc = setup.spawn("start", "--pipeline", "p", faults=SLOW_LOADS)
    try:
        wait_until(lambda: (a := setup.acked()) is not None and a.batch_id >= 5, timeout=60, message="5 acks")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert setup.acked().position == setup.target_position()
    assert json.loads(setup.run("status", "--json").stdout)[0]["status"] == "stopped"


def test_a_signal_is_handled_off_the_main_thread_so_a_lock_held_there_cannot_hang_the_stop():
    """A node once hung after SIGTERM, silent until killed: the handler runs on the main thread,
    maybe inside a `with lock:` of the node's, and stopping took that lock too. Now the handler only
    writes the signal to `_SignalThread`'s pipe: SIGHUP asks a reload, and SIGTERM starts the grace
    watchdog and stops the node on that thread, which waits for the lock while the main thread
    holds it instead of deadlocking."""
    from setl.cli import _SignalThread

    lock = threading.Lock()
    stopped, reloaded = threading.Event(), threading.Event()

    class Node:  # what the relay calls of a node
        asked = 0

        def stop(self) -> None:
            with lock:
                stopped.set()

        def request_reload(self) -> None:
            self.asked += 1
            if self.asked == 1:
                raise RuntimeError("a first reload that fails")  # the relay lives on
            reloaded.set()

    relay = _SignalThread(Node(), grace=600)
    with lock:  # the main thread inside a lock that stopping takes
        os.write(relay.write_end, bytes([signal.SIGHUP, signal.SIGHUP]))
        assert reloaded.wait(5)
        os.write(relay.write_end, bytes([signal.SIGTERM]))
        assert not stopped.wait(0.3)
    assert stopped.wait(5)
    assert relay.watchdog is not None and relay.watchdog.is_alive()  # started before the stop
    relay.watchdog.cancel()


def test_operator_pause_stops_a_running_pipeline_and_resume_restarts_it(tmp_path):
    """`setl pause` stops a running pipeline within seconds; `setl resume` makes the same node go on."""
    setup = Setup(tmp_path, make_stream(20000), follow=True)
    proc = setup.spawn("start", "--pipeline", "p", faults=SLOW_LOADS)
    try:
        wait_until(lambda: (a := setup.acked()) is not None and a.batch_id >= 3, timeout=60, message="3 acks")
        assert setup.run("pause", "--pipeline", "p").returncode == 0
        wait_until(lambda: setup.acked() == setup.acked() and
                   json.loads(setup.run("status", "--json").stdout)[0]["node"] is not None, timeout=5)
        paused_at = wait_until(lambda: _stable_ack(setup), timeout=20, message="acks to stop")
        assert json.loads(setup.run("status", "--json").stdout)[0]["status"] == "paused"
        assert setup.run("resume", "--pipeline", "p").returncode == 0
        wait_until(lambda: setup.acked().batch_id > paused_at.batch_id, timeout=30, message="acks after resume")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0


def test_a_resume_before_the_node_saw_the_pause_shows_running(tmp_path):
    """`setl pause` then `setl resume` at once: the pipeline that never stopped shows running again, and acks."""
    setup = Setup(tmp_path, make_stream(20000), follow=True)
    proc = setup.spawn("start", "--pipeline", "p", faults=SLOW_LOADS)
    try:
        wait_until(lambda: (a := setup.acked()) is not None and a.batch_id >= 3, timeout=60, message="3 acks")
        assert setup.run("pause", "--pipeline", "p").returncode == 0
        assert setup.run("resume", "--pipeline", "p").returncode == 0
        wait_until(lambda: json.loads(setup.run("status", "--json").stdout)[0]["status"] == "running", timeout=20,
                   message="status running after the resume")
        before = setup.acked()
        wait_until(lambda: setup.acked().batch_id > before.batch_id, timeout=30, message="acks after resume")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0


def _stable_ack(setup: Setup):
    """The ack, if it has not moved for 1.5 s (the node stopped acking)."""
    import time

    before = setup.acked()
    time.sleep(1.5)
    after = setup.acked()
    return after if after == before else None


def test_position_reset_replays_from_the_given_position(tmp_path):
    """`setl position reset --to` makes the next start read from there; `show` reports it."""
    setup = Setup(tmp_path, make_stream(200))
    assert setup.run("start", "--pipeline", "p", "--until-caught-up").returncode == 0
    assert setup.run("position", "reset", "--pipeline", "p", "--to", f"{setup.stream.name}:0").returncode == 0
    shown = json.loads(setup.run("position", "show", "--pipeline", "p", "--json").stdout)
    assert shown["position"]["offset"] == 0 and shown["reset"] is True
    db = sqlite3.connect(setup.target)
    db.execute('DELETE FROM "demo.items"')
    db.commit()
    db.close()
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    setup.assert_target_equals_stream()


@pytest.mark.parametrize(
    "body, expected",
    [
        ("pipline: {parallelism: 2}\n", "pipline: unknown key"),
        ("pipeline: {batch: {max_rows: ten}}\n", "pipeline.batch.max_rows: expected an integer, got 'ten'"),
        ("pipeline: {parallelism: 0}\n", "pipeline.parallelism: must be between 1 and 64"),
        ("tables: [{source: '(unclosed'}]\n", "tables[0].source: invalid regex"),
        ("pipeline: {load: {mode: sideways}}\n", "pipeline.load.mode: expected one of ordered, per_table"),
        ("pipeline: {on_table_error: skip}\n", "pipeline.on_table_error: expected one of pause, quarantine"),
        ("pipeline: {on_table_error: quarantine, load: {mode: per_table}}\n",
         "pipeline.on_table_error: quarantine needs load.mode ordered"),
        ("pipeline: {on_table_error: quarantine, load: {chunks: per_table}}\n",
         "pipeline.on_table_error: quarantine needs load.mode ordered and load.chunks ordered"),
        ("pipeline: {quarantine: {max_rows: 0}}\n", "pipeline.quarantine: max_rows and max_bytes must be at least 1"),
    ],
)
def test_bad_config_is_one_line_with_file_and_key_path_and_exit_2(tmp_path, body, expected):
    """A bad pipeline file exits 2 with one line naming the file and key path, and no traceback."""
    setup = Setup(tmp_path, make_stream(5))
    path = setup.conf / "pipelines" / "p.yaml"
    path.write_text(path.read_text() + body)
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and expected in lines[0]


def test_env_expansion_and_missing_variable(tmp_path, monkeypatch):
    """`${VAR}` expands from the environment; an unset variable is a config error naming it."""
    setup = Setup(tmp_path, make_stream(5))
    path = setup.conf / "pipelines" / "p.yaml"
    path.write_text(path.read_text().replace(str(setup.target), '"${SETL_TEST_TARGET}"'))
    monkeypatch.delenv("SETL_TEST_TARGET", raising=False)
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 2 and "SETL_TEST_TARGET is not set" in result.stderr
    monkeypatch.setenv("SETL_TEST_TARGET", str(setup.target))
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    setup.assert_target_equals_stream()


def test_unknown_pipeline_and_debug_traceback(tmp_path):
    """An unknown pipeline exits 2 listing the known ones; --debug adds the traceback."""
    setup = Setup(tmp_path, make_stream(5))
    result = setup.run("start", "--pipeline", "nope")
    assert result.returncode == 2
    assert "no such pipeline (configured: p)" in result.stderr and "Traceback" not in result.stderr
    debug = setup.run("--debug", "start", "--pipeline", "nope")
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_bad_transaction_line_pauses_with_its_position(tmp_path):
    """A malformed source record fails with the pipeline, stage and position named, and nothing after it is acked."""
    setup = Setup(tmp_path, make_stream(50), attempts=2)
    good = setup.stream.stat().st_size
    with open(setup.stream, "a", encoding="utf-8") as out:
        out.write('{"changes": [{"op": "upsert", "schema": "demo", "table": "items"}]}\n')
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 1
    assert f"position={setup.stream.name}:{good}" in result.stderr
    assert "stage=select" in result.stderr and "pipeline=p" in result.stderr
    assert setup.acked().position == Position(setup.stream.name, good)


def test_a_start_that_cannot_open_its_source_is_stopped_with_the_error_in_status(tmp_path):
    """A failed start exits 1 and leaves status STOPPED with the error, not RUNNING with no process."""
    setup = Setup(tmp_path, make_stream(5))
    setup.stream.unlink()
    result = setup.run("start", "--pipeline", "p", "--until-caught-up")
    assert result.returncode == 1, result.stderr
    assert "stage=select" in result.stderr and "Traceback" not in result.stderr
    (status,) = json.loads(setup.run("status", "--json").stdout)
    assert status["status"] == "stopped"
    assert setup.stream.name in status["error"] and "stage=select" in status["error"]


# --- commands that do what they say, on real MariaDB servers (issue 13.7) --------------------------

def _mariadb_pipeline(tmp_path, source, target, database: str, start):
    """A SetlProcess copying `database`.items from `source` to `target` (both created here), from `start`."""
    from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target

    for server in (source, target):
        server.query(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        server.query(f"CREATE TABLE IF NOT EXISTS `{database}`.items (id INT PRIMARY KEY, v INT)")
    return SetlProcess(tmp_path, source=mysql_source(source, start=start), target=mysql_target(target),
                       tables=[{"source": rf"{database}\.items", "target": f"{database}.items"}])


def test_start_latest_is_resolved_once_and_kept(tmp_path, mariadb_source, mariadb_target):
    """`start: latest` is pinned at the first start: a row written before the second start (none acked) is copied."""
    setl = _mariadb_pipeline(tmp_path, mariadb_source, mariadb_target, "cli_latest", "latest")
    mariadb_source.query("INSERT INTO cli_latest.items VALUES (1, 1)")  # before the first start: not copied
    first = setl.start_until_caught_up()
    assert first.returncode == 0, first.stderr[-3000:]
    mariadb_source.query("INSERT INTO cli_latest.items VALUES (2, 2)")  # between the starts: copied
    second = setl.start_until_caught_up()
    assert second.returncode == 0, second.stderr[-3000:]
    assert mariadb_target.query("SELECT id, v FROM cli_latest.items ORDER BY id") == [(2, 2)]


def test_position_reset_to_start_replays_even_though_the_target_records_a_later_position(
        tmp_path, mariadb_source, mariadb_target):
    """`setl position reset --start` restarts from the configured start, not the MariaDB target's position record."""
    from tests.e2e.setl_process import binlog_head

    head = binlog_head(mariadb_source)
    setl = _mariadb_pipeline(tmp_path, mariadb_source, mariadb_target, "cli_reset",
                             {"file": head.log, "pos": head.offset})
    mariadb_source.query("INSERT INTO cli_reset.items VALUES (1, 1), (2, 2), (3, 3)")
    assert setl.start_until_caught_up().returncode == 0
    assert len(mariadb_target.query("SELECT * FROM cli_reset.items")) == 3
    mariadb_target.query("DELETE FROM cli_reset.items")  # the target lost its rows: replay them
    reset = setl.run("position", "reset", "--pipeline", setl.name, "--start")
    assert reset.returncode == 0 and "configured start" in reset.stdout
    shown = json.loads(setl.run("position", "show", "--pipeline", setl.name, "--json").stdout)
    assert shown["position"] is None and shown["reset"] is True
    again = setl.start_until_caught_up()
    assert again.returncode == 0, again.stderr[-3000:]
    assert mariadb_target.query("SELECT id, v FROM cli_reset.items ORDER BY id") == [(1, 1), (2, 2), (3, 3)]
    assert not json.loads(setl.run("position", "show", "--pipeline", setl.name, "--json").stdout)["reset"]


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["pause", "--pipeline", "p"],
                                     ["position", "show", "--pipeline", "p"]])
def test_a_conf_dir_that_does_not_exist_is_one_line_exit_2_and_creates_nothing(tmp_path, command):
    """`--conf` naming a missing directory (a typo) exits 2 with one line and creates no meta store or directory."""
    missing = tmp_path / "cnof"
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(missing), *command],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "cnof" in result.stderr and "does not exist" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_status_before_any_start_creates_no_meta_store(tmp_path):
    """`setl status` on a configured directory where nothing ran yet lists the pipeline and writes nothing."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (conf / "setl.yaml").write_text("meta:\n  store: sqlite\n  path: meta.db\n")
    (conf / "pipelines" / "p1.yaml").write_text(
        "source: {type: file, path: in.jsonl}\ntarget: {type: sqlite, path: out.db}\ntables: [{source: '.*'}]\n")
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf), "status", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [row["pipeline"] for row in json.loads(result.stdout)] == ["p1"]
    assert not (conf / "meta.db").exists()


def test_snapshot_of_a_source_without_the_capability_is_one_line_exit_2(tmp_path):
    """`setl snapshot` on a pipeline whose source connector does not declare snapshots (file) exits 2
    with one line naming the pipeline, the stage and what to do, and records no request."""
    setup = Setup(tmp_path, make_stream(5))
    result = setup.run("snapshot", "--pipeline", "p", "--table", "demo.items")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "pipeline=p" in line and "stage=select" in line
    assert "source type file cannot copy tables" in line and "such as mysql" in line
    assert not setup.meta_path.exists() or SqliteMetaStore(setup.meta_path).snapshot_requests("p") == []


@pytest.mark.parametrize("word", ["items", "demo.", ".items"])
def test_verify_of_a_table_not_schema_dot_table_is_one_line_exit_2(tmp_path, word):
    """`setl verify --table` with a word lacking a schema or a table exits 2 with one line naming the word."""
    setup = Setup(tmp_path, make_stream(5))
    result = setup.run("verify", "--pipeline", "p", "--table", "demo.items", "--table", word)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"--table {word!r} is not SCHEMA.TABLE" in line


def test_version_names_the_installed_release():
    result = subprocess.run([sys.executable, "-m", "setl.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and re.fullmatch(r"setl \d+\.\d+\.\d+\S*\n", result.stdout), result.stdout
