"""The room for chunks read and not handed on (`source.snapshot.max_chunks`) never starves the copy:
readers claiming together take no more than the room, and a keyless table's read (whose open
snapshot holds back every chunk placed after it) waits only for its own pieces to go."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.e2e.setl_process import SetlProcess, mysql_source, mysql_target
from tests.snapshot.test_snapshot_e2e import run_until_caught_up

pytestmark = pytest.mark.timeout(300)

ROWS = 3000


def _tables(server, db: str) -> None:
    """Two keyed tables and a keyless one of ROWS rows (outside the binlog), and an empty `z_w` the
    test writes to while they are copied (so that each snapshot sits at its own binlog position)."""
    conn = server.connect(database=db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("CREATE TABLE a_ints (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)")
            cur.execute("CREATE TABLE b_ints (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)")
            cur.execute("CREATE TABLE c_nokey (x INT NOT NULL, y VARCHAR(20) NOT NULL)")
            cur.execute("CREATE TABLE z_w (id INT AUTO_INCREMENT PRIMARY KEY, at DOUBLE NOT NULL)")
            for name in ("a_ints", "b_ints"):
                cur.executemany(f"INSERT INTO {name} VALUES (%s, %s)", [(i, f"v{i}") for i in range(ROWS)])
            cur.executemany("INSERT INTO c_nokey VALUES (%s, %s)", [(i % 700, f"y{i}") for i in range(ROWS)])
        conn.commit()
    finally:
        conn.close()


class _Ticker:
    """Commits a row into `z_w` every 20 ms (at most for `limit` seconds) while it runs."""

    def __init__(self, server, db: str, limit: float = 90.0) -> None:
        self.server, self.db, self.limit = server, db, limit
        self.stop = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, name="snapshot-room-ticker", daemon=True)

    def _run(self) -> None:
        conn = self.server.connect(database=self.db)
        try:
            deadline = time.monotonic() + self.limit
            while not self.stop.is_set() and time.monotonic() < deadline:
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO z_w (at) VALUES (%s)", (time.time(),))
                conn.commit()
                self.count += 1
                self.stop.wait(0.02)
        finally:
            conn.close()

    def __enter__(self) -> _Ticker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def _rows(server, db: str, name: str) -> list[tuple]:
    return sorted(tuple(r) for r in server.query(f"SELECT * FROM `{db}`.`{name}`"))


def test_readers_claiming_together_never_starve_a_keyless_read(tmp_path, mariadb_source, mariadb_target,
                                                                source_db, mysql_db):
    """`max_chunks: 1`, three readers. The `snapshot_boundary` failpoint holds the first two keyed
    claims (a_ints, b_ints) in their boundary query while the third reader starts the keyless
    c_nokey's read; `snapshot_read` holds that read after its snapshot began, so the keyed chunks are
    read at later binlog positions. Readers that each saw room before any had registered its read
    used to put two keyed chunks in a room of one; they cannot go before the keyless read ends, and
    the keyless read waited for room: no log line, no progress, for ever. Now the copy ends and the
    target equals the source."""
    _tables(mariadb_source, source_db)
    setl = SetlProcess(tmp_path, source=mysql_source(mariadb_source, server_id=2131, start="snapshot",
                                                     snapshot={"chunk_rows": 500, "readers": 3, "max_chunks": 1}),
                       target=mysql_target(mariadb_target),
                       tables=[{"source": rf"{source_db}\..*", "target": f"{mysql_db}.{{table}}"}],
                       pipeline={"parallelism": 3, "batch": {"max_rows": 2000, "max_wait_ms": 50},
                                 "retry": {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 500}})
    setl.faults = json.dumps([
        {"stage": "snapshot_boundary", "action": "slow", "seconds": 2, "times": 2},
        {"stage": "snapshot_read", "action": "slow", "seconds": 6, "times": 1, "task": f"{source_db}.c_nokey"}])
    with _Ticker(mariadb_source, source_db) as ticker:
        stderr = run_until_caught_up(setl, timeout=150)  # fails with every thread's stack if it hangs
    assert ticker.count > 50
    assert "failpoint snapshot_boundary: sleeping" in stderr and "failpoint snapshot_read: sleeping" in stderr, \
        stderr[-3000:]
    setl.faults = None
    stderr += run_until_caught_up(setl)
    for name in ("a_ints", "b_ints", "c_nokey", "z_w"):
        source = _rows(mariadb_source, source_db, name)
        assert source and source == _rows(mariadb_target, mysql_db, name), name
    assert "snapshot finished" in stderr, stderr[-3000:]
