"""Many pipelines in one node, on the node's shared task service: isolation, pause, and the CLI."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from setl.config import PipelineSettings, load_node, load_pipeline
from setl.connectors import registry
from setl.meta import SqliteMetaStore, Status
from setl.node import Node
from setl.runtime import TaskExecutionService
from setl.scheduler import Outcome, Scheduler
from setl.sources.file import encode_transaction
from setl.stages import Extract, Transform
from setl.testing.harness import MemorySink, ScriptedSource, insert, reference_state
from tests.helpers.wait import wait_until
from tests.test_cli import make_stream
from tests.test_scheduler import fast_settings, single_row_stream

BAD_LINE = '{"changes": [{"op": "upsert", "schema": "demo", "table": "items"}]}\n'


class Conf:
    """A conf directory with file-source, SQLite-target pipelines and a small shared runtime."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "conf"
        (self.conf / "pipelines").mkdir(parents=True)
        self.meta_path = root / "meta.db"
        (self.conf / "setl.yaml").write_text(textwrap.dedent(f"""\
            meta: {{store: sqlite, path: {self.meta_path}}}
            runtime: {{workers: 2, max_workers: 4}}
            """))
        self.streams: dict[str, list] = {}

    def add(self, name: str, txs: list, *, follow: bool, bad_tail: bool = False, mode: str = "ordered") -> None:
        self.streams[name] = list(txs)
        stream = self.root / f"{name}.jsonl"
        stream.write_text("".join(encode_transaction(tx) for tx in txs) + (BAD_LINE if bad_tail else ""),
                          encoding="utf-8")
        (self.conf / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            source: {{type: file, path: {stream}, follow: {str(follow).lower()}}}
            target: {{type: sqlite, path: {self.root / (name + '.db')}}}
            pipeline:
              parallelism: 2
              batch: {{max_rows: 20, max_wait_ms: 5}}
              load: {{mode: {mode}}}
              retry: {{max_attempts: 2, initial_backoff_ms: 10, max_backoff_ms: 20}}
            """))

    def append(self, name: str, txs: list) -> None:
        self.streams[name].extend(txs)
        with open(self.root / f"{name}.jsonl", "a", encoding="utf-8") as out:
            out.write("".join(encode_transaction(tx) for tx in txs))

    def rows(self, name: str) -> dict:
        db = sqlite3.connect(self.root / f"{name}.db")
        try:
            return {(r[0],): {"id": r[0], "v": r[1], "note": r[2]}
                    for r in db.execute('SELECT id, v, note FROM "demo.items"')}
        except sqlite3.OperationalError:
            return {}
        finally:
            db.close()

    def caught_up(self, name: str) -> bool:
        return self.rows(name) == reference_state(self.streams[name]).get("demo.items", {})

    def node(self, names: list[str]) -> tuple[Node, SqliteMetaStore]:
        settings = load_node(self.conf)
        meta = SqliteMetaStore(self.meta_path)
        return Node(settings, [load_pipeline(self.conf, n, registry()) for n in names], meta, poll_interval=0.05), meta


def more_rows(start: int, n: int) -> list:
    return [[insert("items", {"id": 1000 + i, "v": i, "note": "late"})] for i in range(start, start + n)]


@pytest.mark.timeout(120)
def test_a_paused_and_a_failing_pipeline_do_not_disturb_the_others(tmp_path):
    """On shared threads, a pipeline pausing on errors and one paused by an operator leave the third running."""
    conf = Conf(tmp_path)
    conf.add("steady", make_stream(120), follow=True)
    conf.add("paused", make_stream(80), follow=True, mode="per_table")
    conf.add("broken", make_stream(60), follow=True, bad_tail=True)
    node, meta = conf.node(["steady", "paused", "broken"])
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(node.run()), name="test-node")
    runner.start()
    try:
        wait_until(lambda: conf.caught_up("steady") and conf.caught_up("paused"), timeout=60,
                   message="both healthy pipelines caught up")
        wait_until(lambda: meta.state("broken").status is Status.PAUSED, timeout=60, message="broken paused")
        assert "stage=select" in meta.state("broken").error
        threads = [t.name for t in threading.enumerate() if t.name.startswith("setl-")]
        assert not [t for t in threads if t.startswith(("setl-steady-", "setl-paused-", "setl-broken-"))
                    and not t.endswith("-supervisor")], f"a pipeline made threads of its own: {threads}"
        assert len([t for t in threads if t.startswith("setl-task-worker")]) <= 4

        conf.append("steady", more_rows(0, 30))
        wait_until(lambda: conf.caught_up("steady"), timeout=60, message="steady took the new rows")

        meta.set_state("paused", Status.PAUSED)  # what `setl pause` does
        wait_until(lambda: "paused" not in node.runs.running(), timeout=60, message="paused stopped")
        conf.append("paused", more_rows(0, 5))
        conf.append("steady", more_rows(30, 30))
        wait_until(lambda: conf.caught_up("steady"), timeout=60, message="steady went on alone")
        assert not conf.caught_up("paused")
    finally:
        node.stop()
        runner.join(60)
    assert not runner.is_alive()
    outcomes = {r.name: r.outcome for r in results}
    assert outcomes["steady"] is Outcome.STOPPED and outcomes["paused"] is Outcome.STOPPED
    assert outcomes["broken"] is Outcome.PAUSED
    assert meta.state("paused").status is Status.PAUSED
    assert node.batch_cap is not None and node.batch_cap.limit == 8  # 4x runtime.workers
    assert node.batch_cap.available == node.batch_cap.limit, "a paused or stopped pipeline kept a node permit"
    meta.close()


@pytest.mark.timeout(120)
def test_forty_pipelines_in_one_node_run_on_a_bounded_number_of_threads(tmp_path):
    """A node's threads do not grow with its pipelines: 40 following pipelines stay within 16 threads."""
    conf = Conf(tmp_path)
    names = [f"q{i}" for i in range(40)]
    for name in names:
        conf.add(name, make_stream(30), follow=True, mode="per_table" if name.endswith("7") else "ordered")
    before = threading.active_count()
    node, meta = conf.node(names)
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(node.run()), name="test-node")
    runner.start()
    peak = 0
    try:
        def all_caught_up() -> bool:
            nonlocal peak
            peak = max(peak, threading.active_count() - before)
            return all(conf.caught_up(name) for name in names)

        wait_until(all_caught_up, timeout=90, interval=0.05, message="40 pipelines caught up")
        for name in names[:5]:
            conf.append(name, more_rows(0, 10))
        wait_until(all_caught_up, timeout=60, interval=0.05, message="new rows replicated")
        assert node.runs.running() == set(names), "every pipeline is still running"
    finally:
        node.stop()
        runner.join(60)
    assert not runner.is_alive()
    assert 0 < peak <= 16, f"{peak} threads for 40 pipelines"
    assert {r.outcome for r in results} == {Outcome.STOPPED}
    meta.close()


@pytest.mark.timeout(120)
def test_start_all_runs_every_pipeline_and_status_lists_them(tmp_path):
    """`setl start --all --until-caught-up` replicates every pipeline in one process; `setl status` lists each."""
    conf = Conf(tmp_path)
    for i in range(3):
        conf.add(f"p{i}", make_stream(50 + 10 * i), follow=False, mode="per_table" if i == 1 else "ordered")

    def setl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "setl.cli", "--conf", str(conf.conf), *args],
                              capture_output=True, text=True, timeout=100)

    result = setl("start", "--all", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    for name in conf.streams:
        assert conf.caught_up(name), name
    status = setl("status", "--json")
    assert status.returncode == 0, status.stderr
    rows = {row["pipeline"]: row for row in json.loads(status.stdout)}
    assert sorted(rows) == ["p0", "p1", "p2"]
    for name, row in rows.items():
        size = (tmp_path / f"{name}.jsonl").stat().st_size
        assert row["status"] == "stopped" and row["position"] == {"log": f"{name}.jsonl", "offset": size}


@pytest.mark.timeout(60)
def test_a_stuck_transform_in_one_pipeline_does_not_stall_another_on_one_shared_worker():
    """A hung transform call on a one-worker shared service does not stop another pipeline finishing."""
    release = threading.Event()
    entered = threading.Event()

    class Hangs(Transform):
        def transform(self, batch):
            entered.set()
            assert release.wait(30)
            return batch

    class BlockingSource(ScriptedSource):
        blocking = True

    tasks = TaskExecutionService(1, 3, overrun_threshold=0.05, name="shared-test")
    meta = SqliteMetaStore(":memory:")
    settings: PipelineSettings = fast_settings(2, max_rows=2)
    stuck = Scheduler("stuck", settings, ScriptedSource(single_row_stream(10)), Extract(), Hangs(), MemorySink(),
                      meta, tasks=tasks)
    txs = single_row_stream(40)
    sink = MemorySink()
    healthy = Scheduler("healthy", settings, BlockingSource(txs), Extract(), Transform(), sink, meta, tasks=tasks)
    try:
        stuck.start(until_caught_up=True)
        assert entered.wait(10)
        healthy.start(until_caught_up=True)
        assert tasks.stats().dedicated == 1  # healthy's Select
        assert healthy.wait(30) is Outcome.CAUGHT_UP
        assert sink.tables == reference_state(txs)
        assert not release.is_set() and stuck.wait(0) is None  # the stuck call was never interrupted
    finally:
        release.set()
        stuck.wait(30)
        healthy.wait(30)
        tasks.shutdown(timeout=10)
    assert stuck.wait(0) is Outcome.CAUGHT_UP
