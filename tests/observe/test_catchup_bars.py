"""`setl start --until-caught-up` on a terminal (a real pseudo-terminal): a bar of how far behind the
binlog's end the pipeline is, filling as it catches up, then the summary."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import subprocess
import time

import pytest

from tests.e2e.setl_process import SetlProcess, binlog_head, mysql_source, mysql_target

pytestmark = pytest.mark.timeout(180)


def _run_on_a_terminal(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run `argv` with stdin, stdout and stderr on a new pseudo-terminal; its exit code and output."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, env={**env, "COLUMNS": "120", "TERM": "xterm"}, stdin=follower, stdout=follower,
                            stderr=follower, close_fds=True)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # the process closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_until_caught_up_on_a_terminal_draws_a_bar_of_the_bytes_behind(tmp_path, mariadb_source, source_db,
                                                                      mariadb_target, mysql_db):
    head = binlog_head(mariadb_source)
    with contextlib.closing(mariadb_source.connect(database=source_db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE backlog (id INT PRIMARY KEY, pad VARCHAR(200))")
        for start in range(0, 60_000, 2000):
            cur.executemany("INSERT INTO backlog VALUES (%s, %s)",
                            [(i, "x" * 200) for i in range(start, start + 2000)])
            conn.commit()
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=2201,
                                                     start={"file": head.log, "pos": head.offset}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}"}],
                       pipeline={"parallelism": 1, "batch": {"max_rows": 100, "max_wait_ms": 50}})
    slow = json.dumps([{"stage": "load", "action": "slow", "seconds": 0.01, "times": None}])  # ~8 s in all
    code, output = _run_on_a_terminal(setl._argv(("start", "--pipeline", setl.name, "--until-caught-up")),
                                      {**setl._env(), "SETL_FAULTS": slow}, timeout=150)
    assert code == 0, output[-3000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output)  # without the terminal's control sequences
    assert f"{setl.name} catching up" in plain, plain[-3000:]
    assert re.search(r"[0-9.]+ MiB behind, [0-9,]+ rows/s", plain), plain[-3000:]
    assert f"{setl.name}: caught up at " in plain and ": 60,001 changes (" in plain  # the summary (+ CREATE)
    assert f"{mysql_db}.backlog" in plain  # per target table
    assert int(mariadb_target.query(f"SELECT COUNT(*) FROM `{mysql_db}`.backlog")[0][0]) == 60_000
