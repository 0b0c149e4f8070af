"""The runbook's steps for a stuck or slow pipeline (docs/runbook.md, "A stuck or slow pipeline"),
performed as an operator would on a running node: `kill -USR1 PID` prints every thread's stack on
its stderr and the node goes on; `setl pause` stops it gracefully and `setl resume` makes it go on;
SIGTERM ends it and the target equals the stream."""

from __future__ import annotations

import json
import signal

import pytest

from tests.helpers.wait import wait_until
from tests.test_cli import SLOW_LOADS, Setup, _stable_ack, make_stream

pytestmark = pytest.mark.timeout(180)


def test_usr1_shows_the_stacks_and_pause_then_resume_moves_a_pipeline_on(tmp_path) -> None:
    """A node loading slowly: USR1 dumps the stacks of its threads without stopping it; pause stops
    the acks, resume restarts them, SIGTERM exits 0 and the target matches the stream."""
    setup = Setup(tmp_path, make_stream(3000), follow=True)
    proc = setup.spawn("start", "--pipeline", "p", faults=SLOW_LOADS)
    try:
        wait_until(lambda: (a := setup.acked()) is not None and a.batch_id >= 2, timeout=60, message="2 acks")
        proc.send_signal(signal.SIGUSR1)
        before = setup.acked()
        wait_until(lambda: setup.acked().batch_id > before.batch_id, timeout=30, message="acks after USR1")
        assert setup.run("pause", "--pipeline", "p").returncode == 0
        paused_at = wait_until(lambda: _stable_ack(setup), timeout=20, message="acks to stop")
        assert json.loads(setup.run("status", "--json").stdout)[0]["status"] == "paused"
        assert setup.run("resume", "--pipeline", "p").returncode == 0
        wait_until(lambda: setup.acked().batch_id > paused_at.batch_id, timeout=30, message="acks after resume")
        wait_until(lambda: setup.acked().position == setup.end(), timeout=60, message="the stream's end acked")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "Current thread" in stderr or "Thread 0x" in stderr, stderr[-3000:]
    assert stderr.count("File ") > 3, stderr[-3000:]  # frames of several threads
    setup.assert_target_equals_stream()
