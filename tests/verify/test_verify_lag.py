"""`setl verify --max-lag`: a check pauses before each chunk while the pipeline's lag (the figure
`setl status` shows) is above the bound, resumes once it falls, and gives up with exit 2 when the
pauses add up to `--lag-timeout`."""

from __future__ import annotations

import contextlib
import json
import subprocess

import pytest

from setl.model import Position
from setl.verify.compare import Verifier
from setl.verify.pace import VerifyError
from tests.e2e.setl_process import binlog_head, mysql_target, spawned
from tests.helpers.wait import wait_until
from tests.verify.test_verify import make_setl, running

pytestmark = pytest.mark.timeout(180)


class Clock:
    """A clock that only moves when the verifier sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _verifier(lags: list[float | None], clock: Clock, **kwargs) -> tuple[Verifier, list]:
    seen: list = []
    figures = iter(lags)
    verifier = Verifier("p", lambda: Position("b.000001", 4), lag=lambda: next(figures), sleep=clock.sleep,
                        clock=clock, paused=lambda table, lag: seen.append((table, lag)), **kwargs)
    return verifier, seen


def test_wait_lag_pauses_until_the_lag_falls():
    """Lag above the bound: the verifier sleeps and reports the pause, then resumes once it is at most the bound."""
    clock = Clock()
    verifier, seen = _verifier([12.0, 9.0, 3.0], clock, max_lag=5.0, lag_timeout=60.0)
    verifier.pace.wait_lag("s.t")
    assert seen == [("s.t", 12.0), ("s.t", 9.0), ("s.t", None)]
    assert clock.now > 0


def test_wait_lag_not_known_or_off_never_pauses():
    """No lag figure (pipeline not running) or `max_lag` 0: no pause."""
    clock = Clock()
    verifier, seen = _verifier([None], clock, max_lag=5.0)
    verifier.pace.wait_lag("s.t")
    off, seen_off = _verifier([100.0], clock, max_lag=0.0)
    off.pace.wait_lag("s.t")
    assert seen == seen_off == [] and clock.now == 0


def test_wait_lag_gives_up_after_the_timeout_in_all():
    """Pauses add up over the check: past `lag_timeout` in all, no verdict (exit 2) naming the pipeline,
    table and acked position."""
    clock = Clock()
    verifier, _ = _verifier([50.0, 50.0, 1.0] + [50.0] * 1000, clock, max_lag=5.0, lag_timeout=10.0)
    verifier.pace.wait_lag("s.t")
    with pytest.raises(VerifyError) as caught:
        verifier.pace.wait_lag("s.t")
    assert caught.value.exit_code == 2
    text = str(caught.value)
    assert "pipeline=p" in text and "table=s.t" in text and "position=b.000001:4" in text
    assert "stayed above the bound of 5s for 10s" in text and "\n" not in text
    assert clock.now < 15


def test_verify_pauses_while_the_pipeline_lags(tmp_path, mariadb_source, mariadb_target, source_db, mysql_db):
    """A pipeline made to lag (every load slowed by a failpoint, a backlog written while it was stopped):
    verify with a short --lag-timeout ends with exit 2 and one line; with a long one it pauses, resumes
    once the pipeline has caught up, and finds the tables equal."""
    conn = mariadb_source.connect(database=source_db)
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT NOT NULL PRIMARY KEY, v INT NOT NULL)")
        cur.executemany("INSERT INTO t VALUES (%s, %s)", [(n, n) for n in range(1, 201)])
    setl = make_setl(tmp_path, mariadb_source, source_db, mysql_target(mariadb_target), f"{mysql_db}.{{table}}",
                     server_id=2231)
    with running(setl, mariadb_source):
        pass
    # a backlog of two-transaction batches, each load slowed by 2 s: the restarted pipeline lags for a
    # while (whole transactions: a transaction cut in pieces has no commit time, so no lag figure)
    setl.config["pipeline"]["batch"]["max_rows"] = 10
    setl.write_config()
    conn = mariadb_source.connect(database=source_db, autocommit=False)
    with contextlib.closing(conn), conn.cursor() as cur:
        for n in range(24):
            cur.execute("UPDATE t SET v = v + 1 WHERE id BETWEEN %s AND %s", (n * 5 + 1, n * 5 + 5))
            conn.commit()
    head = binlog_head(mariadb_source)
    setl.faults = json.dumps([{"stage": "load", "action": "slow", "seconds": 2.0, "times": None}])
    with spawned(setl) as proc:
        def lagging() -> bool:
            assert proc.poll() is None, setl.logs()[-3000:]
            figures = setl.liveness_figures() or {}
            return (figures.get("lag_seconds") or 0) > 3

        wait_until(lagging, timeout=60, interval=0.2,
                   message=lambda: f"a lag above 3s: {setl.liveness_figures()} {setl.logs()[-2000:]}")
        # both checks start while the pipeline lags: one that waits it out, one that gives up first
        waiting = subprocess.Popen(setl._argv(("verify", "--pipeline", setl.name, "--json", "--max-lag", "2",
                                               "--lag-timeout", "120", "--wait-timeout", "60")),
                                   env=setl._env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            gave_up = setl.run("verify", "--pipeline", setl.name, "--json", "--max-lag", "2", "--lag-timeout", "2",
                               timeout=90)
            assert gave_up.returncode == 2, (gave_up.returncode, gave_up.stderr[-3000:])
            assert "paused: lag" in gave_up.stderr
            errors = [line for line in gave_up.stderr.splitlines() if "stayed above the bound of 2s for 2s" in line]
            assert len(errors) == 1 and f"pipeline={setl.name}" in errors[0] and "table=" in errors[0], gave_up.stderr
            assert setl.acked().position < head  # still behind: that check did not wait it out
            stdout, stderr = waiting.communicate(timeout=150)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait(10)
        assert waiting.returncode == 0, (waiting.returncode, stderr[-3000:])
        assert "paused: lag" in stderr and "resumed" in stderr, stderr[-3000:]
        report = json.loads(stdout)
        assert report["equal"] and sum(t["rows"] for t in report["tables"]) == 200, report
        assert setl.acked().position >= head
        assert setl.stop(proc) == 0, setl.logs()[-3000:]
